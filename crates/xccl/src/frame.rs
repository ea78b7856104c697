//! The wire format: every message between two ranks is a sequence of frames, each a fixed
//! 72-byte header followed by its payload, padded to a multiple of 8 bytes so that the next
//! header (and every payload) starts 8-byte aligned in a byte stream.
//!
//! A header names the communicator, the operation's sequence number, its kind, element type,
//! reduction, element count, root and algorithm, and where this frame's payload sits in the
//! message. A receiver checks every field against what it expects before it writes a byte of
//! payload anywhere, so ranks running different operations get an error that describes both
//! sides instead of corrupting memory.

use std::fmt;

use crate::algo::Algorithm;
use crate::coll::CollKind;
use crate::dtype::DType;
use crate::reduce::ReduceOp;
use crate::transport::tcp::LastWords;
use crate::transport::{Closed, Farewell};

/// Bytes in a frame header.
pub(crate) const HEADER_LEN: usize = 72;
/// "XCCL" in little-endian byte order.
const MAGIC: u32 = u32::from_le_bytes(*b"XCCL");
/// Bumped on any incompatible change of the frame layout.
pub(crate) const WIRE_VERSION: u8 = 2;
/// The largest payload one frame may carry; anything larger is refused unread.
pub(crate) const MAX_PAYLOAD: usize = 64 << 20;
/// The largest abort reason accepted from a peer.
pub(crate) const MAX_REASON: usize = 4096;
/// Marks "no root" in a header.
pub(crate) const NO_ROOT: u32 = u32::MAX;

/// Padding that follows a payload of `len` bytes.
pub(crate) const fn pad_for(len: usize) -> usize {
    (8 - len % 8) % 8
}

/// What a frame is for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum FrameKind {
    /// Payload of an operation.
    Data = 1,
    /// The sender aborted its communicator; the payload is the reason (UTF-8).
    Abort = 2,
    /// The sender closed its communicator cleanly; nothing follows.
    Goodbye = 3,
    /// Instead of the payload, where to read it: the receiver copies the segment out of the
    /// sender's memory, then acknowledges it. Payload: address and length (`u64` each).
    Pull = 4,
    /// The receiver has copied a pulled segment. Payload: its length (`u64`).
    Ack = 5,
    /// The receiver of a pulled message asks its sender to write the message's tail into the
    /// receiver's memory while it copies the head itself. Payload: where (the address of the
    /// tail's destination) and from which byte of the message (`u64` each).
    Push = 6,
    /// The sender has written the tail a `Push` asked for, or the message a `Grant` named
    /// (0: it declines the grant, and will send that message as usual). Payload: its length
    /// (`u64`).
    Pushed = 7,
    /// The sender of a pulled message names where the receiver may write the message of
    /// the header's (later) step and index that it owes the sender back, while it folds the
    /// pulled one (protocol `fused`); answered by `Pushed`. Payload: address and length
    /// (`u64` each).
    Grant = 8,
}

/// Payload bytes of a pull descriptor, push request or grant, and of an acknowledgement.
pub(crate) const PULL_LEN: usize = 16;
pub(crate) const ACK_LEN: usize = 8;

/// The identity of one collective call: what every rank must agree on.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct OpDesc {
    pub kind: CollKind,
    /// Sequence number of the collective on its communicator (the same on every rank).
    pub seq: u64,
    pub dtype: DType,
    pub op: Option<ReduceOp>,
    /// The element count every rank passes (`u64::MAX` for the uneven "v" variants).
    pub count: u64,
    pub root: Option<u32>,
    /// Which algorithm's schedule runs (ranks must run the same one).
    pub algo: Algorithm,
}

impl OpDesc {
    /// The same operation under sequence number `seq`.
    pub fn with_seq(&self, seq: u64) -> OpDesc {
        OpDesc { seq, ..*self }
    }

    /// The fields that must match between ranks, as a header would carry them.
    fn signature(&self) -> (CollKind, u64, DType, u8, u64, u32, u8) {
        (
            self.kind,
            self.seq,
            self.dtype,
            self.op.map_or(u8::MAX, |o| o as u8),
            self.count,
            self.root.unwrap_or(NO_ROOT),
            self.algo as u8,
        )
    }
}

