//! What multi-path circuits cost in anonymity (seed 004, De la Cadena et
//! al. 2019, section 6), analytic and by Monte Carlo.
//!
//! A client with `m` entries (guards) and one exit, against an adversary
//! holding a fraction `f_g` of the entry bandwidth and `f_x` of the exit
//! bandwidth, is compromised
//!
//! * for end-to-end correlation (the adversary must see both ends) with
//!   probability `P_m(c) = f_x (1 - (1 - f_g)^m)`, `f_g f_x` for one path
//!   (the paper's footnote 14: 4% and 9.8% at 20% with `m = 3`);
//! * for an attack at the entry alone that one entry suffices for
//!   (the paper's adversary model 1) with `1 - (1 - f_g)^m`;
//! * for one that needs every entry (model 2, website fingerprinting on
//!   split traffic) with `f_g^m`.
//!
//! Guard fingerprinting: `C` clients spread over `G` guards share each
//! guard with `C / G` clients on average, but a set of `m` guards with only
//! `C / (G choose m)` (the paper: 2 million clients, 2000 guards).
//!
//! [`simulate`] draws clients over a real network's bandwidth weights
//! instead of assuming uniform, independent choices: from onionlab's own
//! network document or a C tor consensus ([`consensus::parse`]). Written
//! here: no crate of the field computes these.

pub mod consensus;

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Errors of the analysis.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A consensus that cannot be read.
    #[error("consensus line {line}: {message}")]
    Consensus {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// Parameters the analysis cannot use.
    #[error("{0}")]
    Parameters(String),
}

/// One relay as path selection sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relay {
    /// Its weight in path selection (consensus bandwidth).
    pub bandwidth: u64,
    /// It may be chosen as an entry.
    pub guard: bool,
    /// It may be chosen as an exit.
    pub exit: bool,
}

impl Relay {
    /// The relays of onionlab's network document.
    pub fn of_document(doc: &onionlab_netdoc::NetworkDocument) -> Vec<Relay> {
        doc.relays
            .iter()
            .map(|r| Relay {
                bandwidth: r.bandwidth,
                guard: r.flags.guard,
                exit: r.flags.exit,
            })
            .collect()
    }
}

/// Probabilities that a client with some number of entries is compromised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Compromise {
    /// An adversarial entry and an adversarial exit (correlation).
    pub correlation: f64,
    /// At least one adversarial entry (model 1).
    pub any_entry: f64,
    /// Every entry adversarial (model 2).
    pub all_entries: f64,
}

/// The paper's formulas for `paths` entries, `f_g` and `f_x` as fractions.
pub fn analytic(f_g: f64, f_x: f64, paths: u32) -> Compromise {
    let m = paths as i32;
    let any = 1.0 - (1.0 - f_g).powi(m);
    Compromise {
        correlation: f_x * any,
        any_entry: any,
        all_entries: f_g.powi(m),
    }
}

/// The mean number of clients sharing one set of `paths` guards, with
/// `clients` clients choosing uniformly among `guards` guards:
/// `clients / (guards choose paths)`.
pub fn anonymity_set_estimate(clients: f64, guards: u64, paths: u32) -> f64 {
    clients / binomial(guards, paths)
}

/// `n choose k`, as a float (large values are fine).
pub fn binomial(n: u64, k: u32) -> f64 {
    let k = u64::from(k);
    if k > n {
        return 0.0;
    }
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}

/// A Monte Carlo experiment: who the adversary is, how many clients, how
/// many paths.
#[derive(Debug, Clone, Copy)]
pub struct Experiment {
    /// The adversary's share of entry (guard) bandwidth, in [0, 1).
    pub f_g: f64,
    /// The adversary's share of exit bandwidth, in [0, 1).
    pub f_x: f64,
    /// The adversary runs its share as this many relays each way (more
    /// relays let one client pick several adversarial entries).
    pub adversary_relays: u32,
    /// Entries per client.
    pub paths: u32,
    /// Clients drawn.
    pub clients: u32,
    /// Seed of the draws.
    pub seed: u64,
}

/// What [`simulate`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Fractions of clients compromised, as in [`analytic`].
    pub compromise: Compromise,
    /// Mean, over clients, of the number of clients with the same set of
    /// entries (itself included), without the adversary's relays.
    pub mean_anonymity_set: f64,
    /// Fraction of clients whose set of entries no other client has.
    pub unique_fraction: f64,
    /// The most clients sharing one set of entries.
    pub largest_set: u32,
    /// Relays that could be entries (without the adversary's).
    pub guards: usize,
}

