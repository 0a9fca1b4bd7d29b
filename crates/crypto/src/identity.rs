//! Relay identity and onion keys, and the node ID ntor v1 needs.

use digest::Digest;
use tor_llcrypto::d::Sha1;
use tor_llcrypto::pk::curve25519::{PublicKey, StaticSecret};
use tor_llcrypto::pk::ed25519::{Ed25519Identity, Keypair};
use tor_llcrypto::pk::rsa::RsaIdentity;
use zeroize::Zeroize;

use crate::relay_crypto::LayerKeys;
use crate::Error;

/// What the derivation of a relay's Sphinx key (MORE) covers first.
const SPHINX_KEY_LABEL: &[u8] = b"onionlab MORE sphinx key v1";

/// Length of [`RelaySecretKeys::to_bytes`]: Ed25519 seed (32) and x25519
/// secret (32).
pub const RELAY_SECRET_KEYS_LEN: usize = 64;

/// Domain-separation prefix hashed before the Ed25519 identity in
/// [`ntor_node_id`].
pub const NTOR_NODE_ID_PREFIX: &[u8] = b"onionlab-ntor-node-id";

/// Secret keys of one relay: Ed25519 identity keypair + x25519 ntor onion key.
pub struct RelaySecretKeys {
    /// Long-term Ed25519 identity.
    ed: Keypair,
    /// The ntor onion key (`b` in tor-spec; its public half is `B`).
    onion: StaticSecret,
    /// The public halves, computed once.
    public: RelayPublicKeys,
    /// Our ntor node ID, computed once.
    node_id: RsaIdentity,
}

impl RelaySecretKeys {
    /// Generate a fresh identity and onion key from `rng`.
    pub fn generate<R: rand::Rng + rand::CryptoRng>(rng: &mut R) -> Self {
        let ed = Keypair::generate(rng);
        let onion = StaticSecret::random_from_rng(&mut *rng);
        Self::from_parts(ed, onion)
    }

    /// Assemble, computing the public parts.
    fn from_parts(ed: Keypair, onion: StaticSecret) -> Self {
        let public = RelayPublicKeys {
            ed_identity: Ed25519Identity::from(ed.verifying_key()),
            onion_key: PublicKey::from(&onion),
        };
        let node_id = public.ntor_node_id();
        RelaySecretKeys {
            ed,
            onion,
            public,
            node_id,
        }
    }

    /// The public keys to publish in the network document.
    pub fn public(&self) -> RelayPublicKeys {
        self.public.clone()
    }

    /// Our ntor node ID (see [`ntor_node_id`]).
    pub fn ntor_node_id(&self) -> RsaIdentity {
        self.node_id
    }

    /// Answer an ntor CREATE2 handshake addressed to this relay: same as
    /// [`server_handshake`](crate::ntor::server_handshake) with our node ID
    /// and onion key, minus recomputing the public onion key each time.
    ///
    /// # Errors
    ///
    /// As [`server_handshake`](crate::ntor::server_handshake).
    pub fn ntor_server_handshake<R: rand::Rng + rand::CryptoRng>(
        &self,
        rng: &mut R,
        client_msg: &[u8],
    ) -> Result<([u8; crate::ntor::SERVER_HANDSHAKE_LEN], LayerKeys), Error> {
        self.ntor_server_handshake_as(rng, client_msg)
    }

    /// [`ntor_server_handshake`](Self::ntor_server_handshake), expanding
    /// into keys of another kind (the datagram circuits'
    /// [`HopKeys`](crate::dgram::HopKeys)).
    ///
    /// # Errors
    ///
    /// As [`server_handshake`](crate::ntor::server_handshake).
    pub fn ntor_server_handshake_as<
        K: crate::ntor::ExpandedKeys,
        R: rand::Rng + rand::CryptoRng,
    >(
        &self,
        rng: &mut R,
        client_msg: &[u8],
    ) -> Result<([u8; crate::ntor::SERVER_HANDSHAKE_LEN], K), Error> {
        crate::ntor::server_handshake_with_public_as(
            rng,
            &self.node_id,
            &self.onion,
            &self.public.onion_key,
            client_msg,
        )
    }

    /// The Ed25519 identity keypair (signs, and authenticates the relay on
    /// every transport).
    pub fn ed25519_keypair(&self) -> &Keypair {
        &self.ed
    }

