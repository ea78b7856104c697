//! Which blocks each pipeline stage holds.
//!
//! A model is a sequence of blocks (`embed`, the layers, `head`); a stage holds a
//! contiguous range of them. With `v` virtual stages per rank the model is cut into
//! `p · v` chunks, global stages in pipeline order, which the schedule's
//! [`Placement`](super::placement::Placement) puts on the ranks: rank `r` holds chunks `r, r
//! + p, r + 2p, …` (Megatron's interleaving), or stages `r` and `2p − 1 − r` (ZB-V's V).
//!
//! Without interleaving the cut balances a cost per block: parameter counts by default,
//! measured forward + backward time on request, or an explicit number of blocks per stage.
//! The cut minimises the largest stage's cost (the pipeline runs at the pace of its
//! slowest stage). With interleaving every chunk gets the same number of layers (the
//! embedding goes with the first chunk, the head with the last), as in Megatron-LM.

use std::ops::Range;

use super::schedule::{Kind, Shape};
use crate::error::{Error, Result};
use crate::model::ModelConfig;

/// How the blocks of the model are divided into pipeline stages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Balance {
    /// Contiguous blocks with about equal parameter counts (the most in one stage as small
    /// as it can be).
    Params,
    /// Contiguous blocks with about equal forward and backward time, measured on one rank
    /// before training.
    Time,
    /// This many blocks in each stage (or chunk, with virtual stages), in order.
    Blocks(Vec<usize>),
}

/// Pipeline parallelism: the model cut between blocks into stages that work on
/// micro-batches at the same time ([`crate::pipeline`]). Also reachable as
/// `config::PipelineConfig`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineConfig {
    /// Pipeline stages (ranks along the pipeline axis).
    pub stages: usize,
    /// The order of forwards and backwards on each stage.
    pub schedule: Kind,
    /// Model chunks per stage (interleaved schedule; 1 otherwise).
    pub virtual_stages: usize,
    /// Keep only each micro-batch's stage input and run the forward again in backward.
    pub recompute: bool,
    /// How blocks are divided into stages.
    pub balance: Balance,
}

impl PipelineConfig {
    /// The schedule's shape with `micro_batches` micro-batches per step.
    pub fn shape(&self, micro_batches: usize) -> Shape {
        Shape { stages: self.stages, micro_batches, virtual_stages: self.virtual_stages }
    }
}

/// The number of blocks of a model: the embedding, one per layer, the head.
pub fn blocks(model: &ModelConfig) -> usize {
    model.layers + 2
}

/// Checks, before any communication, that the model's blocks can be cut as `p` asks.
pub fn check(model: &ModelConfig, p: &PipelineConfig) -> Result<()> {
    let n = blocks(model);
    let chunks = p.stages * p.virtual_stages;
    if chunks > n {
        return Err(Error::config(format!(
            "--pp {} × --virtual-stages {} asks for {chunks} pipeline chunks, but the model has only \
             {n} blocks (embedding, {} layers, head): use fewer stages or more --layers",
            p.stages, p.virtual_stages, model.layers
        )));
    }
    if p.virtual_stages > 1 && !model.layers.is_multiple_of(chunks) {
        return Err(Error::config(format!(
            "--virtual-stages {} does not divide the layers per stage: {} layers over --pp {} \
             stages × {} chunks; interleaving gives every chunk the same number of layers, so \
             --layers must be a multiple of {chunks}",
            p.virtual_stages, model.layers, p.stages, p.virtual_stages
        )));
    }
    if let Balance::Blocks(list) = &p.balance {
        if p.virtual_stages > 1 {
            return Err(Error::config(
                "--pp-balance with a list of blocks applies without --virtual-stages (interleaving \
                 gives every chunk the same number of layers)",
            ));
        }
        let total: usize = list.iter().sum();
        if list.len() != p.stages || list.contains(&0) || total != n {
            return Err(Error::config(format!(
                "--pp-balance {} must give {} stage sizes of at least one block adding up to the \
                 model's {n} blocks (embedding, {} layers, head)",
                list.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
                p.stages,
                model.layers
            )));
        }
    }
    Ok(())
}

/// The block range of every global stage (chunk), in pipeline order. `costs` are the
/// blocks' costs, used when balancing by parameters or time without interleaving.
pub fn cut(model: &ModelConfig, p: &PipelineConfig, costs: &[f64]) -> Result<Vec<Range<usize>>> {
    check(model, p)?;
    let n = blocks(model);
    if p.virtual_stages > 1 {
        let per = model.layers / (p.stages * p.virtual_stages);
        let chunks = p.stages * p.virtual_stages;
        return Ok((0..chunks)
            .map(|g| {
                let start = if g == 0 { 0 } else { 1 + g * per };
                let end = if g + 1 == chunks { n } else { 1 + (g + 1) * per };
                start..end
            })
            .collect());
    }
    match &p.balance {
        Balance::Blocks(list) => {
            let mut at = 0;
            Ok(list
                .iter()
                .map(|&k| {
                    at += k;
                    at - k..at
                })
                .collect())
        }
        Balance::Params | Balance::Time => {
            if costs.len() != n {
                return Err(Error::internal(format!("{} block costs for {n} blocks", costs.len())));
            }
            Ok(balanced(costs, p.stages))
        }
    }
}

