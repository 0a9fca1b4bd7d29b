//! Control socket of a running lab: `netem set`, `netem down` and counter
//! queries from other processes. One JSON request per connection, one JSON
//! response line back.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::network::Network;
use crate::topology::{HostUpdate, PathUpdate};

/// File name of the control socket inside the state directory.
pub const SOCKET: &str = "control.sock";

/// A request to a running lab.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Change the path between two hosts.
    SetPath {
        /// First host.
        a: String,
        /// Second host.
        b: String,
        /// Change both directions (otherwise only `a -> b`).
        both: bool,
        /// The change.
        update: PathUpdate,
    },
    /// Change a host's access links.
    SetHost {
        /// Host.
        host: String,
        /// The change.
        update: HostUpdate,
    },
    /// Current counters.
    Counters,
    /// Stop the lab.
    Down,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    /// Error message, if the request failed.
    pub error: Option<String>,
    /// Counters (for `Counters` and `Down`).
    pub counters: Option<Counters>,
}

/// Server side, used by the process that runs the lab.
#[derive(Debug)]
pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
}

impl ControlServer {
    /// Binds the control socket in `state_dir`.
    pub fn bind(state_dir: &Path) -> Result<ControlServer> {
        let path = state_dir.join(SOCKET);
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)
            .map_err(|e| Error::io(format!("bind {}", path.display()), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        Ok(ControlServer { listener, path })
    }

    /// Serves pending requests. Returns true if a `Down` request arrived.
    pub fn poll(&self, net: &Network) -> bool {
        let mut down = false;
        while let Ok((stream, _)) = self.listener.accept() {
            match serve_one(stream, net) {
                Ok(d) => down |= d,
                Err(e) => tracing::warn!(error = %e, "control request failed"),
            }
        }
        down
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve_one(stream: UnixStream, net: &Network) -> Result<bool> {
    stream
        .set_nonblocking(false)
        .and_then(|_| stream.set_read_timeout(Some(Duration::from_secs(2))))
        .map_err(|e| Error::io("control socket", e))?;
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .map_err(|e| Error::io("read control request", e))?;
    let mut down = false;
    let resp = match serde_json::from_str::<Request>(&line) {
        Err(e) => Response {
            error: Some(format!("bad request: {e}")),
            counters: None,
        },
        Ok(req) => {
            let r = match &req {
                Request::SetPath { a, b, both, update } => {
                    net.update_path(a, b, *update, *both).map(|_| None)
                }
                Request::SetHost { host, update } => net.update_host(host, *update).map(|_| None),
                Request::Counters => net.counters().map(Some),
                Request::Down => {
                    down = true;
                    net.counters().map(Some)
                }
            };
            tracing::info!(request = ?req, ok = r.is_ok(), "control request");
            match r {
                Ok(counters) => Response {
                    error: None,
                    counters,
                },
                Err(e) => Response {
                    error: Some(e.to_string()),
                    counters: None,
                },
            }
        }
    };
    let mut text = serde_json::to_string(&resp).map_err(|e| Error::Control(e.to_string()))?;
    text.push('\n');
    (&stream)
        .write_all(text.as_bytes())
        .map_err(|e| Error::io("write control response", e))?;
    Ok(down)
}

/// Sends a request to the lab whose state lives in `state_dir`.
pub fn request(state_dir: &Path, req: &Request) -> Result<Response> {
    let path = state_dir.join(SOCKET);
    let mut stream = UnixStream::connect(&path)
        .map_err(|e| Error::io(format!("connect {}", path.display()), e))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| Error::io("control socket", e))?;
    let mut text = serde_json::to_string(req).map_err(|e| Error::Control(e.to_string()))?;
    text.push('\n');
    stream
        .write_all(text.as_bytes())
        .map_err(|e| Error::io("write control request", e))?;
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .map_err(|e| Error::io("read control response", e))?;
    let resp: Response =
        serde_json::from_str(&line).map_err(|e| Error::Control(format!("bad response: {e}")))?;
    if let Some(e) = &resp.error {
        return Err(Error::Control(e.clone()));
    }
    Ok(resp)
}
