//! Flows sharing links fairly: the fluid model.
//!
//! A flow moves a number of bytes over a route of links. Flows that share a link share its
//! bandwidth max-min fairly: rates are found by progressive filling (the link whose
//! remaining capacity per unfixed flow is smallest fixes the rate of its flows, which then
//! take their share off every other link they cross, and so on). Rates are recomputed only
//! when flows start or end, all changes at one instant together, so an algorithm whose ranks
//! move in lock step costs one computation per step.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::rc::Rc;

/// One flow. Its bytes left are `rem` at time `t0`, falling at `rate` since.
#[derive(Clone, Debug)]
struct Flow {
    route: Rc<[u32]>,
    rem: f64,
    t0: f64,
    rate: f64,
    tag: u64,
}

/// A link's fair share with its index in the refill's table, ordered smallest (then lowest
/// index) first in a max-heap.
#[derive(Debug, PartialEq)]
struct Least(f64, u32);

impl Eq for Least {}

impl PartialOrd for Least {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Least {
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.total_cmp(&self.0).then(other.1.cmp(&self.1))
    }
}

/// No position.
const NONE: u32 = u32::MAX;

/// The flows' end times, earliest first (on a tie the lower id), each flow at most once: a
/// binary heap that knows where each flow sits, so a new rate moves its entry instead of
/// leaving a stale one behind (a refill of thousands of flows would leave thousands).
#[derive(Debug, Default)]
struct Ends {
    heap: Vec<(f64, u32)>,
    /// Per flow, its place in `heap`, or `NONE`.
    at: Vec<u32>,
}

impl Ends {
    fn before(a: (f64, u32), b: (f64, u32)) -> bool {
        a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).is_lt()
    }

    fn first(&self) -> Option<(f64, u32)> {
        self.heap.first().copied()
    }

    /// Flow `id` ends at `t`.
    fn set(&mut self, id: u32, t: f64) {
        if self.at.len() <= id as usize {
            self.at.resize(id as usize + 1, NONE);
        }
        let i = match self.at[id as usize] {
            NONE => {
                self.heap.push((t, id));
                self.heap.len() - 1
            }
            i => {
                self.heap[i as usize].0 = t;
                i as usize
            }
        };
        self.place(i);
    }

    /// Flow `id` ends at no time.
    fn remove(&mut self, id: u32) {
        let i = std::mem::replace(&mut self.at[id as usize], NONE) as usize;
        let last = self.heap.len() - 1;
        self.heap.swap(i, last);
        self.heap.pop();
        if i < last {
            self.place(i);
        }
    }

    /// Moves the entry at `i` up or down to where it belongs.
    fn place(&mut self, mut i: usize) {
        while i > 0 && Self::before(self.heap[i], self.heap[(i - 1) / 2]) {
            self.heap.swap(i, (i - 1) / 2);
            self.at[self.heap[i].1 as usize] = i as u32;
            i = (i - 1) / 2;
        }
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            for c in [l, r] {
                if c < self.heap.len() && Self::before(self.heap[c], self.heap[m]) {
                    m = c;
                }
            }
            if m == i {
                break;
            }
            self.heap.swap(i, m);
            self.at[self.heap[i].1 as usize] = i as u32;
            i = m;
        }
        self.at[self.heap[i].1 as usize] = i as u32;
    }
}

/// The flows in progress over links of given capacities.
///
/// Flows that share a link, directly or through other flows, form a component; a change
/// (a flow starting or ending) refills only its component, whose rates are the only ones
/// max-min fairness lets it change. Each flow's end time is kept in a heap, so finding the
/// next end costs a logarithm, not a pass over every flow.
#[derive(Debug)]
pub struct Fluid {
    caps: Vec<f64>,
    flows: Vec<Option<Flow>>,
    free: Vec<usize>,
    /// Active flows on each link.
    on_link: Vec<Vec<u32>>,
    dirty: Vec<u32>,
    link_mark: Vec<bool>,
    /// A link's index in the refill's table.
    link_pos: Vec<u32>,
    flow_mark: Vec<bool>,
    ends: Ends,
    live: usize,
    /// The refill's tables, kept between refills: the components' links, a component's
    /// flows, the search's stack, each link's capacity left and unfixed flows, the shares,
    /// and the links a fixed flow crossed.
    links: Vec<u32>,
    comp: Vec<usize>,
    stack: Vec<u32>,
    residual: Vec<(u32, f64, u32)>,
    shares: BinaryHeap<Least>,
    touched: Vec<u32>,
    /// Bytes carried per link so far.
    pub carried: Vec<f64>,
}