/// Weighted choice over some relays (cumulative bandwidths, in `u128` so
/// that no sum of `u64` bandwidths overflows).
struct Weighted {
    index: Vec<usize>,
    weight: Vec<u128>,
    cumulative: Vec<u128>,
}

/// Draws that may repeat an excluded relay before [`Weighted`] falls back
/// to an exact draw over what is left.
const REDRAWS: usize = 64;

impl Weighted {
    fn new(relays: &[Relay], keep: impl Fn(&Relay) -> bool) -> Weighted {
        let (mut index, mut weight, mut cumulative, mut sum) =
            (Vec::new(), Vec::new(), Vec::new(), 0u128);
        for (i, r) in relays.iter().enumerate() {
            if keep(r) && r.bandwidth > 0 {
                sum += u128::from(r.bandwidth);
                index.push(i);
                weight.push(u128::from(r.bandwidth));
                cumulative.push(sum);
            }
        }
        Weighted {
            index,
            weight,
            cumulative,
        }
    }

    fn total(&self) -> u128 {
        self.cumulative.last().copied().unwrap_or(0)
    }

    /// A relay by weight, none of `exclude`; `None` if only those are left.
    fn pick_excluding(&self, exclude: &[usize], rng: &mut StdRng) -> Option<usize> {
        if self.total() == 0 {
            return None;
        }
        for _ in 0..REDRAWS {
            let x = rng.random_range(0..self.total());
            let r = self.index[self.cumulative.partition_point(|&c| c <= x)];
            if !exclude.contains(&r) {
                return Some(r);
            }
        }
        // The excluded relays hold most of the weight: draw over the rest.
        let rest = || (0..self.index.len()).filter(|&j| !exclude.contains(&self.index[j]));
        let left: u128 = rest().map(|j| self.weight[j]).sum();
        if left == 0 {
            return None;
        }
        let mut x = rng.random_range(0..left);
        for j in rest() {
            if x < self.weight[j] {
                return Some(self.index[j]);
            }
            x -= self.weight[j];
        }
        None
    }

    /// `k` distinct relays, by weight; false if there are fewer than `k`.
    fn pick_distinct(&self, k: usize, rng: &mut StdRng, out: &mut Vec<usize>) -> bool {
        out.clear();
        while out.len() < k {
            match self.pick_excluding(out, rng) {
                Some(r) => out.push(r),
                None => return false,
            }
        }
        true
    }
}

