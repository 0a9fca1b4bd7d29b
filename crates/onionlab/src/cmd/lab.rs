//! `onionlab lab`: run scenarios over the emulated network and report.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::{Args, Subcommand};
use onionlab_lab::run::{run, RunOptions};
use onionlab_lab::Scenario;
use onionlab_transport::tcp::TcpCongestion;

use crate::cmd::runtime;
use crate::error::{Error, Result};

/// Where bundled scenarios live (relative to the repository root or the
/// current directory).
const SCENARIO_DIR: &str = "scenarios";

/// Lab commands.
#[derive(Subcommand, Debug)]
pub enum LabCommand {
    /// Run a scenario: every variant, every repetition, fresh processes
    /// each time (needs root: network namespaces and TUN).
    #[command(after_long_help = onionlab_transport::registry::help_text())]
    Run(RunArgs),
    /// Print the plan of one repetition of one variant (JSON): the hosts,
    /// links, files and processes the run would deploy. Needs no root.
    Plan(PlanArgs),
    /// Write one repetition of every variant as a Shadow simulation
    /// (DIR/repNNN-vNN/: shadow.yaml, network.gml and the nodes' files),
    /// without running it; prints what Shadow will do differently. Needs
    /// no root.
    ExportShadow(ExportShadowArgs),
    /// (Re)write the report of a run (a run directory, into DIR/report, or
    /// a stored run, into --out).
    Report {
        /// The run: its output directory, or a stored run.
        dir: PathBuf,
        /// Where to write the report (needed for a stored run).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// One comparison table of a run (Markdown): each value of the
    /// compared parameter against the baseline under the same other
    /// parameters, per workload and metric; medians, ratio with a 95%
    /// paired cluster-bootstrap interval over repetitions, Mann-Whitney p
    /// adjusted for the table's comparisons. What the results pages show.
    Table(onionlab_results::TableArgs),
    /// Store a finished run directory compactly (zstd, with a manifest of
    /// digests) for the repository: docs/results/data/ID. Refuses a run
    /// made by a build with uncommitted changes.
    Store {
        /// The run directory.
        run: PathBuf,
        /// The stored run's folder (its name is the run's id); replaced if
        /// it is a stored run already.
        out: PathBuf,
    },
    /// Write a stored run out as a run directory, to continue it with
    /// `lab run --resume --out DIR` on any machine (then store it again).
    Unpack {
        /// The stored run.
        stored: PathBuf,
        /// The new run directory.
        out: PathBuf,
    },
    /// Compare two runs of one scenario (e.g. two commits): per headline
    /// metric and variant, B's median against A's with a 95% interval and
    /// a Mann-Whitney test.
    Compare {
        /// Run directory A (the reference).
        a: PathBuf,
        /// Run directory B.
        b: PathBuf,
        /// Also write the comparison as Markdown to this file.
        #[arg(long)]
        markdown: Option<PathBuf>,
    },
    /// List the bundled scenarios.
    List,
    /// Check a scenario file and print its variants without running it.
    Check {
        /// The scenario file (or the name of a bundled one).
        scenario: String,
    },
    /// (internal) Workload server, started inside a server host.
    #[command(hide = true)]
    Serve {
        /// Address to listen on.
        #[arg(long)]
        listen: SocketAddr,
        /// TCP congestion control of the server's connections (`system`:
        /// the kernel's default).
        #[arg(long, default_value = "system")]
        tcp_congestion: String,
    },
    /// (internal) Workload agent, started inside a client host.
    #[command(hide = true)]
    Agent {
        /// The agent's spec (JSON, written by `lab run`).
        #[arg(long)]
        spec: PathBuf,
    },
}

/// `lab run`'s arguments.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The scenario file (or the name of a bundled one, see `lab list`).
    scenario: String,
    #[command(flatten)]
    flags: RunFlags,
}

