//! Which blocks each pipeline stage holds.
//!
//! A model is a sequence of blocks (`embed`, the layers, `head`); a stage holds a
//! contiguous range of them. With `v` virtual stages per rank the model is cut into `p · v`
//! chunks, global stages in pipeline order, which the schedule's [`Placement`] puts on the
//! ranks: rank `r` holds chunks `r, r + p, r + 2p, …` (Megatron's interleaving), or stages
//! `r` and `2p − 1 − r` (ZB-V's V).
//!
//! Without interleaving the cut balances a cost per block: parameter counts by default,
//! measured forward + backward time on request, or an explicit number of blocks per stage.
//! The cut minimises the largest stage's cost (the pipeline runs at the pace of its
//! slowest stage). With interleaving every chunk gets the same number of layers (the
//! embedding goes with the first chunk, the head with the last), as in Megatron-LM. ZB-V
//! balances the same costs over its V: the largest sum of a rank's two stages as small as
//! it can be ([`balanced_v`]; rank 0 holds the embedding and the head), or takes an explicit
//! list of its `2·p` stage sizes.

use std::ops::Range;

use super::placement::Placement;
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
    let v_shaped = p.schedule.placement() == Placement::V;
    if p.virtual_stages > 1 && !v_shaped && !model.layers.is_multiple_of(chunks) {
        return Err(Error::config(format!(
            "--virtual-stages {} does not divide the layers per stage: {} layers over --pp {} \
             stages × {} chunks; interleaving gives every chunk the same number of layers, so \
             --layers must be a multiple of {chunks}",
            p.virtual_stages, model.layers, p.stages, p.virtual_stages
        )));
    }
    if let Balance::Blocks(list) = &p.balance {
        if p.virtual_stages > 1 && !v_shaped {
            return Err(Error::config(
                "--pp-balance with a list of blocks applies without --virtual-stages (interleaving \
                 gives every chunk the same number of layers)",
            ));
        }
        let total: usize = list.iter().sum();
        if list.len() != chunks || list.contains(&0) || total != n {
            let what = if v_shaped { " (the 2·pp stages of the V, in pipeline order)" } else { "" };
            return Err(Error::config(format!(
                "--pp-balance {} must give {chunks} stage sizes{what} of at least one block adding \
                 up to the model's {n} blocks (embedding, {} layers, head)",
                list.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
                model.layers
            )));
        }
    }
    Ok(())
}

/// The block range of every global stage (chunk), in pipeline order. `costs` are the
/// blocks' costs, used when balancing by parameters or time without interleaving (see
/// [`needs_costs`]); ZB-V balances its ranks' two stages together ([`balanced_v`]).
pub fn cut(model: &ModelConfig, p: &PipelineConfig, costs: &[f64]) -> Result<Vec<Range<usize>>> {
    check(model, p)?;
    let n = blocks(model);
    if p.virtual_stages > 1 && p.schedule.placement() == Placement::Looped {
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
            Ok(match p.schedule.placement() {
                Placement::V => balanced_v(costs, p.stages),
                Placement::Looped => balanced(costs, p.stages),
            })
        }
    }
}