/// Cuts `costs` into `parts` contiguous non-empty ranges (`parts <= costs.len()`) so that
/// the largest sum is as small as possible; among equal maxima, the earliest cut points.
pub fn balanced(costs: &[f64], parts: usize) -> Vec<Range<usize>> {
    let n = costs.len();
    let parts = parts.clamp(1, n.max(1));
    let mut prefix = vec![0.0; n + 1];
    for (i, c) in costs.iter().enumerate() {
        prefix[i + 1] = prefix[i] + c;
    }
    let sum = |a: usize, b: usize| prefix[b] - prefix[a];
    // best[k][i]: the smallest largest part cutting the first i blocks into k parts.
    let mut best = vec![vec![f64::INFINITY; n + 1]; parts + 1];
    let mut from = vec![vec![0usize; n + 1]; parts + 1];
    best[0][0] = 0.0;
    for k in 1..=parts {
        for i in k..=n {
            for j in (k - 1)..i {
                let v = best[k - 1][j].max(sum(j, i));
                if v < best[k][i] {
                    best[k][i] = v;
                    from[k][i] = j;
                }
            }
        }
    }
    let mut cuts = vec![n];
    let mut i = n;
    for k in (1..=parts).rev() {
        i = from[k][i];
        cuts.push(i);
    }
    cuts.reverse();
    cuts.windows(2).map(|w| w[0]..w[1]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelKind;
    use crate::pipeline::schedule::Kind;

    fn gpt(layers: usize) -> ModelConfig {
        ModelConfig { kind: ModelKind::Gpt, vocab: 12, context: 8, width: 16, layers, heads: 2, tied: false }
    }

    fn pp(stages: usize, v: usize, balance: Balance) -> PipelineConfig {
        let schedule = if v > 1 { Kind::Interleaved } else { Kind::OneFOneB };
        PipelineConfig { stages, schedule, virtual_stages: v, recompute: false, balance }
    }

    #[test]
    fn balanced_minimises_the_largest_stage() {
        // Brute force over every cut of 6 blocks into 3 parts.
        let costs = [5.0, 1.0, 1.0, 3.0, 4.0, 2.0];
        let got = balanced(&costs, 3);
        let worst =
            |r: &[Range<usize>]| r.iter().map(|r| costs[r.clone()].iter().sum::<f64>()).fold(0.0, f64::max);
        let mut best = f64::INFINITY;
        for a in 1..5 {
            for b in a + 1..6 {
                best = best.min(worst(&[0..a, a..b, b..6]));
            }
        }
        assert_eq!(worst(&got), best);
        assert_eq!(got.len(), 3);
        assert_eq!((got[0].start, got[2].end), (0, 6));
        assert!(got.windows(2).all(|w| w[0].end == w[1].start && !w[0].is_empty()));
        assert_eq!(balanced(&[1.0; 4], 4), vec![0..1, 1..2, 2..3, 3..4]);
    }

    #[test]
    fn interleaved_chunks_share_the_layers_evenly() {
        let stages = cut(&gpt(4), &pp(2, 2, Balance::Params), &[]).unwrap();
        assert_eq!(stages, vec![0..2, 2..3, 3..4, 4..6]);
        let looped = crate::pipeline::placement::Placement::Looped;
        assert_eq!(looped.chunks_of(&stages, 2, 0), vec![0..2, 3..4]);
        assert_eq!(looped.chunks_of(&stages, 2, 1), vec![2..3, 4..6]);
        let list = cut(&gpt(2), &pp(2, 1, Balance::Blocks(vec![1, 3])), &[]).unwrap();
        assert_eq!(list, vec![0..1, 1..4]);
    }

    #[test]
    fn bad_cuts_are_refused_with_what_to_do() {
        let e = check(&gpt(2), &pp(5, 1, Balance::Params)).unwrap_err().to_string();
        assert!(e.contains("only 4 blocks"), "{e}");
        let e = check(&gpt(6), &pp(2, 2, Balance::Params)).unwrap_err().to_string();
        assert!(e.contains("does not divide the layers per stage"), "{e}");
        let e = check(&gpt(2), &pp(2, 1, Balance::Blocks(vec![2, 1]))).unwrap_err().to_string();
        assert!(e.contains("adding up to the model's 4 blocks"), "{e}");
    }
}
