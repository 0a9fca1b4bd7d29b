//! Thin wrappers over the Linux system calls the emulator needs.
//! Every `unsafe` block is a plain FFI call on memory owned by the caller.

use std::ffi::CString;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::error::{Error, Result};

const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
const SIOCSIFFLAGS: libc::c_ulong = 0x8914;
const SIOCSIFADDR: libc::c_ulong = 0x8916;
const SIOCSIFNETMASK: libc::c_ulong = 0x891c;
const SIOCSIFMTU: libc::c_ulong = 0x8922;
const SIOCSIFTXQLEN: libc::c_ulong = 0x8943;
const SIOCADDRT: libc::c_ulong = 0x890B;
const TUNSETIFF: libc::c_ulong = 0x400454ca;
const IFF_UP: libc::c_short = 0x1;
const RTF_UP: libc::c_ushort = 0x1;

#[repr(C)]
#[derive(Clone, Copy)]
union IfrData {
    addr: libc::sockaddr,
    flags: libc::c_short,
    value: libc::c_int,
    pad: [u8; 24],
}

#[repr(C)]
struct IfReq {
    name: [libc::c_char; 16],
    data: IfrData,
}

#[repr(C)]
struct RtEntry {
    rt_pad1: libc::c_ulong,
    rt_dst: libc::sockaddr,
    rt_gateway: libc::sockaddr,
    rt_genmask: libc::sockaddr,
    rt_flags: libc::c_ushort,
    rt_pad2: libc::c_short,
    rt_pad3: libc::c_ulong,
    rt_pad4: *mut libc::c_void,
    rt_metric: libc::c_short,
    rt_dev: *mut libc::c_char,
    rt_mtu: libc::c_ulong,
    rt_window: libc::c_ulong,
    rt_irtt: libc::c_ushort,
}

fn ifreq(name: &str) -> Result<IfReq> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() > 15 {
        return Err(Error::Unsupported(format!("bad interface name {name:?}")));
    }
    let mut r = IfReq {
        name: [0; 16],
        data: IfrData { pad: [0; 24] },
    };
    for (d, s) in r.name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(r)
}

fn sockaddr_in(a: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(a).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes) on Linux.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn check(ret: libc::c_int, op: impl FnOnce() -> String) -> Result<libc::c_int> {
    if ret < 0 {
        Err(Error::last_os(op()))
    } else {
        Ok(ret)
    }
}

/// Moves the calling thread into a new network namespace.
pub(crate) fn unshare_net() -> Result<()> {
    // SAFETY: plain syscall.
    check(unsafe { libc::unshare(libc::CLONE_NEWNET) }, || {
        "unshare(CLONE_NEWNET)".into()
    })
    .map(|_| ())
}

/// Joins the namespace behind `fd` (`nstype` = CLONE_NEWNET, CLONE_NEWUSER or 0).
pub(crate) fn setns(fd: RawFd, nstype: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscall.
    if unsafe { libc::setns(fd, nstype) } < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Opens a file read-only with O_CLOEXEC.
pub(crate) fn open_ro(path: &str) -> Result<OwnedFd> {
    let c = CString::new(path).map_err(|_| Error::Unsupported(format!("bad path {path:?}")))?;
    // SAFETY: valid C string.
    let fd = check(
        unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) },
        || format!("open {path}"),
    )?;
    // SAFETY: fd was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Inode number of an open file (identifies a namespace).
pub(crate) fn inode(fd: RawFd) -> Result<u64> {
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into st.
    check(unsafe { libc::fstat(fd, &mut st) }, || "fstat".into())?;
    Ok(st.st_ino)
}

/// Creates a TUN interface `name` (no packet information header, non-blocking).
pub(crate) fn tun_open(name: &str) -> Result<OwnedFd> {
    let path = c"/dev/net/tun";
    // SAFETY: valid C string.
    let fd = check(
        unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        },
        || "open /dev/net/tun".into(),
    )?;
    // SAFETY: fd was just returned by open.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut r = ifreq(name)?;
    r.data.flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: r is a valid ifreq.
    check(
        unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &mut r) },
        || format!("TUNSETIFF {name}"),
    )?;
    Ok(fd)
}

fn inet_socket() -> Result<OwnedFd> {
    // SAFETY: plain syscall.
    let s = check(
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) },
        || "socket".into(),
    )?;
    // SAFETY: s was just returned by socket.
    Ok(unsafe { OwnedFd::from_raw_fd(s) })
}

