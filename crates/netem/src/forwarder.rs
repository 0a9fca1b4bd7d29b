//! The forwarder thread: reads packets from every host's TUN, runs them
//! through the link model and writes them to the destination TUN when due.
//!
//! Timing: the thread sleeps in `epoll_wait` on the TUN fds, an eventfd for
//! control messages and a CLOCK_MONOTONIC timerfd armed at the model's next
//! deadline with an absolute, nanosecond expiry (hrtimer-backed, timer slack
//! 1 ns). Optionally it spins for the last few microseconds and/or runs with
//! SCHED_FIFO priority.

use std::collections::HashMap;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::epoll::EpollEvent;

use crate::counters::{Counters, ForwarderCounters, Histogram};
use crate::error::{Error, Result};
use crate::model::{LinkModel, Output};
use crate::sys;
use crate::topology::{HostId, HostUpdate, PathUpdate, Topology};

/// Tuning of the forwarder thread.
#[derive(Debug, Clone, Copy)]
pub struct ForwarderOptions {
    /// Busy-wait (instead of sleeping) when the next release is closer than
    /// this: the timer is armed this much early (default 50 us).
    pub spin: Duration,
    /// Run the thread with SCHED_FIFO priority 10 (needs CAP_SYS_NICE; best
    /// effort, default on).
    pub realtime: bool,
    /// Maximum number of packets read from one TUN before serving others.
    pub batch: usize,
}

impl Default for ForwarderOptions {
    fn default() -> Self {
        ForwarderOptions {
            spin: Duration::from_micros(50),
            realtime: true,
            batch: 32,
        }
    }
}

pub(crate) enum Command {
    UpdatePath(HostId, HostId, PathUpdate),
    UpdateHost(HostId, HostUpdate),
    Counters(mpsc::Sender<Counters>),
    Stop,
}

/// Handle to a running forwarder thread.
pub(crate) struct Forwarder {
    tx: mpsc::Sender<Command>,
    wake: std::sync::Arc<sys::Waker>,
    thread: Option<JoinHandle<Result<Counters>>>,
}

impl Forwarder {
    /// Starts the thread; it takes ownership of the TUN fds (index = host id).
    pub(crate) fn spawn(
        topology: &Topology,
        tuns: Vec<tun_rs::SyncDevice>,
        opts: ForwarderOptions,
    ) -> Result<Forwarder> {
        let (tx, rx) = mpsc::channel();
        let wake = std::sync::Arc::new(sys::Waker::new()?);
        let mut state = State::new(topology, tuns, wake.clone(), rx, opts)?;
        let thread = std::thread::Builder::new()
            .name("netem-forwarder".into())
            .spawn(move || state.run())
            .map_err(|e| Error::io("spawn forwarder thread", e))?;
        Ok(Forwarder {
            tx,
            wake,
            thread: Some(thread),
        })
    }

    pub(crate) fn send(&self, cmd: Command) -> Result<()> {
        self.tx.send(cmd).map_err(|_| Error::ForwarderGone)?;
        self.wake.wake();
        Ok(())
    }

    /// True while the thread runs.
    pub(crate) fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    pub(crate) fn counters(&self) -> Result<Counters> {
        let (tx, rx) = mpsc::channel();
        self.send(Command::Counters(tx))?;
        rx.recv_timeout(Duration::from_secs(5))
            .map_err(|_| Error::ForwarderGone)
    }

    /// Stops the thread and returns the final counters.
    pub(crate) fn stop(&mut self) -> Result<Counters> {
        let _ = self.send(Command::Stop);
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| Error::ForwarderGone)?,
            None => Err(Error::ForwarderGone),
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.stop();
        }
    }
}

struct Packet {
    buf: Vec<u8>,
    len: usize,
}

struct State {
    lab: String,
    model: LinkModel<Packet>,
    tuns: Vec<tun_rs::SyncDevice>,
    addrs: HashMap<u32, HostId>,
    wake: std::sync::Arc<sys::Waker>,
    rx: mpsc::Receiver<Command>,
    opts: ForwarderOptions,
    timer: sys::Timer,
    poller: sys::Poller,
    pool: Vec<Vec<u8>>,
    buf_size: usize,
    release_error: Histogram,
    write_time: Histogram,
    fc: ForwarderCounters,
    start: u64,
}

impl State {
    fn new(
        topology: &Topology,
        tuns: Vec<tun_rs::SyncDevice>,
        wake: std::sync::Arc<sys::Waker>,
        rx: mpsc::Receiver<Command>,
        opts: ForwarderOptions,
    ) -> Result<State> {
        let poller = sys::Poller::new()?;
        let timer = sys::Timer::new()?;
        let n = tuns.len() as u64;
        for (i, t) in tuns.iter().enumerate() {
            poller.add(t, i as u64)?;
        }
        poller.add(&timer.0, n)?;
        poller.add(&wake.0, n + 1)?;
        Ok(State {
            lab: topology.name.clone(),
            model: LinkModel::new(topology),
            addrs: topology
                .hosts
                .iter()
                .enumerate()
                .map(|(i, h)| (u32::from(h.address), i))
                .collect(),
            tuns,
            wake,
            rx,
            opts,
            timer,
            poller,
            pool: Vec::new(),
            buf_size: (topology.mtu as usize + 64).max(2048),
            release_error: Histogram::default(),
            write_time: Histogram::default(),
            fc: ForwarderCounters::default(),
            start: sys::monotonic_ns(),
        })
    }

