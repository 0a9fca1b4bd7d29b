//! Torchestra's circuit classifier (seed 003; `docs/torchestra.md`
//! section 6), sans-IO: the exit counts each circuit's cells on a
//! connection toward a middle during a window, and at the end of every
//! window decides which circuits are heavy (moved to the heavy connection)
//! and which light, from exponentially weighted moving averages of the
//! counts, the thesis's rule:
//!
//! ```text
//! EWMA_conn = alpha * N_conn + (1 - alpha) * EWMA_conn
//! EWMA_circ = alpha * N_circ + (1 - alpha) * EWMA_circ   (beta when N_circ = 0)
//! fair      = EWMA_conn / n   (n: circuits not "very light")
//! light -> heavy when EWMA_circ > (1 + thresh_light) * fair
//! heavy -> light when EWMA_circ < (1 - thresh_heavy) * fair
//! very light     when EWMA_circ < (1 - thresh_verylight) * fair
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use crate::ParamError;

/// The classifier's parameters. Defaults: the thesis's last experiment
/// (5.2.4) and its section 4.4. It is also the `[torchestra]` section of a
/// relay's configuration file (`window_ms`, `alpha`, ...; checked by
/// [`validate`](Self::validate)).
#[serde_with::serde_as]
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClassifierParams {
    /// Length of a counting window (thesis: 2 s).
    #[serde(rename = "window_ms")]
    #[serde_as(as = "serde_with::DurationMilliSeconds<u64>")]
    pub window: Duration,
    /// EWMA multiplier for a circuit with cells in the window, and for the
    /// connection (thesis: 0.18, T = 10 windows).
    pub alpha: f64,
    /// EWMA multiplier for a circuit without cells in the window, so idle
    /// circuits fall out of the count faster (thesis 5.2.4: 0.36).
    pub beta: f64,
    /// How far above its fair share a light circuit must be to turn heavy
    /// (a fraction; thesis: 0.7, and 0.4 in experiment 5.2.2).
    pub thresh_light: f64,
    /// How far below its fair share a heavy circuit must be to turn light
    /// (thesis: 0.7).
    pub thresh_heavy: f64,
    /// How far below its fair share a circuit is not counted as active
    /// (thesis: 0.9).
    pub thresh_verylight: f64,
}

impl Default for ClassifierParams {
    fn default() -> Self {
        ClassifierParams {
            window: Duration::from_secs(2),
            alpha: 0.18,
            beta: 0.36,
            thresh_light: 0.7,
            thresh_heavy: 0.7,
            thresh_verylight: 0.9,
        }
    }
}

impl ClassifierParams {
    /// Check the ranges: a positive window, multipliers in (0, 1],
    /// thresholds in (0, 1].
    ///
    /// # Errors
    ///
    /// The offending parameter and its range.
    pub fn validate(&self) -> Result<(), ParamError> {
        if self.window.is_zero() {
            return Err(ParamError::Zero {
                name: "torchestra window_ms",
            });
        }
        for (name, value) in [
            ("torchestra alpha", self.alpha),
            ("torchestra beta", self.beta),
            ("torchestra thresh_light", self.thresh_light),
            ("torchestra thresh_heavy", self.thresh_heavy),
            ("torchestra thresh_verylight", self.thresh_verylight),
        ] {
            if !(value > 0.0 && value <= 1.0) {
                return Err(ParamError::NotFraction { name, value });
            }
        }
        Ok(())
    }
}

/// A circuit's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// On the light connection (every circuit starts light).
    Light,
    /// On the heavy connection.
    Heavy,
}

#[derive(Debug, Default)]
struct Circ {
    count: u64,
    ewma: f64,
    heavy: bool,
    /// Only classified circuits move; the others count toward the
    /// connection and its number of active circuits.
    classify: bool,
}

/// One connection's classifier; `K` names a circuit.
#[derive(Debug)]
pub struct ConnClassifier<K> {
    params: ClassifierParams,
    count: u64,
    ewma: f64,
    circuits: BTreeMap<K, Circ>,
}

impl<K: Ord + Copy> ConnClassifier<K> {
    /// A connection with no history.
    pub fn new(params: ClassifierParams) -> Self {
        ConnClassifier {
            params,
            count: 0,
            ewma: 0.0,
            circuits: BTreeMap::new(),
        }
    }

    /// `cells` cells of circuit `key` crossed the connection in this
    /// window; `classify`: the circuit may move (we are its exit).
    pub fn count(&mut self, key: K, cells: u64, classify: bool) {
        self.count += cells;
        let c = self.circuits.entry(key).or_default();
        c.count += cells;
        // Whether we are its exit is decided afresh every window (a
        // middle's circuit looks like an exit's until its next hop is
        // attached).
        c.classify = classify;
    }

    /// The circuit left the connection.
    pub fn forget(&mut self, key: K) {
        self.circuits.remove(&key);
    }

