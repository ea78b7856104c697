//! Networks: hosts and switches joined by directed links (one each way: links are full
//! duplex), and the route a message takes between two hosts.
//!
//! | shape | parameters | routing |
//! |---|---|---|
//! | `star` | hosts behind one switch | host → switch → host |
//! | `ring` | hosts in a ring | the shorter way round |
//! | `torus` | 2 or 3 dimensions | dimension order, the shorter way in each |
//! | `hypercube` | 2^d hosts | dimension order (e-cube) |
//! | `fat-tree` | k-ary, 2 levels (leaf-spine) or 3 (pods), uplinks oversubscribed | up to a switch chosen by the destination, then down |
//! | `dragonfly` | groups of routers joined all-to-all, one global link per pair of groups | minimal, or Valiant through a third group |
//! | `dragonfly+` | groups as leaf-spine, spines carry the global links | minimal, or Valiant |
//!
//! Hosts are nodes `0..hosts`; switches and routers follow.

use rustc_hash::FxHashMap;

/// One direction of a link.
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    /// Sending node.
    pub from: usize,
    /// Receiving node.
    pub to: usize,
    /// Bytes per second.
    pub bw: f64,
    /// Seconds a byte takes to cross it.
    pub lat: f64,
    /// Which kind of link (host, up, local, global...), for reports.
    pub kind: &'static str,
}

/// How routes are found.
#[derive(Clone, Debug, PartialEq)]
enum Shape {
    Star,
    Ring,
    Torus(Vec<usize>),
    Hypercube,
    /// Leaves of `per_leaf` hosts under `spines` spines.
    LeafSpine {
        per_leaf: usize,
        spines: usize,
    },
    /// `k` pods of k/2 edge and k/2 aggregation switches, (k/2)² cores.
    FatTree3 {
        k: usize,
    },
    /// `a` routers per group with `p` hosts each, `h` global links per router.
    Dragonfly {
        a: usize,
        p: usize,
        h: usize,
        groups: usize,
        valiant: bool,
    },
    /// `leaves` leaves of `p` hosts and `spines` spines per group, `h` global links per spine.
    DragonflyPlus {
        leaves: usize,
        spines: usize,
        p: usize,
        h: usize,
        groups: usize,
        valiant: bool,
    },
}

/// A network of hosts.
#[derive(Clone, Debug)]
pub struct Topology {
    /// A name with its parameters, for reports.
    pub name: String,
    /// Hosts (nodes `0..hosts`).
    pub hosts: usize,
    /// Every node: hosts, then switches.
    pub nodes: usize,
    /// The links.
    pub links: Vec<Link>,
    shape: Shape,
    by_ends: FxHashMap<(usize, usize), usize>,
}

impl Topology {
    fn new(name: String, hosts: usize, nodes: usize, shape: Shape) -> Topology {
        Topology { name, hosts, nodes, links: Vec::new(), shape, by_ends: FxHashMap::default() }
    }

    /// Adds a link each way between `a` and `b`.
    fn join(&mut self, a: usize, b: usize, bw: f64, lat: f64, kind: &'static str) {
        for (from, to) in [(a, b), (b, a)] {
            if self.by_ends.contains_key(&(from, to)) {
                continue;
            }
            self.by_ends.insert((from, to), self.links.len());
            self.links.push(Link { from, to, bw, lat, kind });
        }
    }

    /// `hosts` hosts behind one switch, each on a link of `bw` bytes/s and `lat` s.
    pub fn star(hosts: usize, bw: f64, lat: f64) -> Topology {
        let mut t = Topology::new(format!("star({hosts})"), hosts, hosts + 1, Shape::Star);
        for h in 0..hosts {
            t.join(h, hosts, bw, lat, "host");
        }
        t
    }

    /// `hosts` hosts in a ring.
    pub fn ring(hosts: usize, bw: f64, lat: f64) -> Topology {
        let mut t = Topology::new(format!("ring({hosts})"), hosts, hosts, Shape::Ring);
        for h in 0..hosts {
            if hosts > 1 {
                t.join(h, (h + 1) % hosts, bw, lat, "ring");
            }
        }
        t
    }

    /// A torus of `dims` (e.g. `[8, 8]` or `[4, 4, 4]`).
    pub fn torus(dims: &[usize], bw: f64, lat: f64) -> Topology {
        let hosts = dims.iter().product();
        let name = format!("torus({})", dims.iter().map(ToString::to_string).collect::<Vec<_>>().join("x"));
        let mut t = Topology::new(name, hosts, hosts, Shape::Torus(dims.to_vec()));
        for h in 0..hosts {
            let c = coords(h, dims);
            for (d, &size) in dims.iter().enumerate() {
                if size > 1 {
                    let mut n = c.clone();
                    n[d] = (c[d] + 1) % size;
                    t.join(h, index(&n, dims), bw, lat, "torus");
                }
            }
        }
        t
    }

