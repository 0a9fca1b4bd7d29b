//! tor1 relay-cell crypto (tor-spec "Relay cells").
//!
//! Each hop of a circuit shares with the client two AES-128-CTR streams
//! (`Kf` forward, `Kb` backward, both with an all-zero IV, running for the
//! life of the circuit) and two running SHA-1 digests seeded with `Df` and
//! `Db`. A relay cell body is
//!
//! ```text
//! command(1) recognized(2) stream_id(2) digest(4) length(2) data(498)
//! ```
//!
//! The originator of a cell hashes the whole body (with `recognized` and
//! `digest` zero) into its running digest, writes the first four bytes of
//! the result into `digest`, and encrypts. A hop that removes its layer and
//! sees `recognized == 0` and a matching digest knows the cell is for it.
//!
//! Nothing here allocates per cell.

use cipher::{KeyIvInit, StreamCipher};
use digest::Digest;
use tor_llcrypto::cipher::aes::Aes128Ctr;
use tor_llcrypto::d::Sha1;
use tor_llcrypto::util::ct::CtByteArray;
use zeroize::Zeroize;

use crate::{CellBody, Error, SendmeTag};

/// Length of the key material one hop needs: `Df | Db | Kf | Kb | KH`.
pub const LAYER_KEY_MATERIAL_LEN: usize = 92;

/// Offset of the 2-byte `recognized` field in a relay cell body.
const RECOGNIZED: std::ops::Range<usize> = 1..3;
/// Offset of the 4-byte `digest` field in a relay cell body.
const DIGEST: std::ops::Range<usize> = 5..9;

/// Keys of one hop, from the 92-byte KDF output
/// `Df(20) | Db(20) | Kf(16) | Kb(16) | KH(20)`.
///
/// The key bytes are wiped when the value is dropped.
#[derive(Clone)]
pub struct LayerKeys {
    /// Forward digest seed.
    df: [u8; 20],
    /// Backward digest seed.
    db: [u8; 20],
    /// Forward AES-128 key.
    kf: [u8; 16],
    /// Backward AES-128 key.
    kb: [u8; 16],
    /// `KH`, the "derivative key data" (used by onion services, and
    /// available for anything else that wants a value bound to the hop).
    kh: [u8; 20],
}

impl LayerKeys {
    /// Split KDF output into the hop keys.
    ///
    /// # Errors
    ///
    /// [`Error::BadLength`] unless `b` is exactly
    /// [`LAYER_KEY_MATERIAL_LEN`] (92) bytes.
    pub fn from_kdf_output(b: &[u8]) -> Result<Self, Error> {
        let bad_len = || Error::BadLength {
            what: "hop key material",
            expected: LAYER_KEY_MATERIAL_LEN,
            got: b.len(),
        };
        if b.len() != LAYER_KEY_MATERIAL_LEN {
            return Err(bad_len());
        }
        Ok(LayerKeys {
            df: b[0..20].try_into().map_err(|_| bad_len())?,
            db: b[20..40].try_into().map_err(|_| bad_len())?,
            kf: b[40..56].try_into().map_err(|_| bad_len())?,
            kb: b[56..72].try_into().map_err(|_| bad_len())?,
            kh: b[72..92].try_into().map_err(|_| bad_len())?,
        })
    }

    /// The key material back in the layout of
    /// [`from_kdf_output`](Self::from_kdf_output). Secret.
    pub fn to_bytes(&self) -> [u8; LAYER_KEY_MATERIAL_LEN] {
        let mut out = [0u8; LAYER_KEY_MATERIAL_LEN];
        out[0..20].copy_from_slice(&self.df);
        out[20..40].copy_from_slice(&self.db);
        out[40..56].copy_from_slice(&self.kf);
        out[56..72].copy_from_slice(&self.kb);
        out[72..92].copy_from_slice(&self.kh);
        out
    }

    /// `KH`: 20 bytes both ends of the hop share and nobody else knows.
    pub fn kh(&self) -> &[u8; 20] {
        &self.kh
    }
}

impl Drop for LayerKeys {
    fn drop(&mut self) {
        self.df.zeroize();
        self.db.zeroize();
        self.kf.zeroize();
        self.kb.zeroize();
        self.kh.zeroize();
    }
}

impl std::fmt::Debug for LayerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LayerKeys { .. }")
    }
}

