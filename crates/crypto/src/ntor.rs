//! The ntor handshake (tor-spec "The ntor handshake", PROTOID
//! `ntor-curve25519-sha256-1`), client and server side.
//!
//! ```text
//! client -> server (CREATE2 HDATA, 84 bytes):  ID(20) | B(32) | X(32)
//! server -> client (CREATED2 HDATA, 64 bytes): Y(32) | AUTH(32)
//!
//! secret_input = EXP(Y,x) | EXP(B,x) | ID | B | X | Y | PROTOID   (client)
//!              = EXP(X,y) | EXP(X,b) | ID | B | X | Y | PROTOID   (server)
//! KEY_SEED     = H(secret_input, t_key)
//! verify       = H(secret_input, t_verify)
//! auth_input   = verify | ID | B | Y | X | PROTOID | "Server"
//! AUTH         = H(auth_input, t_mac)
//! keys         = KDF-RFC5869(secret_input, salt = t_key, info = m_expand)
//! ```
//!
//! where `H(x, t)` is HMAC-SHA256 with key `t` over message `x`.
//!
//! `H(x, t)` is computed here as HKDF-Extract with salt `t` and input `x`,
//! which RFC 5869 defines as exactly `HMAC-Hash(salt, IKM)`; the extract
//! interface lets us feed the inputs piecewise without assembling them.

use hkdf::HkdfExtract;
use tor_llcrypto::d::Sha256;
use tor_llcrypto::pk::curve25519::{PublicKey, SharedSecret, StaticSecret};
use tor_llcrypto::pk::rsa::RsaIdentity;
use tor_llcrypto::util::ct::CtByteArray;

use crate::relay_crypto::{LayerKeys, LAYER_KEY_MATERIAL_LEN};
use crate::Error;

/// Length of the client's CREATE2 handshake data: `ID(20) | B(32) | X(32)`.
pub const CLIENT_HANDSHAKE_LEN: usize = 84;
/// Length of the server's CREATED2 handshake data: `Y(32) | AUTH(32)`.
pub const SERVER_HANDSHAKE_LEN: usize = 64;
/// The `HTYPE` of ntor in CREATE2/EXTEND2.
pub const NTOR_HTYPE: u16 = 0x0002;

/// PROTOID.
const PROTOID: &[u8] = b"ntor-curve25519-sha256-1";
/// t_mac = PROTOID | ":mac".
const T_MAC: &[u8] = b"ntor-curve25519-sha256-1:mac";
/// t_key = PROTOID | ":key_extract".
const T_KEY: &[u8] = b"ntor-curve25519-sha256-1:key_extract";
/// t_verify = PROTOID | ":verify".
const T_VERIFY: &[u8] = b"ntor-curve25519-sha256-1:verify";
/// m_expand = PROTOID | ":key_expand".
const M_EXPAND: &[u8] = b"ntor-curve25519-sha256-1:key_expand";
/// The constant that ends auth_input.
const SERVER_STR: &[u8] = b"Server";

/// Length of a node ID.
const ID_LEN: usize = 20;
/// Length of a curve25519 public key.
const KEY_LEN: usize = 32;

/// Keys a handshake's output expands into: tor1's ([`LayerKeys`]) or the
/// datagram circuits' ([`HopKeys`](crate::dgram::HopKeys)), each under its
/// own `m_expand`, so one handshake never gives both the same bytes.
pub trait ExpandedKeys: Sized {
    /// The HKDF `info` (ntor's `m_expand`) of these keys.
    const M_EXPAND: &'static [u8];
    /// Bytes of key material (at most [`MAX_KEY_MATERIAL_LEN`]).
    const LEN: usize;
    /// The keys from [`Self::LEN`] bytes of material.
    ///
    /// # Errors
    ///
    /// [`Error::BadLength`] for material of another length.
    fn from_material(material: &[u8]) -> Result<Self, Error>;
}

/// The most key material an [`ExpandedKeys`] may ask for.
pub const MAX_KEY_MATERIAL_LEN: usize = 128;

impl ExpandedKeys for LayerKeys {
    const M_EXPAND: &'static [u8] = M_EXPAND;
    const LEN: usize = LAYER_KEY_MATERIAL_LEN;
    fn from_material(material: &[u8]) -> Result<Self, Error> {
        LayerKeys::from_kdf_output(material)
    }
}

