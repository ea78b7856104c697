//! Where reading one peer's incoming stream stands between calls ([`Inbound`]: idle, in a
//! header, a payload, its padding, a control payload, a pull or a push), and the byte-level
//! reads of a frame's fixed-size parts ([`Inbound::fill`]), which need nothing but the link.
//! What a complete part means (a checked header, a placed payload) is `inbound.rs`'s.

use std::io;

use crate::frame::{ACK_LEN, HEADER_LEN, Header, PULL_LEN};
use crate::transport::pull::Pull;
use crate::transport::{Link, Within};

/// Where the payload of an incoming frame goes.
#[derive(Copy, Clone, Debug)]
pub(super) enum Target {
    /// A receive task of the step.
    Task(usize),
    /// A point-to-point message nobody has asked for yet, kept in the stash under this id.
    Stash(u64),
    /// The reason of an abort notice naming rank `origin` as where the failure began,
    /// gathered in the peer's `notice`.
    Reason {
        /// The rank where the failure began.
        origin: usize,
    },
}

/// Reading state of one incoming stream, kept across operations.
#[derive(Clone, Debug, Default)]
pub(super) enum Inbound {
    #[default]
    Idle,
    Header {
        buf: [u8; HEADER_LEN],
        have: usize,
    },
    Payload {
        target: Target,
        remaining: usize,
        pad: usize,
    },
    Pad {
        remaining: usize,
    },
    /// A fixed-size control payload being read (a pull descriptor, an acknowledgement).
    Control {
        what: Control,
        buf: [u8; PULL_LEN],
        have: usize,
    },
    /// A segment being pulled out of the peer's memory.
    Pulling {
        target: Target,
        from: Pull,
        addr: u64,
        len: usize,
        pos: usize,
        /// The pull frame's header, echoed in the acknowledgement.
        header: Header,
    },
    /// The tail of send task `task`, from byte `from`, being written into the peer's memory
    /// at `addr`.
    Pushing {
        task: usize,
        to: Pull,
        from: usize,
        addr: u64,
        pos: usize,
        /// The push request's header, echoed in the confirmation.
        header: Header,
    },
}

/// What a control payload is for.
#[derive(Copy, Clone, Debug)]
pub(super) enum Control {
    /// The descriptor of a pull frame with this header, for `target`.
    Pull { target: Target, header: Header },
    /// An acknowledgement with this header.
    Ack { header: Header },
    /// A request to write the tail of a pulled message into the peer's memory.
    Push { header: Header },
    /// The peer has written the tail of a message into this rank's memory, or answers a
    /// grant.
    Pushed { header: Header },
    /// The peer grants this rank where to write a message it owes the peer in the next step.
    Grant { header: Header },
}

impl Inbound {
    /// Where the stream stands: how much of the frame being read is still to come.
    pub(super) fn within(&self) -> Within<'_> {
        match self {
            Inbound::Header { buf, have } => Within { head: &buf[..*have], rest: 0 },
            Inbound::Payload { remaining, pad, .. } => Within { head: &[], rest: remaining + pad },
            Inbound::Pad { remaining } => Within { head: &[], rest: *remaining },
            Inbound::Control { what, have, .. } => Within { head: &[], rest: what.len() - have },
            // Pulled and pushed payloads are not in the stream.
            Inbound::Idle | Inbound::Pulling { .. } | Inbound::Pushing { .. } => Within::BOUNDARY,
        }
    }
}

impl Control {
    fn len(&self) -> usize {
        match self {
            Control::Pull { .. } | Control::Push { .. } | Control::Grant { .. } => PULL_LEN,
            Control::Ack { .. } | Control::Pushed { .. } => ACK_LEN,
        }
    }
}
/// A fixed-size part of an incoming frame, read whole.
pub(super) enum Filled {
    /// A frame's header.
    Header([u8; HEADER_LEN]),
    /// A control payload (its first `what.len()` bytes).
    Control(Control, [u8; PULL_LEN]),
    /// The padding after a payload.
    Pad,
}