    /// A hypercube of `2^dim` hosts.
    pub fn hypercube(dim: u32, bw: f64, lat: f64) -> Topology {
        let hosts = 1usize << dim;
        let mut t = Topology::new(format!("hypercube({dim})"), hosts, hosts, Shape::Hypercube);
        for h in 0..hosts {
            for k in 0..dim {
                t.join(h, h ^ (1 << k), bw, lat, "cube");
            }
        }
        t
    }

    /// A k-ary fat-tree with `levels` 2 (leaf-spine: k leaves of k/2 hosts, k/2 spines) or
    /// 3 (k pods: k³/4 hosts), holding `hosts` hosts; uplinks from the first level run at
    /// `bw / over` (oversubscription `over`).
    pub fn fat_tree(
        k: usize,
        levels: u32,
        over: f64,
        hosts: usize,
        bw: f64,
        lat: f64,
    ) -> Result<Topology, String> {
        if k < 2 || !k.is_multiple_of(2) {
            return Err(format!("fat-tree: k must be even and at least 2, not {k}"));
        }
        let half = k / 2;
        let up = bw / over.max(1e-9);
        match levels {
            2 => {
                let cap = k * half;
                check_capacity(hosts, cap, "fat-tree with 2 levels")?;
                let leaves = hosts.div_ceil(half);
                let name = format!("fat-tree(k={k},levels=2,over={over})");
                let mut t = Topology::new(
                    name,
                    hosts,
                    hosts + leaves + half,
                    Shape::LeafSpine { per_leaf: half, spines: half },
                );
                for h in 0..hosts {
                    t.join(h, hosts + h / half, bw, lat, "host");
                }
                for l in 0..leaves {
                    for s in 0..half {
                        t.join(hosts + l, hosts + leaves + s, up, lat, "up");
                    }
                }
                Ok(t)
            }
            3 => {
                let cap = k * half * half;
                check_capacity(hosts, cap, "fat-tree with 3 levels")?;
                let pods = k;
                let (edges, aggs, cores) = (pods * half, pods * half, half * half);
                let name = format!("fat-tree(k={k},levels=3,over={over})");
                let mut t = Topology::new(name, hosts, hosts + edges + aggs + cores, Shape::FatTree3 { k });
                let edge = |e: usize| hosts + e;
                let agg = |a: usize| hosts + edges + a;
                let core = |c: usize| hosts + edges + aggs + c;
                for h in 0..hosts {
                    t.join(h, edge(h / half), bw, lat, "host");
                }
                for p in 0..pods {
                    for e in 0..half {
                        for a in 0..half {
                            t.join(edge(p * half + e), agg(p * half + a), up, lat, "up");
                        }
                    }
                    for a in 0..half {
                        for m in 0..half {
                            t.join(agg(p * half + a), core(a * half + m), up, lat, "core");
                        }
                    }
                }
                Ok(t)
            }
            _ => Err(format!("fat-tree: levels must be 2 or 3, not {levels}")),
        }
    }

    /// A dragonfly of groups of `a` routers (all-to-all inside a group), `p` hosts and `h`
    /// global links per router, and `a·h + 1` groups (one global link per pair of groups),
    /// holding `hosts` hosts; global links at `global_bw`.
    #[allow(clippy::too_many_arguments)]
    pub fn dragonfly(
        a: usize,
        p: usize,
        h: usize,
        hosts: usize,
        bw: f64,
        global_bw: f64,
        lat: f64,
        valiant: bool,
    ) -> Result<Topology, String> {
        if a == 0 || p == 0 || h == 0 {
            return Err("dragonfly: a, p and h must be positive".into());
        }
        let groups = a * h + 1;
        check_capacity(hosts, groups * a * p, "dragonfly")?;
        let routers = groups * a;
        let routing = if valiant { "valiant" } else { "minimal" };
        let name = format!("dragonfly(a={a},p={p},h={h},g={groups},{routing})");
        let mut t =
            Topology::new(name, hosts, hosts + routers, Shape::Dragonfly { a, p, h, groups, valiant });
        let router = |g: usize, r: usize| hosts + g * a + r;
        for x in 0..hosts {
            t.join(x, hosts + x / p, bw, lat, "host");
        }
        for g in 0..groups {
            for r in 0..a {
                for s in r + 1..a {
                    t.join(router(g, r), router(g, s), bw, lat, "local");
                }
            }
            for q in 0..a * h {
                let (g2, q2) = global_peer(g, q, groups);
                t.join(router(g, q / h), router(g2, q2 / h), global_bw, lat, "global");
            }
        }
        Ok(t)
    }

