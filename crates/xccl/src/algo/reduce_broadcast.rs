//! All-reduce through a root, the parameter-server shape: every rank sends its buffer to
//! rank 0, which folds them in rank order and sends the result back to everyone. Simple and
//! deterministic, but the root moves `2 (n - 1)` buffers, so it only suits small messages or
//! a deliberate server topology.

use super::{Algorithm, Declaration, Implementation};
use crate::coll::CollKind;
use crate::schedule::{Buf, Program, Region};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::ReduceBroadcast,
    name: "reduce_broadcast",
    implements: &[Implementation::any(CollKind::AllReduce, |c| Some(all_reduce(c.rank, c.n(), c.count()?)))],
};

/// The rank that plays the server.
const SERVER: usize = 0;

/// All-reduce of `count` elements through rank 0.
pub fn all_reduce(rank: usize, n: usize, count: usize) -> Program {
    let mut p = Program::new();
    let input = Region::new(Buf::Input, 0, count);
    let output = Region::new(Buf::Output, 0, count);
    let step = p.step();
    if rank == SERVER {
        for (i, w) in (1..n).enumerate() {
            step.recv_reduce(w, output, if i == 0 { input } else { output });
        }
        // Each send streams behind the last fold of its segment.
        for w in 1..n {
            step.send(w, output);
        }
    } else {
        // In place, the result may overwrite a segment only after it has been sent.
        step.send(SERVER, input).recv(SERVER, output);
    }
    p
}
