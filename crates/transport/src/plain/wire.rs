//! The plain test transport's identity proof: three fixed-size records
//! (see the module docs of [`super`]). Hand-written: a toy exchange of
//! signed nonces no library offers, for test builds only.

use tor_llcrypto::pk::ed25519::{Ed25519Identity, Keypair, PublicKey, Signature};

use crate::WireError;

/// The first bytes an initiator sends.
pub const MAGIC: &[u8; 4] = b"OLPT";
/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of the initiator's hello: magic, nonce, relay flag.
pub const HELLO_LEN: usize = 4 + NONCE_LEN + 1;

/// What the responder signs: this, then the initiator's nonce.
const RESPONDER_CONTEXT: &[u8] = b"onionlab plain test link: responder";
/// What an initiating relay signs: this, then both nonces.
const INITIATOR_CONTEXT: &[u8] = b"onionlab plain test link: initiator";

/// The initiator's hello: its nonce, and whether it is a relay (which
/// then proves its identity too).
pub fn hello(nonce: &[u8; NONCE_LEN], relay: bool) -> [u8; HELLO_LEN] {
    let mut out = [0u8; HELLO_LEN];
    out[..4].copy_from_slice(MAGIC);
    out[4..4 + NONCE_LEN].copy_from_slice(nonce);
    out[HELLO_LEN - 1] = u8::from(relay);
    out
}

/// A hello's nonce and relay flag.
///
/// # Errors
///
/// [`WireError::BadMagic`], or [`WireError::UnknownFlags`] for a flag
/// other than 0 or 1.
pub fn parse_hello(bytes: &[u8; HELLO_LEN]) -> Result<([u8; NONCE_LEN], bool), WireError> {
    if &bytes[..4] != MAGIC {
        return Err(WireError::BadMagic {
            what: "plain link hello",
        });
    }
    let relay = match bytes[HELLO_LEN - 1] {
        0 => false,
        1 => true,
        other => return Err(WireError::UnknownFlags(other)),
    };
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&bytes[4..4 + NONCE_LEN]);
    Ok((nonce, relay))
}

/// The responder's identity key, its signature of the initiator's nonce,
/// and its own nonce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponderProof {
    /// Its Ed25519 identity key.
    pub key: [u8; 32],
    /// Its signature of [`RESPONDER_CONTEXT`] and the initiator's nonce.
    pub sig: [u8; 64],
    /// Its nonce, for an initiating relay to sign.
    pub nonce: [u8; NONCE_LEN],
}

impl ResponderProof {
    /// Bytes of the record.
    pub const LEN: usize = 32 + 64 + NONCE_LEN;

    /// The proof of `identity` for the initiator's `their_nonce`.
    pub fn sign(identity: &Keypair, their_nonce: &[u8; NONCE_LEN], nonce: [u8; NONCE_LEN]) -> Self {
        let content = [RESPONDER_CONTEXT, their_nonce].concat();
        ResponderProof {
            key: identity.verifying_key().to_bytes(),
            sig: identity.sign(&content).to_bytes(),
            nonce,
        }
    }

    /// The record's fields (any bytes are a record; [`verify`](Self::verify)
    /// judges them).
    pub fn parse(bytes: &[u8; Self::LEN]) -> Self {
        let mut p = ResponderProof {
            key: [0; 32],
            sig: [0; 64],
            nonce: [0; NONCE_LEN],
        };
        p.key.copy_from_slice(&bytes[..32]);
        p.sig.copy_from_slice(&bytes[32..96]);
        p.nonce.copy_from_slice(&bytes[96..]);
        p
    }

    /// The record's bytes.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..32].copy_from_slice(&self.key);
        out[32..96].copy_from_slice(&self.sig);
        out[96..].copy_from_slice(&self.nonce);
        out
    }

    /// The identity proven for our `nonce`, or `None` if the key or the
    /// signature is not valid.
    pub fn verify(&self, nonce: &[u8; NONCE_LEN]) -> Option<Ed25519Identity> {
        verify(&self.key, &self.sig, &[RESPONDER_CONTEXT, nonce].concat())
    }
}