    /// A Dragonfly+: groups of `leaves` leaf switches (`p` hosts each) fully joined to
    /// `spines` spines, each spine with `h` global links, `spines·h + 1` groups.
    #[allow(clippy::too_many_arguments)]
    pub fn dragonfly_plus(
        leaves: usize,
        spines: usize,
        p: usize,
        h: usize,
        hosts: usize,
        bw: f64,
        global_bw: f64,
        lat: f64,
        valiant: bool,
    ) -> Result<Topology, String> {
        if leaves == 0 || spines == 0 || p == 0 || h == 0 {
            return Err("dragonfly+: leaves, spines, p and h must be positive".into());
        }
        let groups = spines * h + 1;
        check_capacity(hosts, groups * leaves * p, "dragonfly+")?;
        let per = leaves + spines;
        let routing = if valiant { "valiant" } else { "minimal" };
        let name = format!("dragonfly+(leaves={leaves},spines={spines},p={p},h={h},g={groups},{routing})");
        let shape = Shape::DragonflyPlus { leaves, spines, p, h, groups, valiant };
        let mut t = Topology::new(name, hosts, hosts + groups * per, shape);
        let leaf = |g: usize, l: usize| hosts + g * per + l;
        let spine = |g: usize, s: usize| hosts + g * per + leaves + s;
        for x in 0..hosts {
            let (g, l) = (x / (leaves * p), x / p % leaves);
            t.join(x, leaf(g, l), bw, lat, "host");
        }
        for g in 0..groups {
            for l in 0..leaves {
                for s in 0..spines {
                    t.join(leaf(g, l), spine(g, s), bw, lat, "up");
                }
            }
            for q in 0..spines * h {
                let (g2, q2) = global_peer(g, q, groups);
                t.join(spine(g, q / h), spine(g2, q2 / h), global_bw, lat, "global");
            }
        }
        Ok(t)
    }

    /// The links from host `a` to host `b`, in order (empty for `a == b`).
    pub fn route(&self, a: usize, b: usize) -> Vec<usize> {
        if a == b {
            return Vec::new();
        }
        let path = self.path(a, b);
        path.windows(2).map(|w| self.by_ends[&(w[0], w[1])]).collect()
    }

