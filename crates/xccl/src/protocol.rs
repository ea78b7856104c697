//! Protocols: how one message crosses its link, an axis beside the algorithm.
//!
//! An algorithm says which messages go where; a protocol says how each one travels:
//!
//! | protocol | how | where |
//! |---|---|---|
//! | [`Ll`](Protocol::Ll) | flag and data in the same cache lines of a small channel beside the ring: the receiver polls the data itself, no header, no separate notification | memory links, messages up to 256 bytes |
//! | [`Eager`](Protocol::Eager) | the whole message in one frame, written when the ring takes it whole and placed straight from the ring without the general loop (the express lane) | memory links, messages up to 4 KiB |
//! | [`Stream`](Protocol::Stream) | framed segments through the link, pipelined: the receiver places or reduces segment `k` while segment `k + 1` arrives | every link; the fallback |
//! | [`Pull`](Protocol::Pull) | the sender describes where the message lies; the receiver copies it out of the sender's memory in one pass and acknowledges | links whose receiver can read the sender's memory, messages from `XCCL_PULL_BYTES` (64 KiB), from `XCCL_PULL_PLAIN_BYTES` (half that) in collectives that do not combine |
//! | [`Split`](Protocol::Split) | a pull shared by both sides: the receiver copies the head while the sender writes the tail into the receiver's memory | one-way collectives (broadcast, scatter, gather) with a core per rank, 1-2 MiB |
//! | [`Fused`](Protocol::Fused) | a pull that is folded, and whose result is the next step's message back to its sender: the sender names where that message goes in its own memory (a grant), and the receiver writes each folded piece there while it is still in cache, so the next step has nothing left to move | pulled, combined messages from [`FUSE_MIN`] (the 2-rank all-reduce's reduce-scatter and all-gather, Rabenseifner's middle rounds) |
//!
//! One function per decision, used by the executor when it runs a message and by the tuner
//! when it prices one: [`for_send`] (the sender's choice), [`expected`] (what a receiver
//! can know in advance: LL or not, and whether the express lane may serve it) and
//! [`splits`] (the receiver's answer to a pull), [`fuses`] (whether a folded pull writes its
//! result back ahead). Whether a message goes by LL is decided
//! alike on both ends from what both know (its length, the link, the allowed protocols),
//! since the receiver must look for it in the right place. `XCCL_PROTO` restricts the
//! protocols, for every collective or per collective (like `XCCL_ALGO`); every rank must
//! set it alike, and a message sent one way and expected another is reported as a
//! mismatch.

use std::fmt;
use std::str::FromStr;

use crate::coll::CollKind;
use crate::error::{Error, Result};

/// How one message crosses its link (see the module docs).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Flag and data in one cache line: the latency protocol.
    Ll,
    /// One frame, written and read whole, outside the general loop.
    Eager,
    /// Framed segments, pipelined; every link can carry it.
    Stream,
    /// The receiver copies the message out of the sender's memory.
    Pull,
    /// Receiver and sender copy halves of a pulled message at once.
    Split,
    /// The receiver of a pulled message it folds writes the result straight into the
    /// sender's receive buffer of the next step.
    Fused,
}

impl Protocol {
    /// Every protocol, fastest for small messages first.
    pub const ALL: [Protocol; 6] =
        [Protocol::Ll, Protocol::Eager, Protocol::Stream, Protocol::Pull, Protocol::Split, Protocol::Fused];

    /// The name used in `XCCL_PROTO` and in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Protocol::Ll => "ll",
            Protocol::Eager => "eager",
            Protocol::Stream => "stream",
            Protocol::Pull => "pull",
            Protocol::Split => "split",
            Protocol::Fused => "fused",
        }
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Protocol {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Protocol::ALL.into_iter().find(|p| p.name() == s.trim().to_ascii_lowercase()).ok_or_else(|| {
            let names: Vec<_> = Protocol::ALL.iter().map(|p| p.name()).collect();
            Error::Config(format!("unknown protocol '{s}': expected one of {}", names.join(", ")))
        })
    }
}

