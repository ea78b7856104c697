//! Models as sequences of [`Block`]s: configuration, construction, forward, the loss, and
//! backward block by block.
//!
//! Blockwise backward: block `k` ran on a leaf input `x_k` (a variable detached from block
//! `k - 1`'s output `y_{k-1}`). The last block's backward is `loss.backward()`; block `k`'s
//! is `(y_k · g_k).sum().backward()`, where `g_k` is the gradient of block `k + 1`'s input.
//! Each yields the block's parameter gradients and `g_{k-1}`, so gradients become ready
//! block by block, last block first, as in PyTorch's autograd with DDP hooks.

pub mod block;
pub mod flops;
pub mod gpt;
pub mod mlp;
pub mod softmax;

use std::ops::Range;
use std::sync::Arc;

use candle_core::{D, Tensor, Var};

pub use block::{Block, Init, ids_tensor};

use crate::error::{Error, Result};
use crate::params::{Layout, Param, ParamSet, Shard};
use crate::tp::{self, Tp};
use crate::trace::Trace;

/// Which architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// The GPT-style decoder of [`gpt`].
    Gpt,
    /// The windowed MLP of [`mlp`].
    Mlp,
}

/// The shape of a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    /// Architecture.
    pub kind: ModelKind,
    /// Vocabulary size (set from the data).
    pub vocab: usize,
    /// Longest input sequence (GPT: position embeddings; MLP: the window).
    pub context: usize,
    /// Features per token (GPT) or hidden units (MLP).
    pub width: usize,
    /// Decoder layers (GPT) or hidden layers (MLP).
    pub layers: usize,
    /// Attention heads (GPT).
    pub heads: usize,
    /// Whether the GPT's output head reuses the token embedding.
    pub tied: bool,
}

impl std::fmt::Display for ModelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            ModelKind::Gpt => "gpt",
            ModelKind::Mlp => "mlp",
        };
        write!(
            f,
            "{kind} vocab={} context={} width={} layers={} heads={} tied={}",
            self.vocab, self.context, self.width, self.layers, self.heads, self.tied
        )
    }
}

/// How a forward pass builds its graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Graph {
    /// Each block gets a leaf input, so backward runs block by block.
    Blockwise,
    /// As [`Graph::Blockwise`], but only each block's input is kept: every block but the
    /// last drops its graph (and with it every reference to its parameters) after its
    /// forward, and runs its forward again just before its backward. With a [`Residency`]
    /// that frees parameters, at most a few blocks' parameters exist at any time.
    Recompute,
    /// One graph through the whole model (the reference for tests, and inference).
    Whole,
}

/// Where a block's parameters are while a step runs: a forward or backward pass calls
/// [`fetch`](Residency::fetch) before block `k` uses its parameters and
/// [`evict`](Residency::evict) once it no longer needs them. Plain training keeps every
/// parameter (`()`, which does nothing); ZeRO stage 3 gathers a block's shards on fetch
/// and frees the gathered values on evict.
pub trait Residency {
    /// Block `k` is about to run; `next` is the block that will run after it (to prefetch).
    fn fetch(&mut self, k: usize, next: Option<usize>) -> Result<()>;
    /// Block `k` is done with its parameters until its next fetch.
    fn evict(&mut self, k: usize) -> Result<()>;
}

/// Every parameter stays where it is.
impl Residency for () {
    fn fetch(&mut self, _: usize, _: Option<usize>) -> Result<()> {
        Ok(())
    }

    fn evict(&mut self, _: usize) -> Result<()> {
        Ok(())
    }
}

/// A model, or the part of it a pipeline stage holds: its blocks and its parameters in
/// their fixed order.
pub struct Model {
    config: ModelConfig,
    blocks: Vec<Box<dyn Block>>,
    /// For each block, its index in the whole model.
    global: Vec<usize>,
    params: ParamSet,
    /// The tensor-parallel group the blocks were built for.
    tp: Tp,
    /// For each block, the indices in `params` of the parameters it owns and shares.
    used: Vec<Vec<usize>>,
    /// For each block, the indices of the parameters it owns.
    owned: Vec<Vec<usize>>,
}

