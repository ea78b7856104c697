//! # xccl — collective communication for CPUs, in Rust
//!
//! A [`Communicator`] is a group of ranks that run collectives together: point-to-point
//! [`send`](Communicator::send)/[`recv`](Communicator::recv), broadcast, scatter, gather,
//! reduce, all-reduce, all-gather (also with uneven counts), reduce-scatter (also uneven),
//! all-to-all (also uneven) and barrier, on slices of `f32`, `f64`, `f16`, `bf16`, `i8`, `i32`, `i64`,
//! `u8`, `u32` and `u64`, with the reductions of [`ReduceOp`]. Every operation has a
//! blocking form on slices and an asynchronous form on owned buffers (a `Vec`, a
//! [`HostBuffer`] on huge pages for large messages between processes, or any [`Buffer`]) that returns a [`Work`]; operations run in issue order on the communicator's progress thread, so
//! computation can go on while they do. [`Communicator::split`] makes sub-groups.
//!
//! Ranks can be threads of one process ([`Communicator::local`]) or processes on any hosts,
//! connected over TCP ([`Communicator::from_env`], which understands `xccl run`, torchrun,
//! Slurm and mpirun). The same program runs over both.
//!
//! ```
//! use xccl::{Communicator, ReduceOp};
//!
//! # fn main() -> xccl::Result<()> {
//! let comms = Communicator::local(4)?;
//! let sums = std::thread::scope(|s| {
//!     let handles: Vec<_> = comms
//!         .into_iter()
//!         .map(|comm| {
//!             s.spawn(move || -> xccl::Result<Vec<f32>> {
//!                 // Each rank contributes [rank, rank, rank].
//!                 let mut v = vec![comm.rank() as f32; 3];
//!                 comm.all_reduce(&mut v, ReduceOp::Sum)?;
//!                 // Overlap: start a broadcast, compute, then wait for it.
//!                 let work = comm.broadcast_async(vec![comm.rank() as u64; 2], 3);
//!                 let from_rank_3 = work.wait()?;
//!                 assert_eq!(from_rank_3, vec![3, 3]);
//!                 Ok(v)
//!             })
//!         })
//!         .collect();
//!     handles.into_iter().map(|h| h.join().unwrap()).collect::<xccl::Result<Vec<_>>>()
//! })?;
//! assert!(sums.iter().all(|v| v == &vec![6.0; 3]));
//! # Ok(())
//! # }
//! ```
//!
//! ## How it is built
//!
//! An algorithm is a pure function from `(rank, size, shape, root)` to a
//! [`Program`](schedule::Program) of send / receive / receive-and-reduce / copy steps over
//! buffer regions ([`schedule`], [`algo`]). One executor runs any program over any
//! transport, cutting messages into pipelined segments. Transports are byte streams between
//! two ranks: rings in memory for threads, sockets for processes. Every frame on the wire
//! names its communicator, operation, sequence number, element type, count and root, so
//! ranks that call different collectives get an error describing both sides; every wait
//! has a deadline (`XCCL_TIMEOUT`), and a lost peer fails pending operations promptly,
//! naming it. See `docs/ARCHITECTURE.md` in the repository for the whole data path.

pub mod algo;
pub mod bootstrap;
mod byte_count;
#[cfg(feature = "capi")]
pub mod capi;
mod coll;
mod comm;
mod config;
mod copy;
mod dtype;
mod error;
mod exec;
pub mod flight;
mod frame;
#[cfg(test)]
mod fuzz;
#[doc(hidden)]
pub mod fuzzing;
mod host_buffer;
pub mod protocol;
mod reduce;
pub mod schedule;
mod stall;
mod stream;
mod transport;
pub mod verify;
mod work;

pub use byte_count::parse_bytes;
pub use coll::CollKind;
pub use comm::Communicator;
pub use config::Config;
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use host_buffer::HostBuffer;
pub use reduce::{ReduceOp, reference_reduce};
pub use work::{Buffer, Event, OpSpan, SpanOp, Work};

/// `half`'s 16-bit float types, which collectives accept as elements.
pub use half::{bf16, f16};