/// One direction of one hop: a keystream and a running digest.
struct Direction {
    /// AES-128-CTR, zero IV, running for the whole circuit.
    cipher: Aes128Ctr,
    /// SHA-1 over every cell this direction has originated/recognized,
    /// seeded with `Df` or `Db`.
    digest: Sha1,
}

impl Direction {
    /// Set up a direction from its AES key and digest seed.
    fn new(key: &[u8; 16], seed: &[u8; 20]) -> Self {
        let iv = [0u8; 16];
        let cipher = Aes128Ctr::new(&(*key).into(), &iv.into());
        let mut digest = Sha1::new();
        digest.update(seed);
        Direction { cipher, digest }
    }

    /// XOR the next 509 bytes of keystream into `body`.
    #[inline]
    fn apply(&mut self, body: &mut CellBody) {
        self.cipher.apply_keystream(body);
    }

    /// Originate a cell: hash `body` (whose `digest` field the caller has
    /// zeroed), write the first four digest bytes into it, return the tag.
    #[inline]
    fn stamp(&mut self, body: &mut CellBody) -> SendmeTag {
        body[DIGEST].fill(0);
        self.digest.update(&body[..]);
        let tag: SendmeTag = self.digest.clone().finalize().into();
        body[DIGEST].copy_from_slice(&tag[..4]);
        tag
    }

    /// Is this plaintext `body` a cell originated by the other end of this
    /// direction? If so, advance the running digest, clear the `digest`
    /// field (so `body` is exactly what the originator encoded) and return
    /// the tag; otherwise leave the digest state untouched.
    #[inline]
    fn recognize(&mut self, body: &mut CellBody) -> Option<SendmeTag> {
        if body[RECOGNIZED] != [0, 0] {
            return None;
        }
        let mut trial = self.digest.clone();
        trial.update(&body[..DIGEST.start]);
        trial.update([0u8; 4]);
        trial.update(&body[DIGEST.end..]);
        let tag: SendmeTag = trial.clone().finalize().into();
        let mut got = [0u8; 4];
        got.copy_from_slice(&body[DIGEST]);
        let mut want = [0u8; 4];
        want.copy_from_slice(&tag[..4]);
        if CtByteArray::from(got) != CtByteArray::from(want) {
            return None;
        }
        self.digest = trial;
        body[DIGEST].fill(0);
        Some(tag)
    }
}

/// Both directions of one hop.
struct Layer {
    /// Client -> relay: `Kf`, `Df`.
    fwd: Direction,
    /// Relay -> client: `Kb`, `Db`.
    back: Direction,
}

impl Layer {
    /// Set up both directions from the hop keys.
    fn new(keys: &LayerKeys) -> Self {
        Layer {
            fwd: Direction::new(&keys.kf, &keys.df),
            back: Direction::new(&keys.kb, &keys.db),
        }
    }
}

/// Client-side crypto for a whole circuit: one layer per hop, hop 0 = guard.
#[derive(Default)]
pub struct ClientCircuitCrypto {
    /// The hops, guard first.
    layers: Vec<Layer>,
}

impl ClientCircuitCrypto {
    /// A circuit with no hops yet.
    pub fn new() -> Self {
        ClientCircuitCrypto { layers: Vec::new() }
    }

    /// Add the next hop (after its CREATED2/EXTENDED2 arrived).
    pub fn add_layer(&mut self, keys: &LayerKeys) {
        self.layers.push(Layer::new(keys));
    }

    /// Number of hops.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Drop every hop after the first `n` (after a TRUNCATED from hop `n - 1`).
    pub fn truncate(&mut self, n: usize) {
        self.layers.truncate(n);
    }