/// The gradients one block's backward produced: (parameter index in the [`ParamSet`],
/// gradient), including its contribution to shared parameters.
pub type BlockGrads = Vec<(usize, Tensor)>;

/// What a forward pass keeps for backward.
pub struct Forward {
    /// The token ids the first block ran on (kept to run it again with [`Graph::Recompute`]).
    ids: Tensor,
    /// Output of each block; the last is the logits.
    outputs: Vec<Tensor>,
    /// Leaf input of each block after the first (blockwise graphs).
    inputs: Vec<Option<Var>>,
    graph: Graph,
}

impl Forward {
    /// The logits, `[rows, len, vocab]`.
    pub fn logits(&self) -> &Tensor {
        &self.outputs[self.outputs.len() - 1]
    }
}

impl Model {
    /// Builds the model for `config`, its parameters drawn from a generator seeded with
    /// `seed`: every process that builds it gets the same values.
    pub fn new(config: &ModelConfig, seed: u64) -> Result<Model> {
        Model::with_tp(config, seed, &Tp::none())
    }

    /// This rank's part of the model for `config` in tensor-parallel group `tp`: its
    /// parameters are exact pieces of those [`Model::new`] draws from the same `seed`.
    pub fn with_tp(config: &ModelConfig, seed: u64, tp: &Tp) -> Result<Model> {
        Model::part(config, seed, tp, None)
    }

    /// The blocks `keep` (indices in the whole model, increasing; `None`: all) of the model
    /// for `config` in tensor-parallel group `tp`, as a pipeline stage holds them. Every
    /// block is drawn in turn from the generator seeded with `seed`, so the values are the
    /// whole model's; a block outside `keep` is dropped as soon as it is built. A block that
    /// shares a parameter owned by a dropped block (a tied head on the last stage) holds a
    /// copy of it (a [mirror](crate::params::Slot::mirror)).
    pub fn part(config: &ModelConfig, seed: u64, tp: &Tp, keep: Option<&[usize]>) -> Result<Model> {
        for (what, v) in
            [("--width", config.width), ("--context", config.context), ("vocabulary", config.vocab)]
        {
            if v == 0 {
                return Err(Error::config(format!("{what} must be at least 1")));
            }
        }
        let mut init = Init::new(seed);
        let mut blocks = Vec::new();
        let mut global = Vec::new();
        let mut names: Vec<Vec<(String, Vec<usize>)>> = Vec::new();
        let mut shared = Vec::new();
        let mut emit = |b: Box<dyn Block>| -> Result<()> {
            let k = names.len();
            names.push(b.params().iter().map(|p| (p.name().to_string(), p.full_shape().to_vec())).collect());
            shared.extend(b.shared().iter().map(|p| (k, p.name().to_string())));
            if keep.is_none_or(|ks| ks.contains(&k)) {
                blocks.push(b);
                global.push(k);
            }
            Ok(())
        };
        match config.kind {
            ModelKind::Gpt => gpt::build(config, &mut init, tp, &mut emit)?,
            ModelKind::Mlp if tp.size() > 1 => {
                return Err(Error::config("tensor parallelism (--tp) applies to --model gpt only"));
            }
            ModelKind::Mlp => mlp::build(config, &mut init, &mut emit)?,
        };
        let mut layout =
            Layout::new(names.iter().map(|ps| ps.iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect()));
        for (k, name) in &shared {
            layout.share(*k, name);
        }
        Model::assemble(config.clone(), blocks, global, Arc::new(layout), tp.clone())
    }

