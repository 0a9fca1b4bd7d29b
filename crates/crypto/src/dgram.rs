//! Per-cell onion crypto for circuits over datagram links (mUDP-OR,
//! `docs/datagram.md` section 3): every cell can be lost, duplicated or
//! reordered on its own, and every other cell still decrypts.
//!
//! tor1 ([`crate::relay_crypto`]) runs one AES-CTR stream and one digest
//! per hop for the whole circuit, so one lost cell ends it. Here each cell
//! carries a 16-byte header block `X`. For a cell the client sends to hop
//! `t` with counter `c`:
//!
//! ```text
//! B   = AES-128-GCM(Af_t, nonce = 0x00 | 0^3 | c, P)          (plaintext P: 492 bytes)
//! X_t = AES(Hf_t, 0^8 | c)
//! for j = t-1 .. 1: X_j = AES(Hf_j, X_{j+1}); B ^= CTR(Kf_j, iv = X_j)
//! ```
//!
//! A hop computes `Y = AES^-1(Hf, X)`: if `Y` starts with 64 zero bits and
//! its GCM opens `B` with counter `Y[8..16]` (not seen before), the cell is
//! its own; otherwise it removes its CTR layer (IV `X`) and forwards
//! `(Y, B)`. Backward, the sending hop seals with `Ab` (nonce byte `0x01`)
//! and `X = AES(Hb, 0^8 | c)`; each hop nearer the client applies
//! `X' = AES(Hb, X)` and `B ^= CTR(Kb, iv = X')`; the client peels hop by
//! hop. The security argument and what this gives up against tor1 are in
//! `docs/datagram.md`.
//!
//! Written here: neither Arti nor any other maintained crate has a
//! loss-tolerant relay-cell construction (Arti's tor1 and CGO both chain
//! cells). The primitives are the `aes` and `aes-gcm` crates, the same
//! AES that `tor-llcrypto`'s counter mode is built on.

use aes::cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use aes::{Aes128, Aes128Enc};
use aes_gcm::aead::AeadInOut;
use aes_gcm::Aes128Gcm;
use cipher::{InnerIvInit, StreamCipher};
use zeroize::Zeroize;

use crate::Error;

/// Length of one hop's key material: `Hf | Hb | Kf | Kb | Af | Ab`,
/// 16 bytes each.
pub const HOP_KEY_MATERIAL_LEN: usize = 96;
/// Length of a cell's header block `X`.
pub const HEADER_LEN: usize = 16;
/// Length of a cell's encrypted body: the sealed plaintext and its tag.
pub const BODY_LEN: usize = 508;
/// Length of the GCM tag at the end of a body.
pub const TAG_LEN: usize = 16;
/// Length of the plaintext a cell carries to the hop it is for.
pub const PLAINTEXT_LEN: usize = BODY_LEN - TAG_LEN;
/// How many counters below the highest one accepted an end still takes
/// (each once): later cells may arrive first.
pub const REPLAY_WINDOW: u64 = 2048;

/// The plaintext of a cell.
pub type Plaintext = [u8; PLAINTEXT_LEN];

/// Bytes of the zero prefix that marks a header block as the hop's own.
const MAGIC_LEN: usize = 8;
/// GCM nonce's first byte for cells towards the exit.
const NONCE_FORWARD: u8 = 0x00;
/// GCM nonce's first byte for cells towards the client.
const NONCE_BACKWARD: u8 = 0x01;

/// A cell as it travels between two hops: its header block and body.
#[derive(Clone, PartialEq, Eq)]
pub struct SealedCell {
    /// The header block `X` for the hop that receives the cell.
    pub header: [u8; HEADER_LEN],
    /// The body, under the layers of the hops still ahead.
    pub body: [u8; BODY_LEN],
}

impl std::fmt::Debug for SealedCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedCell").finish_non_exhaustive()
    }
}

