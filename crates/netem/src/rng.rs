//! The link model's seeded random streams: xoshiro256** (rand_xoshiro)
//! seeded through SplitMix64, a fixed algorithm, so that the model gives the
//! same answers for the same seed on every platform and with every version
//! of every dependency (unlike `StdRng`, whose algorithm may change).

use rand::{Rng as _, SeedableRng};
use rand_xoshiro::{SplitMix64, Xoshiro256StarStar};

/// Deterministic PRNG (xoshiro256**, seeded through SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(Xoshiro256StarStar);

impl Rng {
    /// Creates a generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(Xoshiro256StarStar::seed_from_u64(seed))
    }

    /// Creates an independent stream for a sub-component (e.g. one path).
    pub fn derive(seed: u64, a: u64, b: u64) -> Self {
        let mixed =
            seed ^ a.wrapping_mul(0xA24B_AED4_963E_E407) ^ b.wrapping_mul(0x9FB2_1C65_1E98_DF25);
        Rng::new(SplitMix64::seed_from_u64(mixed).next_u64())
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform float in [0, 1): the top 53 bits of the next output.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (p >= 1.0 || self.next_f64() < p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The streams are those of the hand-written generator this replaced
    /// (values computed from the xoshiro256** and SplitMix64 reference
    /// definitions), so stored runs replay with the same random draws.
    #[test]
    fn streams_match_the_reference_definition() {
        let mut r = Rng::new(7);
        let got: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            [
                0xb358_faf7_4ef9_765a,
                0x475c_3d96_4f48_2cd2,
                0xd6f1_d349_952c_7996
            ]
        );
        let mut d = Rng::derive(42, 3, 5);
        let got: Vec<u64> = (0..3).map(|_| d.next_u64()).collect();
        assert_eq!(
            got,
            [
                0x0da8_781a_2ab1_6e43,
                0x73d1_20b1_4104_f79e,
                0xb4f8_b825_c226_f5b8
            ]
        );
    }

    #[test]
    fn deterministic_and_roughly_uniform() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut r = Rng::new(1);
        let n = 100_000;
        let mean: f64 = (0..n).map(|_| r.next_f64()).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }
}