impl fmt::Display for OpDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        describe(f, self, self.algo.name())
    }
}

/// Writes `desc` as `all_reduce #5 (f32 x 8, sum, ring)`, with `algo` named as given.
fn describe(f: &mut fmt::Formatter<'_>, desc: &OpDesc, algo: &str) -> fmt::Result {
    write!(f, "{} #{} ({}", desc.kind, desc.seq, desc.dtype)?;
    if desc.count != u64::MAX {
        write!(f, " x {}", desc.count)?;
    } else {
        write!(f, ", uneven counts")?;
    }
    if let Some(op) = desc.op {
        write!(f, ", {op}")?;
    }
    if let Some(root) = desc.root {
        write!(f, ", root {root}")?;
    }
    write!(f, ", {algo})")
}

/// A decoded frame header.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub kind: FrameKind,
    pub comm: u64,
    /// Collective: its sequence number. Point-to-point: the sender's message number to us.
    pub seq: u64,
    pub coll: CollKind,
    pub dtype: DType,
    /// Reduction tag, `u8::MAX` for none.
    pub op: u8,
    pub algo: u8,
    pub count: u64,
    pub root: u32,
    /// Collective: the schedule step. Point-to-point: the tag.
    pub step: u32,
    /// Index of the message among the sender's sends to us in this step.
    pub msg: u32,
    /// Bytes in the whole message this frame belongs to.
    pub total: u64,
    /// Offset of this frame's payload in the message.
    pub offset: u64,
    /// Payload bytes in this frame.
    pub len: u32,
}

impl Header {
    /// A data frame of collective `desc`.
    pub fn data(comm: u64, desc: &OpDesc, step: u32, msg: u32) -> Header {
        let (coll, seq, dtype, op, count, root, algo) = desc.signature();
        Header {
            kind: FrameKind::Data,
            comm,
            seq,
            coll,
            dtype,
            op,
            algo,
            count,
            root,
            step,
            msg,
            total: 0,
            offset: 0,
            len: 0,
        }
    }

