//! The tuner's constants: what a message costs on each class of link (`α` per message, `β`
//! per byte moved, `γ` per byte reduced, `δ` per byte copied), what a hand-off of the core
//! costs on a crowded host, how each algorithm and protocol runs against its schedule's
//! counts, from which length this machine pulls messages (`xccl tune pull`), and the text
//! format they are kept in (`xccl tune fit -o`, `XCCL_TUNE_FILE`). The
//! built-in values were fitted on the project's reference machine (`reference.tune`,
//! docs/PERFORMANCE.md); `XCCL_TUNE_<CLASS>` and `XCCL_TUNE_SWITCH_US` override single ones.

use super::Algorithm;
use crate::coll::CollKind;
use crate::error::{Error, Result};
use crate::protocol::{Protocol, PullMin};

/// Kinds of link between two ranks.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum LinkClass {
    /// Threads of one process.
    Local,
    /// Processes of one host, through shared memory.
    Shm,
    /// TCP (between hosts, or on one host with shared memory off).
    Tcp,
}

/// The cost constants of one link class.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct LinkCost {
    /// Seconds per message.
    pub alpha: f64,
    /// Seconds per byte moved.
    pub beta: f64,
    /// Seconds per byte reduced.
    pub gamma: f64,
    /// Seconds per byte copied locally.
    pub delta: f64,
}

impl LinkCost {
    /// Constants from a latency in µs and rates in GB/s.
    pub fn new(alpha_us: f64, move_gbps: f64, reduce_gbps: f64, copy_gbps: f64) -> LinkCost {
        LinkCost {
            alpha: alpha_us * 1e-6,
            beta: 1e-9 / move_gbps,
            gamma: 1e-9 / reduce_gbps,
            delta: 1e-9 / copy_gbps,
        }
    }

    fn parse(name: &str, v: &str) -> Result<LinkCost> {
        let nums: Vec<f64> =
            v.split(',').map(|x| x.trim().parse::<f64>()).collect::<std::result::Result<_, _>>().map_err(
                |_| Error::Config(format!("{name}='{v}' is not alpha_us,beta_gbps,gamma_gbps,delta_gbps")),
            )?;
        match nums[..] {
            [a, b, g, d] if nums.iter().all(|x| x.is_finite() && *x > 0.0) => Ok(LinkCost::new(a, b, g, d)),
            _ => Err(Error::Config(format!(
                "{name}='{v}' needs four positive numbers: alpha_us,beta_gbps,gamma_gbps,delta_gbps"
            ))),
        }
    }
}

/// How one algorithm's implementation of one collective runs compared with what the cost
/// of its schedule says: factors on the latency terms (`alpha`, hand-offs, forwarding hops)
/// and on the bandwidth terms (`beta`, `gamma`, `delta`), on hosts with a core per rank or
/// on crowded ones. They capture what a schedule's counts cannot: how much of a step's
/// traffic really overlaps, how caches fare, how ranks that share cores interleave.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Efficiency {
    /// The collective.
    pub kind: CollKind,
    /// The algorithm.
    pub algo: Algorithm,
    /// For hosts with more ranks than cores.
    pub crowded: bool,
    /// Factor on the latency terms.
    pub latency: f64,
    /// Factor on the bandwidth terms.
    pub bandwidth: f64,
}

/// The constants of every link class, and the algorithms' efficiencies.
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    /// Threads of one process.
    pub local: LinkCost,
    /// Shared memory.
    pub shm: LinkCost,
    /// TCP.
    pub tcp: LinkCost,
    /// Seconds each message a rank waits for costs on a crowded host (more ranks than cores),
    /// for handing the core over to its sender.
    pub switch: f64,
    /// Efficiencies; an algorithm absent here has factors of 1.
    pub efficiency: Vec<Efficiency>,
    /// Per protocol, factors on the latency and bandwidth of its messages (a protocol
    /// absent here has factors of 1): what LL saves per message, say.
    pub protocols: Vec<(Protocol, f64, f64)>,
    /// From which length messages are pulled on this machine, as `xccl tune pull` measured
    /// it, per count of ranks on the host ([`CostModel::pull_for`]); none keeps the built-in
    /// thresholds. `XCCL_PULL_BYTES` and `XCCL_PULL_PLAIN_BYTES` override them.
    pub pull: Vec<PullLine>,
}

/// A tuning file's `pull` line: thresholds measured with `ranks` ranks on the host, or for
/// any count (`None`, a line that names none).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PullLine {
    /// The ranks on the host it holds for.
    pub ranks: Option<usize>,
    /// The thresholds.
    pub min: PullMin,
}

