//! A client's datagram circuits (`docs/datagram.md` section 5), sans-IO:
//! it builds circuits hop by hop over a datagram link to the guard,
//! resending each CREATE2 and EXTEND2 until it is answered, then seals
//! messages for any hop and opens what the hops send back.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use onionlab_crypto::dgram::{ClientLayers, HopKeys};
use onionlab_crypto::identity::ntor_node_id;
use onionlab_crypto::ntor::{NtorClient, CLIENT_HANDSHAKE_LEN};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tor_llcrypto::pk::curve25519::PublicKey;
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use crate::wire::{DgramCell, Extend2, RelayCommand, RelayMsg, CELL_LEN};
use crate::{CircuitId, Error, LinkId};

/// How a client builds its datagram circuits.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// A circuit not built in this long fails.
    pub build_timeout: Duration,
    /// First wait before a CREATE2 or EXTEND2 is sent again.
    pub first_resend: Duration,
    /// Longest wait between copies.
    pub max_resend: Duration,
    /// Copies of each DESTROY sent.
    pub destroy_copies: usize,
}

impl Default for ClientSettings {
    fn default() -> Self {
        ClientSettings {
            build_timeout: Duration::from_secs(10),
            first_resend: Duration::from_millis(250),
            max_resend: Duration::from_secs(2),
            destroy_copies: 3,
        }
    }
}

/// A hop of a path, from the network document.
#[derive(Debug, Clone)]
pub struct HopSpec {
    /// Its datagram address.
    pub addr: SocketAddr,
    /// Its Ed25519 identity.
    pub identity: Ed25519Identity,
    /// Its ntor onion key.
    pub onion_key: PublicKey,
}

/// What the client asks of its driver, or tells it.
#[derive(Debug)]
pub enum ClientOutput {
    /// Send this cell on this link.
    Transmit(LinkId, Box<[u8; CELL_LEN]>),
    /// The circuit reaches its last hop.
    Built(CircuitId),
    /// The circuit failed or was destroyed; it is forgotten.
    Closed {
        /// The circuit.
        circuit: CircuitId,
        /// Why.
        error: Error,
    },
    /// A hop sent us a message.
    Delivered {
        /// The circuit.
        circuit: CircuitId,
        /// The hop (0: the guard).
        hop: usize,
        /// The message.
        msg: RelayMsg,
    },
}

/// The handshake under way and when its message goes again.
struct Pending {
    ntor: NtorClient,
    /// The cell (CREATE2) or message (EXTEND2) to send again.
    resend: Resend,
    resend_at: Instant,
    wait: Duration,
}

enum Resend {
    Create([u8; CLIENT_HANDSHAKE_LEN]),
    Extend(RelayMsg),
}

struct Circuit {
    link: LinkId,
    circ_id: u32,
    path: Vec<HopSpec>,
    layers: ClientLayers,
    pending: Option<Pending>,
    started: Instant,
}

/// A client's datagram circuits (see the module docs).
pub struct DgramClient {
    settings: ClientSettings,
    rng: StdRng,
    circuits: HashMap<CircuitId, Circuit>,
    ends: HashMap<(LinkId, u32), CircuitId>,
    next_circuit: u64,
    out: VecDeque<ClientOutput>,
}

impl std::fmt::Debug for DgramClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DgramClient")
            .field("circuits", &self.circuits.len())
            .finish_non_exhaustive()
    }
}

impl DgramClient {
    /// A client with no circuits; `seed` seeds its circuit IDs (the
    /// handshakes' secrets come from the OS).
    pub fn new(settings: ClientSettings, seed: u64) -> Self {
        DgramClient {
            settings,
            rng: StdRng::seed_from_u64(seed),
            circuits: HashMap::new(),
            ends: HashMap::new(),
            next_circuit: 1,
            out: VecDeque::new(),
        }
    }

    /// What the client asks or tells next.
    pub fn poll_output(&mut self) -> Option<ClientOutput> {
        self.out.pop_front()
    }