/// Everything both sides agree on once the DH outputs are known.
struct Transcript<'a> {
    /// `ID`.
    id: &'a [u8; ID_LEN],
    /// `B`.
    b: &'a [u8; KEY_LEN],
    /// `X`.
    x: &'a [u8; KEY_LEN],
    /// `Y`.
    y: &'a [u8; KEY_LEN],
}

/// What both sides derive from `secret_input`.
struct Derived<K> {
    /// `AUTH`.
    auth: [u8; 32],
    /// The hop keys.
    keys: K,
}

/// `H(secret_input, t)`, feeding `secret_input` piecewise.
fn h_secret_input(
    t: &[u8],
    dh1: &SharedSecret,
    dh2: &SharedSecret,
    tr: &Transcript<'_>,
) -> HkdfExtract<Sha256> {
    let mut h = HkdfExtract::<Sha256>::new(Some(t));
    h.input_ikm(dh1.as_bytes());
    h.input_ikm(dh2.as_bytes());
    h.input_ikm(tr.id);
    h.input_ikm(tr.b);
    h.input_ikm(tr.x);
    h.input_ikm(tr.y);
    h.input_ikm(PROTOID);
    h
}

/// The common core: from the two DH outputs (first `EXP(Y,x)`, then
/// `EXP(B,x)`) and the public transcript, compute AUTH and the keys.
fn derive<K: ExpandedKeys>(
    dh1: &SharedSecret,
    dh2: &SharedSecret,
    tr: &Transcript<'_>,
) -> Result<Derived<K>, Error> {
    // KEY_SEED = H(secret_input, t_key) is the HKDF PRK; keys = expand.
    let (_key_seed, hk) = h_secret_input(T_KEY, dh1, dh2, tr).finalize();
    let mut material = zeroize::Zeroizing::new([0u8; MAX_KEY_MATERIAL_LEN]);
    let material = material.get_mut(..K::LEN).ok_or(Error::KdfOutputTooLong {
        requested: K::LEN,
        max: MAX_KEY_MATERIAL_LEN,
    })?;
    hk.expand(K::M_EXPAND, material)
        .map_err(|_| Error::KdfOutputTooLong {
            requested: K::LEN,
            max: crate::kdf::KDF_RFC5869_MAX_OUTPUT,
        })?;
    let keys = K::from_material(material)?;

    let (verify, _) = h_secret_input(T_VERIFY, dh1, dh2, tr).finalize();
    let mut a = HkdfExtract::<Sha256>::new(Some(T_MAC));
    a.input_ikm(&verify);
    a.input_ikm(tr.id);
    a.input_ikm(tr.b);
    a.input_ikm(tr.y);
    a.input_ikm(tr.x);
    a.input_ikm(PROTOID);
    a.input_ikm(SERVER_STR);
    let (auth, _) = a.finalize();
    Ok(Derived {
        auth: auth.into(),
        keys,
    })
}

/// Client state between sending CREATE2 and receiving CREATED2.
pub struct NtorClient {
    /// Our ephemeral secret `x`.
    x: StaticSecret,
    /// `X`.
    x_pub: PublicKey,
    /// The relay's node ID.
    id: [u8; ID_LEN],
    /// The relay's onion key `B`.
    b: PublicKey,
}

impl NtorClient {
    /// Start a handshake with the relay whose ntor node ID is `node_id` and
    /// whose onion key is `onion_key`. Returns the state to keep and the 84
    /// bytes of CREATE2/EXTEND2 handshake data to send.
    pub fn start<R: rand::Rng + rand::CryptoRng>(
        rng: &mut R,
        node_id: &RsaIdentity,
        onion_key: &PublicKey,
    ) -> (Self, [u8; CLIENT_HANDSHAKE_LEN]) {
        Self::start_with_secret(StaticSecret::random_from_rng(rng), node_id, onion_key)
    }

    /// [`start`](Self::start) with a caller-chosen ephemeral secret `x`.
    ///
    /// For known-answer tests only: reusing `x` across handshakes breaks
    /// ntor's forward secrecy.
    pub fn start_with_secret(
        x: StaticSecret,
        node_id: &RsaIdentity,
        onion_key: &PublicKey,
    ) -> (Self, [u8; CLIENT_HANDSHAKE_LEN]) {
        let x_pub = PublicKey::from(&x);
        let mut id = [0u8; ID_LEN];
        id.copy_from_slice(node_id.as_bytes());
        let mut msg = [0u8; CLIENT_HANDSHAKE_LEN];
        msg[..ID_LEN].copy_from_slice(&id);
        msg[ID_LEN..ID_LEN + KEY_LEN].copy_from_slice(onion_key.as_bytes());
        msg[ID_LEN + KEY_LEN..].copy_from_slice(x_pub.as_bytes());
        let state = NtorClient {
            x,
            x_pub,
            id,
            b: *onion_key,
        };
        (state, msg)
    }