/// The constants fitted on the reference machine (2 vCPU Zen 3 guest, shared memory between
/// processes, loopback TCP) by `xccl tune fit`; see docs/PERFORMANCE.md.
const REFERENCE: &str = include_str!("reference.tune");

impl Default for CostModel {
    /// The constants calibrated on the reference machine.
    fn default() -> Self {
        let base = CostModel {
            local: LinkCost::new(1.5, 6.0, 7.0, 10.0),
            shm: LinkCost::new(1.5, 6.0, 7.0, 10.0),
            tcp: LinkCost::new(25.0, 1.6, 7.0, 10.0),
            switch: 20e-6,
            efficiency: Vec::new(),
            protocols: Vec::new(),
            pull: Vec::new(),
        };
        // The embedded file is checked by a test; a broken one would leave the base model.
        base.clone().with_text("reference.tune", REFERENCE).unwrap_or(base)
    }
}

impl CostModel {
    /// Defaults, then the tuning file `XCCL_TUNE_FILE` (as `xccl tune fit -o` writes it),
    /// then `XCCL_TUNE_LOCAL`, `XCCL_TUNE_SHM`, `XCCL_TUNE_TCP` and `XCCL_TUNE_SWITCH_US`.
    /// Every rank must use the same constants (they choose algorithms).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<CostModel> {
        let mut m = CostModel::default();
        if let Some(path) = lookup("XCCL_TUNE_FILE") {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| Error::Config(format!("XCCL_TUNE_FILE={path}: cannot read it: {e}")))?;
            m = m.with_text(&path, &text)?;
        }
        for (name, slot) in
            [("XCCL_TUNE_LOCAL", &mut m.local), ("XCCL_TUNE_SHM", &mut m.shm), ("XCCL_TUNE_TCP", &mut m.tcp)]
        {
            if let Some(v) = lookup(name) {
                *slot = LinkCost::parse(name, &v)?;
            }
        }
        if let Some(v) = lookup("XCCL_TUNE_SWITCH_US") {
            m.switch = parse_us("XCCL_TUNE_SWITCH_US", &v)?;
        }
        Ok(m)
    }

    /// This model with the settings of a tuning file (`name` names it in errors). Lines:
    /// `link CLASS ALPHA_US BETA_GBPS GAMMA_GBPS DELTA_GBPS`, `switch US`,
    /// `efficiency COLLECTIVE ALGORITHM spread|crowded LATENCY BANDWIDTH`,
    /// `protocol PROTOCOL LATENCY BANDWIDTH`, `pull COMBINING PLAIN [ranks=N]` (byte counts
    /// such as `64K`, or `off`: from which length combined and placed messages are pulled,
    /// on hosts of `N` ranks, or any); `#` starts a comment. A later line replaces an earlier
    /// one of the same kind.
    pub fn with_text(mut self, name: &str, text: &str) -> Result<CostModel> {
        for (no, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |what: &str| Error::Config(format!("{name}:{}: {what}: '{line}'", no + 1));
            let f: Vec<&str> = line.split_whitespace().collect();
            let num = |s: &str| s.parse::<f64>().ok().filter(|x| x.is_finite() && *x > 0.0);
            match f[..] {
                ["link", class, a, b, g, d] => {
                    let slot = match class {
                        "local" => &mut self.local,
                        "shm" => &mut self.shm,
                        "tcp" => &mut self.tcp,
                        _ => return Err(bad("unknown link class (local, shm, tcp)")),
                    };
                    let (Some(a), Some(b), Some(g), Some(d)) = (num(a), num(b), num(g), num(d)) else {
                        return Err(bad("link constants must be positive numbers"));
                    };
                    *slot = LinkCost::new(a, b, g, d);
                }
                ["switch", us] => self.switch = parse_us(name, us).map_err(|_| bad("not microseconds"))?,
                ["efficiency", coll, algo, regime, lat, bw] => {
                    let kind = CollKind::named(coll).ok_or_else(|| bad("unknown collective"))?;
                    let algo: Algorithm = algo.parse().map_err(|e: Error| bad(&e.to_string()))?;
                    if !Algorithm::for_collective(kind).contains(&algo) {
                        return Err(bad(&format!("{kind} has no {algo} algorithm")));
                    }
                    let crowded = match regime {
                        "spread" => false,
                        "crowded" => true,
                        _ => return Err(bad("the regime is spread or crowded")),
                    };
                    let (Some(latency), Some(bandwidth)) = (num(lat), num(bw)) else {
                        return Err(bad("factors must be positive numbers"));
                    };
                    self.efficiency.retain(|e| (e.kind, e.algo, e.crowded) != (kind, algo, crowded));
                    self.efficiency.push(Efficiency { kind, algo, crowded, latency, bandwidth });
                }
                ["protocol", name, lat, bw] => {
                    let proto: Protocol = name.parse().map_err(|e: Error| bad(&e.to_string()))?;
                    let (Some(latency), Some(bandwidth)) = (num(lat), num(bw)) else {
                        return Err(bad("factors must be positive numbers"));
                    };
                    self.protocols.retain(|p| p.0 != proto);
                    self.protocols.push((proto, latency, bandwidth));
                }
                ["pull", combining, plain, ref count @ ..] if count.len() <= 1 => {
                    let bytes = |v: &str| crate::byte_count::parse_threshold("pull", v).ok();
                    let (Some(combining), Some(plain)) = (bytes(combining), bytes(plain)) else {
                        return Err(bad("pull lengths are byte counts (64K, 2M) or off"));
                    };
                    let ranks = match count.first() {
                        None => None,
                        Some(c) => match c.strip_prefix("ranks=").and_then(|n| n.parse::<usize>().ok()) {
                            Some(n) if n > 0 => Some(n),
                            _ => return Err(bad("a pull line ends with ranks=N, N the ranks on the host")),
                        },
                    };
                    self.pull.retain(|l| l.ranks != ranks);
                    self.pull.push(PullLine { ranks, min: PullMin { combining, plain } });
                }
                _ => return Err(bad("not a link, switch, efficiency, protocol or pull line")),
            }
        }
        Ok(self)
    }

    /// A tuning file's line for `line` (without its newline), as [`CostModel::with_text`]
    /// reads it: `pull COMBINING PLAIN [ranks=N]`, `off` for never.
    pub fn pull_line(line: PullLine) -> String {
        use crate::byte_count::threshold_text;
        let p = line.min;
        let text = format!("pull {} {}", threshold_text(p.combining), threshold_text(p.plain));
        match line.ranks {
            Some(n) => format!("{text} ranks={n}"),
            None => text,
        }
    }

    /// The thresholds measured for hosts of `ranks` ranks: that count's line, else the line
    /// for any count.
    pub fn pull_for(&self, ranks: usize) -> Option<PullMin> {
        let of = |r: Option<usize>| self.pull.iter().find(|l| l.ranks == r).map(|l| l.min);
        of(Some(ranks)).or_else(|| of(None))
    }

    /// The factors (latency, bandwidth) on messages that travel by `p`.
    pub fn protocol_factors(&self, p: Protocol) -> (f64, f64) {
        self.protocols.iter().find(|q| q.0 == p).map_or((1.0, 1.0), |q| (q.1, q.2))
    }

    /// The model as a tuning file, which [`CostModel::with_text`] reads back.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for (name, c) in [("local", &self.local), ("shm", &self.shm), ("tcp", &self.tcp)] {
            out += &format!(
                "link {name} {:.4} {:.4} {:.4} {:.4}\n",
                c.alpha * 1e6,
                1e-9 / c.beta,
                1e-9 / c.gamma,
                1e-9 / c.delta
            );
        }
        out += &format!("switch {:.4}\n", self.switch * 1e6);
        for &line in &self.pull {
            out += &CostModel::pull_line(line);
            out.push('\n');
        }
        for (p, lat, bw) in &self.protocols {
            out += &format!("protocol {p} {lat:.4} {bw:.4}\n");
        }
        for e in &self.efficiency {
            let regime = if e.crowded { "crowded" } else { "spread" };
            out += &format!(
                "efficiency {} {} {regime} {:.4} {:.4}\n",
                e.kind.name(),
                e.algo,
                e.latency,
                e.bandwidth
            );
        }
        out
    }

    /// The efficiency factors (latency, bandwidth) of `algo` running `kind`.
    pub fn factors(&self, kind: CollKind, algo: Algorithm, crowded: bool) -> (f64, f64) {
        self.efficiency
            .iter()
            .find(|e| (e.kind, e.algo, e.crowded) == (kind, algo, crowded))
            .map_or((1.0, 1.0), |e| (e.latency, e.bandwidth))
    }

    /// The constants of link class `class`.
    pub(crate) fn of(&self, class: LinkClass) -> &LinkCost {
        match class {
            LinkClass::Local => &self.local,
            LinkClass::Shm => &self.shm,
            LinkClass::Tcp => &self.tcp,
        }
    }
}

