//! Key files.
//!
//! Every key file is one line of lowercase hex followed by a newline
//! (surrounding whitespace is ignored when reading):
//!
//! | file | content | mode |
//! |---|---|---|
//! | relay secret keys (`keys.secret`) | 128 hex digits: [`RelaySecretKeys::to_bytes`] (Ed25519 seed, then x25519 secret) | 0600 |
//! | network secret key (`network-key.secret`) | 64 hex digits: the 32-byte Ed25519 secret seed | 0600 |
//! | network public key (`network-key.pub`) | 64 hex digits: the 32-byte Ed25519 public key | 0644 |
//!
//! Secret key files are created with mode 0600 and never overwritten.
//! Loading a secret key file that others can read logs a warning.

use std::io::Write;
use std::path::Path;

use onionlab_crypto::identity::{RelaySecretKeys, RELAY_SECRET_KEYS_LEN};
use tor_llcrypto::pk::ed25519::{Keypair, PublicKey};

use crate::error::{Error, Result};

/// Largest key file read (a key is well under 200 bytes).
const MAX_KEY_FILE: u64 = 4096;

/// Generate a fresh network signing key.
pub fn generate_network_key<R: rand::Rng + rand::CryptoRng>(rng: &mut R) -> Keypair {
    Keypair::generate(rng)
}

/// The network public key as 64 lowercase hex digits (the form used in
/// `network-key.pub` and in the `network_key` field of node configurations).
pub fn public_key_hex(key: &PublicKey) -> String {
    hex::encode(key.as_bytes())
}

/// Parse a network public key from 64 hex digits; `origin` says where the
/// text came from, for the error.
///
/// # Errors
///
/// [`Error::Key`] if the text is not 32 bytes of hex or not a valid Ed25519
/// point.
pub fn parse_public_key(text: &str, origin: &str) -> Result<PublicKey> {
    let bytes: [u8; 32] = decode_hex(text.trim(), 32)
        .and_then(|b| b.try_into().map_err(|_| "wrong length".to_string()))
        .map_err(|reason| Error::Key {
            origin: origin.to_string(),
            reason: format!("bad network public key: {reason}"),
        })?;
    PublicKey::from_bytes(&bytes).map_err(|_| Error::Key {
        origin: origin.to_string(),
        reason: "bad network public key: not a valid Ed25519 public key".into(),
    })
}

/// Decode exactly `len` bytes of hex, with an explanation on failure.
fn decode_hex(text: &str, len: usize) -> std::result::Result<Vec<u8>, String> {
    if text.len() != 2 * len {
        return Err(format!(
            "expected {} hex digits, found {} characters",
            2 * len,
            text.chars().count()
        ));
    }
    hex::decode(text).map_err(|e| format!("not hex: {e}"))
}

/// Write `relay` keys to a new file at `path` with mode 0600.
///
/// # Errors
///
/// [`Error::Io`] if the file exists already or cannot be written.
pub fn save_relay_keys(path: &Path, relay: &RelaySecretKeys) -> Result<()> {
    write_new_file(path, relay_keys_text(relay).as_bytes(), 0o600)
}

/// What [`save_relay_keys`] writes: the keys in hex and a newline (for a
/// caller that writes the file itself, such as the lab's plans).
pub fn relay_keys_text(relay: &RelaySecretKeys) -> String {
    let mut bytes = relay.to_bytes();
    let text = hex::encode(bytes) + "\n";
    bytes.fill(0);
    text
}

/// Read relay secret keys written by [`save_relay_keys`].
///
/// # Errors
///
/// [`Error::Io`] if the file cannot be read, [`Error::Key`] if its content
/// is not 128 hex digits.
pub fn load_relay_keys(path: &Path) -> Result<RelaySecretKeys> {
    let text = read_key_file(path)?;
    let bytes = decode_hex(text.trim(), RELAY_SECRET_KEYS_LEN).map_err(|reason| Error::Key {
        origin: path.display().to_string(),
        reason: format!("bad relay secret keys: {reason}"),
    })?;
    RelaySecretKeys::from_bytes(&bytes).map_err(|e| Error::Key {
        origin: path.display().to_string(),
        reason: format!("bad relay secret keys: {e}"),
    })
}

/// Write the network secret key (its 32-byte seed) to a new file at `path`
/// with mode 0600.
///
/// # Errors
///
/// [`Error::Io`] if the file exists already or cannot be written.
pub fn save_network_key(path: &Path, key: &Keypair) -> Result<()> {
    let text = hex::encode(key.as_bytes()) + "\n";
    write_new_file(path, text.as_bytes(), 0o600)
}

/// Read a network secret key written by [`save_network_key`].
///
/// # Errors
///
/// [`Error::Io`] if the file cannot be read, [`Error::Key`] if its content
/// is not 64 hex digits.
pub fn load_network_key(path: &Path) -> Result<Keypair> {
    let text = read_key_file(path)?;
    let bytes: [u8; 32] = decode_hex(text.trim(), 32)
        .and_then(|b| b.try_into().map_err(|_| "wrong length".to_string()))
        .map_err(|reason| Error::Key {
            origin: path.display().to_string(),
            reason: format!("bad network secret key: {reason}"),
        })?;
    Ok(Keypair::from_bytes(&bytes))
}