/// A set of protocols. [`Stream`](Protocol::Stream) is always in it: every link carries
/// it, and a message no allowed protocol applies to streams.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Protocols(u8);

impl Protocols {
    /// Every protocol.
    pub const ALL: Protocols = Protocols(0b11_1111);

    /// These protocols (and [`Stream`](Protocol::Stream)).
    pub fn of(list: &[Protocol]) -> Protocols {
        Protocols(list.iter().fold(Protocol::Stream.bit(), |m, p| m | p.bit()))
    }

    /// This set without `p` (never without [`Stream`](Protocol::Stream)).
    pub fn without(self, p: Protocol) -> Protocols {
        Protocols((self.0 & !p.bit()) | Protocol::Stream.bit())
    }

    /// Whether `p` is allowed.
    pub fn allows(self, p: Protocol) -> bool {
        self.0 & p.bit() != 0
    }

    /// The allowed protocols, in [`Protocol::ALL`]'s order.
    pub fn iter(self) -> impl Iterator<Item = Protocol> {
        Protocol::ALL.into_iter().filter(move |p| self.allows(*p))
    }
}

impl Default for Protocols {
    fn default() -> Self {
        Protocols::ALL
    }
}

impl fmt::Display for Protocols {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<_> = self.iter().map(Protocol::name).collect();
        f.write_str(&names.join(","))
    }
}

/// The protocols each collective may use: `XCCL_PROTO`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProtocolPolicy {
    all: Protocols,
    per: Vec<(CollKind, Protocols)>,
}

impl ProtocolPolicy {
    /// Parses `XCCL_PROTO`: comma-separated items, each a protocol (allowed for every
    /// collective) or `COLLECTIVE:PROTOCOL` (allowed for that one; collectives named have
    /// only the protocols named for them). `stream` is always allowed. Examples: `stream`
    /// (no latency or single-copy protocols anywhere), `ll,eager`, `allreduce:ll,broadcast:pull`.
    pub fn parse(spec: &str) -> Result<ProtocolPolicy> {
        let mut all: Option<Vec<Protocol>> = None;
        let mut per: Vec<(CollKind, Vec<Protocol>)> = Vec::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.split_once(':') {
                None => all.get_or_insert_with(Vec::new).push(item.parse()?),
                Some((coll, proto)) => {
                    let kind = CollKind::named(coll).ok_or_else(|| {
                        Error::Config(format!("XCCL_PROTO names unknown collective '{coll}' in '{item}'"))
                    })?;
                    let proto: Protocol = proto.parse()?;
                    match per.iter_mut().find(|(k, _)| *k == kind) {
                        Some((_, list)) => list.push(proto),
                        None => per.push((kind, vec![proto])),
                    }
                }
            }
        }
        Ok(ProtocolPolicy {
            all: all.map_or(Protocols::ALL, |l| Protocols::of(&l)),
            per: per.into_iter().map(|(k, l)| (k, Protocols::of(&l))).collect(),
        })
    }

    /// The protocols `kind` may use.
    pub fn for_kind(&self, kind: CollKind) -> Protocols {
        self.per.iter().find(|(k, _)| *k == kind).map_or(self.all, |(_, p)| *p)
    }
}

/// The most bytes one LL message carries on a memory link. LL pays a cache-line transfer per
/// line in a channel both cores keep hot, with no prefetching: measured against eager on the
/// reference machine (2 ranks, `xccl bench all_reduce --every-proto`), LL wins up to 64
/// bytes, ties at 256 and loses from 1 KiB (2.1 µs against 1.0 µs at 1 KiB).
pub const LL_MAX: usize = 256;

/// Messages at least this long may be pulled by default (`XCCL_PULL_BYTES`), on processors
/// other than AMD's ([`PullMin::built_in`]).
pub const PULL_MIN: usize = 64 << 10;

