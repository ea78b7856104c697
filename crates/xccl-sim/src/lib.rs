//! A discrete-event simulator of xccl's collectives over modelled networks.
//!
//! It runs the very schedules the executor runs (`xccl::algo::build`), ordered by the one
//! step ordering rule (`xccl::schedule::order`), over a network of links with latency and
//! bandwidth where flows that share a link share it fairly ([`network`]), along the routes of
//! the topology ([`topology`]: star, ring, torus, hypercube, fat-tree, dragonfly, Dragonfly+,
//! or the constants `xccl tune` measured). What ranks spend comes from the tuner's own cost
//! model (`xccl::algo::tune::CostModel`): ranks of one host talk through its memory with its
//! shared-memory constants. See [`engine`] for the rules of time.
//!
//! ```
//! use xccl::CollKind;
//! use xccl::algo::{Algorithm, Shape};
//! use xccl_sim::{Call, Topology, simulate};
//!
//! // Eight hosts in a ring, 10 GB/s links, 1 µs per hop and 2 µs per message; reducing
//! // costs nothing here.
//! let topo = Topology::ring(8, 10e9, 1e-6);
//! let mut costs = xccl::algo::tune::CostModel::default();
//! costs.tcp.alpha = 2e-6;
//! costs.shm.gamma = 0.0;
//! let hosts: Vec<usize> = (0..8).collect();
//! let shape = Shape::Count(1 << 20);
//! let call = Call { kind: CollKind::AllReduce, algo: Algorithm::Ring, root: 0, shape, esize: 4 };
//! let out = simulate(&topo, &costs, &hosts, &call).unwrap();
//! // Ring all-reduce: 2(n-1) steps of (alpha + hop + S/n/B).
//! let s = 4.0 * (1 << 20) as f64;
//! let expect = 14.0 * (3e-6 + s / 8.0 / 10e9);
//! assert!((out.time - expect).abs() < 1e-9 * expect, "{} vs {expect}", out.time);
//! ```

pub mod engine;
pub mod network;
mod ordering;
mod queue;
pub mod report;
pub mod spec;
pub mod sweep;
mod table;
pub mod timeline;
pub mod topology;

pub use engine::{Call, Outcome, simulate, simulate_calls};
pub use topology::Topology;