/// Write the network public key to a new file at `path` (mode 0644).
///
/// # Errors
///
/// [`Error::Io`] if the file exists already or cannot be written.
pub fn save_network_public_key(path: &Path, key: &PublicKey) -> Result<()> {
    let text = public_key_hex(key) + "\n";
    write_new_file(path, text.as_bytes(), 0o644)
}

/// Read a network public key written by [`save_network_public_key`].
///
/// # Errors
///
/// [`Error::Io`] if the file cannot be read, [`Error::Key`] if it does not
/// hold a valid key.
pub fn load_network_public_key(path: &Path) -> Result<PublicKey> {
    let text = read_file_limited(path, MAX_KEY_FILE)?;
    parse_public_key(&text, &path.display().to_string())
}

/// Read a secret key file, warning if its mode lets others read it.
fn read_key_file(path: &Path) -> Result<String> {
    #[cfg(unix)]
    if let Ok(meta) = std::fs::metadata(path) {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(
                "secret key file {} has mode {:o}; it should be readable by its owner only (0600)",
                path.display(),
                mode & 0o777
            );
        }
    }
    read_file_limited(path, MAX_KEY_FILE)
}

/// Read a UTF-8 text file of at most `max` bytes.
pub fn read_file_limited(path: &Path, max: u64) -> Result<String> {
    use std::io::Read;
    let io_err = |op| {
        move |source| Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    let file = std::fs::File::open(path).map_err(io_err("open"))?;
    let mut buf = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut buf)
        .map_err(io_err("read"))?;
    if buf.len() as u64 > max {
        let size = std::fs::metadata(path).map_or(max + 1, |m| m.len());
        return Err(Error::TooLarge {
            what: path.display().to_string(),
            size,
            max,
        });
    }
    String::from_utf8(buf).map_err(|_| Error::Io {
        op: "read",
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"),
    })
}

/// Create `path` (which must not exist) with `mode` and write `data`.
pub fn write_new_file(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let io_err = |op| {
        move |source| Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    let mut file = opts.open(path).map_err(io_err("create"))?;
    file.write_all(data).map_err(io_err("write"))?;
    file.sync_all().map_err(io_err("write"))?;
    Ok(())
}

#[cfg(test)]
mod test {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn relay_keys_round_trip_with_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.secret");
        let mut rng = StdRng::seed_from_u64(1);
        let keys = RelaySecretKeys::generate(&mut rng);
        save_relay_keys(&path, &keys).unwrap();
        let loaded = load_relay_keys(&path).unwrap();
        assert_eq!(loaded.public(), keys.public());
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.len(), 129);
        assert!(text.ends_with('\n'));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // Never overwritten.
        let err = save_relay_keys(&path, &keys).unwrap_err();
        assert!(matches!(err, Error::Io { op: "create", .. }), "{err}");
    }

    #[test]
    fn network_keys_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = StdRng::seed_from_u64(2);
        let key = generate_network_key(&mut rng);
        let secret = dir.path().join("network-key.secret");
        let public = dir.path().join("network-key.pub");
        save_network_key(&secret, &key).unwrap();
        save_network_public_key(&public, &key.verifying_key()).unwrap();
        assert_eq!(
            load_network_key(&secret).unwrap().as_bytes(),
            key.as_bytes()
        );
        assert_eq!(
            load_network_public_key(&public).unwrap(),
            key.verifying_key()
        );
        let hex = public_key_hex(&key.verifying_key());
        assert_eq!(parse_public_key(&hex, "test").unwrap(), key.verifying_key());
    }

    #[test]
    fn bad_key_files_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.secret");
        std::fs::write(&path, "abcd\n").unwrap();
        let err = load_relay_keys(&path).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("bad.secret"), "{msg}");
        assert!(msg.contains("expected 128 hex digits"), "{msg}");
        let err = load_network_key(&path).unwrap_err();
        assert!(err.to_string().contains("bad.secret"), "{err}");
        std::fs::write(&path, "zz".repeat(32)).unwrap();
        let err = load_network_public_key(&path).unwrap_err();
        assert!(err.to_string().contains("not hex"), "{err}");
        let missing = dir.path().join("missing");
        let err = load_network_key(&missing).unwrap_err();
        assert!(matches!(err, Error::Io { op: "open", .. }), "{err}");
        assert!(err.to_string().contains("missing"), "{err}");
        std::fs::write(&path, "0".repeat(5000)).unwrap();
        assert!(matches!(
            load_relay_keys(&path).unwrap_err(),
            Error::TooLarge { .. }
        ));
    }

    #[test]
    fn invalid_public_key_point_is_refused() {
        // y = 2 is not on the curve.
        let mut b = [0u8; 32];
        b[0] = 2;
        let err = parse_public_key(&hex::encode(b), "cfg").unwrap_err();
        assert!(err.to_string().contains("not a valid Ed25519"), "{err}");
    }
}