impl Fluid {
    /// No flows, over links of `caps` bytes per second.
    pub fn new(caps: Vec<f64>) -> Fluid {
        let n = caps.len();
        Fluid {
            caps,
            flows: Vec::new(),
            free: Vec::new(),
            on_link: vec![Vec::new(); n],
            dirty: Vec::new(),
            link_mark: vec![false; n],
            link_pos: vec![0; n],
            flow_mark: Vec::new(),
            ends: Ends::default(),
            live: 0,
            links: Vec::new(),
            comp: Vec::new(),
            stack: Vec::new(),
            residual: Vec::new(),
            shares: BinaryHeap::new(),
            touched: Vec::new(),
            carried: vec![0.0; n],
        }
    }

    /// Starts a flow of `bytes` over `route` (link indices; not empty) at time `now`;
    /// returns its id.
    pub fn start(&mut self, now: f64, route: Rc<[u32]>, bytes: f64, tag: u64) -> usize {
        let id = self.free.pop().unwrap_or_else(|| {
            self.flows.push(None);
            self.flow_mark.push(false);
            self.flows.len() - 1
        });
        for &l in route.iter() {
            self.carried[l as usize] += bytes;
            self.on_link[l as usize].push(id as u32);
            self.dirty.push(l);
        }
        self.flows[id] = Some(Flow { route, rem: bytes.max(0.0), t0: now, rate: 0.0, tag });
        self.live += 1;
        id
    }

    /// Flows in progress.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no flow is in progress.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// When the next flow ends (after refilling what changed by `now`), if any can.
    pub fn next_end(&mut self, now: f64) -> Option<f64> {
        if !self.dirty.is_empty() {
            self.refill(now);
        }
        self.ends.first().map(|e| e.0).filter(|t| t.is_finite())
    }

    /// Removes a flow that has ended by `now`, the earliest first, and returns its tag.
    pub fn pop_finished(&mut self, now: f64) -> Option<u64> {
        let (t, id) = self.ends.first()?;
        if t > now {
            return None;
        }
        self.ends.remove(id);
        let f = self.flows[id as usize].take()?;
        for &l in f.route.iter() {
            let list = &mut self.on_link[l as usize];
            if let Some(p) = list.iter().position(|&x| x == id) {
                list.swap_remove(p);
            }
            self.dirty.push(l);
        }
        self.free.push(id as usize);
        self.live -= 1;
        Some(f.tag)
    }

    /// Bytes flow `id` has left to move at `now` (0 once it has ended).
    pub fn remaining(&self, now: f64, id: usize) -> f64 {
        self.flows.get(id).and_then(Option::as_ref).map_or(0.0, |f| (f.rem - f.rate * (now - f.t0)).max(0.0))
    }

    /// The current rate of flow `id` (after [`Fluid::next_end`]).
    pub fn rate(&self, id: usize) -> f64 {
        self.flows.get(id).and_then(Option::as_ref).map_or(0.0, |f| f.rate)
    }

    /// Max-min fair rates, by progressive filling, for the flows connected to the links
    /// that changed: component by component (they share nothing; one search from all the
    /// changed links at once would find them one after the other, in this order).
    fn refill(&mut self, now: f64) {
        self.links.clear();
        let mut dirty = std::mem::take(&mut self.dirty);
        while let Some(l) = dirty.pop() {
            if !self.link_mark[l as usize] {
                let first = self.links.len();
                self.component(l);
                self.fill(now, first);
            }
        }
        self.dirty = dirty;
        for &l in &self.links {
            self.link_mark[l as usize] = false;
        }
    }

    /// Marks and appends to `links` the links and to `comp` the flows reachable from link
    /// `from`.
    fn component(&mut self, from: u32) {
        self.comp.clear();
        let mut stack = std::mem::take(&mut self.stack);
        stack.push(from);
        while let Some(l) = stack.pop() {
            if std::mem::replace(&mut self.link_mark[l as usize], true) {
                continue;
            }
            self.links.push(l);
            for &id in &self.on_link[l as usize] {
                let id = id as usize;
                if std::mem::replace(&mut self.flow_mark[id], true) {
                    continue;
                }
                self.comp.push(id);
                if let Some(f) = &self.flows[id] {
                    stack.extend(f.route.iter().filter(|&&l2| !self.link_mark[l2 as usize]));
                }
            }
        }
        self.stack = stack;
    }