    /// Keep only the circuits `keep` says are still on the connection.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.circuits.retain(|k, _| keep(k));
    }

    /// The class of `key` now.
    pub fn class(&self, key: K) -> Class {
        match self.circuits.get(&key) {
            Some(c) if c.heavy => Class::Heavy,
            _ => Class::Light,
        }
    }

    /// Circuits tracked.
    pub fn len(&self) -> usize {
        self.circuits.len()
    }

    /// Whether no circuit is tracked.
    pub fn is_empty(&self) -> bool {
        self.circuits.is_empty()
    }

    /// The window ended: update the averages and return the classified
    /// circuits whose class changed, with their new class.
    pub fn end_window(&mut self) -> Vec<(K, Class)> {
        let p = self.params;
        self.ewma = p.alpha * self.count as f64 + (1.0 - p.alpha) * self.ewma;
        self.count = 0;
        for c in self.circuits.values_mut() {
            c.ewma = if c.count > 0 {
                p.alpha * c.count as f64 + (1.0 - p.alpha) * c.ewma
            } else {
                (1.0 - p.beta) * c.ewma
            };
            c.count = 0;
        }
        // Circuits far below an equal share are not active: they would
        // make the active ones look heavy.
        let all = self
            .circuits
            .values()
            .filter(|c| c.ewma > 0.0)
            .count()
            .max(1);
        let rough = self.ewma / all as f64;
        let n = self
            .circuits
            .values()
            .filter(|c| c.ewma >= (1.0 - p.thresh_verylight) * rough)
            .count()
            .max(1);
        let fair = self.ewma / n as f64;
        let mut changed = Vec::new();
        for (key, c) in self.circuits.iter_mut().filter(|(_, c)| c.classify) {
            if !c.heavy && c.ewma > (1.0 + p.thresh_light) * fair {
                c.heavy = true;
                changed.push((*key, Class::Heavy));
            } else if c.heavy && c.ewma < (1.0 - p.thresh_heavy) * fair {
                c.heavy = false;
                changed.push((*key, Class::Light));
            }
        }
        // Idle circuits that decayed to nothing are forgotten.
        self.circuits
            .retain(|_, c| c.ewma > 1e-3 || c.heavy || c.count > 0);
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One bulk circuit among light ones turns heavy within a few windows
    /// and the light ones stay light; when it goes quiet it turns light
    /// again.
    #[test]
    fn a_bulk_circuit_turns_heavy_and_back() {
        let mut k = ConnClassifier::new(ClassifierParams::default());
        let mut heavy_at = None;
        for w in 0..20 {
            k.count(0, 800, true); // bulk: 800 cells per window
            for light in 1..6 {
                k.count(light, 30, true);
            }
            for (key, class) in k.end_window() {
                assert_eq!(key, 0, "window {w}: a light circuit moved");
                assert_eq!(class, Class::Heavy);
                heavy_at.get_or_insert(w);
            }
        }
        assert!(heavy_at.is_some_and(|w| w < 3), "{heavy_at:?}");
        // The bulk circuit stops; the light ones go on.
        let mut light_at = None;
        for w in 0..30 {
            for light in 1..6 {
                k.count(light, 30, true);
            }
            for (key, class) in k.end_window() {
                assert_eq!((key, class), (0, Class::Light));
                light_at.get_or_insert(w);
            }
        }
        assert!(light_at.is_some(), "the quiet circuit never turned light");
        assert_eq!(k.class(0), Class::Light);
    }

    /// The thesis's rule leaves circuits under a tenth of the average out
    /// of n: a bulk circuit among such very light ones is alone at its
    /// fair share and stays light (docs/torchestra.md section 6).
    #[test]
    fn a_bulk_circuit_among_very_light_ones_stays_light() {
        let mut k = ConnClassifier::new(ClassifierParams::default());
        for _ in 0..20 {
            k.count(0, 800, true);
            for light in 1..6 {
                k.count(light, 10, true);
            }
            assert!(k.end_window().is_empty());
        }
        // Counting every circuit (thresh_verylight = 1) moves it.
        let mut k = ConnClassifier::new(ClassifierParams {
            thresh_verylight: 1.0,
            ..ClassifierParams::default()
        });
        k.count(0, 800, true);
        for light in 1..6 {
            k.count(light, 10, true);
        }
        assert_eq!(k.end_window(), vec![(0, Class::Heavy)]);
    }

    /// Equal circuits never move, whatever their rate.
    #[test]
    fn equal_circuits_stay_light() {
        let mut k = ConnClassifier::new(ClassifierParams::default());
        for _ in 0..50 {
            for c in 0..4 {
                k.count(c, 500, true);
            }
            assert!(k.end_window().is_empty());
        }
    }

    /// Idle circuits are not counted in n: two active circuits with one
    /// three times the other, among ten idle ones, compare with each
    /// other, not with a share diluted by the idle ones.
    #[test]
    fn idle_circuits_do_not_dilute_the_share() {
        let mut k = ConnClassifier::new(ClassifierParams::default());
        for c in 2..12 {
            k.count(c, 1, true);
        }
        k.end_window();
        for _ in 0..20 {
            k.count(0, 300, true);
            k.count(1, 100, true);
            for (key, _) in k.end_window() {
                assert_eq!(key, 0);
            }
        }
        assert_eq!(
            k.class(0),
            Class::Light,
            "1.5x the fair share is under the 1.7x bound"
        );
        assert_eq!(k.class(1), Class::Light);
        // A circuit not ours to classify never moves.
        let mut k = ConnClassifier::new(ClassifierParams::default());
        for _ in 0..10 {
            k.count(0, 1000, false);
            k.count(1, 1, true);
            assert!(k.end_window().is_empty());
        }
    }

    #[test]
    fn parameters_are_checked() {
        assert!(ClassifierParams::default().validate().is_ok());
        for bad in [
            ClassifierParams {
                alpha: 0.0,
                ..Default::default()
            },
            ClassifierParams {
                beta: 1.5,
                ..Default::default()
            },
            ClassifierParams {
                thresh_light: f64::NAN,
                ..Default::default()
            },
            ClassifierParams {
                window: Duration::ZERO,
                ..Default::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
