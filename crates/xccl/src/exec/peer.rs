//! One peer as the executor sees it: what its link can do, and the state of the two
//! streams to and from it that outlives a step (a frame half written, a frame half read,
//! acknowledgements owed), kept in one object per peer as Gloo keeps its `Pair`.

use std::collections::VecDeque;

use super::fused::Ahead;
use super::outbound::{Body, OutFrame};
use super::reading::{Inbound, Target};
use crate::protocol::LinkFacts;
use crate::transport::Link;
use crate::transport::pull::Pull;

/// The executor's state for one peer.
pub(super) struct Peer {
    /// What the link can do, for choosing protocols.
    pub facts: LinkFacts,
    /// Whether and how this rank can read the peer's memory.
    pub pull_from: Option<Pull>,
    /// The frame being written to the peer, if one is half written.
    pub out: Option<OutFrame>,
    /// Acknowledgements (and push requests or confirmations) owed to the peer, still to be
    /// written: the peer waits on them.
    pub acks: VecDeque<OutFrame>,
    /// Where reading the peer's stream stands.
    pub inbound: Inbound,
    /// Where the further frames of a partly received point-to-point message go.
    pub continuing: Option<Target>,
    /// Point-to-point messages sent to the peer so far (the next one's number).
    pub p2p_sent: u64,
    /// The reason of the abort notice being read from the peer.
    pub notice: Vec<u8>,
    /// What this rank and the peer agreed for the next step (protocol `fused`).
    pub ahead: Ahead,
}

impl Peer {
    /// The state for a peer reached by `link` (none: this rank itself).
    pub fn new(link: Option<&mut (dyn Link + 'static)>) -> Peer {
        let (facts, pull_from) = match link {
            Some(l) => (
                LinkFacts {
                    memory: l.fd().is_none(),
                    ll_max: l.ll_max(),
                    seg: l.max_frame(),
                    peer_pulls: l.peer_pulls(),
                },
                l.pull_from_peer(),
            ),
            None => (LinkFacts::default(), None),
        };
        Peer {
            facts,
            pull_from,
            out: None,
            acks: VecDeque::new(),
            inbound: Inbound::Idle,
            continuing: None,
            p2p_sent: 0,
            notice: Vec::new(),
            ahead: Ahead::default(),
        }
    }

    /// Nothing is in flight on the link: no frame half written or half read, nothing owed.
    pub fn quiet(&self) -> bool {
        matches!(self.inbound, Inbound::Idle) && self.out.is_none() && self.acks.is_empty()
    }

    /// Every acknowledgement owed to the peer has been written.
    pub fn owes_nothing(&self) -> bool {
        self.acks.is_empty() && !matches!(self.out, Some(OutFrame { body: Body::Ack(_), .. }))
    }

    /// Whether there is something to write: a half-written frame or an owed one.
    pub fn has_output(&self) -> bool {
        self.out.is_some() || !self.acks.is_empty()
    }

    /// The next frame to write, if none is half written: owed frames first.
    pub fn start_owed(&mut self) -> bool {
        if self.out.is_none() {
            self.out = self.acks.pop_front();
        }
        self.out.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{FrameKind, Header};

    fn ack() -> OutFrame {
        OutFrame::reply(Header::control(FrameKind::Data, 7, 0), FrameKind::Ack, 64)
    }

    #[test]
    fn a_new_peer_without_a_link_is_quiet() {
        let p = Peer::new(None);
        assert!(p.quiet() && p.owes_nothing() && !p.has_output());
        assert_eq!(p.facts, LinkFacts::default());
    }

    #[test]
    fn owed_frames_go_first_and_keep_the_step_open_until_written() {
        let mut p = Peer::new(None);
        p.acks.push_back(ack());
        assert!(!p.quiet() && !p.owes_nothing() && p.has_output());
        assert!(p.start_owed());
        assert!(p.acks.is_empty());
        // Half written: still owed.
        assert!(!p.owes_nothing());
        p.out = None;
        assert!(p.owes_nothing() && p.quiet() && !p.start_owed());
    }
}
