//! Processes the lab and the test networks start: one supervisor,
//! [`Proc`], that stops its process on every way out (SIGTERM, then
//! SIGKILL after a grace period), and the CPU time and peak memory of a
//! process read from `/proc` (with the procfs crate).

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use procfs::CurrentSI;

/// Makes the process `cmd` starts receive `signal` when the thread that
/// started it ends, even if this process is killed outright and no Drop
/// runs: no orphan goes on using CPU and ports. (Start processes from a
/// long-lived thread, never from a short-lived `spawn_blocking` one.)
pub fn die_with_parent(cmd: &mut Command, signal: Signal) {
    // SAFETY: prctl(2) is async-signal-safe and changes only the child;
    // nothing is allocated after fork.
    unsafe {
        cmd.pre_exec(move || nix::sys::prctl::set_pdeathsig(signal).map_err(std::io::Error::from));
    }
}

/// Limits the open files of the process `cmd` starts to `limit`.
pub fn limit_open_files(cmd: &mut Command, limit: u64) {
    // SAFETY: setrlimit(2) is async-signal-safe and touches only the
    // child's own limits; nothing is allocated after fork.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, limit, limit)
                .map_err(std::io::Error::from)
        });
    }
}

/// How long [`Proc::stop`] waits after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

/// A child process; stopped ([`Proc::stop`]) when dropped.
pub struct Proc {
    /// Its name in logs and errors.
    pub(crate) name: String,
    /// The process.
    pub(crate) child: Child,
}

impl Proc {
    /// Supervises `child`, called `name` in errors.
    pub fn new(name: &str, child: Child) -> Proc {
        Proc {
            name: name.into(),
            child,
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, once it has exited (reaped then).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Stops it: SIGTERM, then SIGKILL after [`STOP_GRACE`].
    pub fn stop(&mut self) {
        self.stop_within(STOP_GRACE);
    }

    /// Stops it: SIGTERM, then SIGKILL after `grace`; reaps it.
    pub fn stop_within(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        // It may exit on its own meanwhile: then there is nothing to signal.
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
    }

    /// SIGKILL at once, as a crash would end it, and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// User plus system CPU seconds of process `pid`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = procfs::process::Process::new(pid as i32)
        .ok()?
        .stat()
        .ok()?;
    let ticks = (stat.utime + stat.stime) as f64;
    Some(ticks / procfs::ticks_per_second().max(1) as f64)
}

/// Peak resident memory (VmHWM) of process `pid` in bytes.
pub fn peak_rss(pid: u32) -> Option<u64> {
    let status = procfs::process::Process::new(pid as i32)
        .ok()?
        .status()
        .ok()?;
    Some(status.vmhwm? * 1024)
}

/// Memory in use on the machine (MemTotal less MemAvailable), in bytes.
pub fn machine_memory_in_use() -> Option<u64> {
    use procfs::Current;
    let m = procfs::Meminfo::current().ok()?;
    Some(m.mem_total.saturating_sub(m.mem_available?))
}

/// (busy, total) time of all CPUs since boot, in ticks.
pub(crate) fn cpu_jiffies() -> Option<(u64, u64)> {
    let cpu = procfs::KernelStats::current().ok()?.total;
    let idle = cpu.idle + cpu.iowait.unwrap_or(0);
    let total = cpu.user
        + cpu.nice
        + cpu.system
        + cpu.idle
        + cpu.iowait.unwrap_or(0)
        + cpu.irq.unwrap_or(0)
        + cpu.softirq.unwrap_or(0)
        + cpu.steal.unwrap_or(0)
        + cpu.guest.unwrap_or(0)
        + cpu.guest_nice.unwrap_or(0);
    Some((total - idle, total))
}