    fn assemble(
        config: ModelConfig,
        blocks: Vec<Box<dyn Block>>,
        global: Vec<usize>,
        layout: Arc<Layout>,
        tp: Tp,
    ) -> Result<Model> {
        // A shared parameter no block here owns belongs to a block of another stage: the
        // block that uses it holds a copy.
        let mut owned_params: Vec<Vec<Param>> = blocks.iter().map(|b| b.params().to_vec()).collect();
        let mine = |p: &Param, owned: &[Vec<Param>]| {
            owned.iter().flatten().any(|q| q.tensor().id() == p.tensor().id())
        };
        for (k, b) in blocks.iter().enumerate() {
            for p in b.shared() {
                if !mine(p, &owned_params) && layout.get(p.name()).is_some() {
                    owned_params[k].push(p.clone());
                }
            }
        }
        let refs: Vec<&[Param]> = owned_params.iter().map(Vec::as_slice).collect();
        let params = ParamSet::part(&refs, &global, layout)?;
        let mut used = Vec::new();
        let mut owned = Vec::new();
        for (k, b) in blocks.iter().enumerate() {
            let index = |p: &Param| {
                params.index_of(p).ok_or_else(|| {
                    Error::config(format!(
                        "block {} uses parameter {}, which no block owns",
                        b.name(),
                        p.name()
                    ))
                })
            };
            let own = owned_params[k].iter().map(index).collect::<Result<Vec<_>>>()?;
            let mut all = own.clone();
            for p in b.shared() {
                let i = index(p)?;
                if own.contains(&i) {
                    continue;
                }
                if params.slots()[i].block >= k {
                    return Err(Error::config(format!(
                        "block {} shares {}, which a later block owns: shared parameters must belong to an earlier block",
                        b.name(),
                        p.name()
                    )));
                }
                all.push(i);
            }
            used.push(all);
            owned.push(own);
        }
        Ok(Model { config, blocks, global, params, tp, used, owned })
    }

    /// For each block, its index in the whole model.
    pub fn global_blocks(&self) -> &[usize] {
        &self.global
    }

    /// The tensor-parallel group it was built for.
    pub fn tp(&self) -> &Tp {
        &self.tp
    }

    /// Its configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Its blocks, in forward order.
    pub fn blocks(&self) -> &[Box<dyn Block>] {
        &self.blocks
    }

    /// The indices in [`params`](Self::params) of the parameters block `k` uses (its own
    /// and those of earlier blocks it shares).
    pub fn used_params(&self, k: usize) -> &[usize] {
        &self.used[k]
    }

    /// Its parameters, in their fixed order.
    pub fn params(&self) -> &ParamSet {
        &self.params
    }

    /// Runs every block on token ids `[rows, len]`, recording each block's span in `trace`.
    pub fn forward(&self, ids: &Tensor, graph: Graph, trace: &mut Trace) -> Result<Forward> {
        self.forward_with(ids, graph, trace, &mut ())
    }

    /// [`forward`](Self::forward), telling `residency` when each block uses its parameters.
    pub fn forward_with(
        &self,
        ids: &Tensor,
        graph: Graph,
        trace: &mut Trace,
        residency: &mut dyn Residency,
    ) -> Result<Forward> {
        let n = self.blocks.len();
        let mut outputs: Vec<Tensor> = Vec::with_capacity(n);
        let mut inputs = Vec::with_capacity(n);
        for (k, b) in self.blocks.iter().enumerate() {
            let (input, leaf) = match (outputs.last(), graph) {
                (None, _) => (ids.clone(), None),
                (Some(prev), Graph::Whole) => (prev.clone(), None),
                (Some(prev), Graph::Blockwise | Graph::Recompute) => {
                    let v = Var::from_tensor(&prev.detach())?;
                    (v.as_tensor().clone(), Some(v))
                }
            };
            residency.fetch(k, (k + 1 < n).then_some(k + 1))?;
            let y = trace.span(|| format!("fwd {}", b.name()), || b.forward(&input))?;
            // The last block's graph stays: its backward starts from the loss right away.
            if graph == Graph::Recompute && k + 1 < n {
                outputs.push(y.detach());
                residency.evict(k)?;
            } else {
                outputs.push(y);
            }
            inputs.push(leaf);
        }
        Ok(Forward { ids: ids.clone(), outputs, inputs, graph })
    }