    /// The x25519 ntor onion secret key.
    pub fn onion_secret(&self) -> &StaticSecret {
        &self.onion
    }

    /// The x25519 secret of the relay's MORE (Sphinx) key: derived from
    /// the onion key by HKDF-SHA256 under its own label, so that ntor and
    /// Sphinx never share a Diffie-Hellman key and the relay keeps no
    /// second secret on disk. Secret: it opens every MORE packet's layer
    /// for this relay.
    pub fn sphinx_secret(&self) -> [u8; 32] {
        let mut scalar = [0u8; 32];
        // 32 bytes are within HKDF-SHA256's output: this cannot fail.
        let _ = crate::kdf::kdf_rfc5869(
            &self.onion.to_bytes(),
            SPHINX_KEY_LABEL,
            b"x25519 secret",
            &mut scalar,
        );
        scalar
    }

    /// The public half of [`sphinx_secret`](Self::sphinx_secret), for the
    /// network document.
    pub fn sphinx_public(&self) -> [u8; 32] {
        PublicKey::from(&StaticSecret::from(self.sphinx_secret())).to_bytes()
    }

    /// Serialize as the 32-byte Ed25519 secret seed followed by the 32-byte
    /// x25519 secret. The result is secret: store it with care.
    pub fn to_bytes(&self) -> [u8; RELAY_SECRET_KEYS_LEN] {
        let mut out = [0u8; RELAY_SECRET_KEYS_LEN];
        out[..32].copy_from_slice(self.ed.as_bytes());
        let mut onion = self.onion.to_bytes();
        out[32..].copy_from_slice(&onion);
        onion.zeroize();
        out
    }

    /// Parse the format of [`to_bytes`](Self::to_bytes).
    ///
    /// # Errors
    ///
    /// [`Error::BadLength`] unless `b` is exactly
    /// [`RELAY_SECRET_KEYS_LEN`] bytes long. Every 32-byte string is a valid
    /// Ed25519 seed and a valid x25519 secret, so nothing else can fail.
    pub fn from_bytes(b: &[u8]) -> Result<Self, Error> {
        let bad_len = || Error::BadLength {
            what: "relay secret keys",
            expected: RELAY_SECRET_KEYS_LEN,
            got: b.len(),
        };
        if b.len() != RELAY_SECRET_KEYS_LEN {
            return Err(bad_len());
        }
        let mut seed: [u8; 32] = b[..32].try_into().map_err(|_| bad_len())?;
        let mut onion: [u8; 32] = b[32..].try_into().map_err(|_| bad_len())?;
        let keys = Self::from_parts(Keypair::from_bytes(&seed), StaticSecret::from(onion));
        seed.zeroize();
        onion.zeroize();
        Ok(keys)
    }
}

impl std::fmt::Debug for RelaySecretKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelaySecretKeys")
            .field("public", &self.public())
            .finish_non_exhaustive()
    }
}

/// Public keys as published in the network document.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RelayPublicKeys {
    /// The relay's Ed25519 identity.
    pub ed_identity: Ed25519Identity,
    /// The relay's ntor onion key (`B`).
    pub onion_key: PublicKey,
}

impl RelayPublicKeys {
    /// The 20-byte node ID to use in ntor v1 with this relay; see
    /// [`ntor_node_id`].
    pub fn ntor_node_id(&self) -> RsaIdentity {
        ntor_node_id(&self.ed_identity)
    }
}