/// Brings an interface up (in the calling thread's namespace).
pub(crate) fn if_up(name: &str) -> Result<()> {
    let s = inet_socket()?;
    let mut r = ifreq(name)?;
    // SAFETY: valid ifreq.
    check(
        unsafe { libc::ioctl(s.as_raw_fd(), SIOCGIFFLAGS, &mut r) },
        || format!("SIOCGIFFLAGS {name}"),
    )?;
    // SAFETY: the kernel filled in the flags member.
    unsafe { r.data.flags |= IFF_UP };
    // SAFETY: valid ifreq.
    check(
        unsafe { libc::ioctl(s.as_raw_fd(), SIOCSIFFLAGS, &mut r) },
        || format!("SIOCSIFFLAGS {name}"),
    )?;
    Ok(())
}

/// Sets address, netmask, MTU and transmit queue length of an interface.
pub(crate) fn if_configure(
    name: &str,
    addr: Ipv4Addr,
    prefix: u8,
    mtu: u32,
    txqlen: u32,
) -> Result<()> {
    let s = inet_socket()?;
    let fd = s.as_raw_fd();
    let mut r = ifreq(name)?;
    r.data.addr = sockaddr_in(addr);
    // SAFETY: valid ifreq.
    check(unsafe { libc::ioctl(fd, SIOCSIFADDR, &mut r) }, || {
        format!("SIOCSIFADDR {name}")
    })?;
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix))
    };
    r.data.addr = sockaddr_in(Ipv4Addr::from(mask));
    // SAFETY: valid ifreq.
    check(unsafe { libc::ioctl(fd, SIOCSIFNETMASK, &mut r) }, || {
        format!("SIOCSIFNETMASK {name}")
    })?;
    r.data.value = mtu as libc::c_int;
    // SAFETY: valid ifreq.
    check(unsafe { libc::ioctl(fd, SIOCSIFMTU, &mut r) }, || {
        format!("SIOCSIFMTU {name}")
    })?;
    r.data.value = txqlen as libc::c_int;
    // Best effort: needs CAP_NET_ADMIN in the initial user namespace, so it
    // fails in rootless mode (the default length, 500, is kept then).
    // SAFETY: valid ifreq.
    if unsafe { libc::ioctl(fd, SIOCSIFTXQLEN, &mut r) } < 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "cannot set txqueuelen of {name}");
    }
    Ok(())
}

/// Adds a default route through interface `dev`.
pub(crate) fn add_default_route(dev: &str) -> Result<()> {
    let s = inet_socket()?;
    let dev_c = CString::new(dev).map_err(|_| Error::Unsupported("bad device name".into()))?;
    let mut dev_buf = dev_c.into_bytes_with_nul();
    let mut rt = RtEntry {
        rt_pad1: 0,
        rt_dst: sockaddr_in(Ipv4Addr::UNSPECIFIED),
        rt_gateway: sockaddr_in(Ipv4Addr::UNSPECIFIED),
        rt_genmask: sockaddr_in(Ipv4Addr::UNSPECIFIED),
        rt_flags: RTF_UP,
        rt_pad2: 0,
        rt_pad3: 0,
        rt_pad4: std::ptr::null_mut(),
        rt_metric: 0,
        rt_dev: dev_buf.as_mut_ptr() as *mut libc::c_char,
        rt_mtu: 0,
        rt_window: 0,
        rt_irtt: 0,
    };
    // SAFETY: rt and dev_buf live across the call.
    check(
        unsafe { libc::ioctl(s.as_raw_fd(), SIOCADDRT, &mut rt) },
        || format!("SIOCADDRT default dev {dev}"),
    )?;
    Ok(())
}

/// CLOCK_MONOTONIC in nanoseconds.
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time consumed by the calling thread, in nanoseconds.
pub(crate) fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-parameter.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// An epoll instance.
pub(crate) struct Epoll(OwnedFd);

impl Epoll {
    pub(crate) fn new() -> Result<Epoll> {
        // SAFETY: plain syscall.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) }, || {
            "epoll_create1".into()
        })?;
        // SAFETY: fd was just returned.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub(crate) fn add(&self, fd: RawFd, token: u64) -> Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: ev is valid.
        check(
            unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) },
            || "epoll_ctl".into(),
        )?;
        Ok(())
    }

    /// Waits; `timeout_ms` -1 blocks. Returns the number of events.
    pub(crate) fn wait(&self, events: &mut [libc::epoll_event], timeout_ms: i32) -> Result<usize> {
        // SAFETY: events is a valid buffer of the given length.
        let n = unsafe {
            libc::epoll_wait(
                self.0.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                timeout_ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(Error::io("epoll_wait", e));
        }
        Ok(n as usize)
    }
}

