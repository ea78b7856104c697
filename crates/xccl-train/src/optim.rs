//! Optimisers over flat `f32` slices whose state we own: SGD with momentum and AdamW.
//!
//! candle-nn's `AdamW` keeps its moments private and its `SGD` has no momentum; these keep
//! their state as flat vectors laid out like the parameters, so it can be checkpointed,
//! restored exactly, and held in shards (a parameter-server shard owns the state of its
//! elements). Updates are element-wise and deterministic.

use multiversion::multiversion;

use crate::error::{Error, Result};
use crate::params::Chunks;

/// Which optimiser, with its hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptimConfig {
    /// SGD with momentum and weight decay, as PyTorch's `SGD` (no dampening, no Nesterov):
    /// `g += wd·p; b = μ·b + g; p -= lr·b`.
    Sgd {
        /// Learning rate.
        lr: f64,
        /// Momentum μ (0 for plain SGD).
        momentum: f64,
        /// L2 weight decay.
        weight_decay: f64,
    },
    /// AdamW with bias correction and decoupled weight decay, as candle-nn's and PyTorch's:
    /// `p *= 1 - lr·wd; m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
    /// p -= lr·m̂/(√v̂ + ε)`.
    AdamW {
        /// Learning rate.
        lr: f64,
        /// β1.
        beta1: f64,
        /// β2.
        beta2: f64,
        /// ε.
        eps: f64,
        /// Decoupled weight decay.
        weight_decay: f64,
    },
}

impl OptimConfig {
    /// SGD with momentum 0.9 and no weight decay.
    pub fn sgd(lr: f64) -> OptimConfig {
        OptimConfig::Sgd { lr, momentum: 0.9, weight_decay: 0.0 }
    }

    /// AdamW with β = (0.9, 0.999), ε = 1e-8 and weight decay 0.01 (candle-nn's defaults).
    pub fn adamw(lr: f64) -> OptimConfig {
        OptimConfig::AdamW { lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 }
    }

    /// Names of the state vectors, as checkpoints store them.
    pub fn state_names(&self) -> &'static [&'static str] {
        match self {
            OptimConfig::Sgd { .. } => &["momentum"],
            OptimConfig::AdamW { .. } => &["m", "v"],
        }
    }

    /// Checks the hyper-parameters.
    pub fn validate(&self) -> Result<()> {
        let ok = match *self {
            OptimConfig::Sgd { lr, momentum, weight_decay } => {
                lr > 0.0 && (0.0..1.0).contains(&momentum) && weight_decay >= 0.0
            }
            OptimConfig::AdamW { lr, beta1, beta2, eps, weight_decay } => {
                lr > 0.0
                    && (0.0..1.0).contains(&beta1)
                    && (0.0..1.0).contains(&beta2)
                    && eps > 0.0
                    && weight_decay >= 0.0
            }
        };
        if ok && self.lr().is_finite() {
            Ok(())
        } else {
            Err(Error::config(format!("optimizer settings out of range: {self:?} (--lr must be > 0)")))
        }
    }

    /// The learning rate.
    pub fn lr(&self) -> f64 {
        match *self {
            OptimConfig::Sgd { lr, .. } | OptimConfig::AdamW { lr, .. } => lr,
        }
    }
}

impl std::fmt::Display for OptimConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            OptimConfig::Sgd { lr, momentum, weight_decay } => {
                write!(f, "sgd lr={lr} momentum={momentum} weight_decay={weight_decay}")
            }
            OptimConfig::AdamW { lr, beta1, beta2, eps, weight_decay } => {
                write!(f, "adamw lr={lr} betas=({beta1},{beta2}) eps={eps} weight_decay={weight_decay}")
            }
        }
    }
}

/// An optimiser over `len` elements: its configuration, step count and state.
#[derive(Clone, Debug)]
pub struct Optimizer {
    config: OptimConfig,
    /// Steps taken.
    steps: u64,
    /// One vector per [`OptimConfig::state_names`] entry, each `len` long.
    state: Vec<Vec<f32>>,
}

impl Optimizer {
    /// A fresh optimiser for `len` elements.
    pub fn new(config: OptimConfig, len: usize) -> Optimizer {
        let state = config.state_names().iter().map(|_| vec![0.0; len]).collect();
        Optimizer { config, steps: 0, state }
    }

    /// An optimiser restored from `steps` and `state` (as [`state`](Self::state) returned).
    pub fn restore(config: OptimConfig, steps: u64, state: Vec<Vec<f32>>) -> Result<Optimizer> {
        let names = config.state_names();
        let len = state.first().map_or(0, Vec::len);
        if state.len() != names.len() || state.iter().any(|s| s.len() != len) {
            return Err(Error::config(format!(
                "optimizer state has {} vectors of lengths {:?}; {} needs {} of equal length",
                state.len(),
                state.iter().map(Vec::len).collect::<Vec<_>>(),
                config,
                names.len()
            )));
        }
        Ok(Optimizer { config, steps, state })
    }

