//! The system calls the emulator needs, through maintained crates: nix
//! (namespaces, epoll, timerfd, eventfd, clocks, mounts), tun-rs (the TUN
//! device) and rtnetlink (links, addresses, routes). The one call none of
//! them offers, `sched_setscheduler`, goes through libc.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsFd;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use nix::time::ClockId;
use rtnetlink::packet_route::route::RouteScope;
use rtnetlink::{LinkUnspec, RouteMessageBuilder};

use crate::error::{Error, Result};

fn sys_err(op: impl Into<String>, e: Errno) -> Error {
    Error::io(op, io::Error::from(e))
}

/// Creates the TUN interface `name` in the calling thread's namespace
/// (non-blocking, no packet information header) and configures that
/// namespace as a host: `lo` up; `addr`/32, `mtu` and the default route on
/// the TUN; a transmit queue of 1000 packets where permitted.
pub(crate) fn set_up_host_links(
    name: &str,
    addr: Ipv4Addr,
    mtu: u32,
) -> Result<tun_rs::SyncDevice> {
    let tun = tun_rs::DeviceBuilder::new()
        .name(name)
        .packet_information(false)
        .build_sync()
        .map_err(|e| Error::io(format!("create TUN {name}"), e))?;
    tun.set_nonblocking(true)
        .map_err(|e| Error::io(format!("make TUN {name} non-blocking"), e))?;
    let index = tun
        .if_index()
        .map_err(|e| Error::io(format!("index of {name}"), e))?;
    netlink(|handle| async move {
        let link = handle.link();
        let step = |op: &str| format!("{op} (netlink)");
        link.set(LinkUnspec::new_with_name("lo").up().build())
            .execute()
            .await
            .map_err(|e| (step("bring lo up"), e))?;
        handle
            .address()
            .add(index, IpAddr::V4(addr), 32)
            .execute()
            .await
            .map_err(|e| (step(&format!("add {addr}/32 to {name}")), e))?;
        link.set(LinkUnspec::new_with_index(index).mtu(mtu).up().build())
            .execute()
            .await
            .map_err(|e| (step(&format!("set {name} up with MTU {mtu}")), e))?;
        // A default route out of the TUN without gateway, like
        // `ip route add default dev NAME` (scope link).
        let route = RouteMessageBuilder::<Ipv4Addr>::new()
            .output_interface(index)
            .scope(RouteScope::Link)
            .build();
        handle
            .route()
            .add(route)
            .execute()
            .await
            .map_err(|e| (step(&format!("add default route via {name}")), e))?;
        // Best effort: in rootless mode the kernel refuses a transmit queue
        // length change, and the default (500) is kept.
        let txq = LinkUnspec::new_with_index(index).txqueuelen(1000).build();
        if let Err(e) = link.set(txq).execute().await {
            tracing::debug!(error = %e, "cannot set txqueuelen of {name}");
        }
        Ok::<(), (String, rtnetlink::Error)>(())
    })?;
    Ok(tun)
}

/// Runs `f` with a route-netlink handle bound to the calling thread's
/// network namespace, on a runtime private to this call.
fn netlink<F, Fut>(f: F) -> Result<()>
where
    F: FnOnce(rtnetlink::Handle) -> Fut,
    Fut: Future<Output = std::result::Result<(), (String, rtnetlink::Error)>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| Error::io("start a runtime for netlink", e))?;
    runtime.block_on(async {
        // The socket is created here, so it belongs to this thread's namespace.
        let (connection, handle, _) =
            rtnetlink::new_connection().map_err(|e| Error::io("open a netlink socket", e))?;
        tokio::spawn(connection);
        f(handle)
            .await
            .map_err(|(op, source)| Error::Netlink { op, source })
    })
}

/// Moves the calling thread into a new network namespace.
pub(crate) fn unshare_net() -> Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| sys_err("unshare(CLONE_NEWNET)", e))
}

/// Moves the calling thread into the network namespace `ns` (an open
/// `/proc/.../ns/net` or `/run/netns/...` file).
pub(crate) fn enter_net(ns: impl AsFd) -> io::Result<()> {
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
}

/// Inode number of an open file (identifies a namespace).
pub(crate) fn inode(fd: impl AsFd) -> Result<u64> {
    nix::sys::stat::fstat(fd)
        .map(|st| st.st_ino)
        .map_err(|e| sys_err("fstat", e))
}