/// The keys one hop shares with the client, from
/// [`HOP_KEY_MATERIAL_LEN`] bytes of handshake output.
#[derive(Clone)]
pub struct HopKeys {
    /// Header block cipher, towards the exit.
    hf: Aes128,
    /// Header block cipher, towards the client.
    hb: Aes128,
    /// Body CTR block cipher, towards the exit: its key schedule is
    /// computed once per hop, and each cell's counter mode starts from a
    /// copy of it.
    kf: Aes128Enc,
    /// Body CTR block cipher, towards the client.
    kb: Aes128Enc,
    /// Seals cells the client sends to this hop.
    af: Aes128Gcm,
    /// Seals cells this hop sends to the client.
    ab: Aes128Gcm,
}

impl HopKeys {
    /// Split handshake output into a hop's keys.
    ///
    /// # Errors
    ///
    /// [`Error::BadLength`] unless `b` is exactly
    /// [`HOP_KEY_MATERIAL_LEN`] bytes.
    pub fn from_kdf_output(b: &[u8]) -> Result<Self, Error> {
        if b.len() != HOP_KEY_MATERIAL_LEN {
            return Err(Error::BadLength {
                what: "datagram hop key material",
                expected: HOP_KEY_MATERIAL_LEN,
                got: b.len(),
            });
        }
        let key = |i: usize| -> [u8; 16] {
            let mut k = [0u8; 16];
            k.copy_from_slice(&b[i * 16..(i + 1) * 16]);
            k
        };
        let mut k = [key(0), key(1), key(2), key(3), key(4), key(5)];
        // Every cipher state here is the `aes` crate's, which wipes its
        // round keys on drop (its `zeroize` feature); the copies of the
        // raw keys are wiped below.
        let keys = HopKeys {
            hf: Aes128::new(&Array::from(k[0])),
            hb: Aes128::new(&Array::from(k[1])),
            kf: Aes128Enc::new(&Array::from(k[2])),
            kb: Aes128Enc::new(&Array::from(k[3])),
            af: Aes128Gcm::new(&Array::from(k[4])),
            ab: Aes128Gcm::new(&Array::from(k[5])),
        };
        k.zeroize();
        Ok(keys)
    }
}

/// ntor's `m_expand` for datagram hop keys: the same handshake as a tor1
/// circuit's, expanded under its own label.
pub const M_EXPAND: &[u8] = b"onionlab-dgram-1:key_expand";

impl crate::ntor::ExpandedKeys for HopKeys {
    const M_EXPAND: &'static [u8] = M_EXPAND;
    const LEN: usize = HOP_KEY_MATERIAL_LEN;
    fn from_material(material: &[u8]) -> Result<Self, Error> {
        HopKeys::from_kdf_output(material)
    }
}

/// Which way a cell travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// Client to exit.
    Forward,
    /// Exit to client.
    Backward,
}

impl HopKeys {
    fn header_cipher(&self, way: Way) -> &Aes128 {
        match way {
            Way::Forward => &self.hf,
            Way::Backward => &self.hb,
        }
    }

    fn aead(&self, way: Way) -> &Aes128Gcm {
        match way {
            Way::Forward => &self.af,
            Way::Backward => &self.ab,
        }
    }

    /// `B ^= CTR(K, iv)` with this direction's body key.
    fn apply_layer(&self, way: Way, iv: &[u8; HEADER_LEN], body: &mut [u8; BODY_LEN]) {
        let cipher = match way {
            Way::Forward => &self.kf,
            Way::Backward => &self.kb,
        };
        // The same counter mode as tor-llcrypto's `Aes128Ctr` (big-endian
        // 128-bit counter), started from the hop's expanded key rather than
        // expanding the key again for every cell.
        let core = ctr::CtrCore::<Aes128Enc, ctr::flavors::Ctr128BE>::inner_iv_init(
            cipher.clone(),
            &Array::from(*iv),
        );
        ctr::Ctr128BE::<Aes128Enc>::from_core(core).apply_keystream(body);
    }