/// `lab run`'s options, which `onionlab demo` takes too.
#[derive(Args, Debug)]
pub struct RunFlags {
    /// Override the scenario's repetitions.
    #[arg(long)]
    reps: Option<u32>,
    /// Output directory (default: results/NAME-TIMESTAMP).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in `--out` (interrupted, or to add repetitions
    /// with a larger `--reps`): runs only what it lacks. The scenario
    /// and topology must be unchanged.
    #[arg(long, requires = "out")]
    resume: bool,
    /// With --resume: also run again the repetitions that ran on a
    /// saturated CPU (flagged in the report; their results measured the
    /// machine). segments.jsonl records how many.
    #[arg(long, requires = "resume")]
    redo_saturated: bool,
    /// With --resume: also run again the repetitions that ran beside
    /// others (`--jobs` above 1), so that every repetition ran alone.
    /// segments.jsonl records how many.
    #[arg(long, requires = "resume")]
    redo_shared: bool,
    /// Runs under way at once (1-8), each in a network of its own. For
    /// scenarios whose runs wait on their links with the CPU mostly
    /// idle (loss, long delays, C tor's bootstrap); each run records
    /// the setting, and runs on a saturated CPU are flagged as always.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=8))]
    jobs: u16,
    /// What runs the plans: `namespaces`, a network namespace per host on
    /// this machine over the link emulator (real time, Linux's TCP; needs
    /// root), or `shadow`, the Shadow simulator (simulated time, Shadow's
    /// TCP with Reno; no root; `lab export-shadow` shows what it runs
    /// differently). A run continues on the engine that started it.
    #[arg(long, value_enum, default_value_t = EngineArg::Namespaces)]
    engine: EngineArg,
    /// With --engine shadow: the `shadow` binary (default: `shadow` on
    /// PATH, else ~/.local/bin/shadow; if neither exists, the lab builds
    /// it there from ../shared/vendor/shadow first, 10-20 minutes).
    #[arg(long, value_name = "PATH")]
    shadow: Option<PathBuf>,
    /// With --engine shadow: Shadow's worker threads in each run (0: one
    /// per core).
    #[arg(long, default_value_t = 0)]
    shadow_parallelism: u32,
}

/// `--engine`'s values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineArg {
    /// Network namespaces over the link emulator.
    Namespaces,
    /// The Shadow simulator.
    Shadow,
}

/// `lab plan`'s arguments.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The scenario file (or the name of a bundled one).
    scenario: String,
    /// The variant: its label as `lab check` prints it (full or short),
    /// or its index from 0 (default: the first).
    #[arg(long)]
    variant: Option<String>,
    /// The repetition (0-based); its seed is the one `lab run` uses.
    #[arg(long, default_value_t = 0)]
    rep: u32,
}

/// `lab export-shadow`'s arguments.
#[derive(Args, Debug)]
pub struct ExportShadowArgs {
    /// The scenario file (or the name of a bundled one).
    scenario: String,
    /// Where to write (created; each variant's repetition in a new
    /// folder under it).
    dir: PathBuf,
    /// Only this variant: its label as `lab check` prints it (full or
    /// short), or its index from 0.
    #[arg(long)]
    variant: Option<String>,
    /// The repetition (0-based); its seed is the one `lab run` uses.
    #[arg(long, default_value_t = 0)]
    rep: u32,
    /// The onionlab binary the simulation runs (default: this one).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Shadow's worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    parallelism: u32,
}

/// `lab run`'s SIGINT/SIGTERM handling, as (stop, abort) flags. The first
/// signal sets `stop`: the runs under way finish (their processes and
/// namespaces are cleaned up) and what ran is written with its report. The
/// second sets `abort`: the runs under way end at once, cleaned up the same
/// way and not recorded. A third ends the process at once.
fn stop_flags() -> Result<(Arc<AtomicBool>, Arc<AtomicBool>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let abort = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Registered first, so it sees `abort` before this signal sets it.
        signal_hook::flag::register_conditional_shutdown(sig, 1, abort.clone())
            .map_err(|e| Error::Usage(format!("installing a signal handler: {e}")))?;
        let (stop, abort) = (stop.clone(), abort.clone());
        // SAFETY: the action only swaps and stores atomics, which is
        // async-signal-safe.
        unsafe {
            signal_hook::low_level::register(sig, move || {
                if stop.swap(true, Ordering::SeqCst) {
                    abort.store(true, Ordering::SeqCst);
                }
            })
        }
        .map_err(|e| Error::Usage(format!("installing a signal handler: {e}")))?;
    }
    Ok((stop, abort))
}