    /// The nodes from host `a` to host `b`.
    fn path(&self, a: usize, b: usize) -> Vec<usize> {
        let hosts = self.hosts;
        match &self.shape {
            Shape::Star => vec![a, hosts, b],
            Shape::Ring => {
                let n = hosts;
                let fwd = (b + n - a) % n;
                let step = if fwd <= n - fwd { 1 } else { n - 1 };
                let mut p = vec![a];
                while *p.last().unwrap_or(&b) != b {
                    p.push((p[p.len() - 1] + step) % n);
                }
                p
            }
            Shape::Torus(dims) => {
                let mut c = coords(a, dims);
                let target = coords(b, dims);
                let mut p = vec![a];
                for d in 0..dims.len() {
                    let size = dims[d];
                    let fwd = (target[d] + size - c[d]) % size;
                    let step = if fwd <= size - fwd { 1 } else { size - 1 };
                    while c[d] != target[d] {
                        c[d] = (c[d] + step) % size;
                        p.push(index(&c, dims));
                    }
                }
                p
            }
            Shape::Hypercube => {
                let mut p = vec![a];
                let mut x = a;
                for k in 0..usize::BITS {
                    if (x ^ b) >> k & 1 == 1 {
                        x ^= 1 << k;
                        p.push(x);
                    }
                }
                p
            }
            Shape::LeafSpine { per_leaf, spines } => {
                let leaves = self.nodes - hosts - spines;
                let (la, lb) = (hosts + a / per_leaf, hosts + b / per_leaf);
                if la == lb { vec![a, la, b] } else { vec![a, la, hosts + leaves + b % spines, lb, b] }
            }
            Shape::FatTree3 { k } => {
                let half = k / 2;
                let (edges, aggs) = (k * half, k * half);
                let (ea, eb) = (a / half, b / half);
                let (pa, pb) = (ea / half, eb / half);
                let edge = |e: usize| hosts + e;
                let agg = |x: usize| hosts + edges + x;
                let core = |c: usize| hosts + edges + aggs + c;
                // The destination picks the aggregation switch and the core: up/down routing
                // spreads destinations over the upper levels deterministically.
                let j = b % half;
                if ea == eb {
                    vec![a, edge(ea), b]
                } else if pa == pb {
                    vec![a, edge(ea), agg(pa * half + j), edge(eb), b]
                } else {
                    let m = (b / half) % half;
                    vec![a, edge(ea), agg(pa * half + j), core(j * half + m), agg(pb * half + j), edge(eb), b]
                }
            }
            Shape::Dragonfly { a: per, p, h, groups, valiant } => {
                let router = |g: usize, r: usize| hosts + g * per + r;
                let (ra, rb) = (a / p, b / p);
                let (ga, gb) = (ra / per, rb / per);
                let mut nodes = vec![a, hosts + ra];
                let hop_to = |nodes: &mut Vec<usize>, g: usize, r: usize| {
                    let node = router(g, r);
                    if *nodes.last().unwrap_or(&node) != node {
                        nodes.push(node);
                    }
                };
                let mut cur = (ga, ra % per);
                let mut via = Vec::new();
                if *valiant && ga != gb && *groups > 2 {
                    via.push(third_group(a, b, ga, gb, *groups));
                }
                via.push(gb);
                for g in via {
                    if cur.0 != g {
                        let q = (g + groups - cur.0 - 1) % groups;
                        hop_to(&mut nodes, cur.0, q / h);
                        let (g2, q2) = global_peer(cur.0, q, *groups);
                        hop_to(&mut nodes, g2, q2 / h);
                        cur = (g2, q2 / h);
                    }
                }
                hop_to(&mut nodes, gb, rb % per);
                nodes.push(b);
                nodes
            }
            Shape::DragonflyPlus { leaves, spines, p, h, groups, valiant } => {
                let per = leaves + spines;
                let leaf = |g: usize, l: usize| hosts + g * per + l;
                let spine = |g: usize, s: usize| hosts + g * per + leaves + s;
                let (ga, la) = (a / (leaves * p), a / p % leaves);
                let (gb, lb) = (b / (leaves * p), b / p % leaves);
                let mut nodes = vec![a, leaf(ga, la)];
                if ga == gb {
                    if la != lb {
                        nodes.push(spine(ga, b % spines));
                        nodes.push(leaf(gb, lb));
                    }
                } else {
                    let mut cur = ga;
                    let mut via = Vec::new();
                    if *valiant && *groups > 2 {
                        via.push(third_group(a, b, ga, gb, *groups));
                    }
                    via.push(gb);
                    for g in via {
                        let q = (g + groups - cur - 1) % groups;
                        let out = spine(cur, q / h);
                        let last = nodes[nodes.len() - 1];
                        if last != out {
                            if last >= spine(cur, 0) && last < spine(cur, 0) + spines {
                                // Spines meet only through a leaf (Valiant's middle group).
                                nodes.push(leaf(cur, b % leaves));
                            }
                            nodes.push(out);
                        }
                        let (g2, q2) = global_peer(cur, q, *groups);
                        nodes.push(spine(g2, q2 / h));
                        cur = g2;
                    }
                    nodes.push(leaf(gb, lb));
                }
                nodes.push(b);
                nodes
            }
        }
    }
}

fn check_capacity(hosts: usize, cap: usize, what: &str) -> Result<(), String> {
    if hosts == 0 || hosts > cap {
        return Err(format!("{what} holds 1 to {cap} hosts, not {hosts}"));
    }
    Ok(())
}

/// Global port `q` of group `g` (of `groups`) leads to group `(g + q + 1) mod groups`, at
/// that group's port back.
fn global_peer(g: usize, q: usize, groups: usize) -> (usize, usize) {
    let g2 = (g + q + 1) % groups;
    (g2, (g + groups - g2 - 1) % groups)
}