/// Whether [`cut`] cuts `p` by the blocks' costs (parameter counts or measured times): not
/// for an explicit list, nor for interleaving (equal layers per chunk).
pub fn needs_costs(p: &PipelineConfig) -> bool {
    !matches!(p.balance, Balance::Blocks(_))
        && (p.virtual_stages == 1 || p.schedule.placement() == Placement::V)
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

/// Cuts `costs` into `2·p` contiguous non-empty stages placed in a V (rank `r` holds stages
/// `r` and `2·p − 1 − r`, ZB-V's [`Placement::V`]) so that the largest load of a rank, its
/// two stages' sums, is as small as possible; `p >= 1` and `2·p <= costs.len()`.
///
/// Between cuts of equal load it breaks ties towards a smaller largest stage (a stage much
/// larger than the others would hold up the micro-batches going through it): a tie-break
/// carried through the program, which finds the smallest load exactly but not always the
/// smallest largest stage among such cuts.
///
/// Ranks are cut from the outside in: rank `k` takes the stages at both ends of the middle
/// the ranks before it left, `[a, a′)` and `[b′, b)`, and the last rank the middle itself
/// (its two stages adjacent, split where the larger of the two is smallest). `best[k][a][b]`,
/// the smallest (largest load, largest stage) ranks `k..p` can make of the middle `[a, b)`,
/// is found from the inside out; a rank's ends grow only while their sum stays at most the
/// best load found so far, so each middle tries about `(n/p)²` pairs of ends.
pub fn balanced_v(costs: &[f64], p: usize) -> Vec<Range<usize>> {
    let n = costs.len();
    let p = p.clamp(1, (n / 2).max(1));
    if n < 2 {
        return vec![0..n; 2 * p];
    }
    let mut prefix = vec![0.0; n + 1];
    for (i, c) in costs.iter().enumerate() {
        prefix[i + 1] = prefix[i] + c.max(0.0);
    }
    let sum = |a: usize, b: usize| prefix[b] - prefix[a];
    let at = |a: usize, b: usize| a * (n + 1) + b;
    // The middle's two stages on the last rank: where the larger of the two is smallest.
    let split = |a: usize, b: usize| {
        (a + 1..b)
            .min_by(|&x, &y| sum(a, x).max(sum(x, b)).total_cmp(&sum(a, y).max(sum(y, b))))
            .unwrap_or(a + 1)
    };
    // Per level: the best (largest load, largest stage) of every middle, and the ends that
    // reach it.
    const NONE: (f64, f64) = (f64::INFINITY, f64::INFINITY);
    let mut best = vec![vec![NONE; (n + 1) * (n + 1)]; p];
    let mut ends = vec![vec![(0usize, 0usize); (n + 1) * (n + 1)]; p];
    for a in 0..n {
        for b in a + 2..=n {
            let x = split(a, b);
            best[p - 1][at(a, b)] = (sum(a, b), sum(a, x).max(sum(x, b)));
        }
    }
    let lex = |x: (f64, f64), y: (f64, f64)| x.0 < y.0 || (x.0 == y.0 && x.1 < y.1);
    for k in (0..p - 1).rev() {
        // The ranks after this one need two blocks each.
        let need = 2 * (p - k - 1);
        for a in k..n {
            for b in a + need + 2..=n - k {
                let mut top = NONE;
                let mut pick = (0, 0);
                for a2 in a + 1..b - need {
                    let left = sum(a, a2);
                    if left > top.0 {
                        break;
                    }
                    for b2 in (a2 + need..b).rev() {
                        let right = sum(b2, b);
                        if left + right > top.0 {
                            break;
                        }
                        let inner = best[k + 1][at(a2, b2)];
                        let v = ((left + right).max(inner.0), left.max(right).max(inner.1));
                        if lex(v, top) {
                            (top, pick) = (v, (a2, b2));
                        }
                    }
                }
                best[k][at(a, b)] = top;
                ends[k][at(a, b)] = pick;
            }
        }
    }
    let mut stages = vec![0..0; 2 * p];
    let (mut a, mut b) = (0, n);
    for k in 0..p - 1 {
        let (a2, b2) = ends[k][at(a, b)];
        stages[k] = a..a2;
        stages[2 * p - 1 - k] = b2..b;
        (a, b) = (a2, b2);
    }
    let x = split(a, b);
    stages[p - 1] = a..x;
    stages[p] = x..b;
    stages
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

    /// Every V cut of `n` blocks into `2·p` non-empty stages, by brute force.
    fn every_v_cut(n: usize, p: usize) -> Vec<Vec<Range<usize>>> {
        fn go(
            at: usize,
            n: usize,
            left: usize,
            cut: &mut Vec<Range<usize>>,
            out: &mut Vec<Vec<Range<usize>>>,
        ) {
            if left == 0 {
                if at == n {
                    out.push(cut.clone());
                }
                return;
            }
            for end in at + 1..=n - (left - 1) {
                cut.push(at..end);
                go(end, n, left - 1, cut, out);
                cut.pop();
            }
        }
        let mut out = Vec::new();
        go(0, n, 2 * p, &mut Vec::new(), &mut out);
        out
    }

    fn v_load(costs: &[f64], cut: &[Range<usize>]) -> f64 {
        let p = cut.len() / 2;
        let s = |r: &Range<usize>| costs[r.clone()].iter().sum::<f64>();
        (0..p).map(|r| s(&cut[r]) + s(&cut[2 * p - 1 - r])).fold(0.0, f64::max)
    }

    #[test]
    fn balanced_v_minimises_the_largest_rank_load() {
        // Brute force over every V cut, on costs drawn from a small generator.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut draw = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 100) as f64
        };
        for n in 2..=10 {
            for p in 1..=n / 2 {
                for _ in 0..20 {
                    let costs: Vec<f64> = (0..n).map(|_| draw()).collect();
                    let got = balanced_v(&costs, p);
                    assert_eq!(got.len(), 2 * p);
                    assert_eq!((got[0].start, got[2 * p - 1].end), (0, n), "{costs:?} {got:?}");
                    assert!(got.windows(2).all(|w| w[0].end == w[1].start && !w[0].is_empty()), "{got:?}");
                    assert!(!got[2 * p - 1].is_empty());
                    let best =
                        every_v_cut(n, p).iter().map(|c| v_load(&costs, c)).fold(f64::INFINITY, f64::min);
                    let load = v_load(&costs, &got);
                    assert!(
                        load <= best * (1.0 + 1e-6) + 1e-9,
                        "p={p} {costs:?}: {got:?} loads {load}, best {best}"
                    );
                }
            }
        }
        // The loss's stage heavy: rank 0 (first and last stage) takes fewer layers.
        let mut costs = vec![1.0; 14];
        costs[13] = 3.0;
        let cut = balanced_v(&costs, 2);
        assert_eq!(v_load(&costs, &cut), 8.0, "{cut:?}");
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

    #[test]
    fn zero_bubble_v_cuts_over_its_v() {
        let v = |balance| PipelineConfig {
            stages: 2,
            schedule: Kind::ZeroBubbleV,
            virtual_stages: 2,
            recompute: false,
            balance,
        };
        // Any number of layers: 3 layers, 5 blocks, 4 stages; the costs balanced over the V.
        let costs = [1.0, 4.0, 4.0, 4.0, 1.0];
        let got = cut(&gpt(3), &v(Balance::Params), &costs).unwrap();
        // Rank 1's two middle stages 8, rank 0's ends 6: no cut does better.
        assert_eq!((got.len(), v_load(&costs, &got)), (4, 8.0), "{got:?}");
        // An explicit list of the V's 4 stages, or a refusal that says so.
        assert_eq!(
            cut(&gpt(3), &v(Balance::Blocks(vec![1, 2, 1, 1])), &[]).unwrap(),
            vec![0..1, 1..3, 3..4, 4..5]
        );
        let e = check(&gpt(3), &v(Balance::Blocks(vec![2, 3]))).unwrap_err().to_string();
        assert!(e.contains("must give 4 stage sizes (the 2·pp stages of the V"), "{e}");
        assert!(needs_costs(&v(Balance::Time)) && !needs_costs(&v(Balance::Blocks(vec![1; 4]))));
        assert!(!needs_costs(&pp(2, 2, Balance::Params)));
    }
}