/// A CLOCK_MONOTONIC timerfd armed with absolute deadlines.
pub(crate) struct TimerFd(pub(crate) OwnedFd);

impl TimerFd {
    pub(crate) fn new() -> Result<TimerFd> {
        // SAFETY: plain syscall.
        let fd = check(
            unsafe {
                libc::timerfd_create(
                    libc::CLOCK_MONOTONIC,
                    libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
                )
            },
            || "timerfd_create".into(),
        )?;
        // SAFETY: fd was just returned.
        Ok(TimerFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Arms at absolute monotonic time `at_ns`, or disarms with `None`.
    pub(crate) fn set(&self, at_ns: Option<u64>) -> Result<()> {
        let v = at_ns.map_or(
            libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            |t| {
                let t = t.max(1);
                libc::timespec {
                    tv_sec: (t / 1_000_000_000) as libc::time_t,
                    tv_nsec: (t % 1_000_000_000) as libc::c_long,
                }
            },
        );
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: v,
        };
        // SAFETY: spec is valid; old value not requested.
        check(
            unsafe {
                libc::timerfd_settime(
                    self.0.as_raw_fd(),
                    libc::TFD_TIMER_ABSTIME,
                    &spec,
                    std::ptr::null_mut(),
                )
            },
            || "timerfd_settime".into(),
        )?;
        Ok(())
    }

    pub(crate) fn clear(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: buf is valid; errors (EAGAIN) are irrelevant.
        unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, 8) };
    }
}

/// An eventfd used to wake the forwarder.
pub(crate) struct EventFd(pub(crate) OwnedFd);

impl EventFd {
    pub(crate) fn new() -> Result<EventFd> {
        // SAFETY: plain syscall.
        let fd = check(
            unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) },
            || "eventfd".into(),
        )?;
        // SAFETY: fd was just returned.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub(crate) fn wake(&self) {
        let v: u64 = 1;
        // SAFETY: writes 8 bytes from v.
        unsafe {
            libc::write(
                self.0.as_raw_fd(),
                &v as *const u64 as *const libc::c_void,
                8,
            )
        };
    }

    pub(crate) fn clear(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: buf is valid.
        unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, 8) };
    }
}

/// read(2) into `buf`.
pub(crate) fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for buf.len() bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// write(2) of `buf`.
pub(crate) fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for buf.len() bytes.
    let n = unsafe { libc::write(fd, buf.as_ptr() as *const libc::c_void, buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Makes the calling thread SCHED_FIFO with the given priority.
pub(crate) fn set_realtime(prio: i32) -> Result<()> {
    let p = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: p is valid; 0 = calling thread.
    check(
        unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) },
        || "sched_setscheduler".into(),
    )?;
    Ok(())
}

/// Sets the calling thread's timer slack to 1 ns.
pub(crate) fn min_timer_slack() {
    // SAFETY: plain prctl.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// Bind-mounts `src` onto `dst`.
pub(crate) fn bind_mount(src: &str, dst: &str) -> Result<()> {
    let s = CString::new(src).map_err(|_| Error::Unsupported("bad path".into()))?;
    let d = CString::new(dst).map_err(|_| Error::Unsupported("bad path".into()))?;
    // SAFETY: valid C strings.
    check(
        unsafe {
            libc::mount(
                s.as_ptr(),
                d.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        },
        || format!("bind mount {src} on {dst}"),
    )?;
    Ok(())
}

/// Lazily unmounts `path` (errors ignored: it may not be mounted).
pub(crate) fn umount_detach(path: &str) {
    if let Ok(p) = CString::new(path) {
        // SAFETY: valid C string.
        unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Effective user id.
pub(crate) fn euid() -> u32 {
    // SAFETY: plain syscall.
    unsafe { libc::geteuid() }
}

/// Real user and group id.
pub(crate) fn uid_gid() -> (u32, u32) {
    // SAFETY: plain syscalls.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// Moves the (single-threaded) process into a new user namespace where it is root.
pub(crate) fn unshare_user() -> Result<()> {
    // SAFETY: plain syscall.
    check(unsafe { libc::unshare(libc::CLONE_NEWUSER) }, || {
        "unshare(CLONE_NEWUSER)".into()
    })
    .map(|_| ())
}

/// Sends a signal to a process.
pub(crate) fn kill(pid: i32, sig: libc::c_int) -> bool {
    // SAFETY: plain syscall.
    unsafe { libc::kill(pid, sig) == 0 }
}
