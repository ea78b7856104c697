//! The f32 matrix-product rate of candle on this machine, the denominator of model FLOP
//! utilisation, and optionally the MFU of a finished `xccl train` run.
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p xccl-train --example matmul_rate [N [REPS]]
//! RAYON_NUM_THREADS=2 cargo run --release -p xccl-train --example matmul_rate -- \
//!     1024 10 WIDTH LAYERS VOCAB ROWS LEN STEP_MS
//! ```
//!
//! Prints the median GFLOP/s of an `N × N` product (default 1024, 10 repetitions) on
//! candle's threads; with a GPT shape and a measured step time, also that step's useful
//! GFLOP and its MFU.

use xccl_train::model::flops::{matmul_rate, train_flops_per_step};
use xccl_train::model::{ModelConfig, ModelKind};

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> Result<T, String> {
    match args.get(i) {
        None => Ok(default),
        Some(s) => s.parse().map_err(|_| format!("argument {}: cannot parse {s:?}", i + 1)),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n = arg(&args, 0, 1024usize)?;
    let reps = arg(&args, 1, 10usize)?;
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "all".into());
    let t0 = std::time::Instant::now();
    let rate = matmul_rate(n, reps)?;
    println!(
        "matmul {n}x{n}x{n} f32, {threads} thread(s): {:.1} GFLOP/s (median of {reps}, {:.2} s)",
        rate / 1e9,
        t0.elapsed().as_secs_f64()
    );
    if args.len() >= 8 {
        let cfg = ModelConfig {
            kind: ModelKind::Gpt,
            width: arg(&args, 2, 0)?,
            layers: arg(&args, 3, 0)?,
            vocab: arg(&args, 4, 0)?,
            context: 0,
            heads: 1,
            tied: false,
        };
        let (rows, len, step_ms) = (arg(&args, 5, 0usize)?, arg(&args, 6, 0usize)?, arg(&args, 7, 0.0f64)?);
        let flops = train_flops_per_step(&cfg, rows, len);
        let achieved = flops / (step_ms / 1e3);
        println!(
            "step: {:.3} GFLOP in {step_ms} ms = {:.1} GFLOP/s, MFU {:.1}%",
            flops / 1e9,
            achieved / 1e9,
            100.0 * achieved / rate
        );
    }
    Ok(())
}