    /// Process the server's CREATED2/EXTENDED2 handshake data.
    ///
    /// Verifies AUTH (constant-time) and returns the keys of the new hop.
    ///
    /// # Errors
    ///
    /// [`Error::BadLength`] if `reply` is not [`SERVER_HANDSHAKE_LEN`]
    /// bytes, [`Error::NtorDegenerateKey`] if `Y` gives an all-zero DH
    /// output, [`Error::NtorBadAuth`] if AUTH does not verify.
    pub fn finish(self, reply: &[u8]) -> Result<LayerKeys, Error> {
        self.finish_as(reply)
    }

    /// [`finish`](Self::finish), expanding into keys of another kind (the
    /// datagram circuits' [`HopKeys`](crate::dgram::HopKeys)).
    ///
    /// # Errors
    ///
    /// As [`finish`](Self::finish).
    pub fn finish_as<K: ExpandedKeys>(self, reply: &[u8]) -> Result<K, Error> {
        let reply: &[u8; SERVER_HANDSHAKE_LEN] =
            reply.try_into().map_err(|_| Error::BadLength {
                what: "ntor server handshake",
                expected: SERVER_HANDSHAKE_LEN,
                got: reply.len(),
            })?;
        let mut y = [0u8; KEY_LEN];
        y.copy_from_slice(&reply[..KEY_LEN]);
        let mut their_auth = [0u8; 32];
        their_auth.copy_from_slice(&reply[KEY_LEN..]);

        let y_pub = PublicKey::from(y);
        let xy = self.x.diffie_hellman(&y_pub);
        let xb = self.x.diffie_hellman(&self.b);
        // Compute everything before deciding, so the time taken does not
        // say which check failed.
        let contributory = xy.was_contributory() & xb.was_contributory();
        let tr = Transcript {
            id: &self.id,
            b: self.b.as_bytes(),
            x: self.x_pub.as_bytes(),
            y: &y,
        };
        let derived = derive::<K>(&xy, &xb, &tr)?;
        let auth_ok = CtByteArray::from(derived.auth) == CtByteArray::from(their_auth);
        if !contributory {
            return Err(Error::NtorDegenerateKey { side: "client" });
        }
        if !auth_ok {
            return Err(Error::NtorBadAuth);
        }
        Ok(derived.keys)
    }

    /// The relay node ID this handshake is addressed to.
    pub fn node_id(&self) -> RsaIdentity {
        RsaIdentity::from(self.id)
    }
}

impl std::fmt::Debug for NtorClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NtorClient")
            .field("node_id", &self.node_id())
            .finish_non_exhaustive()
    }
}

/// Server side of ntor.
///
/// Checks that the `ID` and `B` in `client_msg` are ours (else an error),
/// does the DH, and returns the 64-byte reply for CREATED2/EXTENDED2 and the
/// keys of the new hop.
///
/// # Errors
///
/// [`Error::BadLength`] if `client_msg` is not [`CLIENT_HANDSHAKE_LEN`]
/// bytes, [`Error::NtorWrongNodeId`], [`Error::NtorWrongOnionKey`], or
/// [`Error::NtorDegenerateKey`] if `X` gives an all-zero DH output.
pub fn server_handshake<R: rand::Rng + rand::CryptoRng>(
    rng: &mut R,
    node_id: &RsaIdentity,
    onion_secret: &StaticSecret,
    client_msg: &[u8],
) -> Result<([u8; SERVER_HANDSHAKE_LEN], LayerKeys), Error> {
    server_handshake_with_secret(
        StaticSecret::random_from_rng(rng),
        node_id,
        onion_secret,
        client_msg,
    )
}

/// [`server_handshake`] with a caller-chosen ephemeral secret `y`.
///
/// For known-answer tests only: reusing `y` across handshakes breaks ntor's
/// forward secrecy.
///
/// # Errors
///
/// As [`server_handshake`].
pub fn server_handshake_with_secret(
    y: StaticSecret,
    node_id: &RsaIdentity,
    onion_secret: &StaticSecret,
    client_msg: &[u8],
) -> Result<([u8; SERVER_HANDSHAKE_LEN], LayerKeys), Error> {
    let onion_public = PublicKey::from(onion_secret);
    server_core(y, node_id, onion_secret, &onion_public, client_msg)
}