    /// The logits for token ids `[rows, len]`, `[rows, len, vocab]`, without keeping
    /// anything for backward. With tensor parallelism every rank of the group must call it
    /// (the vocabulary's pieces are gathered: for evaluation, never in training).
    pub fn logits(&self, ids: &Tensor) -> Result<Tensor> {
        let mut x = ids.clone();
        for b in &self.blocks {
            x = b.forward(&x)?.detach();
        }
        Ok(tp::comm::gather_last(&self.tp, &x)?.narrow(D::Minus1, 0, self.config.vocab)?)
    }

    /// The training loss of `logits` (this rank's vocabulary columns, `[rows, len, n]`)
    /// against `targets` `[rows, len]` (u32), counting only positions where `mask`
    /// `[rows, len]` is 1, summed and divided by `norm` (see [`loss`]): the fused,
    /// vocabulary-parallel cross-entropy ([`tp::cross_entropy`]).
    pub fn loss(&self, logits: &Tensor, targets: &Tensor, mask: &Tensor, norm: f64) -> Result<Tensor> {
        let range = (self.tp.vocab_start(self.config.vocab), self.config.vocab);
        Ok(tp::cross_entropy(&self.tp, logits, range, targets, mask, norm)?)
    }

    /// With sequence parallelism, the gradients of parameters every rank of the group holds
    /// whole (norms, row-parallel biases, position embeddings) are partial: each rank saw
    /// only its positions. Sums them over the group (one all-reduce per block).
    fn complete(&self, mut grads: BlockGrads) -> Result<BlockGrads> {
        if !self.tp.sp() {
            return Ok(grads);
        }
        let replicated = |i: usize| self.params.slots()[i].param.shard() == Shard::Replicated;
        let mut flat = Vec::new();
        for (i, g) in &grads {
            if replicated(*i) {
                flat.extend(g.flatten_all()?.to_vec1::<f32>()?);
            }
        }
        self.tp.all_reduce(&mut flat)?;
        let mut at = 0;
        for (i, g) in &mut grads {
            if replicated(*i) {
                let n = g.elem_count();
                *g = Tensor::from_slice(&flat[at..at + n], g.dims(), g.device())?;
                at += n;
            }
        }
        Ok(grads)
    }

    /// Backward of `loss` (computed from `fwd`'s logits), block by block from the last:
    /// `done(k, grads)` is called as soon as block `k`'s parameter gradients are known. For a
    /// [`Graph::Whole`] forward, one backward runs and `done` is called for every block after it.
    pub fn backward(
        &self,
        fwd: Forward,
        loss: &Tensor,
        trace: &mut Trace,
        mut done: impl FnMut(usize, BlockGrads) -> Result<()>,
    ) -> Result<()> {
        self.backward_with(fwd, loss, trace, &mut (), |_, k, g| done(k, g))
    }

    /// [`backward`](Self::backward), telling `residency` when each block uses its
    /// parameters (with [`Graph::Recompute`], a block's forward runs again first); `done`
    /// gets `residency` back, so that one object can both hold the parameters and take the
    /// gradients.
    pub fn backward_with<R: Residency + ?Sized>(
        &self,
        fwd: Forward,
        loss: &Tensor,
        trace: &mut Trace,
        residency: &mut R,
        mut done: impl FnMut(&mut R, usize, BlockGrads) -> Result<()>,
    ) -> Result<()> {
        let n = self.blocks.len();
        if fwd.graph == Graph::Whole {
            let store = trace.span(|| "bwd model".to_string(), || loss.backward())?;
            for k in (0..n).rev() {
                done(residency, k, self.complete(self.collect(&store, &self.owned[k])?)?)?;
            }
            return Ok(());
        }
        let mut grad_out: Option<Tensor> = None;
        for k in (0..n).rev() {
            let name = self.blocks[k].name();
            if k > 0 && fwd.inputs[k].is_none() {
                return Err(Error::internal("blockwise input lost"));
            }
            residency.fetch(k, k.checked_sub(1))?;
            let output = match (k + 1 == n, fwd.graph) {
                (true, _) => loss.clone(),
                (false, Graph::Recompute) => {
                    let input =
                        fwd.inputs[k].as_ref().map_or_else(|| fwd.ids.clone(), |v| v.as_tensor().clone());
                    trace.span(|| format!("recompute {name}"), || self.blocks[k].forward(&input))?
                }
                (false, _) => fwd.outputs[k].clone(),
            };
            // The span covers the block's backward and the hand-over of its gradients.
            grad_out = trace.span(
                || format!("bwd {name}"),
                || -> Result<Option<Tensor>> {
                    let (grads, below) =
                        self.backward_blocks(k..k + 1, &output, grad_out.as_ref(), fwd.inputs[k].as_ref())?;
                    residency.evict(k)?;
                    done(residency, k, grads)?;
                    Ok(below)
                },
            )?;
        }
        Ok(())
    }

