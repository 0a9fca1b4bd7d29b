//! `onionlab lab table --by-jobs`: did running several runs at once (`lab
//! run --jobs N`) move the results? Per variant, the repetitions made
//! beside others against those made alone, with an unpaired cluster
//! bootstrap (they are different repetitions) and the machine's load in
//! each group.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use onionlab_lab::rundata::RunData;
use onionlab_stats::{ratio_clustered_unpaired, BOOTSTRAP_RESAMPLES};

use crate::args::TableArgs;
use crate::common::{num, sample_of, table_err, VariantRows};
use crate::select::Sample;
use crate::{Error, Result};

/// `(alone, beside)`: the repetitions of `variant` made alone and beside
/// other runs.
fn groups(data: &RunData, variant: &str) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let mut alone = BTreeSet::new();
    let mut beside = BTreeSet::new();
    for r in data.repetitions.iter().filter(|r| r.variant == variant) {
        if r.jobs > 1 {
            beside.insert(r.repetition);
        } else {
            alone.insert(r.repetition);
        }
    }
    (alone, beside)
}

/// `median (max)` of `values`, `-` without any.
fn spread(values: &[f64], scale: f64) -> String {
    match onionlab_stats::median(values) {
        Ok(m) => {
            let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{} (max {})", num(m * scale), num(max * scale))
        }
        Err(_) => "-".into(),
    }
}

/// The machine's load in each group, for the caption.
fn load_note(data: &RunData) -> String {
    let mut out = String::new();
    for (alone, name) in [(true, "alone"), (false, "beside others")] {
        let reps: Vec<_> = data
            .repetitions
            .iter()
            .filter(|r| (r.jobs <= 1) == alone && !r.cpu_saturated)
            .collect();
        if reps.is_empty() {
            continue;
        }
        let busy: Vec<f64> = reps.iter().map(|r| r.cpu_busy_fraction).collect();
        let late: Vec<f64> = reps
            .iter()
            .filter_map(|r| r.emulator.as_ref().map(|e| e.late_p99_us))
            .collect();
        let _ = write!(
            out,
            " Repetitions {name}: {}, machine busy {} (% of both cores)",
            reps.len(),
            spread(&busy, 100.0)
        );
        if !late.is_empty() {
            let _ = write!(
                out,
                ", the emulator's 99th percentile of packet release lateness {} µs",
                spread(&late, 1.0)
            );
        }
        out.push('.');
    }
    out
}

/// The `--by-jobs` table, as Markdown with its caption.
///
/// # Errors
///
/// The arguments do not fit the run (no repetition made beside others, or
/// none alone), or a statistic fails.
pub fn by_jobs_of(data: &RunData, args: &TableArgs) -> Result<String> {
    if !data.repetitions.iter().any(|r| r.jobs > 1) {
        return Err(table_err(
            data,
            "--by-jobs: no repetition was made beside other runs (lab run --jobs 1 throughout)",
        ));
    }
    let rows = VariantRows::new(data, args)?;
    let center = args.center.stats();
    let mut head = rows.head();
    head.push("reps alone / beside".into());
    for m in &args.metric {
        head.push(format!("{} {} alone", m.title(), m.unit()));
        head.push(format!("{} beside / alone [95% CI]", m.title()));
    }
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
    let mut made = 0;
    for v in &rows.variants {
        let (alone, beside) = groups(data, v);
        if alone.is_empty() || beside.is_empty() {
            continue;
        }
        for part in &rows.parts {
            let mut line = rows.labels(v, part.as_ref());
            let mut counts = (0, 0);
            let mut cells = Vec::new();
            for &m in &args.metric {
                let s = sample_of(&rows.sel, args, m, v, part.as_deref());
                let (a, b): (Sample, Sample) = (s.restricted_to(&beside), s.restricted_to(&alone));
                if a.values.is_empty() || b.values.is_empty() {
                    cells.extend(["-".to_string(), "-".to_string()]);
                    continue;
                }
                counts = (b.repetition_set().len(), a.repetition_set().len());
                let seed = onionlab_stats::seed_of_names(&[
                    "by-jobs",
                    m.name(),
                    part.as_deref().unwrap_or("-"),
                    v,
                ]);
                let r = ratio_clustered_unpaired(
                    &a.values,
                    &a.repetitions,
                    &b.values,
                    &b.repetitions,
                    seed,
                    center,
                )
                .map_err(|source| Error::Stats {
                    context: format!("{} of {v} beside others against alone", m.name()),
                    source,
                })?;
                let alone_center = center.of_values(&b.values).map_err(|source| Error::Stats {
                    context: format!("{} of {v} alone", m.name()),
                    source,
                })?;
                cells.push(num(alone_center));
                cells.push(format!("{:.2} [{:.2}, {:.2}]", r.ratio, r.ci95.0, r.ci95.1));
            }
            line.push(format!("{} / {}", counts.0, counts.1));
            line.extend(cells);
            let _ = writeln!(out, "| {} |", line.join(" | "));
            made += 1;
        }
    }
    if made == 0 {
        return Err(table_err(
            data,
            "--by-jobs: no variant has repetitions both alone and beside other runs",
        ));
    }
    let _ = write!(
        out,
        "\n{} Cells: the {} of {} in each group; ratio beside \
         others / alone with a 95% cluster-bootstrap interval, each group's repetitions \
         drawn apart ({BOOTSTRAP_RESAMPLES} resamples; unpaired: different repetitions, \
         so the repetitions' own differences are in it).{}",
        data.caption_names(),
        args.center.name(),
        crate::common::values_text(args),
        load_note(data),
    );
    out.push_str(&crate::common::sharing_note(args));
    out.push('\n');
    Ok(out)
}
