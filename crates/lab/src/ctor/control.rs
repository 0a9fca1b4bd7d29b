//! A C tor client's control port (cookie authentication): one-off
//! queries (`GETINFO circuit-status`, for the conflux readiness check) and
//! a watch of its circuit and stream events during a run, which gives the
//! circuits' build times and which kind of circuit carried each workload's
//! streams.
//!
//! Written here, by hand: the lab needs three commands and four event
//! lines of tor's control protocol (control-spec.txt), and no maintained
//! Rust crate speaks it.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::Place;
use crate::error::{io_err, Error};

/// How long a control connection waits for tor before giving up.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// Circuit purposes whose builds are timed: the three-hop exit circuits
/// onionlab's clients build too, plain or as a conflux leg (a leg is
/// `CONFLUX_UNLINKED` while it is built and links afterwards).
const TIMED_PURPOSES: [&str; 3] = ["GENERAL", "CONFLUX_UNLINKED", "CONFLUX_LINKED"];

/// An authenticated control connection to the tor at `control`.
fn connect(
    control: SocketAddr,
    cookie: &Path,
) -> Result<(TcpStream, BufReader<TcpStream>), String> {
    let cookie = fs::read(cookie).map_err(|e| format!("reading the control cookie: {e}"))?;
    let conn = TcpStream::connect_timeout(&control, CONTROL_TIMEOUT)
        .map_err(|e| format!("connecting: {e}"))?;
    conn.set_read_timeout(Some(CONTROL_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let w = conn.try_clone().map_err(|e| e.to_string())?;
    let mut c = (w, BufReader::new(conn));
    command(&mut c, &format!("AUTHENTICATE {}", hex::encode(cookie)))?;
    Ok(c)
}

/// Send `cmd` and read its answer: the lines of `250-...` and the data
/// lines of `250+...` up to ".", without the status codes, up to the last
/// `250 ...`. Any other status is a refusal.
fn command(
    (w, r): &mut (TcpStream, BufReader<TcpStream>),
    cmd: &str,
) -> Result<Vec<String>, String> {
    w.write_all(format!("{cmd}\r\n").as_bytes())
        .map_err(|e| format!("writing: {e}"))?;
    let mut answer = Vec::new();
    let mut in_data = false;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)
            .map_err(|e| format!("reading: {e}"))?
            == 0
        {
            return Err("the control connection closed".into());
        }
        let line = line.trim_end();
        if in_data {
            if line == "." {
                in_data = false;
            } else {
                answer.push(line.to_string());
            }
            continue;
        }
        match (line.get(..3), line.get(3..4)) {
            (Some("250"), Some(" ")) => return Ok(answer),
            (Some("250"), Some(sep @ ("-" | "+"))) => {
                in_data = sep == "+";
                answer.push(line[4..].to_string());
            }
            _ => {
                let what = cmd.split(' ').next().unwrap_or("");
                return Err(format!("{what} refused: {line}"));
            }
        }
    }
}

/// One command on tor's control port at `control`: the lines of its
/// answer, without the status codes.
pub(super) fn query(control: SocketAddr, cookie: &Path, cmd: &str) -> Result<Vec<String>, String> {
    let mut c = connect(control, cookie)?;
    command(&mut c, cmd)
}

/// The value of field `key` (`KEY=value`) among a control line's fields.
fn field<'a>(fields: &[&'a str], key: &str) -> Option<&'a str> {
    fields
        .iter()
        .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
}