    /// Runs blocks `blocks` (indices in this model) as one graph on `input`: token ids for
    /// the model's first block, else the output of the block before (a pipeline stage's
    /// forward).
    pub fn forward_blocks(&self, blocks: Range<usize>, input: &Tensor) -> Result<Tensor> {
        let mut x = input.clone();
        for b in &self.blocks[blocks] {
            x = b.forward(&x)?;
        }
        Ok(x)
    }

    /// Backward through blocks `blocks`, which ran from `input` to `output`: `grad` is the
    /// gradient of `output`, or `None` when `output` is the loss. Returns the gradients of
    /// the parameters the blocks use (shared ones included, summed over the blocks) and the
    /// gradient of `input` when it is a variable.
    pub fn backward_blocks(
        &self,
        blocks: Range<usize>,
        output: &Tensor,
        grad: Option<&Tensor>,
        input: Option<&Var>,
    ) -> Result<(BlockGrads, Option<Tensor>)> {
        let store = match grad {
            None => output.backward()?,
            Some(g) => (output * g)?.sum_all()?.backward()?,
        };
        let mut which: Vec<usize> = blocks.flat_map(|k| self.used[k].iter().copied()).collect();
        which.sort_unstable();
        which.dedup();
        let grads = self.complete(self.collect(&store, &which)?)?;
        let below = match input {
            Some(v) => Some(
                store
                    .get(v.as_tensor())
                    .cloned()
                    .ok_or_else(|| Error::internal("no gradient reached the input of the blocks"))?,
            ),
            None => None,
        };
        Ok((grads, below))
    }

    /// The gradients in `store` of parameters `which` (indices in the parameter set).
    fn collect(&self, store: &candle_core::backprop::GradStore, which: &[usize]) -> Result<BlockGrads> {
        which
            .iter()
            .map(|&i| {
                let slot = &self.params.slots()[i];
                store.get(&slot.param.tensor()).map(|g| (i, g.clone())).ok_or_else(|| {
                    Error::internal(format!("parameter {} received no gradient", slot.param.name()))
                })
            })
            .collect()
    }
}

/// Cross-entropy of `logits` `[rows, len, vocab]` against `targets` `[rows, len]` (u32),
/// counting only positions where `mask` `[rows, len]` is 1, summed and divided by `norm`
/// (the number of counted tokens in the whole global batch, so that gradients summed over
/// ranks and micro-batches are those of the global mean loss). Written with candle's
/// differentiable operations: the reference that [`Model::loss`]'s fused kernel is tested
/// against.
pub fn loss(logits: &Tensor, targets: &Tensor, mask: &Tensor, norm: f64) -> Result<Tensor> {
    let (b, t, v) = logits.dims3()?;
    let logp = candle_nn::ops::log_softmax(&logits.reshape((b * t, v))?, D::Minus1)?;
    let picked = logp.gather(&targets.reshape((b * t, 1))?, 1)?.reshape(b * t)?;
    let total = (picked * mask.reshape(b * t)?)?.sum_all()?;
    Ok((total.neg()? / norm)?)
}