/// From which length a message may be pulled: where its receiver combines it
/// (`XCCL_PULL_BYTES`), and where it only places it (`XCCL_PULL_PLAIN_BYTES`, by default
/// half the first; see [`for_send`]). Machines differ in where a copy out of another
/// process's memory starts to beat two copies through the ring, most for placed messages:
/// on an Intel Xeon guest a 32 KiB message of a 2-rank all-gather took 3.4-3.6 µs pulled
/// against 4.9 streamed, on an AMD EPYC (Zen 3) guest 11-20 µs against 5.5-9.0, streaming
/// ahead there for 512 KiB messages too but not always for 128 KiB ones, and for all-gather
/// and broadcast but not for all-to-all (docs/PERFORMANCE.md, "Where a pull pays").
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PullMin {
    /// For messages the receiver combines (and point-to-point messages).
    pub combining: usize,
    /// For messages the receiver only places.
    pub plain: usize,
}

impl PullMin {
    /// `combining` for combined messages, half that for placed ones.
    pub const fn from_combining(combining: usize) -> PullMin {
        PullMin { combining, plain: combining / 2 }
    }

    /// The thresholds of processes on a host of `ranks_on_host` ranks whose processor is
    /// `vendor`, unless a tuning file (`xccl tune pull`) or a setting says otherwise; NCCL
    /// likewise keeps its tuning constants per processor maker. Measured on guests of both
    /// (docs/PERFORMANCE.md, "From which length to pull"):
    ///
    /// - Intel: a pull of 32 KiB took 3.4-3.6 µs against 4.9 streamed: [`PULL_MIN`], half
    ///   that for placed messages.
    /// - AMD (Zen 3): a pull of 32 KiB took 11-20 µs against 5.5-9.0 streamed (pages pinned
    ///   one by one, and `rep movsb` stalling on copies whose ends lie a few bytes apart
    ///   modulo 4 KiB). `xccl tune pull` found 1-4 MiB for combined messages at 2 ranks and
    ///   512 KiB-1 MiB at 4; for placed ones 512 KiB-4 MiB at 2 and 128-512 KiB at 4 (on 2
    ///   cores): 1 MiB at 4 ranks, and 512 KiB or 128 KiB. At 2 ranks combined messages pull
    ///   from 512 KiB: a 1 MiB all-reduce's halves streamed ran 79-451 µs from launch to
    ///   launch (12 of 50 launches beyond twice the median), pulled and folded ahead 182-301.
    pub const fn built_in(vendor: CpuVendor, ranks_on_host: usize) -> PullMin {
        match vendor {
            CpuVendor::Amd if ranks_on_host <= 2 => PullMin { combining: 512 << 10, plain: 512 << 10 },
            CpuVendor::Amd => PullMin { combining: 1 << 20, plain: 128 << 10 },
            CpuVendor::Other => PullMin::from_combining(PULL_MIN),
        }
    }
}

impl Default for PullMin {
    /// [`PULL_MIN`] for combined messages, half that for placed ones, whatever the processor
    /// ([`PullMin::built_in`] is the one that depends on it).
    fn default() -> Self {
        PullMin::from_combining(PULL_MIN)
    }
}

/// The processor makers whose built-in pull thresholds differ ([`PullMin::built_in`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CpuVendor {
    /// AMD's processors, and Hygon's (the same cores).
    Amd,
    /// Any other.
    Other,
}

impl CpuVendor {
    /// The maker of the processor this process runs on, as `cpuid` names it.
    pub fn this() -> CpuVendor {
        #[cfg(target_arch = "x86_64")]
        {
            // Leaf 0 holds the vendor string in ebx, edx, ecx. `__cpuid` is a safe function in
            // current Rust and an unsafe one up to 1.93 (this crate builds from 1.88).
            #[allow(unused_unsafe)]
            // SAFETY: every x86-64 processor has the `cpuid` instruction and its leaf 0; it
            // only reads identification registers.
            let id = unsafe { std::arch::x86_64::__cpuid(0) };
            let mut name = [0u8; 12];
            for (i, r) in [id.ebx, id.edx, id.ecx].into_iter().enumerate() {
                name[4 * i..4 * i + 4].copy_from_slice(&r.to_le_bytes());
            }
            if &name == b"AuthenticAMD" || &name == b"HygonGenuine" {
                return CpuVendor::Amd;
            }
        }
        CpuVendor::Other
    }
}