/// A control line's space-separated fields; a space inside a quoted
/// string (`KEY="a b"`) does not separate.
fn split_fields(line: &str) -> Vec<&str> {
    let line = line.trim_end();
    let (mut fields, mut start, mut quoted, mut escaped) = (Vec::new(), 0, false, false);
    for (i, c) in line.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                fields.push(&line[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    fields.push(&line[start..]);
    fields
}

/// A quoted string as tor writes it (`esc_for_log`: `\\`, `\"`, `\'`,
/// `\n`, `\t`, `\r` and `\ooo` octal for other bytes), unquoted; a
/// value without quotes as it is.
fn unquote(v: &str) -> String {
    let Some(inner) = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else {
        return v.to_string();
    };
    let (mut out, mut bytes) = (Vec::new(), inner.bytes().peekable());
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match bytes.next() {
            Some(b'n') => out.push(b'\n'),
            Some(b't') => out.push(b'\t'),
            Some(b'r') => out.push(b'\r'),
            Some(d @ b'0'..=b'7') => {
                let mut n = u32::from(d - b'0');
                for _ in 0..2 {
                    match bytes.peek() {
                        Some(&d @ b'0'..=b'7') => {
                            n = n * 8 + u32::from(d - b'0');
                            bytes.next();
                        }
                        _ => break,
                    }
                }
                out.push(n as u8);
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The circuits of a `GETINFO circuit-status` answer, one a line: tor
/// puts a single circuit on the `circuit-status=` line itself, several
/// on the data lines after it.
fn circuit_lines(answer: &[String]) -> impl Iterator<Item = &str> {
    answer
        .iter()
        .map(|l| l.strip_prefix("circuit-status=").unwrap_or(l))
        .filter(|l| !l.is_empty())
}

/// Complete linked conflux sets of `legs` circuits in a `GETINFO
/// circuit-status` answer (one circuit a line: `ID STATUS PATH ...
/// PURPOSE=...`). C tor gives a set's circuits `PURPOSE=CONFLUX_LINKED`
/// only once every leg has linked. Where tor names each circuit's set
/// (`CONFLUX_ID=`) the sets are counted by it; tor 0.4.9 does not, and
/// then a set is every `legs` built linked circuits.
pub(super) fn linked_sets(lines: &[String], legs: usize) -> usize {
    let mut by_set: HashMap<Option<&str>, usize> = HashMap::new();
    for l in circuit_lines(lines) {
        let f = split_fields(l);
        if f.get(1) == Some(&"BUILT") && field(&f, "PURPOSE") == Some("CONFLUX_LINKED") {
            *by_set.entry(field(&f, "CONFLUX_ID")).or_default() += 1;
        }
    }
    by_set
        .iter()
        .map(|(id, n)| match id {
            Some(_) => usize::from(*n >= legs),
            None => n / legs.max(1),
        })
        .sum()
}

/// Streams of one workload (its SOCKS username) that ran over circuits
/// of one purpose, as a C tor client's control port told it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StreamCircuits {
    /// The client.
    pub client: String,
    /// The workload (the stream's SOCKS username; empty without one).
    pub workload: String,
    /// The purpose of the circuit the stream was attached to
    /// (`GENERAL`: a plain circuit, `CONFLUX_LINKED`: a conflux set;
    /// `unknown` if the watch did not see the circuit).
    pub purpose: String,
    /// Streams that succeeded on such circuits.
    pub streams: u64,
}

/// What a watch saw: circuit build times (ms) and which circuits the
/// user streams used, by (SOCKS username, circuit purpose).
#[derive(Debug, Default)]
struct Events {
    launched: HashMap<String, Instant>,
    purposes: HashMap<String, String>,
    /// User streams not yet succeeded: id to SOCKS username.
    pending: HashMap<String, String>,
    build_ms: Vec<f64>,
    streams: BTreeMap<(String, String), u64>,
}

impl Events {
    /// Learn the purposes of the circuits that exist already from a
    /// `GETINFO circuit-status` answer (an event seen before it, of a
    /// newer state, would win).
    fn known_circuits(&mut self, status: &[String]) {
        for l in circuit_lines(status) {
            let f = split_fields(l);
            if let (Some(id), Some(p)) = (f.first(), field(&f, "PURPOSE")) {
                self.purposes
                    .entry(id.to_string())
                    .or_insert_with(|| p.to_string());
            }
        }
    }

    /// One line from the control port.
    fn line(&mut self, line: &str, now: Instant) {
        let f = split_fields(line);
        match f.get(..4) {
            Some(["650", "CIRC", id, status]) => self.circuit(id, status, &f[4..], now),
            Some(["650", "CIRC_MINOR", id, "PURPOSE_CHANGED"]) => {
                if let Some(p) = field(&f[4..], "PURPOSE") {
                    self.purposes.insert(id.to_string(), p.to_string());
                }
            }
            Some(["650", "STREAM", id, status]) => self.stream(id, status, &f[4..]),
            _ => {}
        }
    }

    /// `650 CIRC ID STATUS [PATH] ... PURPOSE=...`: LAUNCHED starts the
    /// clock, BUILT stops it for an exit circuit (not a one-hop directory
    /// tunnel, not an onion-service circuit).
    fn circuit(&mut self, id: &str, status: &str, rest: &[&str], now: Instant) {
        let purpose = field(rest, "PURPOSE");
        if let Some(p) = purpose {
            self.purposes.insert(id.to_string(), p.to_string());
        }
        match status {
            "LAUNCHED" => {
                self.launched.insert(id.to_string(), now);
            }
            "BUILT" => {
                let Some(started) = self.launched.remove(id) else {
                    return;
                };
                let one_hop =
                    field(rest, "BUILD_FLAGS").is_some_and(|f| f.contains("ONEHOP_TUNNEL"));
                if purpose.is_some_and(|p| TIMED_PURPOSES.contains(&p)) && !one_hop {
                    self.build_ms
                        .push(now.duration_since(started).as_secs_f64() * 1e3);
                }
            }
            "FAILED" | "CLOSED" => {
                self.launched.remove(id);
            }
            _ => {}
        }
    }

    /// `650 STREAM ID STATUS CIRCID TARGET ...`: NEW says whether it is a
    /// user stream (`PURPOSE=USER`, not a directory fetch) and its SOCKS
    /// username; SUCCEEDED counts it by the purpose of its circuit.
    fn stream(&mut self, id: &str, status: &str, rest: &[&str]) {
        match status {
            "NEW" if field(rest, "PURPOSE") == Some("USER") => {
                let user = field(rest, "SOCKS_USERNAME").map_or(String::new(), unquote);
                self.pending.insert(id.to_string(), user);
            }
            "SUCCEEDED" => {
                let Some(user) = self.pending.remove(id) else {
                    return;
                };
                let circuit = rest.first().copied().unwrap_or("0");
                let purpose = self
                    .purposes
                    .get(circuit)
                    .cloned()
                    .unwrap_or_else(|| "unknown".into());
                *self.streams.entry((user, purpose)).or_default() += 1;
            }
            "FAILED" | "CLOSED" => {
                self.pending.remove(id);
            }
            _ => {}
        }
    }
}

/// What a [`CircuitWatch`] saw.
#[derive(Debug, Default)]
pub struct Watched {
    /// Circuit build times (ms) of the circuits launched while watching.
    pub build_ms: Vec<f64>,
    /// The user streams by workload and circuit purpose.
    pub streams: Vec<StreamCircuits>,
}

/// Watches a C tor client's control port (`SETEVENTS CIRC CIRC_MINOR
/// STREAM`): times each circuit from LAUNCHED to BUILT, the build times
/// onionlab's clients log (only circuits launched while it watches
/// count), and notes which circuit each user stream ran over.
pub struct CircuitWatch {
    client: String,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Events>,
}

impl CircuitWatch {
    /// Connect to the control port `control` of client `client` in
    /// `host` (cookie authentication with `cookie`) and start watching.
    pub fn start(
        place: &Place,
        (client, host): (&str, &str),
        control: SocketAddr,
        cookie: &Path,
    ) -> Result<CircuitWatch, Error> {
        let refused = |e: String| {
            Error::Start(format!(
                "tor's control port in {host} (client {client}): {e}"
            ))
        };
        let mut conn = place
            .run_in(host, || connect(control, cookie))?
            .map_err(refused)?;
        command(&mut conn, "SETEVENTS CIRC CIRC_MINOR STREAM").map_err(refused)?;
        // After SETEVENTS: a circuit that changes from here on is in the
        // events too, and they are newer.
        let status = place
            .run_in(host, || query(control, cookie, "GETINFO circuit-status"))?
            .map_err(refused)?;
        let mut events = Events::default();
        events.known_circuits(&status);
        let (_, mut r) = conn;
        r.get_ref()
            .set_read_timeout(Some(Duration::from_millis(200)))
            .map_err(io_err("setting a socket timeout"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut line = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                // Bytes, not a String: a timeout keeps what was read so
                // far in `line` whatever it is.
                match r.read_until(b'\n', &mut line) {
                    Ok(0) => break,
                    Ok(_) if line.ends_with(b"\n") => {}
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                    Err(_) => break,
                }
                events.line(&String::from_utf8_lossy(&line), Instant::now());
                line.clear();
            }
            events
        });
        Ok(CircuitWatch {
            client: client.to_string(),
            stop,
            thread,
        })
    }

    /// Stop watching; what it saw.
    pub fn finish(self) -> Watched {
        self.stop.store(true, Ordering::Relaxed);
        let events = self.thread.join().unwrap_or_default();
        Watched {
            build_ms: events.build_ms,
            streams: events
                .streams
                .into_iter()
                .map(|((workload, purpose), streams)| StreamCircuits {
                    client: self.client.clone(),
                    workload,
                    purpose,
                    streams,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn linked_conflux_sets_are_counted_from_circuit_status() {
        let status = lines(&[
            "4 BUILT $AA~g1,$BB~m1,$CC~exit BUILD_FLAGS=NEED_CAPACITY,NEED_UPTIME \
             PURPOSE=CONFLUX_LINKED TIME_CREATED=2026-11-26T17:00:00.000000",
            "5 BUILT $DD~g2,$EE~m2,$CC~exit PURPOSE=CONFLUX_LINKED",
            "6 EXTENDED $AA~g1 PURPOSE=CONFLUX_UNLINKED",
            "7 BUILT $AA~g1,$EE~m2,$CC~exit PURPOSE=GENERAL",
            "45 LAUNCHED PURPOSE=CONFLUX_LINKED",
            "8 BUILT $AA~g1,$BB~m1,$CC~exit PURPOSE=CONFLUX_LINKED",
        ]);
        assert_eq!(linked_sets(&status, 2), 1);
        assert_eq!(linked_sets(&status, 3), 1);
        assert_eq!(linked_sets(&status[..2], 3), 0);
        assert_eq!(linked_sets(&[], 2), 0);
        // Named sets: only complete ones count.
        let named = lines(&[
            "4 BUILT $AA~g1 PURPOSE=CONFLUX_LINKED CONFLUX_ID=ab",
            "5 BUILT $DD~g2 PURPOSE=CONFLUX_LINKED CONFLUX_ID=cd",
            "6 BUILT $AA~g1 PURPOSE=CONFLUX_LINKED CONFLUX_ID=ab",
        ]);
        assert_eq!(linked_sets(&named, 2), 1);
    }

    #[test]
    fn quoted_values_keep_their_spaces_and_lose_their_escapes() {
        let f = split_fields(
            "650 STREAM 5 NEW 0 x:80 SOCKS_USERNAME=\"bulk dl \\\"2\\\"\" PURPOSE=USER\r\n",
        );
        assert_eq!(f.len(), 8, "{f:?}");
        assert_eq!(field(&f, "PURPOSE"), Some("USER"));
        assert_eq!(
            unquote(field(&f, "SOCKS_USERNAME").expect("username")),
            "bulk dl \"2\""
        );
        assert_eq!(unquote("\"caf\\303\\251 o\\'b\\\\\""), "café o'b\\");
        assert_eq!(unquote("plain"), "plain");
    }

    #[test]
    fn one_circuit_on_the_getinfo_line_is_read_too() {
        let mut ev = Events::default();
        ev.known_circuits(&lines(&[
            "circuit-status=4 BUILT $AA~g1 PURPOSE=CONFLUX_LINKED",
        ]));
        assert_eq!(
            ev.purposes.get("4").map(String::as_str),
            Some("CONFLUX_LINKED")
        );
        let one = lines(&["circuit-status=4 BUILT $AA~g1 PURPOSE=CONFLUX_LINKED"]);
        assert_eq!(linked_sets(&one, 1), 1);
        assert_eq!(linked_sets(&lines(&["circuit-status="]), 1), 0);
    }

    #[test]
    fn circuit_events_give_build_times() {
        let mut ev = Events::default();
        let t0 = Instant::now();
        let mut at = |l: &str, ms: u64| ev.line(l, t0 + Duration::from_millis(ms));
        at(
            "650 CIRC 7 LAUNCHED BUILD_FLAGS=NEED_CAPACITY PURPOSE=GENERAL\r\n",
            0,
        );
        at("650 CIRC 8 LAUNCHED PURPOSE=GENERAL\r\n", 5);
        at("650 CIRC 7 EXTENDED $AB~r0guard PURPOSE=GENERAL\r\n", 100);
        at(
            "650 CIRC 7 BUILT $AB~r0,$CD~r1,$EF~r2 BUILD_FLAGS=NEED_CAPACITY PURPOSE=GENERAL\r\n",
            250,
        );
        // One-hop directory tunnels are not timed, conflux legs are.
        at("650 CIRC 9 LAUNCHED PURPOSE=GENERAL\r\n", 260);
        at(
            "650 CIRC 9 BUILT $AB~r0 BUILD_FLAGS=ONEHOP_TUNNEL,IS_INTERNAL PURPOSE=GENERAL\r\n",
            280,
        );
        at("650 CIRC 10 LAUNCHED PURPOSE=CONFLUX_UNLINKED\r\n", 300);
        at(
            "650 CIRC 10 BUILT $AB~r0,$CD~r1,$EF~r2 PURPOSE=CONFLUX_UNLINKED\r\n",
            420,
        );
        at("650 CIRC 8 FAILED REASON=TIMEOUT PURPOSE=GENERAL\r\n", 300);
        // A circuit launched before the watch began is not timed.
        at("650 CIRC 3 BUILT $AB~r0guard PURPOSE=GENERAL\r\n", 400);
        at("250 OK\r\n", 400);
        assert_eq!(ev.build_ms, vec![250.0, 120.0]);
        assert!(ev.launched.is_empty());
    }

    #[test]
    fn stream_events_tell_which_circuits_carried_each_workload() {
        let mut ev = Events::default();
        ev.known_circuits(&lines(&[
            "4 BUILT $AA~g1 PURPOSE=CONFLUX_LINKED",
            "5 BUILT $AA~g1 PURPOSE=GENERAL",
        ]));
        let now = Instant::now();
        for l in [
            // A leg built and linked while watching.
            "650 CIRC 6 LAUNCHED PURPOSE=CONFLUX_UNLINKED",
            "650 CIRC 6 BUILT $AA~g1 PURPOSE=CONFLUX_UNLINKED",
            "650 CIRC_MINOR 6 PURPOSE_CHANGED $AA~g1 PURPOSE=CONFLUX_LINKED \
             OLD_PURPOSE=CONFLUX_UNLINKED",
            "650 STREAM 20 NEW 0 10.0.0.9:80 SOURCE_ADDR=127.0.0.1:4000 PURPOSE=USER \
             SOCKS_USERNAME=\"web\" SOCKS_PASSWORD=\"onionlab\"",
            "650 STREAM 20 SENTCONNECT 4 10.0.0.9:80 SOCKS_USERNAME=\"web\"",
            "650 STREAM 20 SUCCEEDED 4 10.0.0.9:80 SOCKS_USERNAME=\"web\"",
            "650 STREAM 21 NEW 0 10.0.0.9:80 PURPOSE=USER SOCKS_USERNAME=\"bulk\"",
            "650 STREAM 21 SUCCEEDED 5 10.0.0.9:80",
            "650 STREAM 22 NEW 0 10.0.0.9:80 PURPOSE=USER SOCKS_USERNAME=\"web\"",
            "650 STREAM 22 SUCCEEDED 6 10.0.0.9:80",
            "650 STREAM 23 NEW 0 10.0.0.9:80 PURPOSE=USER",
            "650 STREAM 23 SUCCEEDED 99 10.0.0.9:80",
            // Directory fetches and failed streams are not counted.
            "650 STREAM 24 NEW 0 10.0.0.1:9130 PURPOSE=DIR_FETCH",
            "650 STREAM 24 SUCCEEDED 5 10.0.0.1:9130",
            "650 STREAM 25 NEW 0 10.0.0.9:80 PURPOSE=USER SOCKS_USERNAME=\"web\"",
            "650 STREAM 25 FAILED 4 10.0.0.9:80 REASON=TIMEOUT",
        ] {
            ev.line(l, now);
        }
        let got: Vec<(&str, &str, u64)> = ev
            .streams
            .iter()
            .map(|((u, p), n)| (u.as_str(), p.as_str(), *n))
            .collect();
        assert_eq!(
            got,
            vec![
                ("", "unknown", 1),
                ("bulk", "GENERAL", 1),
                ("web", "CONFLUX_LINKED", 2)
            ]
        );
        assert!(ev.pending.is_empty());
    }
}
