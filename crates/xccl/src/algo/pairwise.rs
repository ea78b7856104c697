//! Pairwise-exchange all-to-all: in round `s` rank `r` sends to `r + s` and receives from
//! `r - s`, so every round is a perfect matching of senders and receivers.

use super::{Algorithm, Declaration, Implementation, Shape};
use crate::coll::CollKind;
use crate::schedule::{Blocks, Buf, Program};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::Pairwise,
    name: "pairwise",
    implements: &[Implementation::any(CollKind::AllToAll, |c| match c.shape {
        Shape::Count(block) => {
            let b = Blocks::uniform(*block, c.n());
            Some(all_to_all(c.rank, &b, &b))
        }
        Shape::Exchange { send, recv } => Some(all_to_all(c.rank, send, recv)),
        _ => None,
    })],
};

/// All-to-all: block `j` of `send` goes to rank `j`; block `j` of `recv` comes from rank `j`.
pub fn all_to_all(rank: usize, send: &Blocks, recv: &Blocks) -> Program {
    let n = send.count();
    // Ranks cannot tell locally whether the whole exchange is empty (counts differ per rank),
    // so every pair exchanges a message, possibly empty.
    let mut p = Program::new();
    for s in 1..n {
        let to = (rank + s) % n;
        let from = (rank + n - s) % n;
        p.step().send(to, send.region(Buf::Input, to)).recv(from, recv.region(Buf::Output, from));
    }
    // The own block is copied in the first round, after its message is out.
    p.steps[0].copy(send.region(Buf::Input, rank), recv.region(Buf::Output, rank));
    p
}
