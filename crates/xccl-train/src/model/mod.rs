//! Models as sequences of [`Block`]s: configuration, construction, forward, the loss, and
//! backward block by block.
//!
//! Blockwise backward: each block's forward ran without an autograd graph, keeping what its
//! own backward needs ([`Block::forward_saved`]); the logits are a variable, so
//! `loss.backward()` gives their gradient `g`. Then block by block from the last, the
//! block's [`Block::backward_input`] turns the gradient of its output into that of its
//! input and defers its parameters' gradients, which run at once here (a zero-bubble
//! pipeline runs them later). Gradients become ready block by block, last block first,
//! as in PyTorch's autograd with DDP hooks.

pub mod attention;
pub mod block;
pub mod flops;
pub mod gpt;
pub mod mlp;
pub mod softmax;

use std::ops::Range;
use std::sync::Arc;

use candle_core::{D, Tensor, Var};

pub use crate::params::Grad;
pub use block::{Block, Deferred, Holds, Init, Saved, ids_tensor};

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

/// How a forward pass keeps what backward needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Graph {
    /// Each block keeps what its own backward needs ([`Block::forward_saved`]), and
    /// backward runs block by block. What is kept holds no parameter, so with a
    /// [`Residency`] that frees them, only the blocks running hold parameters.
    Blockwise,
    /// As [`Graph::Blockwise`], but only each block's input is kept: every block but the
    /// last drops what it saved after its forward and runs its forward again just before
    /// its backward (activation recomputation: less memory, one more forward).
    Recompute,
    /// One autograd graph through the whole model (the reference for tests, and inference).
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
pub type BlockGrads = Vec<(usize, Grad)>;

/// What a forward pass keeps for backward.
pub struct Forward {
    /// Input of each block (the first's the token ids), kept to run its forward again
    /// with [`Graph::Recompute`].
    inputs: Vec<Tensor>,
    /// What each block's forward saved (`None`: dropped, to be recomputed; or a
    /// [`Graph::Whole`] forward, whose graph holds everything).
    saved: Vec<Option<Saved>>,
    /// The logits; a variable for blockwise graphs (the loss's backward stops there).
    logits: Tensor,
    graph: Graph,
}

impl Forward {
    /// The logits, `[rows, len, vocab]`.
    pub fn logits(&self) -> &Tensor {
        &self.logits
    }

    /// The bytes of the activations the blocks kept for backward (with
    /// [`Graph::Recompute`], the last block's only; 0 for a [`Graph::Whole`] forward).
    pub fn saved_bytes(&self) -> usize {
        self.saved.iter().flatten().map(Saved::bytes).sum()
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
        let mine = |p: &Param, owned: &[Vec<Param>]| owned.iter().flatten().any(|q| q.is(p));
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
        let mut inputs: Vec<Tensor> = Vec::with_capacity(n);
        let mut saved = Vec::with_capacity(n);
        let mut x = ids.clone();
        for (k, b) in self.blocks.iter().enumerate() {
            // The last block's backward comes right after the loss: its parameters stay,
            // and those of the block whose backward follows are fetched meanwhile.
            let last = k + 1 == n;
            residency.fetch(k, if last { k.checked_sub(1) } else { Some(k + 1) })?;
            let name = || format!("fwd {}", b.name());
            let (y, kept) = match graph {
                Graph::Whole => (trace.span(name, || b.forward(&x))?, None),
                _ => {
                    let (y, s) = trace.span(name, || b.forward_saved(&x))?;
                    // The last block's stays: its backward starts right after the loss.
                    (y, (graph == Graph::Blockwise || k + 1 == n).then_some(s))
                }
            };
            // Nothing kept for backward holds a parameter (but a [`Graph::Whole`] graph).
            if graph != Graph::Whole && !last {
                residency.evict(k)?;
            }
            inputs.push(std::mem::replace(&mut x, y));
            saved.push(kept);
        }
        let logits = match graph {
            Graph::Whole => x,
            _ => Var::from_tensor(&x)?.as_tensor().clone(),
        };
        Ok(Forward { inputs, saved, logits, graph })
    }