    /// `AES(H, block)`.
    fn wrap_header(&self, way: Way, block: &[u8; HEADER_LEN]) -> [u8; HEADER_LEN] {
        let mut b = Array::from(*block);
        self.header_cipher(way).encrypt_block(&mut b);
        let mut out = [0u8; HEADER_LEN];
        out.copy_from_slice(&b);
        out
    }

    /// `AES^-1(H, block)`.
    fn unwrap_header(&self, way: Way, block: &[u8; HEADER_LEN]) -> [u8; HEADER_LEN] {
        let mut b = Array::from(*block);
        self.header_cipher(way).decrypt_block(&mut b);
        let mut out = [0u8; HEADER_LEN];
        out.copy_from_slice(&b);
        out
    }

    /// Seal `plaintext` for (or from) this hop: the body, and the header
    /// block `AES(H, 0^8 | counter)`.
    fn seal(&self, way: Way, counter: u64, plaintext: &Plaintext) -> Result<SealedCell, Error> {
        let mut body = [0u8; BODY_LEN];
        body[..PLAINTEXT_LEN].copy_from_slice(plaintext);
        let tag = self
            .aead(way)
            .encrypt_inout_detached(
                &nonce(way, counter),
                &[],
                (&mut body[..PLAINTEXT_LEN]).into(),
            )
            .map_err(|_| Error::DgramSeal)?;
        body[PLAINTEXT_LEN..].copy_from_slice(&tag);
        let mut marked = [0u8; HEADER_LEN];
        marked[MAGIC_LEN..].copy_from_slice(&counter.to_be_bytes());
        Ok(SealedCell {
            header: self.wrap_header(way, &marked),
            body,
        })
    }

    /// If `unwrapped` (the header block with this hop's layer removed)
    /// marks the cell as this hop's and GCM opens `body`, the counter and
    /// plaintext. `body` is left as it was otherwise.
    fn open(
        &self,
        way: Way,
        unwrapped: &[u8; HEADER_LEN],
        body: &[u8; BODY_LEN],
    ) -> Option<(u64, Plaintext)> {
        if unwrapped[..MAGIC_LEN] != [0u8; MAGIC_LEN] {
            return None;
        }
        let mut counter_bytes = [0u8; 8];
        counter_bytes.copy_from_slice(&unwrapped[MAGIC_LEN..]);
        let counter = u64::from_be_bytes(counter_bytes);
        let mut plaintext = [0u8; PLAINTEXT_LEN];
        plaintext.copy_from_slice(&body[..PLAINTEXT_LEN]);
        let tag = Array::from(tail_tag(body));
        self.aead(way)
            .decrypt_inout_detached(&nonce(way, counter), &[], (&mut plaintext[..]).into(), &tag)
            .ok()?;
        Some((counter, plaintext))
    }
}

/// The GCM tag at the end of a body.
fn tail_tag(body: &[u8; BODY_LEN]) -> [u8; TAG_LEN] {
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&body[PLAINTEXT_LEN..]);
    tag
}

/// The GCM nonce of a cell: its direction, three zero bytes, its counter.
fn nonce(way: Way, counter: u64) -> Array<u8, aes_gcm::aead::consts::U12> {
    let mut n = [0u8; 12];
    n[0] = match way {
        Way::Forward => NONCE_FORWARD,
        Way::Backward => NONCE_BACKWARD,
    };
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Array::from(n)
}

/// The counters an end accepted: every counter at most once, none more
/// than [`REPLAY_WINDOW`] below the highest (RFC 9147 section 4.5.1's
/// sliding window, 2048 wide). 264 bytes.
#[derive(Debug, Clone)]
pub struct ReplayWindow {
    /// The highest counter accepted (0: none yet; counters start at 1).
    top: u64,
    /// Bit `i` of the window: counter `top - i` was accepted.
    seen: [u64; (REPLAY_WINDOW / 64) as usize],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow {
            top: 0,
            seen: [0; (REPLAY_WINDOW / 64) as usize],
        }
    }
}