    fn run(&mut self) -> Result<Counters> {
        sys::min_timer_slack();
        if self.opts.realtime {
            if let Err(e) = sys::set_realtime(10) {
                tracing::debug!(error = %e, "cannot use SCHED_FIFO for the forwarder");
            }
        }
        let n = self.tuns.len() as u64;
        let mut events = vec![EpollEvent::empty(); 64];
        let mut armed: Option<u64> = None;
        let spin = self.opts.spin.as_nanos() as u64;
        loop {
            self.release();
            let next = self.model.next_deadline();
            let due = next.is_some_and(|d| d <= sys::monotonic_ns() + spin);
            let want = if due {
                None
            } else {
                next.map(|d| d.saturating_sub(spin))
            };
            if want != armed {
                self.timer.set(want)?;
                armed = want;
            }
            let k = self.poller.wait(&mut events, !due)?;
            for ev in events.iter().take(k) {
                let tok = ev.data();
                if tok < n {
                    self.read_tun(tok as usize);
                } else if tok == n {
                    self.timer.clear();
                    armed = None;
                } else {
                    self.wake.clear();
                    if self.handle_commands() {
                        return Ok(self.finish());
                    }
                }
            }
        }
    }

    fn handle_commands(&mut self) -> bool {
        while let Ok(cmd) = self.rx.try_recv() {
            match cmd {
                Command::UpdatePath(s, d, u) => {
                    self.model.update_path(s, d, &u);
                }
                Command::UpdateHost(h, u) => {
                    self.model.update_host(h, &u);
                }
                Command::Counters(tx) => {
                    let _ = tx.send(self.snapshot());
                }
                Command::Stop => return true,
            }
        }
        false
    }

    fn read_tun(&mut self, src: HostId) {
        if src >= self.tuns.len() {
            return;
        }
        for _ in 0..self.opts.batch {
            let mut buf = self.pool.pop().unwrap_or_else(|| vec![0u8; self.buf_size]);
            let len = match self.tuns[src].recv(&mut buf) {
                Ok(len) => len,
                Err(_) => {
                    self.pool.push(buf);
                    return;
                }
            };
            let now = sys::monotonic_ns();
            self.fc.read_packets += 1;
            if len < 20 || buf[0] >> 4 != 4 {
                self.model.count_not_ipv4(src);
                self.pool.push(buf);
                continue;
            }
            let dst_addr = u32::from_be_bytes([buf[16], buf[17], buf[18], buf[19]]);
            let Some(&dst) = self.addrs.get(&dst_addr) else {
                self.model.count_no_route(src, len);
                self.pool.push(buf);
                continue;
            };
            let protocol = buf[9];
            if let Err((p, _)) =
                self.model
                    .submit_ip(now, src, dst, len, protocol, Packet { buf, len })
            {
                self.pool.push(p.buf);
            }
            // Keep release timing while reading long bursts.
            self.release();
        }
    }

    fn release(&mut self) {
        let now = sys::monotonic_ns();
        while let Some(out) = self.model.poll(now) {
            match out {
                Output::Deliver { token, dst, at, .. } => {
                    let started = sys::monotonic_ns();
                    self.release_error.record(started.saturating_sub(at));
                    let ok = match self.tuns.get(dst) {
                        Some(tun) => tun.send(&token.buf[..token.len]).is_ok(),
                        None => false,
                    };
                    self.write_time
                        .record(sys::monotonic_ns().saturating_sub(started));
                    if ok {
                        self.fc.written_packets += 1;
                    } else {
                        self.fc.write_errors += 1;
                    }
                    self.pool.push(token.buf);
                }
                Output::Drop { token, .. } => self.pool.push(token.buf),
            }
        }
    }

    fn snapshot(&self) -> Counters {
        let (paths, hosts) = self.model.counters();
        let mut fc = self.fc.clone();
        fc.elapsed_s = (sys::monotonic_ns() - self.start) as f64 / 1e9;
        fc.cpu_s = sys::thread_cpu_ns() as f64 / 1e9;
        fc.release_error = self.release_error.summary();
        fc.write_time = self.write_time.summary();
        Counters {
            lab: self.lab.clone(),
            paths,
            hosts,
            forwarder: fc,
        }
    }

    fn finish(&mut self) -> Counters {
        let c = self.snapshot();
        self.model.drain();
        c
    }
}
