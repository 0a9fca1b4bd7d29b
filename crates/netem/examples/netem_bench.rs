//! Forwarder benchmark: packets per second and release-time error.
//!
//! Two hosts `a -> b` with 1 ms latency and no rate limit. A sender thread in
//! `a` offers UDP packets of the given IP size (sendmmsg, paced or as fast as
//! possible), a receiver thread in `b` counts them (recvmmsg). Reports, per
//! run and as medians over runs: offered and delivered packets/s, packets the
//! host dropped before the forwarder (TUN queue full) and the p50/p99 release
//! error of the forwarder.
//!
//! Needs root. Run with
//! `cargo run --release -p onionlab-netem --example netem_bench -- --size 1500 --rate max --secs 3 --runs 5`
//! (`--rate` is packets/s or `max`; `--spin-us N` and `--realtime false`
//! change the forwarder's timing options).

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_netem::{Network, NetworkOptions, Topology};

struct Args {
    size: usize,
    rate: Option<u64>,
    secs: f64,
    runs: usize,
    spin_us: u64,
    realtime: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        size: 1500,
        rate: None,
        secs: 3.0,
        runs: 5,
        spin_us: 50,
        realtime: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().ok_or(format!("{k} needs a value"))?;
        match k.as_str() {
            "--size" => a.size = v.parse().map_err(|_| "bad --size")?,
            "--rate" => {
                a.rate = if v == "max" {
                    None
                } else {
                    Some(v.parse().map_err(|_| "bad --rate")?)
                }
            }
            "--secs" => a.secs = v.parse().map_err(|_| "bad --secs")?,
            "--runs" => a.runs = v.parse().map_err(|_| "bad --runs")?,
            "--spin-us" => a.spin_us = v.parse().map_err(|_| "bad --spin-us")?,
            "--realtime" => a.realtime = v.parse().map_err(|_| "bad --realtime (true/false)")?,
            _ => return Err(format!("unknown option {k}")),
        }
    }
    if !(28..=1500).contains(&a.size) {
        return Err("--size must be 28..=1500 (IP packet bytes)".into());
    }
    Ok(a)
}

struct RunResult {
    offered_pps: f64,
    delivered_pps: f64,
    host_drops: u64,
    p50_us: f64,
    p99_us: f64,
}

fn set_buf(fd: i32, opt: i32, bytes: i32) {
    // SAFETY: plain setsockopt with a valid int.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            &bytes as *const i32 as *const libc::c_void,
            4,
        );
    }
}

