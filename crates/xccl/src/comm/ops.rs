//! The operations of a [`Communicator`]: point-to-point and every collective, each in a
//! blocking form on slices and an asynchronous form on owned buffers.
//!
//! Asynchronous forms take the same buffers as the blocking ones, by value (any
//! [`Buffer`]: a `Vec`, a `Box<[T]>`, memory lent by another runtime), and give them back
//! from [`Work::wait`]; the memory is used where it is, never copied. Arguments are checked
//! when the call is made: a blocking call returns the error, an asynchronous one returns a
//! `Work` that has already failed.
//!
//! The uneven ("v") forms take one count per rank, the same on every rank; their schedules
//! are built over those blocks ([`Shape::Gather`], [`Shape::Scatter`], [`Shape::Exchange`]),
//! which the plan cache keys on, and their frames carry the count `u64::MAX`.

use std::sync::Arc;

use super::{Communicator, PlanArgs, p2p};
use crate::algo::Shape;
use crate::coll::CollKind;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::exec::{Bufs, P2p};
use crate::reduce::ReduceOp;
use crate::schedule::Blocks;
use crate::work::{Buffer, Completion, Work};

/// A checked collective, ready for the communicator's backend.
type Plan = Result<super::Call>;

fn expect(api: &'static str, what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::invalid(api, format!("{what} has {got} elements, expected {want}")));
    }
    Ok(())
}

/// Checks that `what` (`len` elements) holds all `total` elements of an uneven call's counts.
fn expect_total(api: &'static str, what: &str, len: usize, total: usize) -> Result<()> {
    if len != total {
        let msg = format!("{what} has {len} elements, expected {total} (the sum of counts)");
        return Err(Error::invalid(api, msg));
    }
    Ok(())
}

/// The sum of `api`'s `what`, or an error if it overflows.
fn sum(api: &'static str, what: &str, counts: &[usize]) -> Result<usize> {
    counts
        .iter()
        .try_fold(0usize, |a, &c| a.checked_add(c))
        .ok_or_else(|| Error::invalid(api, format!("{what} add up to more elements than memory can hold")))
}

impl Communicator {
    /// The sum of the counts of `api`'s uneven call, once they are known to hold one count
    /// per rank and to fit in memory.
    fn total(&self, api: &'static str, counts: &[usize]) -> Result<usize> {
        if counts.len() != self.size() {
            let msg = format!("counts has {} entries, expected {} (one per rank)", counts.len(), self.size());
            return Err(Error::invalid(api, msg));
        }
        sum(api, "counts", counts)
    }

    /// Checks that `what` (`len` elements) holds this rank's block of `counts` (which
    /// [`total`](Self::total) found to hold one count per rank).
    fn expect_mine(&self, api: &'static str, what: &str, len: usize, counts: &[usize]) -> Result<()> {
        let (r, mine) = (self.rank(), counts[self.rank()]);
        if len != mine {
            let msg = format!("{what} has {len} elements, expected {mine} (counts[{r}], this rank's)");
            return Err(Error::invalid(api, msg));
        }
        Ok(())
    }

    fn plan_all_reduce<T: Element>(&self, len: usize, op: ReduceOp) -> Plan {
        let args = PlanArgs {
            kind: CollKind::AllReduce,
            op: Some(op),
            root: None,
            count: len as u64,
            shape: Shape::Count(len),
            elems: (len, len),
            result: Some(len),
        };
        self.plan::<T>(args)
    }

    fn plan_broadcast<T: Element>(&self, len: usize, root: usize) -> Plan {
        self.check_rank("broadcast", "root", root)?;
        let args = PlanArgs {
            kind: CollKind::Broadcast,
            op: None,
            root: Some(root),
            count: len as u64,
            shape: Shape::Count(len),
            elems: (len, len),
            result: None,
        };
        self.plan::<T>(args)
    }