    /// Build a circuit along `path` (guard first) over `link`, a link to
    /// the guard the driver opened (client links are always ours: our
    /// circuit IDs have the high bit set).
    ///
    /// # Errors
    ///
    /// [`Error::EmptyPath`].
    pub fn build(
        &mut self,
        now: Instant,
        link: LinkId,
        path: Vec<HopSpec>,
    ) -> Result<CircuitId, Error> {
        let guard = path.first().ok_or(Error::EmptyPath)?.clone();
        let circ_id = loop {
            let c = self.rng.random::<u32>() | 0x8000_0000;
            if !self.ends.contains_key(&(link, c)) {
                break c;
            }
        };
        let id = CircuitId(self.next_circuit);
        self.next_circuit += 1;
        let (ntor, handshake) = NtorClient::start(
            &mut rand::rng(),
            &ntor_node_id(&guard.identity),
            &guard.onion_key,
        );
        self.circuits.insert(
            id,
            Circuit {
                link,
                circ_id,
                path,
                layers: ClientLayers::new(),
                pending: Some(Pending {
                    ntor,
                    resend: Resend::Create(handshake),
                    resend_at: now + self.settings.first_resend,
                    wait: self.settings.first_resend,
                }),
                started: now,
            },
        );
        self.ends.insert((link, circ_id), id);
        self.transmit(link, DgramCell::Create2 { circ_id, handshake });
        Ok(id)
    }

    /// Send `msg` to hop `hop` (0: the guard) of a built circuit.
    ///
    /// # Errors
    ///
    /// [`Error::NoCircuit`], [`Error::NotBuilt`], or the message's or the
    /// crypto's error.
    pub fn send(&mut self, circuit: CircuitId, hop: usize, msg: &RelayMsg) -> Result<(), Error> {
        let c = self
            .circuits
            .get_mut(&circuit)
            .ok_or(Error::NoCircuit(circuit))?;
        if c.pending.is_some() {
            return Err(Error::NotBuilt(circuit));
        }
        let cell = c.layers.seal(hop, &msg.encode()?)?;
        let (link, circ_id) = (c.link, c.circ_id);
        self.transmit(
            link,
            DgramCell::Relay {
                circ_id,
                cell: Box::new(cell),
            },
        );
        Ok(())
    }

    /// Hops of a circuit (its length once built).
    pub fn hops(&self, circuit: CircuitId) -> Option<usize> {
        self.circuits.get(&circuit).map(|c| c.path.len())
    }

    /// End a circuit: DESTROY to the guard, forgotten at once.
    pub fn close(&mut self, circuit: CircuitId) {
        if let Some(c) = self.circuits.remove(&circuit) {
            self.ends.remove(&(c.link, c.circ_id));
            for _ in 0..self.settings.destroy_copies.max(1) {
                self.transmit(
                    c.link,
                    DgramCell::Destroy {
                        circ_id: c.circ_id,
                        reason: 9,
                    },
                );
            }
        }
    }