    /// Progressive filling of the component of the links from `links[first]` on.
    fn fill(&mut self, now: f64, first: usize) {
        // Bring the component's flows to `now` at their old rates.
        for &id in &self.comp {
            if let Some(f) = self.flows[id].as_mut() {
                f.rem = (f.rem - f.rate * (now - f.t0)).max(0.0);
                f.t0 = now;
            }
        }
        self.residual.clear();
        self.shares.clear();
        for (i, &l) in self.links[first..].iter().enumerate() {
            let count = self.on_link[l as usize].len() as u32;
            self.residual.push((l, self.caps[l as usize], count));
            // Links are found through their position in `residual`.
            self.link_pos[l as usize] = i as u32;
            if count > 0 {
                self.shares.push(Least(self.caps[l as usize] / f64::from(count), i as u32));
            }
        }
        while let Some(Least(share, i)) = self.shares.pop() {
            let (l, res, count) = self.residual[i as usize];
            if count == 0 || share != res / f64::from(count) {
                continue;
            }
            for k in 0..self.on_link[l as usize].len() {
                let id = self.on_link[l as usize][k] as usize;
                // Still marked: in the component and not fixed yet.
                if !std::mem::replace(&mut self.flow_mark[id], false) {
                    continue;
                }
                let Some(f) = self.flows[id].as_mut() else { continue };
                // An unchanged rate keeps its end.
                if (share - f.rate).abs() > 1e-12 * share {
                    f.rate = share;
                    let end = if share > 0.0 { now + f.rem / share } else { f64::INFINITY };
                    self.ends.set(id as u32, end);
                }
                for &l2 in f.route.iter() {
                    let j = self.link_pos[l2 as usize];
                    let r = &mut self.residual[j as usize];
                    r.1 = (r.1 - share).max(0.0);
                    r.2 -= 1;
                    if self.link_mark[l2 as usize] {
                        self.link_mark[l2 as usize] = false;
                        self.touched.push(j);
                    }
                }
            }
            // The links whose share changed, at their new share (all the flows of this one
            // fixed first: the shares only grow meanwhile, so the order of the links fixed
            // next is the same as with an entry per change).
            for j in self.touched.drain(..) {
                let (l2, res, count) = self.residual[j as usize];
                self.link_mark[l2 as usize] = true;
                if count > 0 && j != i {
                    self.shares.push(Least(res / f64::from(count), j));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(fluid: &mut Fluid) -> Vec<(u64, f64)> {
        let mut out = Vec::new();
        while let Some(t) = fluid.next_end(0.0f64.max(out.last().map_or(0.0, |x: &(u64, f64)| x.1))) {
            while let Some(tag) = fluid.pop_finished(t) {
                out.push((tag, t));
            }
        }
        out
    }

    #[test]
    fn two_flows_on_one_link_take_twice_as_long() {
        let mut f = Fluid::new(vec![100.0]);
        f.start(0.0, Rc::from(vec![0]), 100.0, 1);
        assert_eq!(run(&mut f), vec![(1, 1.0)]);
        f.start(0.0, Rc::from(vec![0]), 100.0, 1);
        f.start(0.0, Rc::from(vec![0]), 100.0, 2);
        let ends = run(&mut f);
        assert!(ends.iter().all(|&(_, t)| (t - 2.0).abs() < 1e-12), "{ends:?}");
    }

    #[test]
    fn max_min_fairness_by_hand() {
        // A on L1; B on L1 and L2; C on L2; L2 at half L1's rate. L2 is the bottleneck:
        // B and C get 25 each, then A gets the 75 left on L1.
        let mut f = Fluid::new(vec![100.0, 50.0]);
        let a = f.start(0.0, Rc::from(vec![0]), 1e9, 0);
        let b = f.start(0.0, Rc::from(vec![0, 1]), 1e9, 1);
        let c = f.start(0.0, Rc::from(vec![1]), 1e9, 2);
        f.next_end(0.0);
        assert_eq!((f.rate(a), f.rate(b), f.rate(c)), (75.0, 25.0, 25.0));
        // When B ends, A and C take whole links.
        let mut f = Fluid::new(vec![100.0, 50.0]);
        f.start(0.0, Rc::from(vec![0]), 150.0, 0);
        f.start(0.0, Rc::from(vec![0, 1]), 25.0, 1);
        f.start(0.0, Rc::from(vec![1]), 50.0, 2);
        let ends = run(&mut f);
        // B ends at 1 s; by then A has 75 left (alone: 0.75 s), C has 25 left (0.5 s).
        assert_eq!(ends, vec![(1, 1.0), (2, 1.5), (0, 1.75)]);
    }
}