/// Pull thresholds as a process sets them: a tuning file's `pull` line, `XCCL_PULL_BYTES`,
/// `XCCL_PULL_PLAIN_BYTES`; `None` where the built-in one stands ([`PullSetting::over`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PullSetting {
    /// For messages the receiver combines.
    pub combining: Option<usize>,
    /// For messages it only places; unset, half of `combining` where that is set.
    pub plain: Option<usize>,
}

impl PullSetting {
    /// Both thresholds set to those of `p`.
    pub const fn exactly(p: PullMin) -> PullSetting {
        PullSetting { combining: Some(p.combining), plain: Some(p.plain) }
    }

    /// The thresholds: what is set, the rest `built_in`'s ([`PullMin::built_in`] for
    /// processes, [`PullMin::default`] for threads of one process, whose pulls are copies).
    pub fn over(&self, built_in: PullMin) -> PullMin {
        let combining = self.combining.unwrap_or(built_in.combining);
        let plain = match (self.plain, self.combining) {
            (Some(p), _) => p,
            (None, Some(c)) => PullMin::from_combining(c).plain,
            (None, None) => built_in.plain,
        };
        PullMin { combining, plain }
    }
}

/// Messages up to this many bytes, over memory links, may go eager (the express lane).
pub const EAGER_MAX: usize = 4096;

/// Pulled messages at least this long, and at most [`SPLIT_MAX`], are split between both
/// sides.
pub const SPLIT_MIN: usize = 1 << 20;

/// Below [`SPLIT_MIN`] the round trip of the request costs more than the half copy saves;
/// beyond `SPLIT_MAX` a copy is bound by memory bandwidth rather than by the core doing it,
/// and a write into another process's memory costs more than a read from it (measured on
/// the reference machine: a 1 MiB broadcast between two processes gains 40%, 512 KiB and
/// 8 MiB lose a little; beyond 2 MiB streaming through the ring does better still, see
/// [`for_send`]).
pub const SPLIT_MAX: usize = 2 << 20;

/// Folded pulls at least this long write their result back to their sender ahead
/// ([`fuses`]): every combining pull at the default `XCCL_PULL_BYTES`. Measured on an Intel
/// Xeon guest, 2 processes, the fused protocol allowed against not, interleaved: a 2-rank
/// all-reduce of 128 KiB (64 KiB halves) took 10.7-17.9 µs against 20.6-23.9, 1 MiB 58-85
/// against 99-174, 64 MiB on 2 MiB pages 1.16x faster out of place and 1.55x in place
/// (`docs/PERFORMANCE.md`, "The memory limit"); pulls below it are unmeasured.
pub const FUSE_MIN: usize = 64 << 10;

/// What a protocol choice needs to know about the link to one peer.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkFacts {
    /// A memory link (shared memory, or threads of one process), not a socket.
    pub memory: bool,
    /// Most payload bytes of one LL message on this link (0: none).
    pub ll_max: usize,
    /// Largest frame payload the link prefers.
    pub seg: usize,
    /// The peer can read this rank's memory (and this rank write the peer's when asked).
    pub peer_pulls: bool,
}

/// What the sender knows about one message of a step.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// Bytes.
    pub len: usize,
    /// A later operation of the step waits for this send to be done. A pulled message is
    /// done only when the receiver has copied it, so two ranks exchanging in place would
    /// each wait for the other's copy: such sends stream.
    pub has_dependents: bool,
    /// Data flows one way in this collective (broadcast, scatter, gather), with a core per
    /// rank, and this is the step's only send or copy: the sender has nothing else to do.
    pub sole_one_way: bool,
    /// The receiver only places the message (the collective does not combine), and the
    /// sender is not a one-way sender on a host with more ranks than cores (which, streaming,
    /// is done once its copies are in the rings, but waits for every receiver's time slice
    /// when they pull): it may be pulled from `pull_min.plain`.
    pub plain: bool,
    /// From which length messages may be pulled.
    pub pull_min: PullMin,
}