    /// A control frame (abort or goodbye) with a payload of `len` bytes.
    pub fn control(kind: FrameKind, comm: u64, len: usize) -> Header {
        Header {
            kind,
            comm,
            seq: 0,
            coll: CollKind::SendRecv,
            dtype: DType::U8,
            op: u8::MAX,
            algo: 0,
            count: 0,
            root: NO_ROOT,
            step: 0,
            msg: 0,
            total: len as u64,
            offset: 0,
            len: len as u32,
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = WIRE_VERSION;
        b[5] = self.kind as u8;
        b[6] = self.coll as u8;
        b[7] = self.dtype as u8;
        b[8] = self.op;
        b[9] = self.algo;
        b[16..24].copy_from_slice(&self.comm.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.count.to_le_bytes());
        b[40..44].copy_from_slice(&self.root.to_le_bytes());
        b[44..48].copy_from_slice(&self.step.to_le_bytes());
        b[48..52].copy_from_slice(&self.msg.to_le_bytes());
        b[52..56].copy_from_slice(&self.len.to_le_bytes());
        b[56..64].copy_from_slice(&self.total.to_le_bytes());
        b[64..72].copy_from_slice(&self.offset.to_le_bytes());
        b
    }

    /// Decodes and sanity-checks a header. The error says what was wrong with the bytes.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, String> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(format!(
                "not an xccl frame (magic {magic:#010x}, expected {MAGIC:#010x}): the stream is corrupt or the peer is not xccl"
            ));
        }
        if b[4] != WIRE_VERSION {
            return Err(format!("wire version {} (this build speaks {WIRE_VERSION})", b[4]));
        }
        let kind = match b[5] {
            1 => FrameKind::Data,
            2 => FrameKind::Abort,
            3 => FrameKind::Goodbye,
            4 => FrameKind::Pull,
            5 => FrameKind::Ack,
            6 => FrameKind::Push,
            7 => FrameKind::Pushed,
            8 => FrameKind::Grant,
            k => return Err(format!("unknown frame kind {k}")),
        };
        let coll = CollKind::from_tag(b[6]).ok_or_else(|| format!("unknown operation tag {}", b[6]))?;
        let dtype = DType::from_tag(b[7]).ok_or_else(|| format!("unknown element type tag {}", b[7]))?;
        if b[8] != u8::MAX && ReduceOp::from_tag(b[8]).is_none() {
            return Err(format!("unknown reduction tag {}", b[8]));
        }
        let h = Header {
            kind,
            comm: u64_at(16),
            seq: u64_at(24),
            coll,
            dtype,
            op: b[8],
            algo: b[9],
            count: u64_at(32),
            root: u32_at(40),
            step: u32_at(44),
            msg: u32_at(48),
            len: u32_at(52),
            total: u64_at(56),
            offset: u64_at(64),
        };
        let fixed = match kind {
            FrameKind::Pull | FrameKind::Push | FrameKind::Grant => Some(PULL_LEN),
            FrameKind::Ack | FrameKind::Pushed => Some(ACK_LEN),
            _ => None,
        };
        if let Some(want) = fixed {
            if h.len as usize != want {
                return Err(format!("{kind:?} frame with a {}-byte payload (expected {want})", h.len));
            }
            return Ok(h);
        }
        let limit = if kind == FrameKind::Data { MAX_PAYLOAD } else { MAX_REASON };
        if h.len as usize > limit {
            return Err(format!("frame payload of {} bytes exceeds the limit of {limit}", h.len));
        }
        if h.offset.checked_add(u64::from(h.len)).is_none_or(|end| end > h.total) {
            return Err(format!("frame covers bytes {}..+{} of a {}-byte message", h.offset, h.len, h.total));
        }
        Ok(h)
    }

    /// Describes the collective this frame belongs to, for error messages.
    pub fn describe(&self) -> String {
        if self.coll == CollKind::SendRecv {
            return format!(
                "send (message #{}, tag {}, {} x {}, {} bytes)",
                self.seq, self.step, self.dtype, self.count, self.total
            );
        }
        let algo = Algorithm::from_tag(self.algo);
        let desc = OpDesc {
            kind: self.coll,
            seq: self.seq,
            dtype: self.dtype,
            op: ReduceOp::from_tag(self.op),
            count: self.count,
            root: (self.root != NO_ROOT).then_some(self.root),
            algo: algo.unwrap_or(Algorithm::Ring),
        };
        struct Described<'a>(&'a OpDesc, &'a str);
        impl fmt::Display for Described<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                describe(f, self.0, self.1)
            }
        }
        Described(&desc, algo.map_or("unknown algorithm", Algorithm::name)).to_string()
    }

    /// Whether this frame belongs to collective `desc` (all agreed fields equal).
    pub fn matches(&self, desc: &OpDesc) -> bool {
        (self.coll, self.seq, self.dtype, self.op, self.count, self.root, self.algo) == desc.signature()
    }
}

/// The last words of communicator `comm`'s streams: a goodbye or abort frame, after
/// which the stream ends.
pub(crate) struct Farewells {
    /// The communicator the frames name.
    pub comm: u64,
}

impl LastWords for Farewells {
    fn say(&self, farewell: &Farewell) -> Vec<u8> {
        let (kind, origin, reason) = match farewell {
            Farewell::Goodbye => (FrameKind::Goodbye, 0, &b""[..]),
            Farewell::Abort { origin, reason } => {
                let cut = reason.len().min(MAX_REASON);
                (FrameKind::Abort, *origin, &reason.as_bytes()[..cut])
            }
        };
        let mut header = Header::control(kind, self.comm, reason.len());
        // An abort names the rank where the failure began in the root field.
        header.root = origin as u32;
        let mut bytes = header.encode().to_vec();
        bytes.extend_from_slice(reason);
        bytes.resize(bytes.len() + pad_for(reason.len()), 0);
        bytes
    }