    /// Send a cell to hop `hop`.
    ///
    /// `body` is a plaintext relay cell body with recognized=0 and digest=0
    /// (as tor-cell encodes it). Updates hop `hop`'s forward digest over it,
    /// writes the first 4 digest bytes into `body[5..9]`, then encrypts with
    /// the forward ciphers of hops `hop, hop-1, ..., 0`. Returns the 20-byte
    /// running digest after this cell (the SENDME v1 tag).
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchHop`] if `hop >= n_layers()`; `body` and all state are
    /// then untouched.
    pub fn encrypt_outbound(
        &mut self,
        body: &mut CellBody,
        hop: usize,
    ) -> Result<SendmeTag, Error> {
        let n_layers = self.layers.len();
        let Some(target) = self.layers.get_mut(hop) else {
            return Err(Error::NoSuchHop { hop, n_layers });
        };
        let tag = target.fwd.stamp(body);
        for layer in self.layers[..=hop].iter_mut().rev() {
            layer.fwd.apply(body);
        }
        Ok(tag)
    }

    /// Receive a cell from the circuit.
    ///
    /// Removes layers 0, 1, ... in turn until one hop recognizes the cell
    /// (recognized == 0 and the digest matches that hop's backward running
    /// digest; on mismatch that digest is not advanced). On success `body`
    /// is the plaintext with the digest field cleared to zero, and the result
    /// is `(hop, tag)`. `None` means no hop recognized it: the caller must
    /// close the circuit (the keystreams have moved on, so `body` is junk).
    pub fn decrypt_inbound(&mut self, body: &mut CellBody) -> Option<(usize, SendmeTag)> {
        for (hop, layer) in self.layers.iter_mut().enumerate() {
            layer.back.apply(body);
            if let Some(tag) = layer.back.recognize(body) {
                return Some((hop, tag));
            }
        }
        None
    }
}

impl std::fmt::Debug for ClientCircuitCrypto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCircuitCrypto")
            .field("n_layers", &self.layers.len())
            .finish_non_exhaustive()
    }
}

/// One relay's layer of a circuit.
pub struct RelayLayer {
    /// Our hop's two directions.
    layer: Layer,
}

impl RelayLayer {
    /// Set up from the keys our ntor server handshake produced.
    pub fn new(keys: &LayerKeys) -> Self {
        RelayLayer {
            layer: Layer::new(keys),
        }
    }

    /// A cell moving away from the client: remove our layer.
    ///
    /// `Some(tag)` if it is recognized and addressed to us (digest state
    /// advanced; `body` is the plaintext with the digest field cleared to
    /// zero); `None` if it must be forwarded to the next hop (digest state
    /// untouched).
    pub fn decrypt_outbound(&mut self, body: &mut CellBody) -> Option<SendmeTag> {
        self.layer.fwd.apply(body);
        self.layer.fwd.recognize(body)
    }

    /// Originate a cell toward the client: `body` has recognized=0 and
    /// digest=0; set the digest with `Db`, encrypt with `Kb`. Returns the
    /// SENDME v1 tag of the cell.
    pub fn originate_inbound(&mut self, body: &mut CellBody) -> SendmeTag {
        let tag = self.layer.back.stamp(body);
        self.layer.back.apply(body);
        tag
    }

    /// Add our layer to a cell from the next hop moving toward the client.
    pub fn encrypt_inbound(&mut self, body: &mut CellBody) {
        self.layer.back.apply(body);
    }
}

impl std::fmt::Debug for RelayLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RelayLayer { .. }")
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::CELL_BODY_LEN;
    use proptest::prelude::*;

    /// A plaintext relay cell body as tor-cell would encode it.
    fn cell(cmd: u8, stream_id: u16, data: &[u8]) -> CellBody {
        let mut b = [0u8; CELL_BODY_LEN];
        b[0] = cmd;
        b[3..5].copy_from_slice(&stream_id.to_be_bytes());
        b[9..11].copy_from_slice(&u16::try_from(data.len()).unwrap().to_be_bytes());
        b[11..11 + data.len()].copy_from_slice(data);
        b
    }

    fn keys(seed: u8) -> LayerKeys {
        let material: Vec<u8> = (0..92u8).map(|i| i.wrapping_add(seed)).collect();
        LayerKeys::from_kdf_output(&material).unwrap()
    }

    /// A client circuit and its relays, all from the same keys.
    fn circuit(n: usize) -> (ClientCircuitCrypto, Vec<RelayLayer>) {
        let mut client = ClientCircuitCrypto::new();
        let mut relays = Vec::new();
        for i in 0..n {
            let k = keys(u8::try_from(i).unwrap() * 100);
            client.add_layer(&k);
            relays.push(RelayLayer::new(&k));
        }
        (client, relays)
    }

    /// Send `body` from the client to `hop`, pass it down the relays, and
    /// return which relay recognized it, with its tag.
    fn send_out(
        client: &mut ClientCircuitCrypto,
        relays: &mut [RelayLayer],
        body: &mut CellBody,
        hop: usize,
    ) -> (SendmeTag, Option<(usize, SendmeTag)>) {
        let ctag = client.encrypt_outbound(body, hop).unwrap();
        for (i, r) in relays.iter_mut().enumerate() {
            if let Some(rtag) = r.decrypt_outbound(body) {
                return (ctag, Some((i, rtag)));
            }
        }
        (ctag, None)
    }

    /// Originate `body` at relay `hop`, layer it through hops hop-1..0, and
    /// let the client receive it.
    fn send_in(
        client: &mut ClientCircuitCrypto,
        relays: &mut [RelayLayer],
        body: &mut CellBody,
        hop: usize,
    ) -> (SendmeTag, Option<(usize, SendmeTag)>) {
        let rtag = relays[hop].originate_inbound(body);
        for r in relays[..hop].iter_mut().rev() {
            r.encrypt_inbound(body);
        }
        (rtag, client.decrypt_inbound(body))
    }

    fn sha256(b: &[u8]) -> String {
        use tor_llcrypto::d::Sha256;
        hex::encode(Sha256::digest(b))
    }

    /// Known answers, computed independently with Python's `hashlib` and
    /// `cryptography` (AES-128-CTR, zero IV; SHA-1 seeded with Df/Db over
    /// the body with a zero digest field): checks the key layout, the
    /// digest placement, running state across cells and the layering.
    #[test]
    fn known_answer_layout() {
        let material: Vec<u8> = (0..92u8).collect();
        let k1 = LayerKeys::from_kdf_output(&material).unwrap();
        let material: Vec<u8> = (100..192u8).collect();
        let k2 = LayerKeys::from_kdf_output(&material).unwrap();
        let mut client = ClientCircuitCrypto::new();
        client.add_layer(&k1);
        client.add_layer(&k2);

        let mut b = cell(2, 1, b"hello");
        let tag = client.encrypt_outbound(&mut b, 1).unwrap();
        assert_eq!(hex::encode(tag), "7401f2292ccce1733eb35c50f4320da74e60ef20");
        assert_eq!(
            sha256(&b),
            "908eebc2209a60f7ffef71552af4cdd27514149149789b69dafdd26fa2462db3"
        );
        let mut b = cell(2, 1, b"world!");
        let tag = client.encrypt_outbound(&mut b, 1).unwrap();
        assert_eq!(hex::encode(tag), "917777d65e0944e1bd7fc8b3616a530862b05898");
        assert_eq!(
            sha256(&b),
            "7a0a3705646f77c26820c873d1916c557705537089d708b3fef0970c0849fb5e"
        );

        let mut relay = RelayLayer::new(&k1);
        let mut b = cell(4, 7, b"connected");
        let tag = relay.originate_inbound(&mut b);
        assert_eq!(hex::encode(tag), "727ebc2ece028f00cd09e9b64d62672a7387ef97");
        assert_eq!(
            sha256(&b),
            "654f9c70298dc2d07f4de5aea6186f89175605ae986771ffaf1cbfa592215c68"
        );
    }

    #[test]
    fn layer_keys_parse() {
        let material: Vec<u8> = (0..92u8).collect();
        let k = LayerKeys::from_kdf_output(&material).unwrap();
        assert_eq!(k.to_bytes().to_vec(), material);
        assert_eq!(k.kh().to_vec(), (72..92u8).collect::<Vec<_>>());
        assert_eq!(format!("{k:?}"), "LayerKeys { .. }");
        for len in [0, 72, 91, 93] {
            assert_eq!(
                LayerKeys::from_kdf_output(&vec![0; len]).unwrap_err(),
                Error::BadLength {
                    what: "hop key material",
                    expected: 92,
                    got: len
                }
            );
        }
    }

    #[test]
    fn no_such_hop() {
        let (mut client, _) = circuit(3);
        let mut b = cell(2, 1, b"x");
        let orig = b;
        assert_eq!(
            client.encrypt_outbound(&mut b, 3).unwrap_err(),
            Error::NoSuchHop {
                hop: 3,
                n_layers: 3
            }
        );
        assert_eq!(b, orig);
        let mut empty = ClientCircuitCrypto::default();
        assert_eq!(empty.n_layers(), 0);
        assert!(empty.encrypt_outbound(&mut b, 0).is_err());
        assert_eq!(empty.decrypt_inbound(&mut b), None);
    }

    #[test]
    fn outbound_recognized_exactly_at_target() {
        let (mut client, mut relays) = circuit(3);
        assert_eq!(client.n_layers(), 3);
        for round in 0..5u8 {
            for hop in 0..3 {
                let orig = cell(2, 1, &[round; 100]);
                let mut b = orig;
                let (ctag, got) = send_out(&mut client, &mut relays, &mut b, hop);
                assert_eq!(got, Some((hop, ctag)));
                assert_eq!(b, orig);
            }
        }
    }

    #[test]
    fn inbound_recognized_as_originating_hop() {
        let (mut client, mut relays) = circuit(3);
        for round in 0..5u8 {
            for hop in 0..3 {
                let orig = cell(2, 9, &[round; 498]);
                let mut b = orig;
                let (rtag, got) = send_in(&mut client, &mut relays, &mut b, hop);
                assert_eq!(got, Some((hop, rtag)));
                assert_eq!(b, orig);
            }
        }
    }

    #[test]
    fn tags_are_running_digests() {
        // Same cell twice gives different tags (the digest runs on).
        let (mut client, mut relays) = circuit(1);
        let mut a = cell(2, 1, b"same");
        let mut b = cell(2, 1, b"same");
        let (t1, _) = send_out(&mut client, &mut relays, &mut a, 0);
        let (t2, _) = send_out(&mut client, &mut relays, &mut b, 0);
        assert_ne!(t1, t2);
    }

    /// The current value of a running digest (white-box).
    fn digest_now(d: &Direction) -> [u8; 20] {
        d.digest.clone().finalize().into()
    }

    /// A corrupted cell is refused, a refused cell leaves every digest as
    /// it was, and traffic to the hops before the corrupted one carries on.
    /// (The target hop's digest is now behind the client's, which has
    /// counted the cell: as in tor, the circuit must then be closed.)
    #[test]
    fn flipped_bit_outbound_is_refused_without_touching_digests() {
        for byte in [0usize, 1, 2, 5, 8, 10, 300, 508] {
            let (mut client, mut relays) = circuit(3);
            let mut b = cell(2, 1, b"payload");
            client.encrypt_outbound(&mut b, 2).unwrap();
            b[byte] ^= 0x10;
            for r in relays.iter_mut() {
                let before = digest_now(&r.layer.fwd);
                assert_eq!(r.decrypt_outbound(&mut b), None, "byte {byte}");
                assert_eq!(digest_now(&r.layer.fwd), before);
            }
            for hop in [0, 1, 0, 1] {
                let orig = cell(2, 1, b"next");
                let mut b = orig;
                let (ctag, got) = send_out(&mut client, &mut relays, &mut b, hop);
                assert_eq!(got, Some((hop, ctag)));
                assert_eq!(b, orig);
            }
        }
    }

    /// As above, toward the client.
    #[test]
    fn flipped_bit_inbound_is_refused_without_touching_digests() {
        for byte in [0usize, 1, 2, 5, 6, 8, 10, 508] {
            let (mut client, mut relays) = circuit(3);
            let mut b = cell(2, 1, b"payload");
            relays[2].originate_inbound(&mut b);
            relays[1].encrypt_inbound(&mut b);
            relays[0].encrypt_inbound(&mut b);
            b[byte] ^= 0x01;
            let before: Vec<_> = client.layers.iter().map(|l| digest_now(&l.back)).collect();
            assert_eq!(client.decrypt_inbound(&mut b), None, "byte {byte}");
            let after: Vec<_> = client.layers.iter().map(|l| digest_now(&l.back)).collect();
            assert_eq!(before, after);
            for hop in [0, 1, 1, 0] {
                let orig = cell(2, 1, b"next");
                let mut b = orig;
                let (rtag, got) = send_in(&mut client, &mut relays, &mut b, hop);
                assert_eq!(got, Some((hop, rtag)));
                assert_eq!(b, orig);
            }
        }
    }

    #[test]
    fn truncate_drops_later_hops_only() {
        let (mut client, mut relays) = circuit(3);
        let mut b = cell(2, 1, b"before");
        let (ctag, got) = send_out(&mut client, &mut relays, &mut b, 1);
        assert_eq!(got, Some((1, ctag)));
        client.truncate(2);
        assert_eq!(client.n_layers(), 2);
        let mut b = cell(2, 1, b"x");
        assert_eq!(
            client.encrypt_outbound(&mut b, 2).unwrap_err(),
            Error::NoSuchHop {
                hop: 2,
                n_layers: 2
            }
        );
        // The remaining hops are still in step, both ways.
        for hop in 0..2 {
            let orig = cell(2, 1, b"after");
            let mut b = orig;
            let (ctag, got) = send_out(&mut client, &mut relays[..2], &mut b, hop);
            assert_eq!((got, b), (Some((hop, ctag)), orig));
            let mut b = orig;
            let (rtag, got) = send_in(&mut client, &mut relays[..2], &mut b, hop);
            assert_eq!((got, b), (Some((hop, rtag)), orig));
        }
        client.truncate(5);
        assert_eq!(client.n_layers(), 2);
    }

    /// A relay that sees a cell for a later hop must not advance its digest:
    /// the next cell addressed to it is still recognized.
    #[test]
    fn forwarding_does_not_touch_digest() {
        let (mut client, mut relays) = circuit(3);
        for _ in 0..10 {
            let mut b = cell(2, 1, b"for the exit");
            send_out(&mut client, &mut relays, &mut b, 2);
        }
        let orig = cell(2, 1, b"for the middle");
        let mut b = orig;
        let (ctag, got) = send_out(&mut client, &mut relays, &mut b, 1);
        assert_eq!(got, Some((1, ctag)));
        assert_eq!(b, orig);
    }

    /// A relay cell body with recognized = 0 and digest = 0.
    fn arb_body() -> impl Strategy<Value = CellBody> {
        proptest::collection::vec(any::<u8>(), CELL_BODY_LEN).prop_map(|v| {
            let mut b = [0u8; CELL_BODY_LEN];
            b.copy_from_slice(&v);
            b[RECOGNIZED].fill(0);
            b[DIGEST].fill(0);
            b
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any interleaving of outbound and inbound cells, to and from any
        /// hop, with occasional corrupted cells. Every intact cell to or from
        /// a hop before the first corrupted one round-trips and is
        /// recognized at the right hop with matching tags; a corrupted cell
        /// is refused everywhere. (A corrupted cell for hop h puts hops >= h
        /// out of step in that direction, as it would in tor, where the
        /// circuit is closed; beyond that point cells are only required to
        /// be refused.)
        #[test]
        fn random_traffic_stays_in_sync(
            ops in proptest::collection::vec(
                (
                    any::<bool>(),
                    0usize..3,
                    arb_body(),
                    proptest::option::weighted(0.1, (0usize..CELL_BODY_LEN, 0u8..8)),
                ),
                1..40,
            )
        ) {
            let (mut client, mut relays) = circuit(3);
            // Per direction (outbound, inbound): the first hop out of step.
            let mut first_broken = [usize::MAX; 2];
            for (outbound, hop, orig, corrupt) in ops {
                let mut b = orig;
                let (tag, got) = if outbound {
                    let ctag = client.encrypt_outbound(&mut b, hop).unwrap();
                    if let Some((byte, bit)) = corrupt {
                        b[byte] ^= 1 << bit;
                    }
                    let mut got = None;
                    for (i, r) in relays.iter_mut().enumerate() {
                        if let Some(t) = r.decrypt_outbound(&mut b) {
                            got = Some((i, t));
                            break;
                        }
                    }
                    (ctag, got)
                } else {
                    let rtag = relays[hop].originate_inbound(&mut b);
                    for r in relays[..hop].iter_mut().rev() {
                        r.encrypt_inbound(&mut b);
                    }
                    if let Some((byte, bit)) = corrupt {
                        b[byte] ^= 1 << bit;
                    }
                    (rtag, client.decrypt_inbound(&mut b))
                };
                let broken = &mut first_broken[usize::from(!outbound)];
                if corrupt.is_some() || hop >= *broken {
                    prop_assert_eq!(got, None);
                    *broken = (*broken).min(hop);
                } else {
                    prop_assert_eq!(got, Some((hop, tag)));
                    prop_assert_eq!(b, orig);
                }
            }
        }
    }
}