/// An initiating relay's identity key and its signature of both nonces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitiatorProof {
    /// Its Ed25519 identity key.
    pub key: [u8; 32],
    /// Its signature of [`INITIATOR_CONTEXT`] and both nonces.
    pub sig: [u8; 64],
}

impl InitiatorProof {
    /// Bytes of the record.
    pub const LEN: usize = 32 + 64;

    /// The proof of `identity` for the exchange of `ours` and `theirs`.
    pub fn sign(identity: &Keypair, ours: &[u8; NONCE_LEN], theirs: &[u8; NONCE_LEN]) -> Self {
        let content = [INITIATOR_CONTEXT, ours, theirs].concat();
        InitiatorProof {
            key: identity.verifying_key().to_bytes(),
            sig: identity.sign(&content).to_bytes(),
        }
    }

    /// The record's fields.
    pub fn parse(bytes: &[u8; Self::LEN]) -> Self {
        let mut p = InitiatorProof {
            key: [0; 32],
            sig: [0; 64],
        };
        p.key.copy_from_slice(&bytes[..32]);
        p.sig.copy_from_slice(&bytes[32..]);
        p
    }

    /// The record's bytes.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..32].copy_from_slice(&self.key);
        out[32..].copy_from_slice(&self.sig);
        out
    }

    /// The identity proven for the exchange (`theirs`: the initiator's
    /// nonce, `ours`: the responder's), or `None`.
    pub fn verify(
        &self,
        theirs: &[u8; NONCE_LEN],
        ours: &[u8; NONCE_LEN],
    ) -> Option<Ed25519Identity> {
        verify(
            &self.key,
            &self.sig,
            &[INITIATOR_CONTEXT, theirs, ours].concat(),
        )
    }
}

fn verify(key: &[u8; 32], sig: &[u8; 64], content: &[u8]) -> Option<Ed25519Identity> {
    let public = PublicKey::from_bytes(key).ok()?;
    public.verify(content, &Signature::from_bytes(sig)).ok()?;
    Some(Ed25519Identity::from(&public))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keypair(seed: u8) -> Keypair {
        Keypair::from_bytes(&[seed; 32])
    }

    #[test]
    fn proofs_verify_for_their_exchange_only() {
        let (a, b) = (keypair(1), keypair(2));
        let (n1, n2) = ([7u8; NONCE_LEN], [9u8; NONCE_LEN]);
        let r = ResponderProof::parse(&ResponderProof::sign(&b, &n1, n2).to_bytes());
        assert_eq!(
            r.verify(&n1),
            Some(Ed25519Identity::from(&b.verifying_key()))
        );
        assert_eq!(r.nonce, n2);
        assert_eq!(r.verify(&n2), None);
        let i = InitiatorProof::parse(&InitiatorProof::sign(&a, &n1, &n2).to_bytes());
        assert_eq!(
            i.verify(&n1, &n2),
            Some(Ed25519Identity::from(&a.verifying_key()))
        );
        assert_eq!(i.verify(&n2, &n1), None);
        // A responder's proof is no initiator's, and a changed byte fails.
        let mut forged = i.clone();
        forged.sig[0] ^= 1;
        assert_eq!(forged.verify(&n1, &n2), None);
        let as_initiator = InitiatorProof {
            key: r.key,
            sig: r.sig,
        };
        assert_eq!(as_initiator.verify(&n1, &n2), None);
    }

    #[test]
    fn hellos_round_trip_and_bad_ones_are_refused() {
        let n = [3u8; NONCE_LEN];
        assert_eq!(parse_hello(&hello(&n, true)), Ok((n, true)));
        assert_eq!(parse_hello(&hello(&n, false)), Ok((n, false)));
        let mut bad = hello(&n, true);
        bad[HELLO_LEN - 1] = 2;
        assert_eq!(parse_hello(&bad), Err(WireError::UnknownFlags(2)));
        bad[0] = b'X';
        assert!(matches!(parse_hello(&bad), Err(WireError::BadMagic { .. })));
    }
}