    fn plan_reduce<T: Element>(&self, len: usize, out_len: usize, op: ReduceOp, root: usize) -> Plan {
        self.check_rank("reduce", "root", root)?;
        let is_root = self.rank() == root;
        if is_root {
            expect("reduce", "the root's output", out_len, len)?;
        }
        let args = PlanArgs {
            kind: CollKind::Reduce,
            op: Some(op),
            root: Some(root),
            count: len as u64,
            shape: Shape::Count(len),
            elems: (len, out_len),
            result: is_root.then_some(len),
        };
        self.plan::<T>(args)
    }

    pub(super) fn plan_all_gather<T: Element>(&self, block: usize, out_len: usize) -> Plan {
        expect("all_gather", "the output", out_len, block * self.size())?;
        let args = PlanArgs {
            kind: CollKind::AllGather,
            op: None,
            root: None,
            count: block as u64,
            shape: Shape::Count(block),
            elems: (block, out_len),
            result: None,
        };
        self.plan::<T>(args)
    }

    fn plan_all_gather_v<T: Element>(&self, in_len: usize, out_len: usize, counts: &[usize]) -> Plan {
        expect("all_gather_v", "counts", counts.len(), self.size())?;
        expect("all_gather_v", "the input", in_len, counts[self.rank()])?;
        expect("all_gather_v", "the output", out_len, sum("all_gather_v", "counts", counts)?)?;
        let args = PlanArgs {
            kind: CollKind::AllGather,
            op: None,
            root: None,
            count: u64::MAX,
            shape: Shape::Gather(Blocks::from_counts(counts)),
            elems: (in_len, out_len),
            result: None,
        };
        self.plan::<T>(args)
    }

    fn plan_reduce_scatter<T: Element>(&self, in_len: usize, out_len: usize, op: ReduceOp) -> Plan {
        expect("reduce_scatter", "the input", in_len, out_len * self.size())?;
        let args = PlanArgs {
            kind: CollKind::ReduceScatter,
            op: Some(op),
            root: None,
            count: out_len as u64,
            shape: Shape::Count(out_len),
            elems: (in_len, out_len),
            result: Some(out_len),
        };
        self.plan::<T>(args)
    }

    fn plan_reduce_scatter_v<T: Element>(
        &self,
        in_len: usize,
        out_len: usize,
        counts: &[usize],
        op: ReduceOp,
    ) -> Plan {
        const API: &str = "reduce_scatter_v";
        let total = self.total(API, counts)?;
        expect_total(API, "the input", in_len, total)?;
        self.expect_mine(API, "the output", out_len, counts)?;
        let args = PlanArgs {
            kind: CollKind::ReduceScatter,
            op: Some(op),
            root: None,
            count: u64::MAX,
            shape: Shape::Scatter(Blocks::from_counts(counts)),
            elems: (in_len, out_len),
            result: Some(out_len),
        };
        self.plan::<T>(args)
    }

    fn plan_all_to_all<T: Element>(&self, in_len: usize, out_len: usize) -> Plan {
        expect("all_to_all", "the output", out_len, in_len)?;
        if !in_len.is_multiple_of(self.size()) {
            let msg =
                format!("the buffers' {in_len} elements do not split into {} equal blocks", self.size());
            return Err(Error::invalid("all_to_all", msg));
        }
        let block = in_len / self.size();
        let args = PlanArgs {
            kind: CollKind::AllToAll,
            op: None,
            root: None,
            count: block as u64,
            shape: Shape::Count(block),
            elems: (in_len, out_len),
            result: None,
        };
        self.plan::<T>(args)
    }

    fn plan_all_to_all_v<T: Element>(
        &self,
        in_len: usize,
        send: &[usize],
        out_len: usize,
        recv: &[usize],
    ) -> Plan {
        expect("all_to_all_v", "send_counts", send.len(), self.size())?;
        expect("all_to_all_v", "recv_counts", recv.len(), self.size())?;
        expect("all_to_all_v", "the input", in_len, sum("all_to_all_v", "send_counts", send)?)?;
        expect("all_to_all_v", "the output", out_len, sum("all_to_all_v", "recv_counts", recv)?)?;
        let args = PlanArgs {
            kind: CollKind::AllToAll,
            op: None,
            root: None,
            count: u64::MAX,
            shape: Shape::Exchange { send: Blocks::from_counts(send), recv: Blocks::from_counts(recv) },
            elems: (in_len, out_len),
            result: None,
        };
        self.plan::<T>(args)
    }