/// CLOCK_MONOTONIC in nanoseconds.
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(ClockId::CLOCK_MONOTONIC)
}

/// CPU time consumed by the calling thread, in nanoseconds.
pub(crate) fn thread_cpu_ns() -> u64 {
    clock_ns(ClockId::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_ns(clock: ClockId) -> u64 {
    // Both clocks exist on every Linux this runs on; clock_gettime can only
    // fail for an invalid clock or buffer.
    let ts = clock.now().unwrap_or_else(|_| TimeSpec::new(0, 0));
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// An epoll instance watching file descriptors for input, each under a token.
pub(crate) struct Poller(Epoll);

impl Poller {
    pub(crate) fn new() -> Result<Poller> {
        Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map(Poller)
            .map_err(|e| sys_err("epoll_create1", e))
    }

    pub(crate) fn add(&self, fd: impl AsFd, token: u64) -> Result<()> {
        self.0
            .add(fd, EpollEvent::new(EpollFlags::EPOLLIN, token))
            .map_err(|e| sys_err("epoll_ctl", e))
    }

    /// Waits for events (without blocking if `block` is false) and returns
    /// how many were stored in `events`; an interrupted wait returns 0.
    pub(crate) fn wait(&self, events: &mut [EpollEvent], block: bool) -> Result<usize> {
        let timeout = if block {
            EpollTimeout::NONE
        } else {
            EpollTimeout::ZERO
        };
        match self.0.wait(events, timeout) {
            Ok(n) => Ok(n),
            Err(Errno::EINTR) => Ok(0),
            Err(e) => Err(sys_err("epoll_wait", e)),
        }
    }
}

/// A CLOCK_MONOTONIC timerfd armed with absolute deadlines.
pub(crate) struct Timer(pub(crate) TimerFd);

impl Timer {
    pub(crate) fn new() -> Result<Timer> {
        TimerFd::new(
            nix::sys::timerfd::ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )
        .map(Timer)
        .map_err(|e| sys_err("timerfd_create", e))
    }

    /// Arms at absolute monotonic time `at_ns`, or disarms with `None`.
    pub(crate) fn set(&self, at_ns: Option<u64>) -> Result<()> {
        let result = match at_ns {
            // An all-zero expiry would disarm the timer: the earliest is 1 ns.
            Some(t) => self.0.set(
                Expiration::OneShot(TimeSpec::from_duration(Duration::from_nanos(t.max(1)))),
                TimerSetTimeFlags::TFD_TIMER_ABSTIME,
            ),
            None => self.0.unset(),
        };
        result.map_err(|e| sys_err("timerfd_settime", e))
    }

    /// Consumes an expiry (nothing to consume is not an error).
    pub(crate) fn clear(&self) {
        let _ = self.0.wait();
    }
}

/// An eventfd used to wake the forwarder.
pub(crate) struct Waker(pub(crate) EventFd);

impl Waker {
    pub(crate) fn new() -> Result<Waker> {
        EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map(Waker)
            .map_err(|e| sys_err("eventfd", e))
    }

    pub(crate) fn wake(&self) {
        // Only fails when the counter would overflow, and then it is set.
        let _ = self.0.write(1);
    }

    pub(crate) fn clear(&self) {
        let _ = self.0.read();
    }
}

/// Makes the calling thread SCHED_FIFO with the given priority.
pub(crate) fn set_realtime(prio: i32) -> Result<()> {
    let p = libc::sched_param {
        sched_priority: prio,
    };
    // nix has no sched_setscheduler.
    // SAFETY: p is a valid sched_param; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } < 0 {
        return Err(Error::last_os("sched_setscheduler"));
    }
    Ok(())
}

/// Sets the calling thread's timer slack to 1 ns.
pub(crate) fn min_timer_slack() {
    if let Err(e) = nix::sys::prctl::set_timerslack(1) {
        tracing::debug!(error = %e, "cannot set the timer slack");
    }
}

/// Bind-mounts `src` onto `dst`.
pub(crate) fn bind_mount(src: &str, dst: &str) -> Result<()> {
    nix::mount::mount(
        Some(src),
        dst,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| sys_err(format!("bind mount {src} on {dst}"), e))
}

/// Lazily unmounts `path` (errors ignored: it may not be mounted).
pub(crate) fn umount_detach(path: &str) {
    let _ = nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH);
}