/// Valiant's intermediate group for a message from `a` to `b`: neither end's, chosen by a
/// hash of the pair so that runs repeat.
fn third_group(a: usize, b: usize, ga: usize, gb: usize, groups: usize) -> usize {
    let mut x =
        (a as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (b as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 31;
    let mut g = (x % groups as u64) as usize;
    while g == ga || g == gb {
        g = (g + 1) % groups;
    }
    g
}

fn coords(mut h: usize, dims: &[usize]) -> Vec<usize> {
    dims.iter()
        .map(|&d| {
            let c = h % d;
            h /= d;
            c
        })
        .collect()
}

fn index(c: &[usize], dims: &[usize]) -> usize {
    c.iter().zip(dims).rev().fold(0, |acc, (&x, &d)| acc * d + x)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hops(t: &Topology, a: usize, b: usize) -> usize {
        t.route(a, b).len()
    }

    /// Every route is a chain of links from `a` to `b`.
    fn connected(t: &Topology) {
        let n = t.hosts;
        for a in (0..n).step_by((n / 17).max(1)) {
            for b in (0..n).step_by((n / 13).max(1)) {
                let r = t.route(a, b);
                let mut at = a;
                for &l in &r {
                    assert_eq!(t.links[l].from, at, "{} route {a}->{b} breaks", t.name);
                    at = t.links[l].to;
                }
                assert_eq!(at, b, "{} route {a}->{b} ends at {at}", t.name);
            }
        }
    }

    #[test]
    fn rings_tori_and_hypercubes_route_by_dimension_the_short_way() {
        let r = Topology::ring(8, 1.0, 0.0);
        connected(&r);
        assert_eq!(hops(&r, 0, 1), 1);
        assert_eq!(hops(&r, 0, 7), 1, "backwards is shorter");
        assert_eq!(hops(&r, 1, 5), 4);
        let t = Topology::torus(&[4, 4, 4], 1.0, 0.0);
        connected(&t);
        // (0,0,0) -> (2,3,1): 2 + 1 (wrapping) + 1 hops.
        assert_eq!(hops(&t, 0, index(&[2, 3, 1], &[4, 4, 4])), 4);
        // Dimension order: the first hop moves along x.
        let first = t.links[t.route(0, index(&[1, 1, 0], &[4, 4, 4]))[0]].to;
        assert_eq!(first, 1);
        let h = Topology::hypercube(6, 1.0, 0.0);
        connected(&h);
        assert_eq!(hops(&h, 0b000000, 0b101101), 4, "one hop per differing bit");
    }

    #[test]
    fn fat_tree_routes_go_up_then_down() {
        let t = Topology::fat_tree(8, 3, 2.0, 128, 1.0, 0.0).unwrap();
        connected(&t);
        assert_eq!(hops(&t, 0, 1), 2, "same edge switch");
        assert_eq!(hops(&t, 0, 4), 4, "same pod");
        assert_eq!(hops(&t, 0, 127), 6, "across pods through a core");
        // Up then down: kinds never go down and up again.
        for b in [5, 77, 127] {
            let kinds: Vec<_> = t.route(0, b).iter().map(|&l| (t.links[l].from, t.links[l].to)).collect();
            let level = |n: usize| {
                if n < 128 {
                    0
                } else if n < 128 + 32 {
                    1
                } else if n < 128 + 64 {
                    2
                } else {
                    3
                }
            };
            let ups: Vec<bool> = kinds.iter().map(|&(f, to)| level(to) > level(f)).collect();
            let turn = ups.iter().position(|u| !u).unwrap_or(ups.len());
            assert!(ups[turn..].iter().all(|u| !u), "route to {b} goes down then up: {ups:?}");
        }
        let ls = Topology::fat_tree(8, 2, 1.0, 32, 1.0, 0.0).unwrap();
        connected(&ls);
        assert_eq!(hops(&ls, 0, 31), 4);
        assert!(Topology::fat_tree(8, 3, 1.0, 129, 1.0, 0.0).is_err());
    }

    #[test]
    fn dragonfly_minimal_routes_take_one_global_hop_and_valiant_two() {
        for plus in [false, true] {
            let make = |valiant| {
                if plus {
                    Topology::dragonfly_plus(2, 2, 2, 2, 20, 1.0, 1.0, 0.0, valiant).unwrap()
                } else {
                    Topology::dragonfly(4, 2, 2, 72, 1.0, 1.0, 0.0, valiant).unwrap()
                }
            };
            let (min, val) = (make(false), make(true));
            connected(&min);
            connected(&val);
            let globals =
                |t: &Topology, a, b| t.route(a, b).iter().filter(|&&l| t.links[l].kind == "global").count();
            let far = min.hosts - 1;
            assert_eq!(globals(&min, 0, far), 1, "{}", min.name);
            assert_eq!(globals(&val, 0, far), 2, "{}", val.name);
            assert_eq!(globals(&min, 0, 1), 0, "same group stays local");
            assert!(hops(&val, 0, far) > hops(&min, 0, far));
        }
    }
}