impl Inbound {
    /// Reads the fixed-size part of a frame the stream is in (a header, a control payload,
    /// padding) as far as `link` gives it without blocking: the bytes read and, once the part
    /// is whole, the part, the stream then being `Idle` until its reader says what follows.
    /// In any other state it reads nothing.
    pub(super) fn fill(&mut self, link: &mut dyn Link) -> io::Result<(usize, Option<Filled>)> {
        let (n, filled) = match self {
            Inbound::Header { buf, have } => {
                let n = link.read(&mut buf[*have..])?;
                *have += n;
                (n, (*have == HEADER_LEN).then_some(Filled::Header(*buf)))
            }
            Inbound::Control { what, buf, have } => {
                let n = link.read(&mut buf[*have..what.len()])?;
                *have += n;
                (n, (*have == what.len()).then_some(Filled::Control(*what, *buf)))
            }
            Inbound::Pad { remaining } => {
                let mut sink = [0u8; 8];
                let n = link.read(&mut sink[..*remaining])?;
                *remaining -= n;
                (n, (*remaining == 0).then_some(Filled::Pad))
            }
            _ => (0, None),
        };
        if filled.is_some() {
            *self = Inbound::Idle;
        }
        Ok((n, filled))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::scripted::Scripted;
    use crate::frame::FrameKind;

    /// Reads the part `state` is at from a stream of `bytes` cut into `gives`: the calls it
    /// took, and the part.
    fn fill_all(mut state: Inbound, bytes: &[u8], gives: &[usize]) -> (usize, Filled, Inbound) {
        let mut link = Scripted::reads(bytes, gives);
        for call in 1..=gives.len() {
            let (n, filled) = state.fill(&mut link).expect("a read");
            assert!(n <= gives[call - 1]);
            if let Some(f) = filled {
                return (call, f, state);
            }
            assert!(!matches!(state, Inbound::Idle), "idle before the part is whole");
        }
        panic!("the part never came whole: {gives:?}")
    }

    #[test]
    fn a_header_is_read_whole_from_any_cut_of_the_stream() {
        let h = Header::control(FrameKind::Goodbye, 77, 0).encode();
        for gives in [vec![HEADER_LEN], vec![1, 0, 70, 1], vec![8; 9], vec![71, 0, 0, 5]] {
            let fresh = Inbound::Header { buf: [0; HEADER_LEN], have: 0 };
            let (calls, part, state) = fill_all(fresh, &h, &gives);
            assert!(matches!(part, Filled::Header(b) if b == h), "{gives:?}");
            assert!(matches!(state, Inbound::Idle));
            // Whole at the first read that brings the 72nd byte, not before, not after.
            let mut total = 0;
            let whole_at = gives.iter().position(|g| {
                total += g;
                total >= HEADER_LEN
            });
            assert_eq!(Some(calls - 1), whole_at, "{gives:?}");
        }
    }

    #[test]
    fn control_payloads_and_padding_take_exactly_their_length() {
        let header = Header::control(FrameKind::Ack, 1, ACK_LEN);
        let ack = Inbound::Control { what: Control::Ack { header }, buf: [0; PULL_LEN], have: 0 };
        let bytes: Vec<u8> = (1..=20).collect();
        let (_, part, _) = fill_all(ack, &bytes, &[3, 100]);
        let Filled::Control(Control::Ack { .. }, buf) = part else { panic!("an acknowledgement") };
        assert_eq!(&buf[..ACK_LEN], &bytes[..ACK_LEN], "only its 8 bytes are read");
        let mut link = Scripted::reads(&bytes, &[2, 100, 100]);
        let mut pad = Inbound::Pad { remaining: 5 };
        assert_eq!(pad.fill(&mut link).unwrap().0, 2);
        let (n, filled) = pad.fill(&mut link).unwrap();
        assert!(n == 3 && matches!(filled, Some(Filled::Pad)) && matches!(pad, Inbound::Idle));
        // The next frame's bytes are left in the stream.
        let mut next = [0u8; 1];
        assert_eq!((link.read(&mut next).unwrap(), next[0]), (1, 6));
        let mut broken = Scripted::broken();
        let mut header = Inbound::Header { buf: [0; HEADER_LEN], have: 3 };
        assert!(header.fill(&mut broken).is_err());
        assert!(matches!(header, Inbound::Header { have: 3, .. }), "a failed read changes nothing");
    }
}
