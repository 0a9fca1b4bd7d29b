//! The arguments of `onionlab lab table` (also what a results page's
//! marker command parses to).

use std::path::PathBuf;

use onionlab_stats::Center;

use crate::select::{Aggregate, MetricKind};

/// How p-values are adjusted for the number of comparisons in a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Correction {
    /// Holm's step-down: the family-wise error rate.
    Holm,
    /// Benjamini-Hochberg: the false discovery rate, at 5%.
    Bh,
}

/// What a ratio compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CenterArg {
    /// Medians (robust).
    Median,
    /// Means (as papers that give "mean ± CI" compare).
    Mean,
    /// 75th percentiles (the slowest quarter's edge).
    P75,
    /// 95th percentiles (the slowest 5%'s edge).
    P95,
    /// 99th percentiles (the tail; for metrics with many values per
    /// repetition, such as probes).
    P99,
}

impl CenterArg {
    pub(crate) fn stats(self) -> Center {
        match self {
            CenterArg::Median => Center::Median,
            CenterArg::Mean => Center::Mean,
            CenterArg::P75 => Center::P75,
            CenterArg::P95 => Center::P95,
            CenterArg::P99 => Center::P99,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            CenterArg::Median => "median",
            CenterArg::Mean => "mean",
            CenterArg::P75 => "75th percentile",
            CenterArg::P95 => "95th percentile",
            CenterArg::P99 => "99th percentile",
        }
    }
}

/// What `lab table` shows (also what a results page's marker command
/// parses to).
#[derive(clap::Args, Debug, Clone)]
pub struct TableArgs {
    /// The run: a stored run (`docs/results/data/ID`) or a run directory;
    /// several are read together (presets made to be compared, whose
    /// repetition r shares its seed, such as seed 001's loaded toy and its
    /// companions), each variant from the one run that has it.
    #[arg(required = true, num_args = 1..)]
    pub runs: Vec<PathBuf>,
    /// The matrix parameter compared (default: the scenario's `[report]
    /// compare`, else `transport`).
    #[arg(long)]
    pub compare: Option<String>,
    /// The value of `--compare` the others are compared with (default:
    /// the scenario's `[report] baseline`, else `tls` for transport, else
    /// its first value).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Instead of `--compare`: variant A against variant B (full labels,
    /// as in records.jsonl); repeat for more rows.
    #[arg(long, num_args = 2, value_names = ["A", "B"], conflicts_with_all = ["compare", "baseline"])]
    pub pair: Vec<String>,
    /// Metrics, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "ttfb,ttlb")]
    pub metric: Vec<MetricKind>,
    /// Only these workloads, comma-separated, in this order (default:
    /// all, in the run's order); a `*` in a name stands for any run of
    /// characters, and the workloads a pattern matches are pooled into
    /// one row (`--workload 'light-*,heavy-*'`).
    #[arg(long, value_delimiter = ',')]
    pub workload: Vec<String>,
    /// Every workload of a variant counts as one, `all` (clients that do
    /// the same thing).
    #[arg(long)]
    pub pool: bool,
    /// Only variants with this matrix value (`PARAM=VALUE`, the names of
    /// the full labels: `loss:guard-middle=1%`); repeatable.
    #[arg(long = "where", value_name = "PARAM=VALUE")]
    pub filter: Vec<String>,
    /// The relays of the relay metrics (`relay-cpu`, `relay-cpu-s`,
    /// `relay-core`, `relay-rss`), comma-separated name patterns such as
    /// `g1,m1,exit` or `g*`: one row each (default: all relays, one row).
    #[arg(long, value_delimiter = ',')]
    pub relay: Vec<String>,
    /// Matrix parameters left out of the conditions: a variant is set
    /// against the baseline whatever its value of these (which a column
    /// shows). For variants the baseline has no counterpart of: seed
    /// 004's leg schedulers against the one path, which has no scheduler
    /// to vary. Comma-separated.
    #[arg(long, value_delimiter = ',', conflicts_with = "pair")]
    pub ignore: Vec<String>,
    /// Instead of comparisons: each variant's centre of each metric with
    /// its 95% cluster-bootstrap interval over repetitions (a table of
    /// absolute values, as papers give "mean ± 95% CI").
    #[arg(long, conflicts_with_all = ["pair", "baseline", "ignore"])]
    pub summary: bool,
    /// Instead of comparisons: per variant, the least-squares slope of each
    /// repetition's mean of the `--metric` (or its `--per-repetition`
    /// value) over the repetition's value of this metric per repetition,
    /// with a 95% bootstrap interval over repetitions: what each unit of
    /// it costs (`--slope-over lost-packets --metric ttlb`: ms per lost
    /// packet).
    #[arg(long, value_enum, value_name = "METRIC", conflicts_with_all = ["pair", "baseline", "ignore", "summary"])]
    pub slope_over: Option<MetricKind>,
    /// Instead of comparisons between variants: each variant's
    /// repetitions made beside other runs (`lab run --jobs` above 1)
    /// against those it made alone (unpaired: different repetitions), to
    /// check whether running several at once moved the results.
    #[arg(long, conflicts_with_all = ["pair", "baseline", "ignore", "summary", "slope_over", "alone"])]
    pub by_jobs: bool,
    /// Only repetitions made alone (`lab run --jobs 1`), not beside other
    /// runs.
    #[arg(long)]
    pub alone: bool,
    /// Reduce each repetition's values to one first: `min` (with
    /// `--pool --metric goodput`: the slowest client), `max`, `median`,
    /// `mean`, `sum` (the network's throughput), `p95` or `p99`. A repetition
    /// with a failed transfer among those values is left out.
    #[arg(long, value_enum)]
    pub per_repetition: Option<Aggregate>,
    /// Reduce each workload's values in a repetition to one first (each
    /// client's, where every client has a workload of its own): `median`
    /// with `--center median` is seed 001's "median of the clients'
    /// medians". Applied before `--per-repetition`.
    #[arg(long, value_enum, value_name = "AGGREGATE")]
    pub per_workload: Option<Aggregate>,
    /// Only the transfers that ended before the first stream of their
    /// repetition did (the network loaded throughout them: seed 001's
    /// loaded toy, whose background load is streams of a fixed length);
    /// the others are counted in the caption.
    #[arg(long)]
    pub while_loaded: bool,
    /// Only the web clients whose circuit shares this with a bulk
    /// client's circuit in their repetition: `connection` (a pair of
    /// adjacent relays, so a link connection), `relay` (a relay only) or
    /// `apart` (nothing). From the circuits the lab records of onionlab's
    /// clients; C tor's variants have none and drop out.
    #[arg(long, value_enum)]
    pub sharing: Option<crate::sharing::Sharing>,
    /// Only each workload's transfer number N in its repetition, from 0
    /// (a client's first download against its later ones: seed 003's
    /// light clients download twice, the second after the exit moved the
    /// heavy circuits).
    #[arg(long, value_name = "N")]
    pub index: Option<u32>,
    /// What the ratio compares (and a summary shows): medians, means, or
    /// the 75th or 95th percentiles of the pooled values.
    #[arg(long, value_enum, default_value = "median")]
    pub center: CenterArg,
    /// The adjustment for multiple comparisons.
    #[arg(long, value_enum, default_value = "holm")]
    pub correction: Correction,
}
