//! Binding TLS to a relay's Ed25519 identity with raw public keys
//! (RFC 7250).
//!
//! tor proves a relay's Ed25519 identity with CERTS and AUTHENTICATE cells
//! after an unauthenticated TLS handshake. onionlab uses TLS 1.3 itself:
//! each relay's TLS "certificate" is its Ed25519 identity key as a raw
//! SubjectPublicKeyInfo, and the TLS CertificateVerify signature (over the
//! handshake transcript) proves possession of the secret key. The client
//! side compares the key with the identity it expected from the network
//! document; a relay accepting a connection learns the initiating relay's
//! identity the same way, and an anonymous client sends an empty
//! certificate. rustls verifies the signatures; what it cannot know (which
//! key is expected) is written here.

use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{
    verify_tls13_signature_with_raw_key, CryptoProvider, WebPkiSupportedAlgorithms,
};
use rustls::pki_types::{
    CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, SubjectPublicKeyInfoDer,
    UnixTime,
};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, PeerIncompatible, SignatureScheme};
use tor_llcrypto::pk::ed25519::{Ed25519Identity, Keypair};

use crate::Error;

/// DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410): SEQUENCE {
/// SEQUENCE { OID 1.3.101.112 }, BIT STRING (33 bytes, 0 unused bits) }.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// DER prefix of an Ed25519 PKCS#8 v1 private key (RFC 8410): version 0,
/// the algorithm, then OCTET STRING { OCTET STRING (32-byte seed) }.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// The raw-public-key "certificate" for an Ed25519 identity.
pub fn spki_for(identity: &Ed25519Identity) -> Vec<u8> {
    let mut v = ED25519_SPKI_PREFIX.to_vec();
    v.extend_from_slice(identity.as_bytes());
    v
}

/// The Ed25519 identity in a raw-public-key certificate, if it is one.
pub fn identity_from_spki(der: &[u8]) -> Option<Ed25519Identity> {
    let key = der.strip_prefix(&ED25519_SPKI_PREFIX[..])?;
    let key: [u8; 32] = key.try_into().ok()?;
    Some(Ed25519Identity::new(key))
}

/// Our identity as rustls signing material.
pub fn certified_key(
    provider: &CryptoProvider,
    keypair: &Keypair,
) -> Result<Arc<CertifiedKey>, Error> {
    let mut pkcs8 = ED25519_PKCS8_PREFIX.to_vec();
    pkcs8.extend_from_slice(&keypair.to_bytes());
    let key = provider
        .key_provider
        .load_private_key(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8)))
        .map_err(|e| Error::Config(format!("loading the Ed25519 identity key into TLS: {e}")))?;
    let identity = Ed25519Identity::from(keypair.verifying_key());
    Ok(Arc::new(CertifiedKey::new(
        vec![CertificateDer::from(spki_for(&identity))],
        key,
    )))
}

fn verify_tls13(
    algs: &WebPkiSupportedAlgorithms,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    if dss.scheme != SignatureScheme::ED25519 {
        return Err(PeerIncompatible::NoSignatureSchemesInCommon.into());
    }
    verify_tls13_signature_with_raw_key(
        message,
        &SubjectPublicKeyInfoDer::from(cert.as_ref()),
        dss,
        algs,
    )
}

fn not_ed25519() -> rustls::Error {
    rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
}

/// Client side: accept only the expected identity, and remember what the
/// peer presented so a mismatch can be reported precisely.
#[derive(Debug)]
pub struct ExpectIdentity {
    expected: Ed25519Identity,
    presented: Mutex<Option<Ed25519Identity>>,
    algs: WebPkiSupportedAlgorithms,
}

impl ExpectIdentity {
    /// A verifier that requires `expected`.
    pub fn new(expected: Ed25519Identity, provider: &CryptoProvider) -> Self {
        ExpectIdentity {
            expected,
            presented: Mutex::new(None),
            algs: provider.signature_verification_algorithms,
        }
    }

    /// The identity the peer presented, if it got that far.
    pub fn presented(&self) -> Option<Ed25519Identity> {
        *self.presented.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ServerCertVerifier for ExpectIdentity {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = identity_from_spki(end_entity).ok_or_else(not_ed25519)?;
        *self.presented.lock().unwrap_or_else(|e| e.into_inner()) = Some(got);
        if got == self.expected {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(PeerIncompatible::Tls13RequiredForQuic.into())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13(&self.algs, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }

    fn requires_raw_public_keys(&self) -> bool {
        true
    }
}

/// Relay side: ask for a raw Ed25519 key but let anonymous clients in
/// without one. Which identity it was is read from the connection after
/// the handshake.
#[derive(Debug)]
pub struct AnyRelayIdentity {
    algs: WebPkiSupportedAlgorithms,
}

impl AnyRelayIdentity {
    /// The verifier for `provider`'s algorithms.
    pub fn new(provider: &CryptoProvider) -> Self {
        AnyRelayIdentity {
            algs: provider.signature_verification_algorithms,
        }
    }
}

impl ClientCertVerifier for AnyRelayIdentity {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        identity_from_spki(end_entity).ok_or_else(not_ed25519)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(PeerIncompatible::Tls13RequiredForQuic.into())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13(&self.algs, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }

    fn requires_raw_public_keys(&self) -> bool {
        true
    }
}

/// An anonymous client: advertises raw public keys (as the relay
/// requires) but presents none.
#[derive(Debug)]
pub struct Anonymous;

impl rustls::client::ResolvesClientCert for Anonymous {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        None
    }

    fn only_raw_public_keys(&self) -> bool {
        true
    }

    fn has_certs(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spki_round_trip_and_rejects_other_shapes() {
        let id = Ed25519Identity::new([7; 32]);
        let der = spki_for(&id);
        assert_eq!(der.len(), 44);
        assert_eq!(identity_from_spki(&der), Some(id));
        assert_eq!(identity_from_spki(&der[..43]), None);
        let mut longer = der.clone();
        longer.push(0);
        assert_eq!(identity_from_spki(&longer), None);
        let mut other_alg = der;
        other_alg[8] = 0x71; // Ed448
        assert_eq!(identity_from_spki(&other_alg), None);
    }
}