/// Draw `e.clients` clients over `relays` (bandwidth-weighted: each takes
/// `e.paths` distinct entries among the Guard relays and one exit among the
/// Exit relays that is none of its entries), with the adversary's relays
/// added so that it holds `f_g` of the entry and `f_x` of the exit
/// bandwidth. Tor's position weights (`Wgg`, `Wee`...) are left out: every
/// relay weighs its bandwidth in every position.
pub fn simulate(relays: &[Relay], e: &Experiment) -> Result<Outcome, Error> {
    check(e)?;
    let honest_guards = Weighted::new(relays, |r| r.guard);
    let honest_exits = Weighted::new(relays, |r| r.exit);
    let paths = e.paths as usize;
    if honest_guards.index.len() < paths {
        return Err(Error::Parameters(format!(
            "{} entries per client, but the network has {} guards with bandwidth",
            e.paths,
            honest_guards.index.len()
        )));
    }
    if honest_exits.total() == 0 {
        return Err(Error::Parameters(
            "the network has no exit with bandwidth".into(),
        ));
    }
    // The adversary's relays, appended: guards first, then exits.
    let mut all = relays.to_vec();
    // Each of the adversary's k relays a side: f / (1 - f) of the honest
    // total, split k ways (saturating at u64::MAX per relay).
    let k = u64::from(e.adversary_relays);
    let share = |total: u128, f: f64| (total as f64 * f / (1.0 - f) / k as f64).ceil() as u64;
    let adv_guard_bw = share(honest_guards.total(), e.f_g);
    let adv_exit_bw = share(honest_exits.total(), e.f_x);
    let first_adversarial = all.len();
    for _ in 0..k {
        all.push(Relay {
            bandwidth: adv_guard_bw,
            guard: true,
            exit: false,
        });
    }
    for _ in 0..k {
        all.push(Relay {
            bandwidth: adv_exit_bw,
            guard: false,
            exit: true,
        });
    }
    let guards = Weighted::new(&all, |r| r.guard);
    let exits = Weighted::new(&all, |r| r.exit);
    let bad = |i: usize| i >= first_adversarial;

    let mut rng = StdRng::seed_from_u64(e.seed);
    let (mut correlation, mut any, mut every) = (0u64, 0u64, 0u64);
    let mut entries = Vec::with_capacity(paths);
    let mut sets: HashMap<Vec<usize>, u32> = HashMap::new();
    let no_exit = || {
        Error::Parameters(
            "a client's entries are all the exits the network has: no exit left to choose".into(),
        )
    };
    for _ in 0..e.clients {
        if !guards.pick_distinct(paths, &mut rng, &mut entries) {
            return Err(Error::Parameters(format!("fewer than {paths} guards")));
        }
        let exit = exits
            .pick_excluding(&entries, &mut rng)
            .ok_or_else(no_exit)?;
        let bad_entries = entries.iter().filter(|&&g| bad(g)).count();
        any += u64::from(bad_entries > 0);
        every += u64::from(bad_entries == paths);
        correlation += u64::from(bad_entries > 0 && bad(exit));
        // Guard fingerprinting: the honest network alone (it has at least
        // `paths` guards: checked above).
        honest_guards.pick_distinct(paths, &mut rng, &mut entries);
        entries.sort_unstable();
        *sets.entry(entries.clone()).or_default() += 1;
    }
    let n = f64::from(e.clients);
    let sizes = sets.values();
    let shared: f64 = sizes.clone().map(|&s| f64::from(s) * f64::from(s)).sum();
    let unique = sizes.clone().filter(|&&s| s == 1).count() as f64;
    Ok(Outcome {
        compromise: Compromise {
            correlation: correlation as f64 / n,
            any_entry: any as f64 / n,
            all_entries: every as f64 / n,
        },
        mean_anonymity_set: shared / n,
        unique_fraction: unique / n,
        largest_set: sets.values().copied().max().unwrap_or(0),
        guards: honest_guards.index.len(),
    })
}