impl ReplayWindow {
    /// Whether `counter` would be accepted (not seen, not too old).
    pub fn fresh(&self, counter: u64) -> bool {
        if counter == 0 {
            return false;
        }
        if counter > self.top {
            return true;
        }
        let age = self.top - counter;
        age < REPLAY_WINDOW && !self.bit(age)
    }

    /// Record `counter` as accepted; `false` (and nothing recorded) if
    /// it is not [`fresh`](Self::fresh).
    pub fn accept(&mut self, counter: u64) -> bool {
        if !self.fresh(counter) {
            return false;
        }
        if counter > self.top {
            self.shift(counter - self.top);
            self.top = counter;
        }
        let age = self.top - counter;
        self.seen[(age / 64) as usize] |= 1 << (age % 64);
        true
    }

    fn bit(&self, age: u64) -> bool {
        self.seen[(age / 64) as usize] & (1 << (age % 64)) != 0
    }

    /// Age every recorded counter by `by`.
    fn shift(&mut self, by: u64) {
        if by >= REPLAY_WINDOW {
            self.seen = [0; (REPLAY_WINDOW / 64) as usize];
            return;
        }
        let words = (by / 64) as usize;
        let bits = (by % 64) as u32;
        let old = self.seen;
        for (i, word) in self.seen.iter_mut().enumerate() {
            let from = i.checked_sub(words);
            let hi = from.map_or(0, |f| old[f]);
            let lo = from.and_then(|f| f.checked_sub(1)).map_or(0, |f| old[f]);
            *word = if bits == 0 {
                hi
            } else {
                (hi << bits) | (lo >> (64 - bits))
            };
        }
    }
}

/// Counters start at 1; the last one is never handed out.
fn next_counter(next: &mut u64) -> Result<u64, Error> {
    if *next == u64::MAX {
        return Err(Error::DgramCountersExhausted);
    }
    let c = *next;
    *next += 1;
    Ok(c)
}

/// The client's side of a datagram circuit: every hop's keys, the
/// forward counter, and a replay window per hop for what they send.
pub struct ClientLayers {
    /// The hops, guard first.
    hops: Vec<HopKeys>,
    /// What each hop sent that we accepted.
    windows: Vec<ReplayWindow>,
    /// The next forward counter.
    next: u64,
}