    /// The logits for token ids `[rows, len]`, `[rows, len, vocab]`, without keeping
    /// anything for backward. With tensor parallelism every rank of the group must call it
    /// (the vocabulary's pieces are gathered: for evaluation, never in training).
    pub fn logits(&self, ids: &Tensor) -> Result<Tensor> {
        let mut x = ids.clone();
        for b in &self.blocks {
            x = b.forward_saved(&x)?.0;
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
        let mut partial = Vec::new();
        for (i, g) in &grads {
            if replicated(*i) {
                let t = g.tensor()?;
                flat.extend(t.flatten_all()?.to_vec1::<f32>()?);
                partial.push(t);
            }
        }
        self.tp.all_reduce(&mut flat)?;
        let mut at = 0;
        let mut partial = partial.into_iter();
        for (i, g) in &mut grads {
            if replicated(*i) {
                let t = partial.next().ok_or_else(|| Error::internal("a partial gradient lost"))?;
                let n = t.elem_count();
                *g = Grad::Tensor(Tensor::from_slice(&flat[at..at + n], t.dims(), t.device())?);
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
        mut fwd: Forward,
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
        let mut grad: Option<Tensor> = None;
        for k in (0..n).rev() {
            let block = &self.blocks[k];
            let name = block.name();
            residency.fetch(k, k.checked_sub(1))?;
            let saved = match fwd.saved[k].take() {
                Some(s) => s,
                None => trace.span(|| format!("recompute {name}"), || block.forward_saved(&fwd.inputs[k]))?.1,
            };
            // The span covers the block's backward and the hand-over of its gradients.
            grad = trace.span(
                || format!("bwd {name}"),
                || -> Result<Option<Tensor>> {
                    let g = match grad.take() {
                        Some(g) => g,
                        None => self.logits_grad(&fwd.logits, loss)?,
                    };
                    let (below, deferred) = block.backward_input(saved, &g)?;
                    residency.evict(k)?;
                    done(residency, k, self.weight_grads(k..k + 1, deferred)?)?;
                    if below.is_none() && k > 0 {
                        return Err(Error::internal(format!("block {name} gave no gradient of its input")));
                    }
                    Ok(below)
                },
            )?;
        }
        Ok(())
    }

    /// The gradient of `loss` with respect to `logits`, the variable a blockwise forward
    /// ended with.
    fn logits_grad(&self, logits: &Tensor, loss: &Tensor) -> Result<Tensor> {
        let store = loss.backward()?;
        store.get(logits).cloned().ok_or_else(|| Error::internal("the loss does not depend on the logits"))
    }

    /// Runs blocks `blocks` (indices in this model) on `input`, token ids for the model's
    /// first block, else the output of the block before (a pipeline stage's forward): the
    /// output and what each block saved for its backward.
    pub fn forward_saved(&self, blocks: Range<usize>, input: &Tensor) -> Result<(Tensor, Vec<Saved>)> {
        let mut x = input.clone();
        let mut saved = Vec::with_capacity(blocks.len());
        for b in &self.blocks[blocks] {
            let (y, s) = b.forward_saved(&x)?;
            saved.push(s);
            x = y;
        }
        Ok((x, saved))
    }

    /// The input half of the backward through blocks `blocks` (as [`forward_saved`]
    /// ran them, which saved `saved`), from the gradient `grad` of their output: the
    /// gradient of their input (`None` for token ids) and the parameters' gradients,
    /// deferred ([`weight_grads`](Self::weight_grads) runs them).
    ///
    /// [`forward_saved`]: Self::forward_saved
    pub fn backward_input(
        &self,
        blocks: Range<usize>,
        saved: Vec<Saved>,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Deferred)> {
        if saved.len() != blocks.len() {
            return Err(Error::internal(format!("{} saved states for {} blocks", saved.len(), blocks.len())));
        }
        let mut g = Some(grad.clone());
        let mut all = Deferred::new();
        for (b, s) in self.blocks[blocks.clone()].iter().zip(saved).rev() {
            let Some(gy) = g.take() else {
                return Err(Error::internal(format!("block {} gets no gradient of its output", b.name())));
            };
            let (below, d) = b.backward_input(s, &gy)?;
            all.extend(d);
            g = below;
        }
        Ok((g, all))
    }

    /// Runs the deferred weight-gradient work of blocks `blocks`: the gradients of every
    /// parameter they use (shared ones included, summed over the blocks), with the
    /// group's partial sums completed under sequence parallelism.
    pub fn weight_grads(&self, blocks: Range<usize>, deferred: Deferred) -> Result<BlockGrads> {
        let mut which: Vec<usize> = blocks.flat_map(|k| self.used[k].iter().copied()).collect();
        which.sort_unstable();
        which.dedup();
        let mut grads: Vec<Option<Grad>> = vec![None; which.len()];
        for (p, g) in deferred.run()? {
            let Some(at) = which.iter().position(|&i| self.params.slots()[i].param.is(&p)) else {
                return Err(Error::internal(format!(
                    "a gradient for {}, which these blocks do not use",
                    p.name()
                )));
            };
            // A parameter used twice in these blocks (a tied embedding and head).
            grads[at] = Some(match grads[at].take() {
                Some(sum) => Grad::Tensor((sum.tensor()? + g.tensor()?)?),
                None => g,
            });
        }
        let grads = which
            .into_iter()
            .zip(grads)
            .map(|(i, g)| {
                g.map(|g| (i, g)).ok_or_else(|| {
                    Error::internal(format!(
                        "parameter {} received no gradient",
                        self.params.slots()[i].param.name()
                    ))
                })
            })
            .collect::<Result<BlockGrads>>()?;
        self.complete(grads)
    }

    /// The loss of logits `logits` (see [`loss`](Self::loss)) and its gradient with respect
    /// to them (a pipeline's last stage, which starts its backward there).
    pub fn loss_and_grad(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        mask: &Tensor,
        norm: f64,
    ) -> Result<(f64, Tensor)> {
        let logits = Var::from_tensor(logits)?;
        let loss = self.loss(logits.as_tensor(), targets, mask, norm)?;
        let value = f64::from(loss.to_scalar::<f32>()?);
        Ok((value, self.logits_grad(logits.as_tensor(), &loss)?))
    }

    /// The gradients in `store` of parameters `which` (indices in the parameter set).
    fn collect(&self, store: &candle_core::backprop::GradStore, which: &[usize]) -> Result<BlockGrads> {
        which
            .iter()
            .map(|&i| {
                let slot = &self.params.slots()[i];
                store.get(&slot.param.tensor()).map(|g| (i, Grad::Tensor(g.clone()))).ok_or_else(|| {
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