/// Whether a message of `len` bytes on `link` goes by LL. Decided alike by sender and
/// receiver.
pub fn ll(len: usize, link: &LinkFacts, allowed: Protocols) -> bool {
    allowed.allows(Protocol::Ll) && link.memory && len <= link.ll_max
}

/// Whether a small message goes eager: one frame, through the express lane.
fn eager(len: usize, link: &LinkFacts, pull_min: usize, allowed: Protocols) -> bool {
    allowed.allows(Protocol::Eager) && link.memory && len <= EAGER_MAX && len <= link.seg && len < pull_min
}

/// The least length from which message `m` may be pulled: `pull_min.combining` where the
/// receiver combines it, `pull_min.plain` (by default half that) where it only places it.
/// Below the first a combining receiver does
/// better reducing straight out of the ring, in one pass, than copying out of the sender's
/// memory into a stage and reducing from there; a placing receiver makes one pass either
/// way, and a pull spares the sender its copy into the ring (measured on an Intel Xeon
/// guest, 2 ranks: a 64 KiB all-gather or all-to-all, 32 KiB per message, 4.9 µs streamed
/// and 3.4-3.6 µs pulled; a 64 KiB all-reduce, 32 KiB halves, 8.1 µs streamed and 13.1 µs
/// pulled).
fn pull_from(m: &Outgoing) -> usize {
    if m.plain { m.pull_min.plain } else { m.pull_min.combining }
}

/// How the sender sends message `m` to a peer over `link`.
///
/// LL and eager for small messages on memory links; a pull where the peer can read this
/// rank's memory and the message is long enough, unless a later operation waits for it or
/// it is a large one-way message (beyond [`SPLIT_MAX`] streaming through the ring, which
/// stays in cache, lets each side make one pass over main memory in parallel: a 64 MiB
/// broadcast between two processes took 7.2-7.8 ms instead of 13.4-13.7 ms); else stream.
pub fn for_send(m: &Outgoing, link: &LinkFacts, allowed: Protocols) -> Protocol {
    if ll(m.len, link, allowed) {
        Protocol::Ll
    } else if eager(m.len, link, m.pull_min.combining, allowed) {
        Protocol::Eager
    } else if allowed.allows(Protocol::Pull)
        && link.peer_pulls
        && m.len >= pull_from(m)
        && !m.has_dependents
        && !(m.len > SPLIT_MAX && m.sole_one_way)
    {
        Protocol::Pull
    } else {
        Protocol::Stream
    }
}

/// What a receiver of `len` bytes over `link` can know before anything arrives: LL, eager
/// (one frame that the express lane may read), or stream (the sender's frames say whether
/// they are streamed or pulled).
pub fn expected(len: usize, link: &LinkFacts, pull_min: usize, allowed: Protocols) -> Protocol {
    if ll(len, link, allowed) {
        Protocol::Ll
    } else if eager(len, link, pull_min, allowed) {
        Protocol::Eager
    } else {
        Protocol::Stream
    }
}

/// What the receiver knows about a pulled message when its descriptor arrives.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Incoming {
    /// Bytes the descriptor covers.
    pub len: usize,
    /// The descriptor covers the whole message.
    pub whole: bool,
    /// It lands in a plain receive (no combining) that nothing later in the step reads
    /// before it completes.
    pub plain_and_last: bool,
    /// Data flows one way in this collective, with a core per rank.
    pub one_way: bool,
}

/// Whether the receiver of pulled message `m` over `link` splits the copy with its sender:
/// only where the sender has nothing else to do (in exchanges both sides are busy copying
/// already, and measured slower), for a whole message of [`SPLIT_MIN`]-[`SPLIT_MAX`] bytes,
/// and only where the sender may write this rank's memory.
pub fn splits(m: &Incoming, link: &LinkFacts, allowed: Protocols) -> bool {
    allowed.allows(Protocol::Split)
        && m.one_way
        && m.plain_and_last
        && m.whole
        && (SPLIT_MIN..=SPLIT_MAX).contains(&m.len)
        && link.peer_pulls
}