/// [`server_handshake`] for a caller that already has the public half of
/// its onion key, which saves a scalar multiplication per handshake
/// ([`RelaySecretKeys::ntor_server_handshake`](crate::identity::RelaySecretKeys::ntor_server_handshake)
/// uses this).
///
/// `onion_public` must be `PublicKey::from(onion_secret)`; if it is not,
/// clients naming the real key are refused and the handshakes that are
/// accepted fail at the client's AUTH check.
///
/// # Errors
///
/// As [`server_handshake`].
pub fn server_handshake_with_public<R: rand::Rng + rand::CryptoRng>(
    rng: &mut R,
    node_id: &RsaIdentity,
    onion_secret: &StaticSecret,
    onion_public: &PublicKey,
    client_msg: &[u8],
) -> Result<([u8; SERVER_HANDSHAKE_LEN], LayerKeys), Error> {
    server_handshake_with_public_as(rng, node_id, onion_secret, onion_public, client_msg)
}

/// [`server_handshake_with_public`], expanding into keys of another kind
/// (the datagram circuits' [`HopKeys`](crate::dgram::HopKeys)).
///
/// # Errors
///
/// As [`server_handshake`].
pub fn server_handshake_with_public_as<K: ExpandedKeys, R: rand::Rng + rand::CryptoRng>(
    rng: &mut R,
    node_id: &RsaIdentity,
    onion_secret: &StaticSecret,
    onion_public: &PublicKey,
    client_msg: &[u8],
) -> Result<([u8; SERVER_HANDSHAKE_LEN], K), Error> {
    server_core(
        StaticSecret::random_from_rng(rng),
        node_id,
        onion_secret,
        onion_public,
        client_msg,
    )
}