/// The scenario file NAME names: a path, or a bundled scenario's name.
fn scenario_path(name: &str) -> Result<PathBuf> {
    let p = PathBuf::from(name);
    if p.exists() {
        return Ok(p);
    }
    let bundled = Path::new(SCENARIO_DIR).join(format!("{name}.toml"));
    if bundled.exists() {
        return Ok(bundled);
    }
    Err(Error::Usage(format!(
        "no scenario file {name:?} and no bundled scenario ./{} \
         (bundled scenarios are found from the repository root; `onionlab lab list` shows them)",
        bundled.display()
    )))
}

fn bundled() -> Vec<(String, std::result::Result<Scenario, onionlab_lab::Error>)> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(SCENARIO_DIR) {
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        paths.sort();
        for p in paths {
            let name = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            out.push((name, Scenario::from_file(&p)));
        }
    }
    out
}

fn write_report(dir: &Path, out: Option<&Path>) -> Result<ExitCode> {
    let files = onionlab_lab::summary::report_dir(dir, out)
        .map_err(|e| Error::Usage(format!("lab report: {e}")))?;
    print_findings(&files.findings_text);
    println!("report: {}", files.html.display());
    println!("        {}", files.markdown.display());
    Ok(ExitCode::SUCCESS)
}

/// Findings tables shown on the terminal at most; the report has them all.
const TERMINAL_FINDINGS: usize = 6;

/// Prints the report's first findings tables (ratios against the baseline
/// of each condition).
fn print_findings(text: &str) {
    let tables: Vec<&str> = text
        .split("\n\n")
        .filter(|t| !t.trim().is_empty())
        .collect();
    if tables.is_empty() {
        return;
    }
    println!("\nFindings (median ratio against the baseline of the same condition [95% CI], Mann-Whitney p Holm-adjusted over each table's comparisons; ✱: adjusted p < 0.05):\n");
    for t in tables.iter().take(TERMINAL_FINDINGS) {
        println!("{t}\n");
    }
    if tables.len() > TERMINAL_FINDINGS {
        println!(
            "({} more findings tables in the report)\n",
            tables.len() - TERMINAL_FINDINGS
        );
    }
}

