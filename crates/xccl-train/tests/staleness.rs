//! The asynchronous parameter server: with a deliberately slow worker, the fast one runs
//! ahead, but never more than the staleness bound, and training still converges.

mod common;

use std::time::Duration;

use common::{run_with, tiny};
use xccl_train::metrics::StepStat;
use xccl_train::optim::OptimConfig;
use xccl_train::ps::PsConfig;
use xccl_train::trainer::{Observer, Strategy};

/// Sleeps after every step on the slow rank.
struct Pace(Duration);

impl Observer for Pace {
    fn step(&mut self, _stat: &StepStat) {
        std::thread::sleep(self.0);
    }
}

#[test]
fn staleness_is_bounded_and_training_converges() {
    let s = 3;
    let steps = 60;
    // One server that also works beside a slow worker; two dedicated servers, two workers.
    for (ranks, servers, dedicated) in [(2, 1, false), (4, 2, true)] {
        let strategy = Strategy::Ps(PsConfig { servers, dedicated, staleness: s });
        let config = tiny(OptimConfig::adamw(1e-2), strategy, 16, 1, steps);
        let slow = ranks - 1;
        let pace = |rank| Pace(if rank == slow { Duration::from_millis(15) } else { Duration::ZERO });
        let outcomes: Vec<_> = run_with(ranks, &config, pace).into_iter().map(|r| r.unwrap()).collect();
        let mut ahead = 0;
        for (rank, o) in outcomes.iter().enumerate() {
            for st in &o.steps {
                let v = st.version.unwrap();
                assert!(
                    v + s >= st.step,
                    "rank {rank} computed step {} on version {v}, beyond staleness {s}",
                    st.step
                );
                assert!(v <= st.step, "rank {rank} saw version {v} before step {} was pushed", st.step);
                if st.step > v {
                    ahead += 1;
                }
            }
        }
        assert!(ahead > 0, "no worker ever ran ahead: the slow worker did not make the run asynchronous");
        let summary = outcomes[0].summary.as_ref().unwrap();
        assert!(
            summary.staleness.iter().any(|&(k, _)| k > 0) && summary.staleness.iter().all(|&(k, _)| k <= s)
        );
        let losses: Vec<f64> = summary.losses.iter().map(|&(_, l)| l).collect();
        assert_eq!(losses.len(), steps as usize);
        let first: f64 = losses[..10].iter().sum::<f64>() / 10.0;
        let last: f64 = losses[losses.len() - 10..].iter().sum::<f64>() / 10.0;
        assert!(last < 0.85 * first, "loss did not fall: {first:.3} -> {last:.3}");
        for o in &outcomes[1..] {
            assert_eq!(o.params, outcomes[0].params, "ranks ended with different parameters");
        }
    }
}
