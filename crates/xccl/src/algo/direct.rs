//! Direct exchange: in one step every rank sends to and receives from every other rank.
//!
//! All-reduce is a direct reduce-scatter (rank `r` folds every peer's copy of block `r` into
//! its own) followed by a direct all-gather of the reduced blocks. It moves exactly the bytes
//! of the ring, `2 (n - 1) / n` of the buffer each way, but in two steps instead of
//! `2 (n - 1)`. That suits shared memory, where a rank can copy from any peer's memory and
//! links share no wire: ranks meet twice instead of `2 (n - 1)` times, which matters most when
//! there are more ranks than cores and every meeting waits for a time slice.
//!
//! All-to-all is every rank's pairwise exchange in one step: `n - 1` messages out and in at
//! once, where pairwise exchange takes `n - 1` steps and Bruck `⌈log2 n⌉`.
//!
//! A rank visits its peers starting from the next one (`r + 1, r + 2, ...`), so that no
//! rank is everybody's first source. Block `r` is reduced by rank `r` alone, in a fixed
//! order, and then copied: every rank ends with the same bits.

use super::{Algorithm, Declaration, Implementation, Shape};
use crate::coll::CollKind;
use crate::schedule::{Blocks, Buf, Program, Region};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::Direct,
    name: "direct",
    implements: &[
        Implementation::any(CollKind::AllReduce, |c| Some(all_reduce(c.rank, c.n(), c.count()?))),
        Implementation::any(CollKind::AllGather, |c| Some(all_gather(c.rank, c.gather()?))),
        Implementation::any(CollKind::ReduceScatter, |c| Some(reduce_scatter(c.rank, c.scatter()?))),
        Implementation::any(CollKind::AllToAll, |c| match c.shape {
            Shape::Count(block) => {
                let b = Blocks::uniform(*block, c.n());
                Some(all_to_all(c.rank, &b, &b))
            }
            Shape::Exchange { send, recv } => Some(all_to_all(c.rank, send, recv)),
            _ => None,
        }),
    ],
};

/// Peers of `rank` among `n`, starting after it.
fn peers(rank: usize, n: usize) -> impl Iterator<Item = usize> {
    (1..n).map(move |s| (rank + s) % n)
}

/// Appends the reduce-scatter step: block `q` of `input` goes to rank `q`; this rank's block,
/// reduced over all ranks, lands in `dst`.
fn reduce_scatter_step(p: &mut Program, rank: usize, n: usize, input: &Blocks, dst: Region) {
    let s = p.step();
    let mut acc = input.region(Buf::Input, rank);
    for q in peers(rank, n) {
        s.send(q, input.region(Buf::Input, q));
        s.recv_reduce(q, dst, acc);
        acc = dst;
    }
}

/// Appends the all-gather step: this rank's block `own` goes to every peer; block `q` of the
/// output comes from rank `q`.
fn all_gather_step(p: &mut Program, rank: usize, blocks: &Blocks, own: Region) {
    let n = blocks.count();
    let s = p.step();
    for q in peers(rank, n) {
        s.send(q, own);
        s.recv(q, blocks.region(Buf::Output, q));
    }
}

/// All-reduce of `count` elements.
pub fn all_reduce(rank: usize, n: usize, count: usize) -> Program {
    let mut p = Program::new();
    let blocks = Blocks::even(count, n);
    let mine = blocks.region(Buf::Output, rank);
    reduce_scatter_step(&mut p, rank, n, &blocks, mine);
    all_gather_step(&mut p, rank, &blocks, mine);
    p
}

/// Reduce-scatter: the input is laid out by `blocks` (uneven blocks give
/// reduce-scatter-v); block `rank`, reduced over all ranks, lands in the output.
pub fn reduce_scatter(rank: usize, blocks: &Blocks) -> Program {
    let mut p = Program::new();
    let out = Region::new(Buf::Output, 0, blocks.len_of(rank));
    reduce_scatter_step(&mut p, rank, blocks.count(), blocks, out);
    p
}

/// All-gather: this rank's input is block `rank` of the output laid out by `blocks`.
pub fn all_gather(rank: usize, blocks: &Blocks) -> Program {
    let mut p = Program::new();
    let own = Region::new(Buf::Input, 0, blocks.len_of(rank));
    all_gather_step(&mut p, rank, blocks, own);
    // The own block is copied after the messages are out.
    p.steps[0].copy(own, blocks.region(Buf::Output, rank));
    p
}

/// All-to-all: block `q` of `send` goes to rank `q`, block `q` of `recv` comes from rank `q`,
/// every message in one step (empty ones too: ranks cannot tell locally whether a peer
/// sends nothing, as in pairwise exchange).
pub fn all_to_all(rank: usize, send: &Blocks, recv: &Blocks) -> Program {
    let n = send.count();
    let mut p = Program::new();
    let s = p.step();
    for q in peers(rank, n) {
        s.send(q, send.region(Buf::Input, q));
        s.recv(q, recv.region(Buf::Output, q));
    }
    // The own block is copied after the messages are out.
    s.copy(send.region(Buf::Input, rank), recv.region(Buf::Output, rank));
    p
}
