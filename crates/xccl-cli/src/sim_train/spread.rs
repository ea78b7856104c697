//! How unevenly ranks compute: the wait for the slowest rank that every step ends with.
//!
//! Ranks do not compute at one pace from one iteration to the next (another thread takes
//! the core for a while, a page fault, the memory another rank streams), and ranks that
//! wait for each other every step (the data-parallel all-reduce, the pipeline's messages,
//! the loss) end it with the slowest of them. The median block times a prediction composes
//! leave that out: measured on this machine, `--dp 2` steps ran 2–4% longer than either
//! rank's median compute. [`Spread`] keeps the measured iterations and gives the factor by
//! which a step of more ranks stretches.

/// Per-iteration compute of the groups of ranks measured at once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Spread {
    /// For each iteration, the compute seconds of the slowest of the groups measured at once,
    /// sorted.
    slowest: Vec<f64>,
    /// How many groups ran at once.
    at_once: usize,
    /// The median of every group's iterations: one group's pace.
    typical: f64,
}

impl Spread {
    /// From the compute seconds of each iteration of each group that ran at once (one list
    /// per group, iterations in order; iteration `i` of every group ran at about the same
    /// time, so what slows them all at once is not counted as a wait).
    pub fn from_iterations(groups: &[Vec<f64>]) -> Spread {
        let n = groups.iter().map(Vec::len).min().unwrap_or(0);
        if n == 0 {
            return Spread::default();
        }
        let mut slowest: Vec<f64> =
            (0..n).map(|i| groups.iter().map(|g| g[i]).fold(f64::NEG_INFINITY, f64::max)).collect();
        slowest.sort_by(f64::total_cmp);
        let mut all: Vec<f64> = groups.iter().flat_map(|g| g[..n].iter().copied()).collect();
        all.sort_by(f64::total_cmp);
        Spread { slowest, at_once: groups.len(), typical: quantile(&all, 0.5) }
    }

    /// How many times one group's median iteration the median step of `groups` groups takes
    /// when they wait for each other every step (at least 1); a group is a tensor-parallel
    /// group, or one rank without tensor parallelism. The groups measured at once share
    /// this machine's moments, and their slowest was measured; `groups` of them make
    /// `groups / at_once` such sets, taken as independent: the median of the slowest of `g`
    /// independent draws is the `0.5^(1/g)` quantile of one. One group waits for nobody;
    /// between one and the groups measured at once, the slowest of those measured is taken.
    pub fn wait_factor(&self, groups: usize) -> f64 {
        if groups <= 1 || self.slowest.is_empty() || self.typical <= 0.0 {
            return 1.0;
        }
        let sets = groups.div_ceil(self.at_once.max(1)).max(1);
        (quantile(&self.slowest, 0.5f64.powf(1.0 / sets as f64)) / self.typical).max(1.0)
    }

    /// How many groups ran at once (0 when nothing was measured).
    pub fn at_once(&self) -> usize {
        self.at_once
    }
}

/// The `q` quantile of `sorted` (ascending), linear between neighbours.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n => {
            let at = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (at - lo as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    /// Two ranks, 100 iterations: rank 0 takes i + 1, rank 1 takes 100 − i (so their slowest
    /// is 51..=100 twice over), one rank's median 50.5.
    fn two() -> Spread {
        let a: Vec<f64> = (0..100).map(|i| f64::from(i + 1)).collect();
        let b: Vec<f64> = (0..100).map(|i| f64::from(100 - i)).collect();
        Spread::from_iterations(&[a, b])
    }

    #[test]
    fn the_slowest_of_ranks_measured_at_once_is_taken_per_iteration() {
        let s = two();
        assert_eq!(s.at_once(), 2);
        assert!(close(s.typical, 50.5));
        // The two ranks of the measurement: the median of 51, 51, 52, 52, …, 100, 100.
        assert!(close(s.wait_factor(2), 75.5 / 50.5), "{}", s.wait_factor(2));
        assert_eq!(s.wait_factor(1), 1.0);
    }

    #[test]
    fn more_ranks_wait_for_a_higher_quantile_of_the_measured_slowest() {
        let s = two();
        // 8 ranks are 4 groups of the 2 measured: the 0.5^(1/4) quantile of the slowest.
        let q = 0.5f64.powf(0.25) * 99.0;
        let lo = q.floor() as usize;
        let at = |i: usize| 51.0 + (i / 2) as f64;
        let want = at(lo) + (at(lo + 1) - at(lo)) * (q - lo as f64);
        assert!(close(s.wait_factor(8), want / 50.5), "{} {}", s.wait_factor(8), want / 50.5);
        assert!(s.wait_factor(7) == s.wait_factor(8) && s.wait_factor(8) < s.wait_factor(64));
        // However many ranks, never beyond the slowest measured iteration.
        assert!(s.wait_factor(1 << 20) <= 100.0 / 50.5);
    }

    #[test]
    fn ranks_at_one_pace_or_nothing_measured_wait_for_nothing() {
        let even = Spread::from_iterations(&[vec![2.0; 10], vec![2.0; 10]]);
        assert_eq!(even.wait_factor(4096), 1.0);
        assert_eq!(Spread::default().wait_factor(8), 1.0);
        assert_eq!(Spread::from_iterations(&[vec![], vec![1.0]]).wait_factor(8), 1.0);
        // One rank alone waits for nobody, however its iterations vary.
        let alone = Spread::from_iterations(&[vec![1.0, 5.0, 2.0, 9.0, 3.0]]);
        assert_eq!(alone.wait_factor(1), 1.0);
        assert!(alone.wait_factor(2) > 1.0);
    }
}