/// Let a listing piped into `head` end quietly (the default action of
/// SIGPIPE) instead of panicking on a failed print. Only for commands that
/// just print: anything that runs processes or namespaces keeps Rust's
/// ignored SIGPIPE, so it always gets to clean up.
fn quiet_on_closed_stdout() {
    // SAFETY: signal(2) with the default action, before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Run a lab command.
pub fn run_cmd(cmd: LabCommand) -> Result<ExitCode> {
    if matches!(
        cmd,
        LabCommand::List
            | LabCommand::Check { .. }
            | LabCommand::Compare { .. }
            | LabCommand::Table(_)
            | LabCommand::Plan(_)
            | LabCommand::ExportShadow(_)
    ) {
        quiet_on_closed_stdout();
    }
    match cmd {
        LabCommand::List => list_cmd(),
        LabCommand::Check { scenario } => check_cmd(&scenario),
        LabCommand::Run(args) => run_scenario_cmd(args),
        LabCommand::Plan(args) => plan_cmd(&args),
        LabCommand::ExportShadow(args) => export_shadow_cmd(&args),
        LabCommand::Report { dir, out } => write_report(&dir, out.as_deref()),
        LabCommand::Table(args) => {
            let text = onionlab_results::table(&args)
                .map_err(|e| Error::Usage(format!("lab table: {e}")))?;
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Store { run, out } => store_cmd(&run, &out),
        LabCommand::Unpack { stored, out } => unpack_cmd(&stored, &out),
        LabCommand::Compare { a, b, markdown } => compare_cmd(&a, &b, markdown.as_deref()),
        LabCommand::Serve {
            listen,
            tcp_congestion,
        } => serve_cmd(listen, &tcp_congestion),
        LabCommand::Agent { spec } => agent_cmd(&spec),
    }
}

/// `lab list`.
fn list_cmd() -> Result<ExitCode> {
    let list = bundled();
    if list.is_empty() {
        return Err(Error::Usage(format!(
            "no scenarios in ./{SCENARIO_DIR} (run from the repository root)"
        )));
    }
    for (name, s) in list {
        match s {
            Ok(s) => {
                let n = s.variants().len();
                let variants = if n == 1 { "variant" } else { "variants" };
                println!(
                    "{name:<28} {} ({n} {variants} x {} repetitions)",
                    s.description, s.repetitions
                )
            }
            Err(e) => println!("{name:<28} INVALID: {e}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `lab check`.
fn check_cmd(scenario: &str) -> Result<ExitCode> {
    let s = Scenario::from_file(&scenario_path(scenario)?)?;
    println!("{}: {}", s.name, s.description);
    println!("{} repetitions of each variant:", s.repetitions);
    let variants = s.variants();
    let full: Vec<String> = variants.iter().map(|v| v.label.clone()).collect();
    let short = s.short_labels();
    let width = short.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    for (l, f) in short.iter().zip(&full) {
        if l == f {
            println!("  {f}");
        } else {
            println!("  {l:<width$}  ({f})");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `onionlab demo`: the default experiment, `lab run demo`.
pub fn run_demo(flags: RunFlags) -> Result<ExitCode> {
    run_scenario_cmd(RunArgs {
        scenario: "demo".into(),
        flags,
    })
}

/// `lab plan`: the plan `lab run` would run for one variant and
/// repetition, as JSON on standard output.
fn plan_cmd(args: &PlanArgs) -> Result<ExitCode> {
    let s = Scenario::from_file(&scenario_path(&args.scenario)?)?;
    let variants = s.variants();
    let index = match &args.variant {
        None => 0,
        Some(name) => variant_index(&s, &args.scenario, name)?,
    };
    let seed = onionlab_lab::run::repetition_seed(s.seed, args.rep);
    let mut plan = onionlab_lab::plan::Plan::of(
        &s,
        &variants[index],
        (args.rep, seed),
        onionlab_config::unix_now(),
    )?;
    // Keys stay out of terminals and pastes: the engine writes them.
    for f in plan.files.iter_mut().filter(|f| f.secret) {
        f.text = format!(
            "(secret, {} bytes, written 0600 by the engine)",
            f.text.len()
        );
    }
    let text =
        serde_json::to_string_pretty(&plan).map_err(|e| Error::Usage(format!("lab plan: {e}")))?;
    println!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// The index of variant `name` of `s` (read from `scenario`): its label,
/// full or short, or its index.
fn variant_index(s: &Scenario, scenario: &str, name: &str) -> Result<usize> {
    let variants = s.variants();
    let short = s.short_labels();
    variants
        .iter()
        .zip(&short)
        .position(|(v, l)| v.label == name || l == name)
        .or_else(|| name.parse::<usize>().ok().filter(|i| *i < variants.len()))
        .ok_or_else(|| {
            Error::Usage(format!(
                "no variant {name:?} in {} (`onionlab lab check {scenario}` lists them; \
                 or give an index from 0 to {})",
                s.name,
                variants.len() - 1
            ))
        })
}

/// `lab export-shadow`: each variant's repetition as a Shadow simulation;
/// a variant Shadow cannot run is listed with the reason, and the command
/// fails if none could be written.
fn export_shadow_cmd(args: &ExportShadowArgs) -> Result<ExitCode> {
    use onionlab_lab::engine::shadow::{export, ShadowOptions, CONFIG_FILE};
    let s = Scenario::from_file(&scenario_path(&args.scenario)?)?;
    let variants = s.variants();
    let chosen: Vec<usize> = match &args.variant {
        None => (0..variants.len()).collect(),
        Some(name) => vec![variant_index(&s, &args.scenario, name)?],
    };
    let absolute = |p: &Path| -> Result<PathBuf> {
        std::path::absolute(p)
            .map_err(|e| Error::Usage(format!("lab export-shadow: {}: {e}", p.display())))
    };
    let bin = match &args.bin {
        Some(b) => absolute(b)?,
        None => std::env::current_exe()
            .map_err(|e| Error::Usage(format!("lab export-shadow: this binary's path: {e}")))?,
    };
    let opts = ShadowOptions {
        bin,
        parallelism: args.parallelism,
        log: std::env::var("ONIONLAB_LOG").ok(),
    };
    let root = absolute(&args.dir)?;
    let seed = onionlab_lab::run::repetition_seed(s.seed, args.rep);
    let short = s.short_labels();
    let (mut written, mut notes) = (Vec::new(), Vec::new());
    let dirs: Vec<(usize, PathBuf)> = chosen
        .into_iter()
        .map(|i| (i, root.join(format!("rep{:03}-v{i:02}", args.rep))))
        .collect();
    // Keys are never written over: refuse before writing anything.
    if let Some((_, dir)) = dirs.iter().find(|(_, d)| d.exists()) {
        return Err(Error::Usage(format!(
            "lab export-shadow: {} exists (remove it, or export elsewhere)",
            dir.display()
        )));
    }
    for (i, dir) in dirs {
        match export(&s, &variants[i], (args.rep, seed), &dir, &opts) {
            Ok(e) => {
                notes.extend(e.notes);
                written.push((dir, i, e.schedule.stop_at));
            }
            Err(e @ onionlab_lab::Error::Shadow(_)) if args.variant.is_none() => {
                println!("not written: {}: {e}", short[i]);
            }
            Err(e) => return Err(e.into()),
        }
    }
    notes.sort();
    notes.dedup();
    for n in &notes {
        println!("note: {n}");
    }
    for (dir, i, stop) in &written {
        println!(
            "{}: {} ({} simulated s)",
            dir.display(),
            short[*i],
            stop.as_secs()
        );
    }
    if written.is_empty() {
        return Err(Error::Usage(
            "lab export-shadow: Shadow can run none of the variants".into(),
        ));
    }
    println!("run one with: cd DIR && shadow {CONFIG_FILE}");
    Ok(ExitCode::SUCCESS)
}

/// The lab's set-up step for the Shadow engine: `None` if Shadow is
/// installed, else builds it from the vendored source (with a progress
/// line; 10-20 minutes) and returns the installed binary.
fn install_shadow_if_missing() -> Result<Option<PathBuf>> {
    use onionlab_lab::engine::shadow::install::{install_vendored, installed_shadow};
    if installed_shadow().is_some() {
        return Ok(None);
    }
    let log =
        std::env::temp_dir().join(format!("onionlab-shadow-build-{}.log", std::process::id()));
    let started = std::time::Instant::now();
    let bin = install_vendored(&log, |script| {
        eprintln!(
            "Shadow is not installed: building it with {} (10-20 minutes on two cores; log: {})",
            script.display(),
            log.display()
        );
    })?;
    eprintln!(
        "Shadow installed as {} in {:.0} min",
        bin.display(),
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(Some(bin))
}

/// `lab run`.
fn run_scenario_cmd(args: RunArgs) -> Result<ExitCode> {
    let RunArgs {
        scenario,
        flags:
            RunFlags {
                reps,
                out,
                resume,
                redo_saturated,
                redo_shared,
                jobs,
                engine,
                shadow,
                shadow_parallelism,
            },
    } = args;
    if redo_shared && jobs > 1 {
        return Err(Error::Usage(
            "--redo-shared runs again what ran beside others: run it with --jobs 1".into(),
        ));
    }
    if engine != EngineArg::Shadow && (shadow.is_some() || shadow_parallelism != 0) {
        return Err(Error::Usage(
            "--shadow and --shadow-parallelism are for --engine shadow".into(),
        ));
    }
    let bin = std::env::current_exe()
        .map_err(|e| Error::Usage(format!("finding onionlab's own path: {e}")))?;
    // Read before any engine set-up (a Shadow build takes minutes).
    let s = Scenario::from_file(&scenario_path(&scenario)?)?;
    let shadow = match engine {
        EngineArg::Namespaces => {
            onionlab_netem::check_privileges()?;
            None
        }
        EngineArg::Shadow => {
            let opts = onionlab_lab::engine::shadow::ShadowOptions {
                bin: bin.clone(),
                parallelism: shadow_parallelism,
                log: std::env::var("ONIONLAB_LOG").ok(),
            };
            let shadow = match shadow {
                Some(path) => Some(path),
                None => install_shadow_if_missing()?,
            };
            Some(onionlab_lab::engine::shadow::Shadow::new(shadow, opts)?)
        }
    };
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let out = out.unwrap_or_else(|| PathBuf::from(format!("results/{}-{stamp}", s.name)));
    let (stop, abort) = stop_flags()?;
    let opts = RunOptions {
        out: out.clone(),
        bin,
        repetitions: reps,
        resume,
        redo: onionlab_lab::journal::Redo {
            saturated: redo_saturated,
            shared: redo_shared,
        },
        jobs: usize::from(jobs),
        progress: true,
        stop: Some(stop),
        abort: Some(abort),
        shadow,
    };
    let outcome = run(&s, &opts).map_err(|e| {
        let kept = std::fs::metadata(out.join("repetitions.jsonl")).is_ok_and(|m| m.len() > 0);
        let hint = if kept {
            format!(
                " (the runs completed so far are kept in {}: continue with --resume)",
                out.display()
            )
        } else {
            String::new()
        };
        Error::Usage(format!("lab run: {e}{hint}"))
    })?;
    let failed = outcome.records.iter().filter(|r| r.error.is_some()).count();
    println!(
        "{} transfers ({} failed) in {} repetitions; raw results in {}",
        outcome.records.len(),
        failed,
        outcome.repetitions.len(),
        outcome.out.display()
    );
    write_report(&outcome.out, None)
}

/// `lab store`.
fn store_cmd(run: &Path, out: &Path) -> Result<ExitCode> {
    let s = onionlab_lab::rundata::store(run, out)
        .map_err(|e| Error::Usage(format!("lab store: {e}")))?;
    println!(
        "stored {} as {}: {:.1} KiB ({:.1} KiB uncompressed)",
        run.display(),
        s.dir.display(),
        s.bytes as f64 / 1024.0,
        s.source_bytes as f64 / 1024.0
    );
    Ok(ExitCode::SUCCESS)
}

/// `lab unpack`.
fn unpack_cmd(stored: &Path, out: &Path) -> Result<ExitCode> {
    onionlab_lab::rundata::unpack(stored, out)
        .map_err(|e| Error::Usage(format!("lab unpack: {e}")))?;
    println!(
        "unpacked {} into {}: continue it with `onionlab lab run SCENARIO --resume --out {}`",
        stored.display(),
        out.display(),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `lab compare`.
fn compare_cmd(a: &Path, b: &Path, markdown: Option<&Path>) -> Result<ExitCode> {
    let c = onionlab_lab::summary::compare_dirs(a, b)
        .map_err(|e| Error::Usage(format!("lab compare: {e}")))?;
    print!("{}", c.text);
    if let Some(path) = markdown {
        std::fs::write(path, &c.markdown)
            .map_err(|e| Error::Usage(format!("lab compare: writing {}: {e}", path.display())))?;
        println!("written: {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `lab serve` (internal): the workload server.
fn serve_cmd(listen: SocketAddr, tcp_congestion: &str) -> Result<ExitCode> {
    runtime::current_thread()?.block_on(async {
        let congestion = TcpCongestion::parse(tcp_congestion)
            .and_then(|c| c.check_available().map(|()| c))
            .map_err(|e| Error::Usage(e.to_string()))?;
        let l = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|source| Error::Write {
                path: format!("listening on {listen}"),
                source,
            })?;
        // Accepted connections inherit it.
        congestion.apply(&l).map_err(|source| Error::Write {
            path: format!("TCP_CONGESTION {congestion} on {listen}"),
            source,
        })?;
        tokio::select! {
            () = onionlab_lab::traffic::serve(l) => {}
            () = runtime::shutdown_signal() => {}
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `lab agent` (internal): the workload agent.
fn agent_cmd(spec: &Path) -> Result<ExitCode> {
    let text = std::fs::read_to_string(spec).map_err(|source| Error::Write {
        path: spec.display().to_string(),
        source,
    })?;
    let spec: onionlab_lab::agent::AgentSpec =
        serde_json::from_str(&text).map_err(|e| Error::Usage(format!("agent spec: {e}")))?;
    runtime::multi_thread()?.block_on(async {
        onionlab_lab::agent::run(&spec)
            .await
            .map_err(|source| Error::Write {
                path: spec.out.display().to_string(),
                source,
            })
    })?;
    Ok(ExitCode::SUCCESS)
}
