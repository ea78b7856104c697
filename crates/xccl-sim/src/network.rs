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

/// A time with an index, ordered earliest (or smallest) first in a max-heap.
#[derive(Debug, PartialEq)]
struct Least(f64, usize, u32);

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
    /// Per slot, bumped whenever its flow's rate changes or it ends: older entries of the
    /// end heap are stale.
    version: Vec<u32>,
    ends: BinaryHeap<Least>,
    live: usize,
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
            version: Vec::new(),
            ends: BinaryHeap::new(),
            live: 0,
            carried: vec![0.0; n],
        }
    }

    /// Starts a flow of `bytes` over `route` (link indices; not empty) at time `now`;
    /// returns its id.
    pub fn start(&mut self, now: f64, route: Rc<[u32]>, bytes: f64, tag: u64) -> usize {
        let id = self.free.pop().unwrap_or_else(|| {
            self.flows.push(None);
            self.flow_mark.push(false);
            self.version.push(0);
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
        while let Some(Least(t, id, v)) = self.ends.peek() {
            if self.flows[*id].is_some() && self.version[*id] == *v {
                return t.is_finite().then_some(*t);
            }
            self.ends.pop();
        }
        None
    }

    /// Removes the flows that have ended by `now` and returns their tags.
    pub fn take_finished(&mut self, now: f64) -> Vec<u64> {
        let mut done = Vec::new();
        while let Some(Least(t, id, v)) = self.ends.peek() {
            let (t, id, v) = (*t, *id, *v);
            if t > now {
                break;
            }
            self.ends.pop();
            if self.version[id] != v {
                continue;
            }
            if let Some(f) = self.flows[id].take() {
                self.version[id] = self.version[id].wrapping_add(1);
                for &l in f.route.iter() {
                    let list = &mut self.on_link[l as usize];
                    if let Some(p) = list.iter().position(|&x| x as usize == id) {
                        list.swap_remove(p);
                    }
                    self.dirty.push(l);
                }
                self.free.push(id);
                self.live -= 1;
                done.push(f.tag);
            }
        }
        done
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
    /// that changed.
    fn refill(&mut self, now: f64) {
        // The component: links and flows reachable from the changed links.
        let mut links: Vec<u32> = Vec::new();
        let mut comp: Vec<usize> = Vec::new();
        let mut stack = std::mem::take(&mut self.dirty);
        while let Some(l) = stack.pop() {
            if std::mem::replace(&mut self.link_mark[l as usize], true) {
                continue;
            }
            links.push(l);
            for &id in &self.on_link[l as usize] {
                let id = id as usize;
                if std::mem::replace(&mut self.flow_mark[id], true) {
                    continue;
                }
                comp.push(id);
                if let Some(f) = &self.flows[id] {
                    stack.extend(f.route.iter().filter(|&&l2| !self.link_mark[l2 as usize]));
                }
            }
        }
        // Bring the component's flows to `now` at their old rates.
        for &id in &comp {
            if let Some(f) = self.flows[id].as_mut() {
                f.rem = (f.rem - f.rate * (now - f.t0)).max(0.0);
                f.t0 = now;
            }
        }
        let mut residual: Vec<(u32, f64, u32)> = links
            .iter()
            .map(|&l| (l, self.caps[l as usize], self.on_link[l as usize].len() as u32))
            .collect();
        // Links are found through their position in `residual`.
        for (i, &(l, _, _)) in residual.iter().enumerate() {
            self.link_pos[l as usize] = i as u32;
        }
        let mut heap: BinaryHeap<Least> = residual
            .iter()
            .enumerate()
            .filter(|(_, r)| r.2 > 0)
            .map(|(i, r)| Least(r.1 / f64::from(r.2), i, 0))
            .collect();
        while let Some(Least(share, i, _)) = heap.pop() {
            let (l, res, count) = residual[i];
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
                // An unchanged rate keeps its end (and its entry in the heap).
                if (share - f.rate).abs() > 1e-12 * share {
                    f.rate = share;
                    self.version[id] = self.version[id].wrapping_add(1);
                    let end = if share > 0.0 { now + f.rem / share } else { f64::INFINITY };
                    self.ends.push(Least(end, id, self.version[id]));
                }
                for &l2 in f.route.iter() {
                    let j = self.link_pos[l2 as usize] as usize;
                    let r = &mut residual[j];
                    r.1 = (r.1 - share).max(0.0);
                    r.2 -= 1;
                    if r.2 > 0 && j != i {
                        heap.push(Least(r.1 / f64::from(r.2), j, 0));
                    }
                }
            }
        }
        for &l in &links {
            self.link_mark[l as usize] = false;
        }
        if self.ends.len() > 4 * self.live + 1024 {
            // Mostly stale entries: keep the current ones only.
            let live: Vec<Least> = self
                .ends
                .drain()
                .filter(|Least(_, id, v)| self.flows[*id].is_some() && self.version[*id] == *v)
                .collect();
            self.ends = live.into_iter().collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(fluid: &mut Fluid) -> Vec<(u64, f64)> {
        let mut out = Vec::new();
        while let Some(t) = fluid.next_end(0.0f64.max(out.last().map_or(0.0, |x: &(u64, f64)| x.1))) {
            for tag in fluid.take_finished(t) {
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
