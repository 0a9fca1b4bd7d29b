//! The runner's progress line on standard error: a bar, runs done, time
//! elapsed, the estimated time left and what runs now.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The progress of one `lab run`.
pub(super) struct Progress {
    /// Whether to show it at all.
    show: bool,
    /// When the runs started.
    started: Instant,
    /// Runs to do in this invocation.
    left: usize,
    /// Runs finished so far (recorded or not).
    finished: AtomicUsize,
    /// Width of the widest short variant label.
    width: usize,
}

impl Progress {
    /// The progress of `left` runs, shown if `show`; `width` is the widest
    /// short variant label's.
    pub(super) fn new(show: bool, left: usize, width: usize) -> Progress {
        Progress {
            show,
            started: Instant::now(),
            left,
            finished: AtomicUsize::new(0),
            width,
        }
    }

    /// Width of the widest short variant label.
    pub(super) fn width(&self) -> usize {
        self.width
    }

    /// Shows the run under way (`label`) and what it does before its
    /// workload (`what`, such as C tor's bootstrap; empty: nothing).
    pub(super) fn show_run(&self, label: &str, what: &str) {
        if !self.show {
            return;
        }
        let now = if what.is_empty() {
            label.to_string()
        } else {
            format!("{label} ({what})")
        };
        line(
            self.finished.load(Ordering::Relaxed),
            self.left,
            self.started,
            &now,
        );
    }

    /// Counts a finished run.
    pub(super) fn finished_one(&self) {
        self.finished.fetch_add(1, Ordering::Relaxed);
    }

    /// The last line: `done` runs recorded.
    pub(super) fn done(&self, done: usize) {
        if self.show {
            let now = format!("{:<w$}", "done", w = self.width + 9);
            line(done, self.left, self.started, &now);
            eprintln!();
        }
    }
}

/// Minutes and seconds, e.g. `12m05s`.
fn min_sec(secs: f64) -> String {
    format!("{}m{:02}s", (secs / 60.0) as u64, (secs % 60.0) as u64)
}

/// One progress line (redrawn in place): a bar, runs done, time elapsed,
/// the estimated time left (from the mean time per run so far) and what
/// runs now.
fn line(done: usize, total: usize, started: Instant, now: &str) {
    let frac = done as f64 / total.max(1) as f64;
    let width = 30;
    let filled = ((frac * width as f64) as usize).min(width);
    let elapsed = started.elapsed().as_secs_f64();
    let eta = if done == 0 {
        "?".to_string()
    } else {
        min_sec(elapsed / done as f64 * total.saturating_sub(done) as f64)
    };
    // On a terminal, clear what a longer earlier line left behind.
    let clear = if std::io::stderr().is_terminal() {
        "\x1b[K"
    } else {
        ""
    };
    eprint!(
        "\r[{}{}] {done}/{total} {} elapsed, ETA {eta}  {now}{clear}",
        "#".repeat(filled),
        " ".repeat(width - filled),
        min_sec(elapsed),
    );
}