    fn plan_scatter<T: Element>(&self, in_len: usize, out_len: usize, root: usize) -> Plan {
        self.check_rank("scatter", "root", root)?;
        if self.rank() == root {
            expect("scatter", "the root's input", in_len, out_len * self.size())?;
        }
        let args = PlanArgs {
            kind: CollKind::Scatter,
            op: None,
            root: Some(root),
            count: out_len as u64,
            shape: Shape::Count(out_len),
            elems: (in_len, out_len),
            result: None,
        };
        self.plan::<T>(args)
    }

    fn plan_gather<T: Element>(&self, in_len: usize, out_len: usize, root: usize) -> Plan {
        self.check_rank("gather", "root", root)?;
        if self.rank() == root {
            expect("gather", "the root's output", out_len, in_len * self.size())?;
        }
        let args = PlanArgs {
            kind: CollKind::Gather,
            op: None,
            root: Some(root),
            count: in_len as u64,
            shape: Shape::Count(in_len),
            elems: (in_len, out_len),
            result: None,
        };
        self.plan::<T>(args)
    }

    /// The plan of `gather_v` (`kind` gather) or `scatter_v` (scatter): this rank's input
    /// (gather) or output (scatter) holds its block of `counts`, the root's other buffer
    /// holds them all.
    fn plan_rooted_v<T: Element>(
        &self,
        kind: CollKind,
        (in_len, out_len): (usize, usize),
        counts: &[usize],
        root: usize,
    ) -> Plan {
        let gather = kind == CollKind::Gather;
        let api = if gather { "gather_v" } else { "scatter_v" };
        self.check_rank(api, "root", root)?;
        let total = self.total(api, counts)?;
        let ((mine, mine_len), (all, all_len)) = if gather {
            (("the input", in_len), ("the root's output", out_len))
        } else {
            (("the output", out_len), ("the root's input", in_len))
        };
        self.expect_mine(api, mine, mine_len, counts)?;
        if self.rank() == root {
            expect_total(api, all, all_len, total)?;
        }
        let blocks = Blocks::from_counts(counts);
        let args = PlanArgs {
            kind,
            op: None,
            root: Some(root),
            count: u64::MAX,
            shape: if gather { Shape::Gather(blocks) } else { Shape::Scatter(blocks) },
            elems: (in_len, out_len),
            result: None,
        };
        self.plan::<T>(args)
    }

    fn plan_barrier(&self) -> Plan {
        let args = PlanArgs {
            kind: CollKind::Barrier,
            op: None,
            root: None,
            count: 0,
            shape: Shape::Count(0),
            elems: (0, 0),
            result: None,
        };
        self.plan::<u8>(args)
    }

    // ---- point-to-point ----

    /// Sends `buf` to rank `peer` with `tag`; returns once the data has been handed to the
    /// transport (small messages do not wait for the receiver). Messages from one rank to
    /// another with the same tag arrive in order; a matching [`recv`](Self::recv) must ask
    /// for the same element type and count.
    pub fn send<T: Element>(&self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        self.p2p_check("send", peer, tag)?;
        // The receive side only reads through this pointer for a send.
        self.p2p_block(p2p(true, peer, tag, buf.as_ptr().cast_mut(), buf.len()))
    }