/// The server side, given every input explicitly.
fn server_core<K: ExpandedKeys>(
    y: StaticSecret,
    node_id: &RsaIdentity,
    onion_secret: &StaticSecret,
    our_b: &PublicKey,
    client_msg: &[u8],
) -> Result<([u8; SERVER_HANDSHAKE_LEN], K), Error> {
    let msg: &[u8; CLIENT_HANDSHAKE_LEN] = client_msg.try_into().map_err(|_| Error::BadLength {
        what: "ntor client handshake",
        expected: CLIENT_HANDSHAKE_LEN,
        got: client_msg.len(),
    })?;
    let mut id = [0u8; ID_LEN];
    id.copy_from_slice(&msg[..ID_LEN]);
    let mut b = [0u8; KEY_LEN];
    b.copy_from_slice(&msg[ID_LEN..ID_LEN + KEY_LEN]);
    let mut x = [0u8; KEY_LEN];
    x.copy_from_slice(&msg[ID_LEN + KEY_LEN..]);

    if node_id.as_bytes() != id {
        return Err(Error::NtorWrongNodeId {
            got: RsaIdentity::from(id).as_hex_upper(),
            ours: node_id.as_hex_upper(),
        });
    }
    if our_b.as_bytes() != &b {
        return Err(Error::NtorWrongOnionKey);
    }

    let x_pub = PublicKey::from(x);
    let y_pub = PublicKey::from(&y);
    let xy = y.diffie_hellman(&x_pub);
    let xb = onion_secret.diffie_hellman(&x_pub);
    if !(xy.was_contributory() & xb.was_contributory()) {
        return Err(Error::NtorDegenerateKey { side: "server" });
    }
    let tr = Transcript {
        id: &id,
        b: &b,
        x: &x,
        y: y_pub.as_bytes(),
    };
    let derived = derive::<K>(&xy, &xb, &tr)?;
    let mut reply = [0u8; SERVER_HANDSHAKE_LEN];
    reply[..KEY_LEN].copy_from_slice(y_pub.as_bytes());
    reply[KEY_LEN..].copy_from_slice(&derived.auth);
    Ok((reply, derived.keys))
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::identity::RelaySecretKeys;

    fn h32(s: &str) -> [u8; 32] {
        hex::decode(s).unwrap().try_into().unwrap()
    }

    /// Known-answer test. The vector (keys, IDs and expected messages) is the
    /// ntor v1 vector arti's tor-proto carries (`ntor.rs`, `testvec`),
    /// produced with tor's reference implementation; it covers the first 72
    /// bytes of key material (`Df|Db|Kf|Kb`), which our 92 bytes extend.
    #[test]
    fn known_answer_vector() {
        let b_sk = h32("4820544f4c4420594f5520444f474954204b454550532048415050454e494e47");
        let b_pk = h32("ccbc8541904d18af08753eae967874749e6149f873de937f57f8fd903a21c471");
        let x_sk = h32("706f6461792069207075742e2e2e2e2e2e2e2e4a454c4c59206f6e2074686973");
        let x_pk = h32("e65dfdbef8b2635837fe2cebc086a8096eae3213e6830dc407516083d412b078");
        let y_sk = h32("70686520737175697272656c2e2e2e2e2e2e2e2e686173206869732067616d65");
        let y_pk = h32("390480a14362761d6aec1fea840f6e9e928fb2adb7b25c670be1045e35133a37");
        let id = hex::decode("69546f6c64596f7541626f75745374616972732e").unwrap();
        let client_handshake = "69546f6c64596f7541626f75745374616972732e\
            ccbc8541904d18af08753eae967874749e6149f873de937f57f8fd903a21c471\
            e65dfdbef8b2635837fe2cebc086a8096eae3213e6830dc407516083d412b078";
        let server_handshake = "390480a14362761d6aec1fea840f6e9e928fb2adb7b25c670be1045e35133a37\
            1cbdf68b89923e1f85e8e18ee6e805ea333fe4849c790ffd2670bd80fec95cc8";
        let keys72 = "0c62dee7f48893370d0ef896758d35729867beef1a5121df80e00f79ed349af3\
            9b51cae125719182f19d932a667dae1afbf2e336e6910e7822223e763afad0a1\
            3342157969dc6b79";

        let b = StaticSecret::from(b_sk);
        assert_eq!(PublicKey::from(&b).to_bytes(), b_pk);
        assert_eq!(PublicKey::from(&StaticSecret::from(x_sk)).to_bytes(), x_pk);
        assert_eq!(PublicKey::from(&StaticSecret::from(y_sk)).to_bytes(), y_pk);
        let node_id = RsaIdentity::from_bytes(&id).unwrap();

        let (client, create) =
            NtorClient::start_with_secret(StaticSecret::from(x_sk), &node_id, &b_pk.into());
        assert_eq!(hex::encode(create), client_handshake);

        let (created, server_keys) =
            server_handshake_with_secret(StaticSecret::from(y_sk), &node_id, &b, &create).unwrap();
        assert_eq!(hex::encode(created), server_handshake);

        let client_keys = client.finish(&created).unwrap();
        assert_eq!(hex::encode(&client_keys.to_bytes()[..72]), keys72);
        assert_eq!(hex::encode(&server_keys.to_bytes()[..72]), keys72);
        assert_eq!(client_keys.to_bytes(), server_keys.to_bytes());
    }

    /// The 92-byte output is KDF-RFC5869 over secret_input, recomputed here
    /// from its definition with `kdf_rfc5869` (so the KH part, beyond the
    /// 72 bytes the vector pins, is checked as well).
    #[test]
    fn key_material_is_kdf_of_secret_input() {
        let b = StaticSecret::from([3u8; 32]);
        let b_pub = PublicKey::from(&b);
        let x = StaticSecret::from([5u8; 32]);
        let y = StaticSecret::from([7u8; 32]);
        let node_id = RsaIdentity::from([9u8; 20]);
        let (client, create) = NtorClient::start_with_secret(x.clone(), &node_id, &b_pub);
        let (created, skeys) =
            server_handshake_with_secret(y.clone(), &node_id, &b, &create).unwrap();
        let ckeys = client.finish(&created).unwrap();

        let y_pub = PublicKey::from(&y);
        let mut secret_input = Vec::new();
        secret_input.extend_from_slice(x.diffie_hellman(&y_pub).as_bytes());
        secret_input.extend_from_slice(x.diffie_hellman(&b_pub).as_bytes());
        secret_input.extend_from_slice(node_id.as_bytes());
        secret_input.extend_from_slice(b_pub.as_bytes());
        secret_input.extend_from_slice(PublicKey::from(&x).as_bytes());
        secret_input.extend_from_slice(y_pub.as_bytes());
        secret_input.extend_from_slice(b"ntor-curve25519-sha256-1");
        let mut want = [0u8; 92];
        crate::kdf::kdf_rfc5869(
            &secret_input,
            b"ntor-curve25519-sha256-1:key_extract",
            b"ntor-curve25519-sha256-1:key_expand",
            &mut want,
        )
        .unwrap();
        assert_eq!(ckeys.to_bytes(), want);
        assert_eq!(skeys.to_bytes(), want);
        assert_eq!(&ckeys.kh()[..], &want[72..]);
    }

    fn relay() -> (RelaySecretKeys, RsaIdentity, PublicKey) {
        let keys = RelaySecretKeys::generate(&mut rand::rng());
        let public = keys.public();
        (keys, public.ntor_node_id(), public.onion_key)
    }

    #[test]
    fn round_trip_gives_equal_keys() {
        let mut rng = rand::rng();
        for _ in 0..8 {
            let (sk, id, b) = relay();
            let (client, create) = NtorClient::start(&mut rng, &id, &b);
            assert_eq!(client.node_id(), id);
            let (created, skeys) =
                server_handshake(&mut rng, &id, sk.onion_secret(), &create).unwrap();
            let ckeys = client.finish(&created).unwrap();
            assert_eq!(ckeys.to_bytes(), skeys.to_bytes());
        }
    }

    #[test]
    fn handshakes_are_fresh() {
        let mut rng = rand::rng();
        let (sk, id, b) = relay();
        let (c1, m1) = NtorClient::start(&mut rng, &id, &b);
        let (c2, m2) = NtorClient::start(&mut rng, &id, &b);
        assert_ne!(m1, m2);
        let (r1, k1) = server_handshake(&mut rng, &id, sk.onion_secret(), &m1).unwrap();
        let (r2, k2) = server_handshake(&mut rng, &id, sk.onion_secret(), &m2).unwrap();
        assert_ne!(k1.to_bytes(), k2.to_bytes());
        // Replies are bound to their own handshake.
        assert_eq!(c1.finish(&r2).unwrap_err(), Error::NtorBadAuth);
        assert_eq!(c2.finish(&r1).unwrap_err(), Error::NtorBadAuth);
    }

    #[test]
    fn tampered_reply_is_rejected() {
        let mut rng = rand::rng();
        let (sk, id, b) = relay();
        // Every single-bit flip, in Y or in AUTH, must be caught.
        let (_, create) = NtorClient::start_with_secret(StaticSecret::from([1u8; 32]), &id, &b);
        let (created, _) = server_handshake(&mut rng, &id, sk.onion_secret(), &create).unwrap();
        for byte in 0..SERVER_HANDSHAKE_LEN {
            for bit in 0..8 {
                // (Flipping Y's top bit leaves its x25519 value alone, but
                // Y's bytes are in the transcript, so AUTH still fails.)
                let mut bad = created;
                bad[byte] ^= 1 << bit;
                let (client, _) =
                    NtorClient::start_with_secret(StaticSecret::from([1u8; 32]), &id, &b);
                let err = client.finish(&bad).unwrap_err();
                assert!(
                    matches!(err, Error::NtorBadAuth | Error::NtorDegenerateKey { .. }),
                    "byte {byte} bit {bit}: {err:?}"
                );
            }
        }
        let (client, _) = NtorClient::start_with_secret(StaticSecret::from([1u8; 32]), &id, &b);
        assert!(client.finish(&created).is_ok());
    }

    #[test]
    fn reply_of_wrong_length_is_rejected() {
        let mut rng = rand::rng();
        let (_, id, b) = relay();
        for len in [0, 32, 63, 65, 128] {
            let (client, _) = NtorClient::start(&mut rng, &id, &b);
            assert_eq!(
                client.finish(&vec![1u8; len]).unwrap_err(),
                Error::BadLength {
                    what: "ntor server handshake",
                    expected: 64,
                    got: len
                }
            );
        }
    }

    #[test]
    fn client_message_of_wrong_length_is_rejected() {
        let mut rng = rand::rng();
        let (sk, id, b) = relay();
        let (_, create) = NtorClient::start(&mut rng, &id, &b);
        for len in [0, 20, 52, 83, 85] {
            let mut msg = create.to_vec();
            msg.resize(len, 0);
            let err = server_handshake(&mut rng, &id, sk.onion_secret(), &msg).unwrap_err();
            assert_eq!(
                err,
                Error::BadLength {
                    what: "ntor client handshake",
                    expected: 84,
                    got: len
                }
            );
        }
    }

    #[test]
    fn wrong_node_id_is_rejected() {
        let mut rng = rand::rng();
        let (sk, id, b) = relay();
        let other = RsaIdentity::from([0xAB; 20]);
        let (_, create) = NtorClient::start(&mut rng, &other, &b);
        let err = server_handshake(&mut rng, &id, sk.onion_secret(), &create).unwrap_err();
        assert_eq!(
            err,
            Error::NtorWrongNodeId {
                got: other.as_hex_upper(),
                ours: id.as_hex_upper()
            }
        );
    }

    #[test]
    fn wrong_onion_key_is_rejected() {
        let mut rng = rand::rng();
        let (sk, id, _) = relay();
        let (_, _, other_b) = relay();
        let (_, create) = NtorClient::start(&mut rng, &id, &other_b);
        let err = server_handshake(&mut rng, &id, sk.onion_secret(), &create).unwrap_err();
        assert_eq!(err, Error::NtorWrongOnionKey);
    }

    /// A client that talks to the wrong relay (its onion key is not B) gets
    /// a reply that does not verify.
    #[test]
    fn impostor_relay_is_detected() {
        let mut rng = rand::rng();
        let (_, id, b) = relay();
        let (impostor, _, impostor_b) = relay();
        let (client, create) = NtorClient::start(&mut rng, &id, &b);
        // The impostor answers as if the client had named its key.
        let mut forged = create;
        forged[20..52].copy_from_slice(impostor_b.as_bytes());
        let (reply, _) = server_handshake(&mut rng, &id, impostor.onion_secret(), &forged).unwrap();
        assert_eq!(client.finish(&reply).unwrap_err(), Error::NtorBadAuth);
    }

    /// Small-order curve25519 points (all give an all-zero DH output).
    fn small_order_points() -> Vec<[u8; 32]> {
        let mut one = [0u8; 32];
        one[0] = 1;
        vec![
            [0u8; 32],
            one,
            // Points of order 8 (from the x25519 literature).
            h32("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
            h32("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
            h32("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),
        ]
    }

    #[test]
    fn all_zero_point_is_rejected_by_server() {
        let mut rng = rand::rng();
        let (sk, id, b) = relay();
        for p in small_order_points() {
            let mut msg = [0u8; CLIENT_HANDSHAKE_LEN];
            msg[..20].copy_from_slice(id.as_bytes());
            msg[20..52].copy_from_slice(b.as_bytes());
            msg[52..].copy_from_slice(&p);
            let err = server_handshake(&mut rng, &id, sk.onion_secret(), &msg).unwrap_err();
            assert_eq!(err, Error::NtorDegenerateKey { side: "server" }, "{p:02x?}");
        }
    }

    #[test]
    fn all_zero_point_is_rejected_by_client() {
        let mut rng = rand::rng();
        let (_, id, b) = relay();
        for p in small_order_points() {
            let (client, _) = NtorClient::start(&mut rng, &id, &b);
            let mut reply = [0u8; SERVER_HANDSHAKE_LEN];
            reply[..32].copy_from_slice(&p);
            let err = client.finish(&reply).unwrap_err();
            assert_eq!(err, Error::NtorDegenerateKey { side: "client" }, "{p:02x?}");
        }
    }

    /// Even with AUTH computed correctly by someone who knows the (forced,
    /// all-zero) shared secret, a degenerate Y is refused.
    #[test]
    fn degenerate_y_with_valid_auth_is_rejected() {
        let (sk, id, b) = relay();
        let x = StaticSecret::from([0x11; 32]);
        let (client, create) = NtorClient::start_with_secret(x.clone(), &id, &b);
        let y = [0u8; 32];
        let xy = x.diffie_hellman(&PublicKey::from(y));
        let xb = sk.onion_secret().diffie_hellman(&PublicKey::from(&x));
        let tr = Transcript {
            id: &create[..20].try_into().unwrap(),
            b: b.as_bytes(),
            x: &create[52..].try_into().unwrap(),
            y: &y,
        };
        let d = derive::<LayerKeys>(&xy, &xb, &tr).unwrap();
        let mut reply = [0u8; SERVER_HANDSHAKE_LEN];
        reply[32..].copy_from_slice(&d.auth);
        assert_eq!(
            client.finish(&reply).unwrap_err(),
            Error::NtorDegenerateKey { side: "client" }
        );
    }
}