    /// A link is gone: its circuits fail.
    pub fn link_down(&mut self, link: LinkId) {
        let ids: Vec<CircuitId> = self
            .circuits
            .iter()
            .filter(|(_, c)| c.link == link)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.fail(id, Error::LinkDown);
        }
    }

    /// A cell from `link`.
    pub fn handle_cell(&mut self, now: Instant, link: LinkId, bytes: &[u8]) {
        let Ok(cell) = DgramCell::parse(bytes) else {
            return;
        };
        let Some(&id) = self.ends.get(&(link, cell.circ_id())) else {
            return;
        };
        match cell {
            DgramCell::Created2 { reply, .. } => self.on_handshake_reply(now, id, 0, &reply),
            DgramCell::Relay { cell, .. } => {
                let Some(c) = self.circuits.get_mut(&id) else {
                    return;
                };
                match c.layers.open(*cell) {
                    Ok((hop, _, plaintext)) => match RelayMsg::parse(&plaintext) {
                        Ok(msg) => self.on_msg(now, id, hop, msg),
                        Err(e) => self.fail(id, e.into()),
                    },
                    // A copy of a cell we had: dropped.
                    Err(onionlab_crypto::Error::DgramReplay { .. }) => {}
                    Err(e) => self.fail(id, e.into()),
                }
            }
            DgramCell::Destroy { reason, .. } => {
                if let Some(c) = self.circuits.remove(&id) {
                    self.ends.remove(&(c.link, c.circ_id));
                    self.out.push_back(ClientOutput::Closed {
                        circuit: id,
                        error: Error::Destroyed(reason),
                    });
                }
            }
            // A relay never sends us CREATE2.
            DgramCell::Create2 { .. } => self.fail(id, Error::Protocol("CREATE2 to a client")),
        }
    }

    /// Run the timers: resend handshakes, fail slow builds.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut late = Vec::new();
        let mut resend = Vec::new();
        for (&id, c) in &mut self.circuits {
            let Some(p) = c.pending.as_mut() else {
                continue;
            };
            if now.saturating_duration_since(c.started) >= self.settings.build_timeout {
                late.push(id);
            } else if now >= p.resend_at {
                p.wait = (p.wait * 2).min(self.settings.max_resend);
                p.resend_at = now + p.wait;
                resend.push(id);
            }
        }
        for id in late {
            self.fail(id, Error::BuildTimeout);
        }
        for id in resend {
            self.resend(id);
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.circuits
            .values()
            .filter_map(|c| {
                let p = c.pending.as_ref()?;
                Some(p.resend_at.min(c.started + self.settings.build_timeout))
            })
            .min()
    }

    fn resend(&mut self, id: CircuitId) {
        let Some(c) = self.circuits.get_mut(&id) else {
            return;
        };
        let (link, circ_id) = (c.link, c.circ_id);
        let cell = match c.pending.as_ref().map(|p| &p.resend) {
            Some(Resend::Create(handshake)) => DgramCell::Create2 {
                circ_id,
                handshake: *handshake,
            },
            Some(Resend::Extend(msg)) => {
                let last = c.layers.n_hops().saturating_sub(1);
                match msg
                    .encode()
                    .map_err(Error::from)
                    .and_then(|p| Ok(c.layers.seal(last, &p)?))
                {
                    Ok(cell) => DgramCell::Relay {
                        circ_id,
                        cell: Box::new(cell),
                    },
                    Err(e) => return self.fail(id, e),
                }
            }
            None => return,
        };
        self.transmit(link, cell);
    }

    fn on_msg(&mut self, now: Instant, id: CircuitId, hop: usize, msg: RelayMsg) {
        let building = self.circuits.get(&id).is_some_and(|c| c.pending.is_some());
        match (msg.command, building) {
            (RelayCommand::Extended2, true) => {
                let Ok(reply) = <[u8; 64]>::try_from(msg.data.as_slice()) else {
                    return self.fail(id, Error::Protocol("EXTENDED2 of the wrong length"));
                };
                self.on_handshake_reply(now, id, hop + 1, &reply);
            }
            // A copy of an EXTENDED2 we had: dropped.
            (RelayCommand::Extended2, false) => {}
            (_, false) => self.out.push_back(ClientOutput::Delivered {
                circuit: id,
                hop,
                msg,
            }),
            (_, true) => self.fail(
                id,
                Error::Protocol("a message before the circuit was built"),
            ),
        }
    }

    /// The handshake reply of hop `hop`: add the hop, then extend or
    /// report the circuit built.
    fn on_handshake_reply(&mut self, now: Instant, id: CircuitId, hop: usize, reply: &[u8]) {
        let Some(c) = self.circuits.get_mut(&id) else {
            return;
        };
        // A reply for another hop than the one being added is a copy.
        if c.layers.n_hops() != hop {
            return;
        }
        let Some(p) = c.pending.take() else {
            return;
        };
        let keys: HopKeys = match p.ntor.finish_as(reply) {
            Ok(k) => k,
            Err(e) => return self.fail(id, e.into()),
        };
        c.layers.add_hop(keys);
        let Some(next) = c.path.get(hop + 1).cloned() else {
            self.out.push_back(ClientOutput::Built(id));
            return;
        };
        let (ntor, handshake) = NtorClient::start(
            &mut rand::rng(),
            &ntor_node_id(&next.identity),
            &next.onion_key,
        );
        let msg = RelayMsg {
            command: RelayCommand::Extend2,
            data: Extend2 {
                addr: next.addr,
                identity: next.identity,
                handshake,
            }
            .encode(),
        };
        c.pending = Some(Pending {
            ntor,
            resend: Resend::Extend(msg),
            resend_at: now + self.settings.first_resend,
            wait: self.settings.first_resend,
        });
        self.resend(id);
    }

    fn fail(&mut self, id: CircuitId, error: Error) {
        if let Some(c) = self.circuits.remove(&id) {
            self.ends.remove(&(c.link, c.circ_id));
            // Nothing goes on a link that is gone.
            let copies = if matches!(error, Error::LinkDown) {
                0
            } else {
                self.settings.destroy_copies.max(1)
            };
            for _ in 0..copies {
                self.transmit(
                    c.link,
                    DgramCell::Destroy {
                        circ_id: c.circ_id,
                        reason: 1,
                    },
                );
            }
            self.out
                .push_back(ClientOutput::Closed { circuit: id, error });
        }
    }

    fn transmit(&mut self, link: LinkId, cell: DgramCell) {
        self.out
            .push_back(ClientOutput::Transmit(link, Box::new(cell.encode())));
    }
}
