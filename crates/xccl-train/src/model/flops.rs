//! Model FLOP utilisation: the useful floating-point operations of a training step, and the
//! rate of a large f32 matrix product on this machine to hold them against.
//!
//! MFU = [`train_flops_per_step`] / step time / [`matmul_rate`], both on the same threads
//! (candle's matrix product runs on `RAYON_NUM_THREADS` threads, default all cores).

use std::time::Instant;

use candle_core::{Device, Tensor};

use super::{ModelConfig, ModelKind};

/// Useful FLOPs of one training step (forward and backward) on `rows` sequences of `len`
/// tokens, counting matrix products only (a multiply-add is 2 FLOPs).
///
/// With `N = rows · len` tokens, every weight matrix `[out, in]` costs `2·N·in·out` forward
/// and twice that backward (the input's gradient and the weight's), so `6·N·P` for the `P`
/// matrix-product weights: biases, layer norms and embedding look-ups are not counted.
///
/// GPT (width `d`, `L` layers, vocabulary `V`): each layer has `qkv` (`d × 3d`), `proj`
/// (`d × d`), `fc` (`d × 4d`) and `out` (`4d × d`), `12·d²` in all, and the head `d × V`
/// (counted whether or not it is tied to the embedding, since it is multiplied either way):
/// `P = 12·L·d² + d·V`. Attention adds, per layer and sequence, `q·kᵀ` and `att·v`, each
/// `2·len²·d` forward over all heads (the full `len × len` scores, as computed, not only the
/// causal half) and twice that backward: `12·rows·L·len²·d`. So
///
/// `flops = 6·rows·len·(12·L·d² + d·V) + 12·rows·L·len²·d`.
///
/// MLP (window of `context` tokens of `e` embedding features, hidden width `w`):
/// `P = context·e·w + (L − 1)·w² + w·V`, and no attention.
pub fn train_flops_per_step(cfg: &ModelConfig, rows: usize, len: usize) -> f64 {
    let (n, d, l, v) = (rows as f64 * len as f64, cfg.width as f64, cfg.layers as f64, cfg.vocab as f64);
    match cfg.kind {
        ModelKind::Gpt => {
            let weights = 12.0 * l * d * d + d * v;
            6.0 * n * weights + 12.0 * rows as f64 * l * (len as f64).powi(2) * d
        }
        ModelKind::Mlp => {
            let inputs = (cfg.context * super::mlp::embed_width(cfg)) as f64;
            let weights = if cfg.layers == 0 { inputs * v } else { inputs * d + (l - 1.0) * d * d + d * v };
            6.0 * n * weights
        }
    }
}

/// The median rate, in FLOP/s, of candle's f32 matrix product of two `n × n` matrices over
/// `reps` repetitions (after one warm-up), on candle's threads (`RAYON_NUM_THREADS`).
///
/// `n = 1024` with `reps = 10` takes about 0.2 to 0.5 s on one core of a current x86 CPU.
pub fn matmul_rate(n: usize, reps: usize) -> candle_core::Result<f64> {
    let n = n.max(1);
    let a = Tensor::from_vec(
        (0..n * n).map(|i| ((i * 7 + 3) % 13) as f32 * 0.1 - 0.6).collect::<Vec<_>>(),
        (n, n),
        &Device::Cpu,
    )?;
    let b = a.t()?.contiguous()?;
    let _ = a.matmul(&b)?;
    let mut seconds = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        let c = a.matmul(&b)?;
        seconds.push(t0.elapsed().as_secs_f64());
        drop(c);
    }
    seconds.sort_by(f64::total_cmp);
    let median = seconds[seconds.len() / 2];
    Ok(2.0 * (n as f64).powi(3) / median.max(f64::MIN_POSITIVE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt(width: usize, layers: usize, vocab: usize) -> ModelConfig {
        ModelConfig { kind: ModelKind::Gpt, vocab, context: 16, width, layers, heads: 2, tied: false }
    }

    #[test]
    fn gpt_flops_by_hand() {
        // d = 4, L = 2, V = 10, 3 rows of 5 tokens: N = 15.
        // Weights: 2 layers × 12 × 16 = 384, head 40: P = 424; 6·15·424 = 38 160.
        // Attention: 12 · 3 rows · 2 layers · 25 · 4 = 7 200.
        assert_eq!(train_flops_per_step(&gpt(4, 2, 10), 3, 5), 45_360.0);
        // Tying does not change the count.
        let tied = ModelConfig { tied: true, ..gpt(4, 2, 10) };
        assert_eq!(train_flops_per_step(&tied, 3, 5), 45_360.0);
    }

    #[test]
    fn mlp_flops_by_hand() {
        // context 16, embed width max(8 / 4, 4) = 4: inputs 64; w = 8, L = 2, V = 10.
        // P = 64·8 + 1·64 + 8·10 = 656; 6 · 2 rows · 3 tokens · 656 = 23 616.
        let cfg = ModelConfig { kind: ModelKind::Mlp, ..gpt(8, 2, 10) };
        assert_eq!(train_flops_per_step(&cfg, 2, 3), 23_616.0);
    }

    #[test]
    fn matmul_rate_is_positive() {
        let r = matmul_rate(64, 3).unwrap();
        assert!(r.is_finite() && r > 0.0);
    }
}