    /// Walks the frames left in the stream: the last one says how the peer ended.
    fn read(&self, mut rest: &[u8]) -> Closed {
        loop {
            if rest.is_empty() {
                return Closed::Vanished(
                    "connection closed without a goodbye (process exited or was killed)".into(),
                );
            }
            let Some(head) = rest.first_chunk::<HEADER_LEN>() else {
                return Closed::Vanished("connection closed in the middle of a frame".into());
            };
            let h = match Header::decode(head) {
                Ok(h) => h,
                Err(e) => return Closed::Vanished(format!("connection closed after a bad frame: {e}")),
            };
            let body = h.len as usize + pad_for(h.len as usize);
            let Some(after) = rest.get(HEADER_LEN + body..) else {
                return Closed::Vanished("connection closed in the middle of a frame".into());
            };
            match h.kind {
                FrameKind::Goodbye if after.is_empty() => return Closed::Goodbye,
                FrameKind::Abort => {
                    let reason = &rest[HEADER_LEN..HEADER_LEN + h.len as usize];
                    let reason = String::from_utf8_lossy(reason).into_owned();
                    return Closed::Aborted { origin: h.root as usize, reason };
                }
                _ => rest = after,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        let desc = OpDesc {
            kind: CollKind::AllReduce,
            seq: 42,
            dtype: DType::BF16,
            op: Some(ReduceOp::Max),
            count: 1 << 33,
            root: None,
            algo: Algorithm::Ring,
        };
        let mut h = Header::data(0xdead_beef_cafe, &desc, 7, 3);
        h.total = 1 << 34;
        h.offset = 1 << 20;
        h.len = 4096;
        h
    }

    #[test]
    fn encode_decode_round_trip() {
        let h = sample();
        assert_eq!(Header::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn garbage_is_rejected_with_a_reason() {
        let mut b = sample().encode();
        b[0] = b'Y';
        assert!(Header::decode(&b).unwrap_err().contains("not an xccl frame"));
        let mut b = sample().encode();
        b[4] = 99;
        assert!(Header::decode(&b).unwrap_err().contains("wire version"));
        let mut b = sample().encode();
        b[7] = 200;
        assert!(Header::decode(&b).unwrap_err().contains("element type"));
    }

    #[test]
    fn oversized_or_out_of_range_payloads_are_rejected() {
        let mut h = sample();
        h.len = (MAX_PAYLOAD + 1) as u32;
        h.total = u64::MAX;
        assert!(Header::decode(&h.encode()).unwrap_err().contains("exceeds"));
        let mut h = sample();
        h.offset = h.total - 10;
        assert!(Header::decode(&h.encode()).unwrap_err().contains("covers"));
        let mut h = Header::control(FrameKind::Abort, 1, MAX_REASON + 1);
        h.total = h.len as u64;
        assert!(Header::decode(&h.encode()).is_err());
    }

    #[test]
    fn last_words_are_read_back_after_data() {
        let words = Farewells { comm: 9 };
        let mut data = sample();
        data.len = 5;
        data.total = 5;
        data.offset = 0;
        let mut stream = data.encode().to_vec();
        stream.extend_from_slice(&[1, 2, 3, 4, 5, 0, 0, 0]);
        let after_data = |farewell: &Farewell| {
            let mut s = stream.clone();
            s.extend(words.say(farewell));
            words.read(&s)
        };
        assert_eq!(after_data(&Farewell::Goodbye), Closed::Goodbye);
        let abort = Farewell::Abort { origin: 3, reason: "disk on fire".into() };
        assert_eq!(after_data(&abort), Closed::Aborted { origin: 3, reason: "disk on fire".into() });
        let long = Farewell::Abort { origin: 1, reason: "x".repeat(MAX_REASON + 10) };
        assert!(matches!(after_data(&long), Closed::Aborted { reason, .. } if reason.len() == MAX_REASON));
        let vanished = |s: &[u8], why: &str| matches!(words.read(s), Closed::Vanished(r) if r.contains(why));
        assert!(vanished(&stream, "without a goodbye"));
        assert!(vanished(&stream[..stream.len() - 1], "middle of a frame"));
        assert!(vanished(&stream[..10], "middle of a frame"));
        assert!(vanished(&[7u8; HEADER_LEN], "bad frame"));
        // A goodbye with bytes after it is not the last word.
        let mut s = words.say(&Farewell::Goodbye);
        s.extend_from_slice(&stream[..HEADER_LEN]);
        assert!(vanished(&s, "middle of a frame"));
    }

    #[test]
    fn padding_keeps_frames_aligned() {
        assert_eq!(HEADER_LEN % 8, 0);
        for len in 0..32 {
            assert_eq!((len + pad_for(len)) % 8, 0);
            assert!(pad_for(len) < 8);
        }
    }
}
