//! # xccl-train — parallel training on candle tensors over xccl
//!
//! Turns a single-process training program into an equivalent parallel one: data
//! parallelism (DDP, ZeRO stages 1–3, a parameter server), tensor (Megatron) and sequence
//! parallelism, and pipeline parallelism (GPipe, 1F1B, interleaved 1F1B, ZB-H1) on a device
//! mesh. Tensors and matrix products come from [candle](https://github.com/huggingface/candle)
//! (CPU), whose autograd is the reference the layers' own backward is tested against; the
//! communication is [`xccl`]'s collectives. This crate knows nothing about sockets, and
//! `xccl` knows nothing about neural networks.
//!
//! - [`layers`]: seeded initialisation, `Linear`, `LayerNorm` and the fused CPU kernels
//!   that blocks and tensor parallelism's layers are made of, each with its backward written
//!   out: the input's gradient now, the weights' deferred ([`layers::grads`]).
//! - A [`Model`](model::Model) is a sequence of [`Block`](model::Block)s whose forward keeps
//!   exactly what its own backward reads, so backward runs block by block, each block's
//!   gradients are ready as soon as its backward is done, and its weights' half can wait for
//!   a pipeline's bubble ([`model`]): a GPT-style decoder and an MLP are built in.
//! - Parameters form one list ordered by block, then name, with flat views for
//!   communication ([`params`]); optimisers with state we own, SGD with momentum and AdamW,
//!   work on those flat vectors ([`optim`]).
//! - [`ddp`]: gradients packed in buckets in reverse block order, each bucket's all-reduce
//!   started as soon as its blocks' backward is done, overlapping the rest of backward.
//! - [`ps`]: a parameter server with sharded servers, synchronous or with a bounded
//!   staleness (stale synchronous parallel).
//! - [`zero`]: ZeRO stages 1–3 over the data axis: optimiser state, gradients and (stage 3)
//!   parameters sharded, gathered block by block for forward and again for backward.
//! - [`pipeline`]: stages of consecutive blocks, schedules as data (GPipe, 1F1B, interleaved, ZB-H1)
//!   checked for matching, deadlock freedom and their closed-form bubble, and the executor
//!   that runs them with activations and gradients sent between stages.
//! - [`mesh`]: the world as a `pp × dp × tp` grid with a communicator per axis; [`tp`]: Megatron's
//!   column- and row-parallel layers, heads split over the group, vocabulary-parallel
//!   embedding and cross-entropy, sequence parallelism, the communication as autograd ops and
//!   as plain collectives for the explicit backward.
//! - [`trainer::train`] composes them on any communicator and runs one training loop for
//!   every strategy: a strategy (DDP, ZeRO, a parameter server's worker) is data plus
//!   hooks the loop calls (before and after each block, when a block's gradients are done,
//!   the reduction, the optimiser step, the checkpoint snapshot, the finish); [`run`] holds
//!   what the loop and every strategy share. Every rank builds the same global
//!   batch from the seed ([`data`]), takes its share, and divides its loss by the global
//!   number of target tokens, so any number of ranks, any uneven shares and any gradient
//!   accumulation give the gradient of the global mean loss: parallel training is
//!   equivalent to single-process training, and the tests check that it is.
//! - [`checkpoint`]s (safetensors, written atomically) resume bit-identically; [`dcp`]: the
//!   distributed checkpoint, each rank writing its own pieces, read back on any mesh; [`trace`]
//!   records compute and communication spans as a Chrome trace; [`metrics`] summarises.
//!
//! Two ranks (threads here; processes over TCP work the same with
//! `Communicator::from_env`) train a small GPT with DDP on the embedded addition task and end
//! with identical parameters and a falling loss:
//!
//! ```
//! use xccl::Communicator;
//! use xccl_train::data::TaskConfig;
//! use xccl_train::ddp::DdpConfig;
//! use xccl_train::model::{ModelConfig, ModelKind};
//! use xccl_train::optim::OptimConfig;
//! use xccl_train::trainer::{Strategy, TrainConfig, train};
//!
//! # fn main() -> xccl_train::Result<()> {
//! let config = TrainConfig {
//!     model: ModelConfig { kind: ModelKind::Gpt, vocab: 12, context: 8, width: 16, layers: 1, heads: 2, tied: true },
//!     task: TaskConfig::Sums { digits: 2 },
//!     optim: OptimConfig::adamw(1e-2),
//!     strategy: Strategy::Ddp(DdpConfig::default()),
//!     tp: 1,
//!     sp: false,
//!     pipeline: None,
//!     batch: 16,
//!     accum: 1,
//!     steps: 30,
//!     seed: 7,
//!     checkpoint: None,
//!     trace: false,
//!     evaluate: false,
//! };
//! let outcomes = std::thread::scope(|s| {
//!     let ranks: Vec<_> = Communicator::local(2)?
//!         .into_iter()
//!         .map(|comm| {
//!             let config = &config;
//!             s.spawn(move || train(&comm, config, &mut ()))
//!         })
//!         .collect();
//!     ranks.into_iter().map(|h| h.join().expect("rank panicked")).collect::<xccl_train::Result<Vec<_>>>()
//! })?;
//! assert_eq!(outcomes[0].params, outcomes[1].params);
//! let losses = &outcomes[0].summary.as_ref().expect("rank 0 summarises").losses;
//! assert!(losses[29].1 < losses[0].1);
//! # Ok(())
//! # }
//! ```

pub mod checkpoint;
pub mod config;
pub mod data;
pub mod dcp;
pub mod ddp;
mod error;
pub mod layers;
pub mod mesh;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod params;
pub mod pipeline;
pub mod product;
pub mod ps;
pub mod run;
mod strategy;
pub mod tp;
pub mod trace;
mod train_loop;
pub mod trainer;
pub mod zero;

pub use error::{Error, Result};