fn check(e: &Experiment) -> Result<(), Error> {
    let fraction = |f: f64| (0.0..1.0).contains(&f);
    if !fraction(e.f_g) || !fraction(e.f_x) {
        return Err(Error::Parameters(format!(
            "the adversary's shares must be in [0, 1): f_g = {}, f_x = {}",
            e.f_g, e.f_x
        )));
    }
    if e.paths == 0 || e.paths > 8 {
        return Err(Error::Parameters(format!(
            "paths = {}: from 1 to 8",
            e.paths
        )));
    }
    if e.clients == 0 || e.adversary_relays == 0 {
        return Err(Error::Parameters(
            "at least one client and one adversarial relay each way".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_figures() {
        // Footnote 14: 20% of the bandwidth each way.
        let one = analytic(0.2, 0.2, 1);
        assert!((one.correlation - 0.04).abs() < 1e-12);
        let three = analytic(0.2, 0.2, 3);
        assert!((three.correlation - 0.0976).abs() < 1e-12, "{three:?}");
        assert!((three.all_entries - 0.008).abs() < 1e-12);
        assert!((three.any_entry - 0.488).abs() < 1e-12);
        // About 2 million clients over about 2000 entries: 1000 per entry.
        assert!((anonymity_set_estimate(2e6, 2000, 1) - 1000.0).abs() < 1e-9);
        assert!((anonymity_set_estimate(2e6, 2000, 2) - 2e6 / 1_999_000.0).abs() < 1e-9);
        assert_eq!(binomial(5, 7), 0.0);
        assert!((binomial(2000, 3) - 1_331_334_000.0).abs() < 1.0);
    }

    fn uniform(guards: usize, exits: usize) -> Vec<Relay> {
        let mut relays = vec![
            Relay {
                bandwidth: 1000,
                guard: true,
                exit: false,
            };
            guards
        ];
        relays.extend(vec![
            Relay {
                bandwidth: 1000,
                guard: false,
                exit: true,
            };
            exits
        ]);
        relays
    }

    fn experiment(paths: u32) -> Experiment {
        Experiment {
            f_g: 0.2,
            f_x: 0.2,
            adversary_relays: 50,
            paths,
            clients: 200_000,
            seed: 7,
        }
    }

    #[test]
    fn a_uniform_network_meets_the_formulas() {
        // Many small relays on both sides: close to independent choices.
        let relays = uniform(400, 400);
        for paths in 1..=3 {
            let got = simulate(&relays, &experiment(paths)).expect("simulate");
            let want = analytic(0.2, 0.2, paths);
            // Within 5% of the formula, or 0.2 points for small values.
            let near = |a: f64, b: f64| (a - b).abs() < 0.002f64.max(0.05 * b);
            assert!(
                near(got.compromise.correlation, want.correlation)
                    && near(got.compromise.any_entry, want.any_entry)
                    && near(got.compromise.all_entries, want.all_entries),
                "{paths} paths: {got:?} against {want:?}"
            );
        }
    }

    #[test]
    fn guard_sets_fingerprint_clients() {
        // 100 000 clients over 400 equal guards: 250 share each guard, and
        // pairs are almost all unique (79 800 pairs).
        let relays = uniform(400, 10);
        let e = Experiment {
            clients: 100_000,
            ..experiment(1)
        };
        let one = simulate(&relays, &e).expect("simulate");
        assert!((one.mean_anonymity_set - 251.0).abs() < 10.0, "{one:?}");
        assert_eq!(one.unique_fraction, 0.0);
        assert_eq!(one.guards, 400);
        let two = simulate(&relays, &Experiment { paths: 2, ..e }).expect("simulate");
        assert!(two.mean_anonymity_set < 3.5, "{two:?}");
        assert!(two.unique_fraction > 0.2, "{two:?}");
    }

    #[test]
    fn networks_that_cannot_be_drawn_from_are_errors_not_hangs() {
        let r = |bandwidth, guard, exit| Relay {
            bandwidth,
            guard,
            exit,
        };
        // The only exit is also a guard every client takes, and the
        // adversary has no exit bandwidth.
        let relays = vec![r(100, true, true)];
        let e = Experiment {
            f_x: 0.0,
            clients: 10,
            ..experiment(1)
        };
        assert!(simulate(&relays, &e).is_err());
        // Bandwidths that overflow a u64 sum still draw every relay.
        let huge = vec![
            r(u64::MAX, true, false),
            r(u64::MAX, true, true),
            r(1, false, true),
        ];
        let e = Experiment {
            f_g: 0.0,
            clients: 1000,
            ..experiment(2)
        };
        let o = simulate(&huge, &e).expect("simulate");
        assert_eq!(o.guards, 2);
        assert_eq!(o.largest_set, 1000, "both guards in every pair");
        // An adversary with almost everything.
        let greedy = Experiment {
            f_g: 0.999_999,
            f_x: 0.999_999,
            clients: 1000,
            ..experiment(1)
        };
        let o = simulate(&uniform(5, 5), &greedy).expect("simulate");
        assert!(o.compromise.correlation > 0.99, "{o:?}");
    }

    #[test]
    fn bad_parameters_are_refused() {
        let relays = uniform(2, 2);
        let bad = |e: Experiment| simulate(&relays, &e).is_err();
        assert!(bad(Experiment {
            f_g: 1.0,
            ..experiment(1)
        }));
        assert!(bad(Experiment {
            f_x: -0.1,
            ..experiment(1)
        }));
        assert!(bad(Experiment {
            paths: 0,
            ..experiment(1)
        }));
        assert!(bad(experiment(3)), "3 entries from 2 guards");
        assert!(bad(Experiment {
            clients: 0,
            ..experiment(1)
        }));
        assert!(simulate(&uniform(3, 0), &experiment(1)).is_err(), "no exit");
        assert!(simulate(&relays, &experiment(2)).is_ok());
    }

    #[test]
    fn the_same_seed_draws_the_same_clients() {
        let relays = uniform(50, 50);
        let e = Experiment {
            clients: 5000,
            ..experiment(2)
        };
        let a = simulate(&relays, &e).expect("simulate");
        assert_eq!(a, simulate(&relays, &e).expect("simulate"));
        let other = simulate(&relays, &Experiment { seed: 8, ..e }).expect("simulate");
        assert_ne!(a, other, "another seed draws other clients");
    }
}