    /// Receives into `buf` the next message from rank `peer` with `tag`. Messages with
    /// other tags that arrive first are kept until asked for.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        self.p2p_check("recv", peer, tag)?;
        self.p2p_block(p2p(false, peer, tag, buf.as_mut_ptr(), buf.len()))
    }

    fn p2p_spawn<T: Element, B: Buffer<T>>(
        &self,
        api: &'static str,
        send: bool,
        mut buf: B,
        peer: usize,
        tag: u32,
    ) -> Work<B> {
        if let Err(e) = self.p2p_check(api, peer, tag) {
            return Work::new(Completion::finished(Err(e)));
        }
        let mem = buf.as_mut_slice();
        let msg: P2p = p2p(send, peer, tag, mem.as_mut_ptr(), mem.len());
        let done = Arc::new(Completion::default());
        done.keep(Box::new(buf));
        self.p2p_submit(msg, done.clone());
        Work::new(done)
    }

    /// Asynchronous [`send`](Self::send).
    pub fn isend<T: Element, B: Buffer<T>>(&self, buf: B, peer: usize, tag: u32) -> Work<B> {
        self.p2p_spawn("isend", true, buf, peer, tag)
    }

    /// Asynchronous [`recv`](Self::recv): the buffer's length says how many elements to
    /// receive.
    pub fn irecv<T: Element, B: Buffer<T>>(&self, buf: B, peer: usize, tag: u32) -> Work<B> {
        self.p2p_spawn("irecv", false, buf, peer, tag)
    }

    // ---- collectives ----

    /// Replaces `buf` on every rank with the reduction of all ranks' `buf` by `op`.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.block(self.plan_all_reduce::<T>(buf.len(), op), Bufs::in_place(buf))
    }

    /// Out-of-place [`all_reduce`](Self::all_reduce): `output` gets the reduction of all
    /// ranks' `input`.
    pub fn all_reduce_into<T: Element>(&self, input: &[T], output: &mut [T], op: ReduceOp) -> Result<()> {
        expect("all_reduce_into", "the output", output.len(), input.len())?;
        self.block(self.plan_all_reduce::<T>(input.len(), op), Bufs::pair(input, output))
    }

    /// Asynchronous [`all_reduce_into`](Self::all_reduce_into): both buffers come back from
    /// [`Work::wait`].
    pub fn all_reduce_into_async<T: Element, I: Buffer<T>, O: Buffer<T>>(
        &self,
        input: I,
        mut output: O,
        op: ReduceOp,
    ) -> Work<(I, O)> {
        let (n, m) = (input.as_slice().len(), output.as_slice().len());
        let plan = expect("all_reduce_into_async", "the output", m, n)
            .and_then(|()| self.plan_all_reduce::<T>(n, op));
        let bufs = Bufs::pair(input.as_slice(), output.as_mut_slice());
        self.spawn(plan, bufs, (input, output))
    }

    /// Asynchronous [`all_reduce`](Self::all_reduce).
    pub fn all_reduce_async<T: Element, B: Buffer<T>>(&self, mut buf: B, op: ReduceOp) -> Work<B> {
        let plan = self.plan_all_reduce::<T>(buf.as_slice().len(), op);
        let bufs = Bufs::in_place(buf.as_mut_slice());
        self.spawn(plan, bufs, buf)
    }

    /// Copies the root's `buf` into every other rank's `buf` (all the same length).
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.block(self.plan_broadcast::<T>(buf.len(), root), Bufs::in_place(buf))
    }

    /// Asynchronous [`broadcast`](Self::broadcast).
    pub fn broadcast_async<T: Element, B: Buffer<T>>(&self, mut buf: B, root: usize) -> Work<B> {
        let plan = self.plan_broadcast::<T>(buf.as_slice().len(), root);
        let bufs = Bufs::in_place(buf.as_mut_slice());
        self.spawn(plan, bufs, buf)
    }

    /// Reduces every rank's `input` by `op` into the root's `output` (same length). Other
    /// ranks' `output` is not touched and may be empty.
    pub fn reduce<T: Element>(&self, input: &[T], output: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        self.block(self.plan_reduce::<T>(input.len(), output.len(), op, root), Bufs::pair(input, output))
    }

    /// In-place [`reduce`](Self::reduce): the root's `buf` is replaced by the reduction;
    /// other ranks' `buf` is left as it was.
    pub fn reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        let plan = self.plan_reduce::<T>(buf.len(), buf.len(), op, root);
        self.block(plan, Bufs::in_place(buf))
    }

    /// Asynchronous [`reduce_in_place`](Self::reduce_in_place).
    pub fn reduce_in_place_async<T: Element, B: Buffer<T>>(
        &self,
        mut buf: B,
        op: ReduceOp,
        root: usize,
    ) -> Work<B> {
        let len = buf.as_slice().len();
        let plan = self.plan_reduce::<T>(len, len, op, root);
        let bufs = Bufs::in_place(buf.as_mut_slice());
        self.spawn(plan, bufs, buf)
    }

    /// Asynchronous [`reduce`](Self::reduce); gives back `(input, output)`.
    pub fn reduce_async<T: Element, I: Buffer<T>, O: Buffer<T>>(
        &self,
        input: I,
        mut output: O,
        op: ReduceOp,
        root: usize,
    ) -> Work<(I, O)> {
        let plan = self.plan_reduce::<T>(input.as_slice().len(), output.as_slice().len(), op, root);
        let bufs = Bufs::pair(input.as_slice(), output.as_mut_slice());
        self.spawn(plan, bufs, (input, output))
    }

    /// Concatenates every rank's `input` (all the same length) in rank order into every
    /// rank's `output` (`size()` times as long).
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.block(self.plan_all_gather::<T>(input.len(), output.len()), Bufs::pair(input, output))
    }

    /// Asynchronous [`all_gather`](Self::all_gather); gives back `(input, output)`.
    pub fn all_gather_async<T: Element, I: Buffer<T>, O: Buffer<T>>(
        &self,
        input: I,
        mut output: O,
    ) -> Work<(I, O)> {
        let plan = self.plan_all_gather::<T>(input.as_slice().len(), output.as_slice().len());
        let bufs = Bufs::pair(input.as_slice(), output.as_mut_slice());
        self.spawn(plan, bufs, (input, output))
    }

    /// [`all_gather`](Self::all_gather) with uneven inputs: rank `i` contributes
    /// `counts[i]` elements, and every rank passes the same `counts`.
    pub fn all_gather_v<T: Element>(&self, input: &[T], output: &mut [T], counts: &[usize]) -> Result<()> {
        self.block(self.plan_all_gather_v::<T>(input.len(), output.len(), counts), Bufs::pair(input, output))
    }

    /// Asynchronous [`all_gather_v`](Self::all_gather_v); gives back `(input, output)`.
    pub fn all_gather_v_async<T: Element, I: Buffer<T>, O: Buffer<T>>(
        &self,
        input: I,
        mut output: O,
        counts: &[usize],
    ) -> Work<(I, O)> {
        let plan = self.plan_all_gather_v::<T>(input.as_slice().len(), output.as_slice().len(), counts);
        let bufs = Bufs::pair(input.as_slice(), output.as_mut_slice());
        self.spawn(plan, bufs, (input, output))
    }

    /// Reduces every rank's `input` (`size()` blocks of `output.len()` elements) by `op`;
    /// rank `i` gets block `i` of the result in `output`.
    pub fn reduce_scatter<T: Element>(&self, input: &[T], output: &mut [T], op: ReduceOp) -> Result<()> {
        self.block(self.plan_reduce_scatter::<T>(input.len(), output.len(), op), Bufs::pair(input, output))
    }

    /// Asynchronous [`reduce_scatter`](Self::reduce_scatter); gives back `(input, output)`.
    pub fn reduce_scatter_async<T: Element, I: Buffer<T>, O: Buffer<T>>(
        &self,
        input: I,
        mut output: O,
        op: ReduceOp,
    ) -> Work<(I, O)> {
        let plan = self.plan_reduce_scatter::<T>(input.as_slice().len(), output.as_slice().len(), op);
        let bufs = Bufs::pair(input.as_slice(), output.as_mut_slice());
        self.spawn(plan, bufs, (input, output))
    }

    /// [`reduce_scatter`](Self::reduce_scatter) with uneven blocks: every rank's `input`
    /// holds `size()` consecutive blocks, block `i` of `counts[i]` elements; rank `i` gets
    /// block `i` reduced by `op` in `output` (`counts[i]` elements). Every rank passes the
    /// same `counts`; blocks may be empty.
    pub fn reduce_scatter_v<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<()> {
        let plan = self.plan_reduce_scatter_v::<T>(input.len(), output.len(), counts, op);
        self.block(plan, Bufs::pair(input, output))
    }

    /// Asynchronous [`reduce_scatter_v`](Self::reduce_scatter_v); gives back
    /// `(input, output)`.
    pub fn reduce_scatter_v_async<T: Element, I: Buffer<T>, O: Buffer<T>>(
        &self,
        input: I,
        mut output: O,
        counts: &[usize],
        op: ReduceOp,
    ) -> Work<(I, O)> {
        let plan =
            self.plan_reduce_scatter_v::<T>(input.as_slice().len(), output.as_slice().len(), counts, op);
        let bufs = Bufs::pair(input.as_slice(), output.as_mut_slice());
        self.spawn(plan, bufs, (input, output))
    }

    /// Block `j` of rank `i`'s `input` becomes block `i` of rank `j`'s `output`; both
    /// buffers hold `size()` equal blocks.
    pub fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.block(self.plan_all_to_all::<T>(input.len(), output.len()), Bufs::pair(input, output))
    }

    /// Asynchronous [`all_to_all`](Self::all_to_all); gives back `(input, output)`.
    pub fn all_to_all_async<T: Element, I: Buffer<T>, O: Buffer<T>>(
        &self,
        input: I,
        mut output: O,
    ) -> Work<(I, O)> {
        let plan = self.plan_all_to_all::<T>(input.as_slice().len(), output.as_slice().len());
        let bufs = Bufs::pair(input.as_slice(), output.as_mut_slice());
        self.spawn(plan, bufs, (input, output))
    }

    /// [`all_to_all`](Self::all_to_all) with uneven blocks: `send_counts[j]` elements go to
    /// rank `j`, `recv_counts[j]` come from rank `j` (and must equal what rank `j` sends).
    pub fn all_to_all_v<T: Element>(
        &self,
        input: &[T],
        send_counts: &[usize],
        output: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        let plan = self.plan_all_to_all_v::<T>(input.len(), send_counts, output.len(), recv_counts);
        self.block(plan, Bufs::pair(input, output))
    }

    /// Asynchronous [`all_to_all_v`](Self::all_to_all_v); gives back `(input, output)`.
    pub fn all_to_all_v_async<T: Element, I: Buffer<T>, O: Buffer<T>>(
        &self,
        input: I,
        send_counts: &[usize],
        mut output: O,
        recv_counts: &[usize],
    ) -> Work<(I, O)> {
        let plan = self.plan_all_to_all_v::<T>(
            input.as_slice().len(),
            send_counts,
            output.as_slice().len(),
            recv_counts,
        );
        let bufs = Bufs::pair(input.as_slice(), output.as_mut_slice());
        self.spawn(plan, bufs, (input, output))
    }

    /// Splits the root's `input` (`size()` blocks of `output.len()` elements) so that rank
    /// `i` gets block `i` in `output`. Only the root's `input` is read (others may be empty).
    pub fn scatter<T: Element>(&self, input: &[T], output: &mut [T], root: usize) -> Result<()> {
        self.block(self.plan_scatter::<T>(input.len(), output.len(), root), Bufs::pair(input, output))
    }

    /// Asynchronous [`scatter`](Self::scatter); gives back `(input, output)`.
    pub fn scatter_async<T: Element, I: Buffer<T>, O: Buffer<T>>(
        &self,
        input: I,
        mut output: O,
        root: usize,
    ) -> Work<(I, O)> {
        let plan = self.plan_scatter::<T>(input.as_slice().len(), output.as_slice().len(), root);
        let bufs = Bufs::pair(input.as_slice(), output.as_mut_slice());
        self.spawn(plan, bufs, (input, output))
    }

    /// Concatenates every rank's `input` in rank order into the root's `output`. Only the
    /// root's `output` is written (others may be empty).
    pub fn gather<T: Element>(&self, input: &[T], output: &mut [T], root: usize) -> Result<()> {
        self.block(self.plan_gather::<T>(input.len(), output.len(), root), Bufs::pair(input, output))
    }

    /// Asynchronous [`gather`](Self::gather); gives back `(input, output)`.
    pub fn gather_async<T: Element, I: Buffer<T>, O: Buffer<T>>(
        &self,
        input: I,
        mut output: O,
        root: usize,
    ) -> Work<(I, O)> {
        let plan = self.plan_gather::<T>(input.as_slice().len(), output.as_slice().len(), root);
        let bufs = Bufs::pair(input.as_slice(), output.as_mut_slice());
        self.spawn(plan, bufs, (input, output))
    }

    /// [`scatter`](Self::scatter) with uneven blocks: the root's `input` holds `size()`
    /// consecutive blocks, block `i` of `counts[i]` elements, and rank `i` gets block `i` in
    /// `output` (`counts[i]` elements). Every rank passes the same `counts`; blocks may be
    /// empty. Only the root's `input` is read (others may be empty).
    pub fn scatter_v<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        counts: &[usize],
        root: usize,
    ) -> Result<()> {
        let plan = self.plan_rooted_v::<T>(CollKind::Scatter, (input.len(), output.len()), counts, root);
        self.block(plan, Bufs::pair(input, output))
    }

    /// Asynchronous [`scatter_v`](Self::scatter_v); gives back `(input, output)`.
    pub fn scatter_v_async<T: Element, I: Buffer<T>, O: Buffer<T>>(
        &self,
        input: I,
        mut output: O,
        counts: &[usize],
        root: usize,
    ) -> Work<(I, O)> {
        let lens = (input.as_slice().len(), output.as_slice().len());
        let plan = self.plan_rooted_v::<T>(CollKind::Scatter, lens, counts, root);
        let bufs = Bufs::pair(input.as_slice(), output.as_mut_slice());
        self.spawn(plan, bufs, (input, output))
    }

    /// [`gather`](Self::gather) with uneven inputs: rank `i` contributes `counts[i]`
    /// elements, and the root's `output` gets them all in rank order (the sum of `counts`).
    /// Every rank passes the same `counts`; blocks may be empty. Only the root's `output` is
    /// written (others may be empty).
    pub fn gather_v<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        counts: &[usize],
        root: usize,
    ) -> Result<()> {
        let plan = self.plan_rooted_v::<T>(CollKind::Gather, (input.len(), output.len()), counts, root);
        self.block(plan, Bufs::pair(input, output))
    }

    /// Asynchronous [`gather_v`](Self::gather_v); gives back `(input, output)`.
    pub fn gather_v_async<T: Element, I: Buffer<T>, O: Buffer<T>>(
        &self,
        input: I,
        mut output: O,
        counts: &[usize],
        root: usize,
    ) -> Work<(I, O)> {
        let lens = (input.as_slice().len(), output.as_slice().len());
        let plan = self.plan_rooted_v::<T>(CollKind::Gather, lens, counts, root);
        let bufs = Bufs::pair(input.as_slice(), output.as_mut_slice());
        self.spawn(plan, bufs, (input, output))
    }

    /// Returns once every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.block(self.plan_barrier(), Bufs::in_place::<u8>(&mut []))
    }

    /// Asynchronous [`barrier`](Self::barrier).
    pub fn barrier_async(&self) -> Work<()> {
        self.spawn(self.plan_barrier(), Bufs::in_place::<u8>(&mut []), ())
    }
}