/// The 20-byte node ID ntor (v1) needs.
///
/// tor-spec's ntor binds the handshake to the relay's `ID`, the SHA-1 of its
/// RSA identity key. onionlab relays have no RSA key, so we derive the ID
/// from the Ed25519 identity instead:
///
/// `ID = SHA-1("onionlab-ntor-node-id" || ed25519_identity_bytes)`
///
/// (see [`NTOR_NODE_ID_PREFIX`]). The ID still commits to the relay's
/// identity, which is all ntor needs of it. The consequence is that a C-tor
/// (or arti) client can extend to an onionlab relay with ntor v1 only if it
/// learns this ID from somewhere (our network document publishes it); it
/// cannot compute it from a tor-format descriptor, which has an RSA key.
pub fn ntor_node_id(ed: &Ed25519Identity) -> RsaIdentity {
    let mut h = Sha1::new();
    h.update(NTOR_NODE_ID_PREFIX);
    h.update(ed.as_bytes());
    let digest: [u8; 20] = h.finalize().into();
    RsaIdentity::from(digest)
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn secret_keys_round_trip() {
        let mut rng = rand::rng();
        let k = RelaySecretKeys::generate(&mut rng);
        let bytes = k.to_bytes();
        let k2 = RelaySecretKeys::from_bytes(&bytes).unwrap();
        assert_eq!(k.public(), k2.public());
        assert_eq!(k2.to_bytes(), bytes);
        assert_eq!(k.onion_secret().to_bytes(), bytes[32..]);
        assert_eq!(k.ed25519_keypair().to_bytes(), bytes[..32]);
    }

    #[test]
    fn the_sphinx_key_follows_from_the_onion_key_alone() {
        let mut rng = rand::rng();
        let k = RelaySecretKeys::generate(&mut rng);
        let again = RelaySecretKeys::from_bytes(&k.to_bytes()).unwrap();
        assert_eq!(k.sphinx_secret(), again.sphinx_secret());
        assert_ne!(k.sphinx_secret(), [0u8; 32]);
        assert_ne!(k.sphinx_secret(), k.onion_secret().to_bytes());
        assert_ne!(k.sphinx_public(), k.public().onion_key.to_bytes());
        let other = RelaySecretKeys::generate(&mut rng);
        assert_ne!(k.sphinx_public(), other.sphinx_public());
    }

    #[test]
    fn secret_keys_wrong_length() {
        for len in [0, 32, 63, 65, 128] {
            let err = RelaySecretKeys::from_bytes(&vec![7u8; len]).unwrap_err();
            assert_eq!(
                err,
                Error::BadLength {
                    what: "relay secret keys",
                    expected: 64,
                    got: len
                }
            );
        }
    }

    #[test]
    fn distinct_keys_are_generated() {
        let mut rng = rand::rng();
        let a = RelaySecretKeys::generate(&mut rng);
        let b = RelaySecretKeys::generate(&mut rng);
        assert_ne!(a.public().ed_identity, b.public().ed_identity);
        assert_ne!(a.public().onion_key, b.public().onion_key);
        assert_ne!(a.public().ntor_node_id(), b.public().ntor_node_id());
        assert_eq!(a.ntor_node_id(), a.public().ntor_node_id());
    }

    #[test]
    fn relay_answers_ntor_with_its_own_keys() {
        let mut rng = rand::rng();
        let relay = RelaySecretKeys::generate(&mut rng);
        let public = relay.public();
        let (client, create) =
            crate::ntor::NtorClient::start(&mut rng, &public.ntor_node_id(), &public.onion_key);
        let (reply, skeys) = relay.ntor_server_handshake(&mut rng, &create).unwrap();
        let ckeys = client.finish(&reply).unwrap();
        assert_eq!(ckeys.to_bytes(), skeys.to_bytes());

        // A handshake for another relay is refused.
        let other = RelaySecretKeys::generate(&mut rng).public();
        let (_, create) =
            crate::ntor::NtorClient::start(&mut rng, &other.ntor_node_id(), &other.onion_key);
        assert!(matches!(
            relay.ntor_server_handshake(&mut rng, &create),
            Err(Error::NtorWrongNodeId { .. })
        ));
    }

    #[test]
    fn node_id_is_the_documented_hash() {
        // Independent of the helper: SHA-1 over the concatenation.
        let ed = Ed25519Identity::new([0x42; 32]);
        let mut buf = NTOR_NODE_ID_PREFIX.to_vec();
        buf.extend_from_slice(&[0x42; 32]);
        let want: [u8; 20] = Sha1::digest(&buf).into();
        assert_eq!(ntor_node_id(&ed).as_bytes(), &want[..]);
        // SHA-1("onionlab-ntor-node-id" || 0x42 * 32), computed with
        // Python's hashlib.
        assert_eq!(hex::encode(ntor_node_id(&ed).as_bytes()), NODE_ID_0X42_HEX);
    }

    /// See `node_id_is_the_documented_hash`.
    const NODE_ID_0X42_HEX: &str = "622a7e1213612bf298fb613f50ba3fbd0175844f";
}
