//! A discrete-event simulator of xccl's collectives over modelled networks.
//!
//! It runs the very schedules the executor runs (`xccl::algo::build`), ordered by the one
//! step ordering rule (`xccl::schedule::order`), over a network of links with latency and
//! bandwidth where flows that share a link share it fairly ([`network`]), along the routes of
//! the topology ([`topology`]: star, ring, torus, hypercube, fat-tree, dragonfly, Dragonfly+,
//! or the constants `xccl tune` measured). Ranks of one host talk through its memory with the
//! shared-memory constants. See [`engine`] for the rules of time.
//!
//! ```
//! use xccl::CollKind;
//! use xccl::algo::{Algorithm, Shape};
//! use xccl_sim::{Call, Model, Topology, simulate};
//!
//! // Eight hosts in a ring, 10 GB/s links, 1 µs per hop and 2 µs per message.
//! let topo = Topology::ring(8, 10e9, 1e-6);
//! let model = Model { alpha: 2e-6, ..Model::default() };
//! let hosts: Vec<usize> = (0..8).collect();
//! let shape = Shape::Count(1 << 20);
//! let call = Call { kind: CollKind::AllReduce, algo: Algorithm::Ring, root: 0, shape, esize: 4 };
//! let out = simulate(&topo, &model, &hosts, &call).unwrap();
//! // Ring all-reduce: 2(n-1) steps of (alpha + hop + S/n/B).
//! let s = 4.0 * (1 << 20) as f64;
//! let expect = 14.0 * (3e-6 + s / 8.0 / 10e9);
//! assert!((out.time - expect).abs() < 1e-9 * expect, "{} vs {expect}", out.time);
//! ```

pub mod engine;
pub mod network;
mod queue;
pub mod report;
pub mod spec;
pub mod sweep;
pub mod timeline;
pub mod topology;

pub use engine::{Call, Model, Outcome, simulate};
pub use topology::Topology;

impl Default for Model {
    /// The reference machine's shared memory (docs/PERFORMANCE.md), no reduction or copy
    /// cost, 1 µs per message between hosts, 1 MiB forwarding segments.
    fn default() -> Self {
        Model {
            alpha: 1e-6,
            shm_alpha: 1.5e-6,
            shm_bw: 6e9,
            gamma: 0.0,
            delta: 0.0,
            segment: (1 << 20) as f64,
        }
    }
}

impl Model {
    /// The constants of a cost model (`xccl tune fit`'s file): the TCP class's latency per
    /// message between hosts, the shared-memory class inside hosts, its reduce and copy
    /// rates.
    pub fn from_costs(c: &xccl::algo::tune::CostModel) -> Model {
        Model {
            alpha: c.tcp.alpha,
            shm_alpha: c.shm.alpha,
            shm_bw: 1.0 / c.shm.beta,
            gamma: c.shm.gamma,
            delta: c.shm.delta,
            segment: (1 << 20) as f64,
        }
    }
}