fn one_run(args: &Args, run: usize) -> Result<RunResult, Box<dyn std::error::Error>> {
    let topo = Topology::from_toml_str(
        &format!("name = \"bench{run}\"\n[defaults]\nlatency = \"1ms\"\n[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n"),
        "bench",
    )?;
    let opts = NetworkOptions {
        forwarder: onionlab_netem::ForwarderOptions {
            spin: Duration::from_micros(args.spin_us),
            realtime: args.realtime,
            ..Default::default()
        },
        ..Default::default()
    };
    let net = Network::up(topo, opts)?;
    let b = SocketAddr::from((net.address("b")?, 9999));
    let a = SocketAddr::from((net.address("a")?, 0));
    let rx = net.run_in("b", move || UdpSocket::bind(b))??;
    let tx = net.run_in("a", move || UdpSocket::bind(a))??;
    set_buf(rx.as_raw_fd(), libc::SO_RCVBUFFORCE, 64 << 20);
    set_buf(tx.as_raw_fd(), libc::SO_SNDBUFFORCE, 4 << 20);
    tx.connect(b)?;
    rx.set_read_timeout(Some(Duration::from_millis(200)))?;
    let payload = args.size - 28;
    let stop = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));

    let (st, rc) = (stop.clone(), received.clone());
    let receiver = std::thread::spawn(move || {
        const B: usize = 64;
        let mut bufs = vec![[0u8; 2048]; B];
        let mut iov: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: zeroed mmsghdr is valid; we fill the iovec pointers.
        let mut msgs: Vec<libc::mmsghdr> = (0..B).map(|_| unsafe { std::mem::zeroed() }).collect();
        for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
        }
        let fd = rx.as_raw_fd();
        loop {
            // SAFETY: msgs/iov/bufs outlive the call.
            let n =
                unsafe { libc::recvmmsg(fd, msgs.as_mut_ptr(), B as u32, 0, std::ptr::null_mut()) };
            if n > 0 {
                rc.fetch_add(n as u64, Ordering::Relaxed);
            } else if st.load(Ordering::Relaxed) {
                break;
            }
        }
    });

    let (st, sc) = (stop.clone(), sent.clone());
    let rate = args.rate;
    let secs = args.secs;
    let sender = std::thread::spawn(move || {
        const B: usize = 32;
        let buf = vec![0xABu8; payload];
        let mut iov: Vec<libc::iovec> = (0..B)
            .map(|_| libc::iovec {
                iov_base: buf.as_ptr() as *mut libc::c_void,
                iov_len: buf.len(),
            })
            .collect();
        // SAFETY: zeroed mmsghdr is valid; we fill the iovec pointers.
        let mut msgs: Vec<libc::mmsghdr> = (0..B).map(|_| unsafe { std::mem::zeroed() }).collect();
        for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
        }
        let fd = tx.as_raw_fd();
        let start = Instant::now();
        let mut total = 0u64;
        while start.elapsed().as_secs_f64() < secs && !st.load(Ordering::Relaxed) {
            if let Some(r) = rate {
                let due = Duration::from_secs_f64(total as f64 / r as f64);
                let el = start.elapsed();
                if due > el {
                    std::thread::sleep(due - el);
                }
            }
            // SAFETY: msgs/iov/buf outlive the call.
            let n = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), B as u32, 0) };
            if n > 0 {
                total += n as u64;
            }
        }
        sc.store(total, Ordering::Relaxed);
        start.elapsed().as_secs_f64()
    });
    let elapsed = sender.join().map_err(|_| "sender panicked")?;
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    receiver.join().map_err(|_| "receiver panicked")?;
    let c = net.shutdown()?;
    let sent = sent.load(Ordering::Relaxed);
    let got = received.load(Ordering::Relaxed);
    let p = c.path("a", "b").cloned().unwrap_or_default();
    let fr = &c.forwarder.release_error;
    let r = RunResult {
        offered_pps: sent as f64 / elapsed,
        delivered_pps: got as f64 / elapsed,
        host_drops: sent.saturating_sub(p.submitted_packets),
        p50_us: fr.p50_us,
        p99_us: fr.p99_us,
    };
    println!(
        "run {run}: forwarder CPU {:.2} us/packet ({:.0} pps per core); size {} offered {:.0} pps, delivered {:.0} pps ({:.2} Gbit/s), dropped before forwarder {} ({:.2}%), forwarder wrote {}, receiver got {}, release error p50 {:.1} us p99 {:.1} us max {:.1} us, write p50 {:.1} us",
        c.forwarder.cpu_s * 1e6 / c.forwarder.written_packets.max(1) as f64,
        c.forwarder.written_packets as f64 / c.forwarder.cpu_s.max(1e-9),
        args.size,
        r.offered_pps,
        r.delivered_pps,
        r.delivered_pps * args.size as f64 * 8.0 / 1e9,
        r.host_drops,
        100.0 * r.host_drops as f64 / sent.max(1) as f64,
        c.forwarder.written_packets,
        got,
        fr.p50_us,
        fr.p99_us,
        fr.max_us,
        c.forwarder.write_time.p50_us,
    );
    Ok(r)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    onionlab_netem::check_privileges()?;
    let mut results = Vec::new();
    for run in 0..args.runs {
        results.push(one_run(&args, run)?);
    }
    println!(
        "median of {} runs: size {} B, offered {:.0} pps, delivered {:.0} pps ({:.2} Gbit/s), release error p50 {:.1} us, p99 {:.1} us",
        args.runs,
        args.size,
        median(results.iter().map(|r| r.offered_pps).collect()),
        median(results.iter().map(|r| r.delivered_pps).collect()),
        median(results.iter().map(|r| r.delivered_pps).collect()) * args.size as f64 * 8.0 / 1e9,
        median(results.iter().map(|r| r.p50_us).collect()),
        median(results.iter().map(|r| r.p99_us).collect()),
    );
    Ok(())
}