fn parse_us(name: &str, v: &str) -> Result<f64> {
    match v.trim().parse::<f64>() {
        Ok(us) if us.is_finite() && us >= 0.0 => Ok(us * 1e-6),
        _ => Err(Error::Config(format!("{name}='{v}' is not a number of microseconds"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference link constants without the algorithms' efficiencies or the protocols'
    /// factors.
    fn plain() -> CostModel {
        CostModel { efficiency: Vec::new(), protocols: Vec::new(), ..CostModel::default() }
    }

    #[test]
    fn the_reference_tuning_parses_and_round_trips() {
        let base = plain();
        let reference = base.clone().with_text("reference.tune", REFERENCE).unwrap();
        assert_eq!(reference, CostModel::default());
        let again = base.with_text("again", &reference.to_text()).unwrap();
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-3;
        assert!(close(again.shm.beta, reference.shm.beta) && close(again.switch, reference.switch));
        assert_eq!(again.efficiency.len(), reference.efficiency.len());
        assert_eq!(again.protocols, reference.protocols);
        assert_eq!(reference.protocol_factors(Protocol::Ll).0, 0.6);
        for (a, b) in again.efficiency.iter().zip(&reference.efficiency) {
            assert_eq!((a.kind, a.algo, a.crowded), (b.kind, b.algo, b.crowded));
            assert!(close(a.latency, b.latency) && close(a.bandwidth, b.bandwidth));
        }
    }

    #[test]
    fn tuning_files_say_which_line_is_wrong() {
        for (text, want) in [
            ("link fiber 1 2 3 4", "unknown link class"),
            ("link shm 1 2 -3 4", "positive"),
            ("efficiency all_reduce teleport spread 1 1", "teleport"),
            ("efficiency broadcast ring spread 1 1", "no ring"),
            ("efficiency all_reduce ring sideways 1 1", "spread or crowded"),
            ("switch x", "microseconds"),
            ("pull 64K", "not a link"),
            ("pull 64K -1", "byte counts"),
            ("pull 0 1M", "byte counts"),
            ("pull 1M 1M 4", "ranks=N"),
            ("pull 1M 1M ranks=0", "ranks=N"),
            ("pull 1M 1M ranks=4 x", "not a link"),
            ("# fine\nbogus", "line 2"),
        ] {
            let err = plain().with_text("t.tune", text).unwrap_err().to_string();
            let want = want.replace("line 2", "t.tune:2");
            assert!(err.contains(&want), "{text}: {err}");
        }
    }

    #[test]
    fn pull_lengths_are_read_and_written_back() {
        assert_eq!(CostModel::default().pull, vec![]);
        assert_eq!(CostModel::default().pull_for(2), None);
        let m = plain().with_text("t.tune", "pull 4M off\n").unwrap();
        let any = PullMin { combining: 4 << 20, plain: usize::MAX };
        assert_eq!(m.pull, vec![PullLine { ranks: None, min: any }]);
        assert!(m.to_text().contains("pull 4194304 off\n"), "{}", m.to_text());
        assert_eq!(plain().with_text("again", &m.to_text()).unwrap().pull, m.pull);
        // A later line replaces an earlier one of the same count; each count has its own.
        let m = plain()
            .with_text("t.tune", "pull 1M 2M\npull 32K 16K ranks=4\npull 32K 16K\npull 2M 128K ranks=4")
            .unwrap();
        let four = PullMin { combining: 2 << 20, plain: 128 << 10 };
        assert_eq!(m.pull_for(4), Some(four));
        assert_eq!(m.pull_for(2), Some(PullMin { combining: 32 << 10, plain: 16 << 10 }));
        assert!(m.to_text().contains("pull 2097152 131072 ranks=4\n"), "{}", m.to_text());
        assert_eq!(plain().with_text("again", &m.to_text()).unwrap().pull, m.pull);
        // Without a line for any count, other counts keep the built-in thresholds.
        let m = plain().with_text("t.tune", "pull 2M 128K ranks=4").unwrap();
        assert_eq!((m.pull_for(4), m.pull_for(2)), (Some(four), None));
    }

    #[test]
    fn constants_parse_or_say_what_is_wrong() {
        let m = CostModel::from_lookup(|k| (k == "XCCL_TUNE_TCP").then(|| "50, 1, 5, 10".into())).unwrap();
        assert_eq!(m.tcp, LinkCost::new(50.0, 1.0, 5.0, 10.0));
        assert!(CostModel::from_lookup(|_| Some("1,2".into())).is_err());
        assert!(CostModel::from_lookup(|_| Some("1,2,x,4".into())).is_err());
        assert!(CostModel::from_lookup(|_| Some("1,-2,3,4".into())).is_err());
        let sw = CostModel::from_lookup(|k| (k == "XCCL_TUNE_SWITCH_US").then(|| "7".into())).unwrap();
        assert!((sw.switch - 7e-6).abs() < 1e-12);
        assert!(CostModel::from_lookup(|k| (k == "XCCL_TUNE_SWITCH_US").then(|| "-1".into())).is_err());
    }
}
