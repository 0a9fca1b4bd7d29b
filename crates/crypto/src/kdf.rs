//! KDF-RFC5869: HKDF (RFC 5869) instantiated with SHA-256, as tor-spec uses it
//! to turn the ntor `secret_input` into circuit key material.

use hkdf::Hkdf;
use tor_llcrypto::d::Sha256;

use crate::Error;

/// The most output HKDF-SHA256 can produce: 255 blocks of 32 bytes.
pub const KDF_RFC5869_MAX_OUTPUT: usize = 255 * 32;

/// KDF-RFC5869 (HKDF-SHA256) as tor-spec uses it for ntor.
///
/// `PRK = HMAC-SHA256(key = salt, msg = secret)` (for ntor, `salt` is
/// `t_key` and `secret` is `secret_input`, so PRK is the spec's `KEY_SEED`),
/// then `out` is filled with `T(1) | T(2) | ...` where
/// `T(i) = HMAC-SHA256(PRK, T(i-1) | info | i)`; for ntor `info` is `m_expand`.
///
/// # Errors
///
/// [`Error::KdfOutputTooLong`] if `out` is longer than
/// [`KDF_RFC5869_MAX_OUTPUT`] bytes; `out` is then left untouched.
pub fn kdf_rfc5869(secret: &[u8], salt: &[u8], info: &[u8], out: &mut [u8]) -> Result<(), Error> {
    if out.len() > KDF_RFC5869_MAX_OUTPUT {
        return Err(Error::KdfOutputTooLong {
            requested: out.len(),
            max: KDF_RFC5869_MAX_OUTPUT,
        });
    }
    Hkdf::<Sha256>::new(Some(salt), secret)
        .expand(info, out)
        .map_err(|_| Error::KdfOutputTooLong {
            requested: out.len(),
            max: KDF_RFC5869_MAX_OUTPUT,
        })
}

#[cfg(test)]
mod test {
    use super::*;

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    /// RFC 5869 appendix A, test cases 1-3 (the SHA-256 ones).
    #[test]
    fn rfc5869_sha256_test_cases() {
        /// IKM, salt, info, expected OKM (hex).
        type Case = (Vec<u8>, Vec<u8>, Vec<u8>, &'static str);
        let cases: [Case; 3] = [
            (
                vec![0x0b; 22],
                (0x00..=0x0c).collect(),
                (0xf0..=0xf9).collect(),
                "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf\
                 34007208d5b887185865",
            ),
            (
                (0x00..=0x4f).collect(),
                (0x60..=0xaf).collect(),
                (0xb0..=0xff).collect(),
                "b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c\
                 59045a99cac7827271cb41c65e590e09da3275600c2f09b8367793a9aca3db71\
                 cc30c58179ec3e87c14c01d5c1f3434f1d87",
            ),
            (
                vec![0x0b; 22],
                vec![],
                vec![],
                "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d\
                 9d201395faa4b61a96c8",
            ),
        ];
        for (ikm, salt, info, okm) in cases {
            let want = h(okm);
            let mut out = vec![0u8; want.len()];
            kdf_rfc5869(&ikm, &salt, &info, &mut out).unwrap();
            assert_eq!(hex::encode(&out), okm);
        }
    }

    /// The KDF-RFC5869 vectors in tor's `test_crypto.c`
    /// (`test_crypto_hkdf_sha256`, generated with `ntor_ref.py`): ntor's
    /// `t_key` as salt, `m_expand` as info, 100 bytes of output.
    #[test]
    fn tor_kdf_rfc5869_vectors() {
        let salt = b"ntor-curve25519-sha256-1:key_extract";
        let info = b"ntor-curve25519-sha256-1:key_expand";
        let cases: [(&[u8], &str); 3] = [
            (
                b"",
                "d3490ed48b12a48f9547861583573fe3f19aafe3f81dc7fc75\
                 eeed96d741b3290f941576c1f9f0b2d463d1ec7ab2c6bf71cd\
                 d7f826c6298c00dbfe6711635d7005f0269493edf6046cc7e7\
                 dcf6abe0d20c77cf363e8ffe358927817a3d3e73712cee28d8",
            ),
            (
                b"Tor",
                "5521492a85139a8d9107a2d5c0d9c91610d0f95989975ebee6\
                 c02a4f8d622a6cfdf9b7c7edd3832e2760ded1eac309b76f8d\
                 66c4a3c4d6225429b3a016e3c3d45911152fc87bc2de9630c3\
                 961be9fdb9f93197ea8e5977180801926d3321fa21513e59ac",
            ),
            (
                b"AN ALARMING ITEM TO FIND ON YOUR CREDIT-RATING STATEMENT",
                "a2aa9b50da7e481d30463adb8f233ff06e9571a0ca6ab6df0f\
                 b206fa34e5bc78d063fc291501beec53b36e5a0e434561200c\
                 5f8bd13e0f88b3459600b4dc21d69363e2895321c06184879d\
                 94b18f078411be70b767c7fc40679a9440a0c95ea83a23efbf",
            ),
        ];
        for (secret, want) in cases {
            let mut out = [0u8; 100];
            kdf_rfc5869(secret, salt, info, &mut out).unwrap();
            assert_eq!(hex::encode(out), want);
        }
    }

    #[test]
    fn output_prefix_is_stable() {
        // Asking for fewer bytes gives a prefix of the longer output.
        let mut long = [0u8; 92];
        let mut short = [0u8; 33];
        kdf_rfc5869(b"k", b"s", b"i", &mut long).unwrap();
        kdf_rfc5869(b"k", b"s", b"i", &mut short).unwrap();
        assert_eq!(&long[..33], &short[..]);
    }

    #[test]
    fn too_long_output_is_rejected() {
        let mut ok = vec![0u8; KDF_RFC5869_MAX_OUTPUT];
        kdf_rfc5869(b"k", b"s", b"i", &mut ok).unwrap();
        let mut too_long = vec![0u8; KDF_RFC5869_MAX_OUTPUT + 1];
        let err = kdf_rfc5869(b"k", b"s", b"i", &mut too_long).unwrap_err();
        assert_eq!(
            err,
            Error::KdfOutputTooLong {
                requested: KDF_RFC5869_MAX_OUTPUT + 1,
                max: KDF_RFC5869_MAX_OUTPUT
            }
        );
        assert!(too_long.iter().all(|&b| b == 0));
    }
}