impl std::fmt::Debug for ClientLayers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientLayers")
            .field("hops", &self.hops.len())
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl Default for ClientLayers {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientLayers {
    /// A circuit with no hops yet.
    pub fn new() -> Self {
        ClientLayers {
            hops: Vec::new(),
            windows: Vec::new(),
            next: 1,
        }
    }

    /// Add the next hop.
    pub fn add_hop(&mut self, keys: HopKeys) {
        self.hops.push(keys);
        self.windows.push(ReplayWindow::default());
    }

    /// How many hops the circuit has.
    pub fn n_hops(&self) -> usize {
        self.hops.len()
    }

    /// Seal `plaintext` for hop `hop` (0: the guard), under a fresh
    /// counter, as it leaves the client.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchHop`] for a hop past the circuit;
    /// [`Error::DgramCountersExhausted`] after 2^64 - 2 cells.
    pub fn seal(&mut self, hop: usize, plaintext: &Plaintext) -> Result<SealedCell, Error> {
        let n_layers = self.hops.len();
        let target = self
            .hops
            .get(hop)
            .ok_or(Error::NoSuchHop { hop, n_layers })?;
        let counter = next_counter(&mut self.next)?;
        let mut cell = target.seal(Way::Forward, counter, plaintext)?;
        for keys in self.hops[..hop].iter().rev() {
            cell.header = keys.wrap_header(Way::Forward, &cell.header);
            keys.apply_layer(Way::Forward, &cell.header, &mut cell.body);
        }
        Ok(cell)
    }

    /// Open a cell that arrived from the guard: the hop that sent it (0:
    /// the guard), its counter and its plaintext.
    ///
    /// # Errors
    ///
    /// [`Error::DgramReplay`] for a counter that hop's window refuses (drop
    /// the cell); [`Error::DgramUnrecognised`] if no hop's seal opens: a
    /// relay on the path changed it or made it up (end the circuit).
    pub fn open(&mut self, mut cell: SealedCell) -> Result<(usize, u64, Plaintext), Error> {
        for (i, keys) in self.hops.iter().enumerate() {
            let unwrapped = keys.unwrap_header(Way::Backward, &cell.header);
            if let Some((counter, plaintext)) = keys.open(Way::Backward, &unwrapped, &cell.body) {
                if !self.windows[i].accept(counter) {
                    return Err(Error::DgramReplay { counter });
                }
                return Ok((i, counter, plaintext));
            }
            keys.apply_layer(Way::Backward, &cell.header, &mut cell.body);
            cell.header = unwrapped;
        }
        Err(Error::DgramUnrecognised)
    }
}

/// What a relay does with a cell from the client's side.
#[derive(Debug, PartialEq, Eq)]
pub enum Inbound {
    /// The cell is ours: its counter and plaintext.
    Ours {
        /// The client's counter.
        counter: u64,
        /// What the client sent us.
        plaintext: Plaintext,
    },
    /// Not ours: send this on to the next hop (the end of the circuit
    /// must treat it as [`Error::DgramUnrecognised`]).
    Forward(SealedCell),
}

/// A relay's side of one datagram circuit: its keys, its backward
/// counter, and the window of forward counters it accepted.
pub struct RelayLayer {
    /// This hop's keys.
    keys: HopKeys,
    /// Forward cells for us that we accepted.
    window: ReplayWindow,
    /// The next backward counter.
    next: u64,
}

impl std::fmt::Debug for RelayLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayLayer")
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl RelayLayer {
    /// A relay's layer with the keys of its handshake.
    pub fn new(keys: HopKeys) -> Self {
        RelayLayer {
            keys,
            window: ReplayWindow::default(),
            next: 1,
        }
    }

    /// A cell from the client's side: ours, or the cell to forward.
    ///
    /// # Errors
    ///
    /// [`Error::DgramReplay`] for a cell of ours the window refuses (drop
    /// it).
    pub fn inbound(&mut self, mut cell: SealedCell) -> Result<Inbound, Error> {
        let unwrapped = self.keys.unwrap_header(Way::Forward, &cell.header);
        if let Some((counter, plaintext)) = self.keys.open(Way::Forward, &unwrapped, &cell.body) {
            if !self.window.accept(counter) {
                return Err(Error::DgramReplay { counter });
            }
            return Ok(Inbound::Ours { counter, plaintext });
        }
        self.keys
            .apply_layer(Way::Forward, &cell.header, &mut cell.body);
        cell.header = unwrapped;
        Ok(Inbound::Forward(cell))
    }

    /// Add our layer to a cell from the exit's side, on its way to the
    /// client.
    pub fn outbound(&self, mut cell: SealedCell) -> SealedCell {
        cell.header = self.keys.wrap_header(Way::Backward, &cell.header);
        self.keys
            .apply_layer(Way::Backward, &cell.header, &mut cell.body);
        cell
    }

    /// Seal `plaintext` for the client, under a fresh backward counter.
    ///
    /// # Errors
    ///
    /// [`Error::DgramCountersExhausted`] after 2^64 - 2 cells.
    pub fn seal(&mut self, plaintext: &Plaintext) -> Result<SealedCell, Error> {
        let counter = next_counter(&mut self.next)?;
        self.keys.seal(Way::Backward, counter, plaintext)
    }
}

#[cfg(test)]
mod tests;