/// Whether a pulled message of `len` bytes that the receiver folds, and whose folded result
/// is the next step's message back to the sender, goes [`Fused`](Protocol::Fused): the
/// sender grants the receiver its receive buffer of that next message, and the receiver
/// writes each folded piece into it while the piece is in cache (one pass over memory
/// instead of a second pull of the whole result). Asked by the sender before it grants
/// (with the plan's structural conditions: `exec/plan.rs`) and by the receiver before it
/// takes a grant (it declines one it would not have given).
pub fn fuses(len: usize, link: &LinkFacts, allowed: Protocols) -> bool {
    allowed.allows(Protocol::Fused) && allowed.allows(Protocol::Pull) && link.peer_pulls && len >= FUSE_MIN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_processor_maker_is_the_one_the_kernel_names() {
        // Linux's own reading of the same cpuid leaf; elsewhere there is nothing to compare.
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else { return };
        let Some(line) = info.lines().find(|l| l.starts_with("vendor_id")) else { return };
        let amd = line.contains("AuthenticAMD") || line.contains("HygonGenuine");
        assert_eq!(CpuVendor::this() == CpuVendor::Amd, amd, "{line}");
    }

    fn shm() -> LinkFacts {
        LinkFacts { memory: true, ll_max: LL_MAX, seg: 1 << 20, peer_pulls: true }
    }

    fn tcp() -> LinkFacts {
        LinkFacts { memory: false, ll_max: 0, seg: 1 << 20, peer_pulls: false }
    }

    fn out(len: usize) -> Outgoing {
        Outgoing {
            len,
            has_dependents: false,
            sole_one_way: false,
            plain: false,
            pull_min: PullMin::default(),
        }
    }

    #[test]
    fn each_size_and_link_gets_its_protocol() {
        let all = Protocols::ALL;
        assert_eq!(for_send(&out(8), &shm(), all), Protocol::Ll);
        assert_eq!(for_send(&out(LL_MAX), &shm(), all), Protocol::Ll);
        assert_eq!(for_send(&out(LL_MAX + 1), &shm(), all), Protocol::Eager);
        assert_eq!(for_send(&out(4096), &shm(), all), Protocol::Eager);
        assert_eq!(for_send(&out(8), &tcp(), all), Protocol::Stream);
        assert_eq!(for_send(&out(32 << 10), &shm(), all), Protocol::Stream);
        assert_eq!(for_send(&out(64 << 10), &shm(), all), Protocol::Pull);
        assert_eq!(for_send(&out(64 << 10), &tcp(), all), Protocol::Stream);
        // A receiver that only places the message pulls it from half the threshold.
        let plain = |len| Outgoing { plain: true, ..out(len) };
        assert_eq!(for_send(&plain(32 << 10), &shm(), all), Protocol::Pull);
        assert_eq!(for_send(&plain((32 << 10) - 1), &shm(), all), Protocol::Stream);
        // Its own threshold, when set, leaves the combining one alone.
        let late = PullMin { combining: 64 << 10, plain: 2 << 20 };
        let placed = |len| Outgoing { plain: true, pull_min: late, ..out(len) };
        assert_eq!(for_send(&placed(1 << 20), &shm(), all), Protocol::Stream);
        assert_eq!(for_send(&placed(2 << 20), &shm(), all), Protocol::Pull);
        assert_eq!(for_send(&Outgoing { pull_min: late, ..out(64 << 10) }, &shm(), all), Protocol::Pull);
        // A later operation waits for it: a pull would wait for the peer's copy.
        assert_eq!(
            for_send(&Outgoing { has_dependents: true, ..out(1 << 20) }, &shm(), all),
            Protocol::Stream
        );
        // Large one-way messages stream; smaller ones are still pulled.
        let one_way = |len| Outgoing { sole_one_way: true, ..out(len) };
        assert_eq!(for_send(&one_way(64 << 20), &shm(), all), Protocol::Stream);
        assert_eq!(for_send(&one_way(2 << 20), &shm(), all), Protocol::Pull);
        // Without LL, small messages go eager, but only below the pull threshold.
        let no_ll = Protocols::of(&[Protocol::Eager, Protocol::Pull]);
        assert_eq!(for_send(&out(8), &shm(), no_ll), Protocol::Eager);
        assert_eq!(
            for_send(&Outgoing { pull_min: PullMin::from_combining(8), ..out(8) }, &shm(), no_ll),
            Protocol::Pull
        );
    }

    #[test]
    fn sender_and_receiver_agree_on_ll_and_eager() {
        for allowed in [Protocols::ALL, Protocols::of(&[]), Protocols::of(&[Protocol::Eager])] {
            for link in [shm(), tcp()] {
                for len in [0, 1, 8, LL_MAX, LL_MAX + 1, 4096, 4097, 1 << 20] {
                    let (s, r) =
                        (for_send(&out(len), &link, allowed), expected(len, &link, 64 << 10, allowed));
                    assert_eq!(s == Protocol::Ll, r == Protocol::Ll, "{len} {link:?} {allowed}");
                    assert_eq!(s == Protocol::Eager, r == Protocol::Eager, "{len} {link:?} {allowed}");
                }
            }
        }
    }

    #[test]
    fn splits_only_one_way_whole_plain_messages_of_its_range() {
        let m = Incoming { len: 1 << 20, whole: true, plain_and_last: true, one_way: true };
        assert!(splits(&m, &shm(), Protocols::ALL));
        assert!(!splits(&m, &shm(), Protocols::of(&[Protocol::Pull])));
        assert!(!splits(&Incoming { one_way: false, ..m }, &shm(), Protocols::ALL));
        assert!(!splits(&Incoming { whole: false, ..m }, &shm(), Protocols::ALL));
        assert!(!splits(&Incoming { len: 4 << 20, ..m }, &shm(), Protocols::ALL));
        assert!(!splits(&m, &LinkFacts { peer_pulls: false, ..shm() }, Protocols::ALL));
    }

    #[test]
    fn fuses_only_large_pulls_where_both_pull_and_fused_are_allowed() {
        assert!(fuses(FUSE_MIN, &shm(), Protocols::ALL));
        assert!(fuses(32 << 20, &shm(), Protocols::ALL));
        assert!(!fuses(FUSE_MIN - 1, &shm(), Protocols::ALL));
        assert!(!fuses(FUSE_MIN, &tcp(), Protocols::ALL));
        assert!(!fuses(FUSE_MIN, &shm(), Protocols::ALL.without(Protocol::Fused)));
        assert!(!fuses(FUSE_MIN, &shm(), Protocols::ALL.without(Protocol::Pull)));
        assert!(fuses(FUSE_MIN, &shm(), Protocols::of(&[Protocol::Pull, Protocol::Fused])));
    }

    #[test]
    fn the_policy_parses_and_says_what_is_wrong() {
        let p = ProtocolPolicy::parse("stream").unwrap();
        assert_eq!(p.for_kind(CollKind::AllReduce).to_string(), "stream");
        let p = ProtocolPolicy::parse("ll, eager,broadcast:pull").unwrap();
        assert_eq!(p.for_kind(CollKind::AllReduce).to_string(), "ll,eager,stream");
        assert_eq!(p.for_kind(CollKind::Broadcast).to_string(), "stream,pull");
        assert_eq!(ProtocolPolicy::parse("").unwrap(), ProtocolPolicy::default());
        assert!(ProtocolPolicy::parse("ll128").unwrap_err().to_string().contains("unknown protocol 'll128'"));
        assert!(ProtocolPolicy::parse("teleport:ll").unwrap_err().to_string().contains("teleport"));
    }
}