    /// Its configuration.
    pub fn config(&self) -> &OptimConfig {
        &self.config
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Its state vectors, named by [`OptimConfig::state_names`].
    pub fn state(&self) -> &[Vec<f32>] {
        &self.state
    }

    /// One step: updates `params` with the gradients in `grads`, whose chunks cover
    /// `params` exactly (chunk ranges index into `params` and the state).
    pub fn step(&mut self, params: &mut [f32], grads: &Chunks) -> Result<()> {
        let len = self.len();
        if params.len() != len || grads.len() != len {
            return Err(Error::internal(format!(
                "optimizer over {len} elements given {} parameters and {} gradients",
                params.len(),
                grads.len()
            )));
        }
        self.begin_step();
        for (range, g) in grads.iter() {
            self.update(range.start, &mut params[range.clone()], g)?;
        }
        Ok(())
    }

    /// Elements it holds state for.
    pub fn len(&self) -> usize {
        self.state.first().map_or(0, Vec::len)
    }

    /// Whether it holds no state (SGD without momentum state is never empty: every
    /// optimiser here keeps at least one vector).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts a step taken piece by piece with [`update`](Self::update) (the step count
    /// used by bias correction advances once).
    pub fn begin_step(&mut self) {
        self.steps += 1;
    }

    /// Updates `params` (the elements `at .. at + params.len()` of what the optimiser
    /// covers) with their gradients `grads`, within the step begun last.
    pub fn update(&mut self, at: usize, params: &mut [f32], grads: &[f32]) -> Result<()> {
        let range = at..at + params.len();
        if grads.len() != params.len() || range.end > self.len() {
            return Err(Error::internal(format!(
                "update of elements {range:?} (with {} gradients) beyond the optimizer's {}",
                grads.len(),
                self.len()
            )));
        }
        let t = self.steps.max(1) as i32;
        match self.config {
            OptimConfig::Sgd { lr, momentum, weight_decay } => {
                let k = SgdStep { lr: lr as f32, mu: momentum as f32, wd: weight_decay as f32 };
                sgd(params, &mut self.state[0][range], grads, &k);
            }
            OptimConfig::AdamW { lr, beta1, beta2, eps, weight_decay } => {
                let k = AdamWStep {
                    decay: (1.0 - lr * weight_decay) as f32,
                    b1: beta1 as f32,
                    b2: beta2 as f32,
                    c1: (1.0 - beta1) as f32,
                    c2: (1.0 - beta2) as f32,
                    scale_m: (1.0 / (1.0 - beta1.powi(t))) as f32,
                    scale_v: (1.0 / (1.0 - beta2.powi(t))) as f32,
                    lr: lr as f32,
                    eps: eps as f32,
                };
                let [m, v] = &mut self.state[..] else {
                    return Err(Error::internal("AdamW without its two moments"));
                };
                adamw(params, &mut m[range.clone()], &mut v[range], grads, &k);
            }
        }
        Ok(())
    }
}

/// The constants of one SGD step.
struct SgdStep {
    lr: f32,
    mu: f32,
    wd: f32,
}

/// SGD with momentum and weight decay on equally long slices (compiled also for AVX2 and
/// AVX-512, chosen at run time; every version computes the same bits: no operation is fused
/// or reordered).
#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq+avx512bw", "x86_64+avx2+fma"))]
fn sgd(params: &mut [f32], b: &mut [f32], grads: &[f32], k: &SgdStep) {
    for ((p, b), &g) in params.iter_mut().zip(b).zip(grads) {
        let g = g + k.wd * *p;
        *b = k.mu * *b + g;
        *p -= k.lr * *b;
    }
}

/// The constants of one AdamW step (the bias corrections of step `t` included).
struct AdamWStep {
    decay: f32,
    b1: f32,
    b2: f32,
    c1: f32,
    c2: f32,
    scale_m: f32,
    scale_v: f32,
    lr: f32,
    eps: f32,
}

/// AdamW on equally long slices, as [`sgd`] is compiled.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq+avx512bw", "x86_64+avx2+fma"))]
fn adamw(params: &mut [f32], m: &mut [f32], v: &mut [f32], grads: &[f32], k: &AdamWStep) {
    for (((p, m), v), &g) in params.iter_mut().zip(m).zip(v).zip(grads) {
        *m = k.b1 * *m + k.c1 * g;
        *v = k.b2 * *v + k.c2 * g * g;
        let update = (*m * k.scale_m) / ((*v * k.scale_v).sqrt() + k.eps);
        *p = *p * k.decay - k.lr * update;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgd_momentum_matches_the_formula() {
        let mut o = Optimizer::new(OptimConfig::Sgd { lr: 0.1, momentum: 0.5, weight_decay: 0.0 }, 2);
        let mut p = vec![1.0f32, 2.0];
        let mut g = Chunks::new(&[1, 1]);
        g.add(0, &[1.0, -1.0]).unwrap();
        o.step(&mut p, &g).unwrap();
        assert_eq!(p, vec![0.9, 2.1]);
        o.step(&mut p, &g).unwrap();
        // b = 0.5·1 + 1 = 1.5
        assert!((p[0] - 0.75).abs() < 1e-6 && (p[1] - 2.25).abs() < 1e-6, "{p:?}");
        assert_eq!(o.steps(), 2);
    }

    #[test]
    fn adamw_first_step_moves_by_lr() {
        let mut o = Optimizer::new(OptimConfig::adamw(0.01), 3);
        let mut p = vec![1.0f32, -1.0, 0.5];
        let mut g = Chunks::new(&[3]);
        g.add(0, &[3.0, -0.2, 0.0]).unwrap();
        o.step(&mut p, &g).unwrap();
        // Bias-corrected first step: update = sign(g) (for |g| >> eps), after decay.
        let d = 1.0 - 0.01 * 0.01;
        assert!((p[0] - (d - 0.01)).abs() < 1e-6);
        assert!((p[1] - (-d + 0.01)).abs() < 1e-6);
        assert!((p[2] - 0.5 * d).abs() < 1e-6);
        let restored = Optimizer::restore(*o.config(), o.steps(), o.state().to_vec()).unwrap();
        assert_eq!(restored.state(), o.state());
        assert!(Optimizer::restore(*o.config(), 1, vec![vec![0.0; 3]]).is_err());
    }
}
