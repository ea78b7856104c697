//! Folding `n` ranks onto the largest power of two `p <= n`, for the hypercube algorithms.
//!
//! The first `2 (n - p)` ranks pair up: the even rank of each pair (an *extra*) hands its
//! data to the odd one (its *host*) before the main rounds and gets the result back after
//! them; every other rank takes part directly. Participants are numbered `0..p`: hosts by
//! `r / 2`, the rest by `r - (n - p)`.

/// How this rank takes part in a folded algorithm.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// Sits the main rounds out; its partner (host) works for it.
    Extra { host: usize },
    /// Takes part as participant `v`, and works for `extra` if it hosts one.
    Part { v: usize, extra: Option<usize> },
}

#[derive(Copy, Clone, Debug)]
pub(super) struct Fold {
    /// Participants: the largest power of two not above `n`.
    pub p: usize,
    /// Extras (`n - p`).
    pub rem: usize,
}

impl Fold {
    pub fn new(n: usize) -> Fold {
        let p = if n == 0 { 0 } else { 1 << (usize::BITS - 1 - n.leading_zeros()) };
        Fold { p, rem: n - p }
    }

    /// Whether some ranks fold (then programs have a step before and after the main rounds).
    pub fn folds(&self) -> bool {
        self.rem > 0
    }

    pub fn role(&self, rank: usize) -> Role {
        if rank < 2 * self.rem {
            if rank.is_multiple_of(2) {
                Role::Extra { host: rank + 1 }
            } else {
                Role::Part { v: rank / 2, extra: Some(rank - 1) }
            }
        } else {
            Role::Part { v: rank - self.rem, extra: None }
        }
    }

    /// The rank of participant `v`.
    pub fn rank_of(&self, v: usize) -> usize {
        if v < self.rem { 2 * v + 1 } else { v + self.rem }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn participants_and_extras_cover_every_rank_once() {
        for n in 1..70 {
            let f = Fold::new(n);
            assert!(f.p.is_power_of_two() && f.p <= n && 2 * f.p > n);
            let mut seen = vec![0; n];
            for v in 0..f.p {
                seen[f.rank_of(v)] += 1;
                assert_eq!(f.role(f.rank_of(v)), Role::Part { v, extra: f.role(f.rank_of(v)).extra() });
            }
            for (r, count) in seen.iter_mut().enumerate() {
                if let Role::Extra { host } = f.role(r) {
                    *count += 1;
                    assert_eq!(f.role(host), Role::Part { v: host / 2, extra: Some(r) });
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "n={n}");
        }
    }

    impl Role {
        fn extra(self) -> Option<usize> {
            match self {
                Role::Part { extra, .. } => extra,
                Role::Extra { .. } => None,
            }
        }
    }
}
