//! Transports: how bytes move between two ranks.
//!
//! Every transport offers the same thing, a non-blocking, ordered, full-duplex byte stream
//! to each peer ([`Link`]); framing, matching and reduction live above it in the executor,
//! written once. Links differ only in how they wait: socket links are polled, memory links
//! (the local transport, and shared memory across processes) sleep on a [`Doorbell`] that
//! peers ring. [`Links`] is one rank's set of links in one communicator and knows how to
//! wait on any mix of them.

pub(crate) mod doorbell;
pub(crate) mod idle;
pub(crate) mod ll;
pub(crate) mod local;
pub(crate) mod pull;
pub(crate) mod ring;
pub(crate) mod shm;
pub(crate) mod tcp;

pub(crate) use idle::{Polling, Spell, polling_for};
pub(crate) use ll::LlRecv;

use std::io::{self, IoSlice};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags};

use self::doorbell::Armed;
use self::ring::RingHost;

/// How a peer's side of a link ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Closed {
    /// It closed its communicator cleanly.
    Goodbye,
    /// It aborted: the rank where the failure began, and what happened there.
    Aborted {
        /// The rank that failed first (the peer itself, or one it heard from).
        origin: usize,
        /// What happened.
        reason: String,
    },
    /// It vanished without a word (process killed, connection reset).
    Vanished(String),
}

/// Where the incoming stream of a link stands, for [`Link::hangup`]: how much of the frame
/// being read is still to come.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Within<'a> {
    /// The bytes of a frame header read so far, when its header is incomplete (the
    /// frame's length is in the rest of it).
    pub head: &'a [u8],
    /// Bytes of the current frame (payload, padding) the link has not handed out yet.
    pub rest: usize,
}

impl Within<'_> {
    /// Between two frames.
    pub const BOUNDARY: Within<'static> = Within { head: &[], rest: 0 };
}

/// The payload of the I/O error a memory link returns when its peer aborted, so that the
/// executor can report the abort rather than a lost peer.
#[derive(Debug)]
pub(crate) struct PeerAborted {
    /// The rank where the failure began.
    pub origin: usize,
    /// What happened there.
    pub reason: String,
}

impl std::fmt::Display for PeerAborted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "aborted (rank {} failed: {})", self.origin, self.reason)
    }
}

impl std::error::Error for PeerAborted {}

/// What a rank says to its peers when it stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Farewell {
    /// A clean close.
    Goodbye,
    /// An abort: the rank where the failure began, and what happened there.
    Abort {
        /// The rank that failed first.
        origin: usize,
        /// What happened.
        reason: String,
    },
}

/// A non-blocking, ordered, full-duplex byte stream to one peer.
pub(crate) trait Link: Send {
    /// Writes a prefix of `parts` without blocking; returns the bytes written (0: full).
    fn write(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize>;

    /// Reads up to `dst.len()` bytes without blocking (0: nothing available yet). The end of
    /// the stream is an error of kind `UnexpectedEof`.
    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize>;

    /// Consumes up to `max` available bytes, a multiple of `align`, handing them to `f` in
    /// one or more contiguous pieces whose lengths are multiples of `align` and which start
    /// at `align`-aligned addresses when the stream position is. `max` must be a multiple of
    /// `align`, and reads through one message must not mix `read` and `read_with`.
    fn read_with(&mut self, max: usize, align: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize>;

    /// The descriptor to poll, for socket links.
    fn fd(&self) -> Option<BorrowedFd<'_>>;

    /// The largest payload worth putting in one frame on this link.
    fn max_frame(&self) -> usize;

    /// Whether a write of `bytes` would be taken whole right now. Only memory links can tell
    /// without a system call; the others always say no.
    fn room_for(&mut self, _bytes: usize) -> bool {
        false
    }

    /// Whether `bytes` are readable right now (memory links; the others always say no).
    fn holds(&mut self, _bytes: usize) -> bool {
        false
    }

    /// Whether, and how, this rank can read the peer's memory directly.
    fn pull_from_peer(&self) -> Option<pull::Pull> {
        None
    }

    /// Whether the peer can read this rank's memory directly.
    fn peer_pulls(&self) -> bool {
        false
    }

    /// Whether the peer has ended its side and how, or `None` while it is open. Data the
    /// peer sent before it ended stays readable. `at` says where the incoming stream stands
    /// ([`Within::BOUNDARY`] between frames): a socket link skips the rest of the current
    /// frame and hands what follows to its stream's `LastWords`.
    fn hangup(&mut self, at: Within<'_>) -> io::Result<Option<Closed>>;

    /// Says `farewell` (abort notices only if `at_boundary`, i.e. no outgoing frame is half
    /// written) and closes this side, waiting at most `patience` for room to say it.
    fn close(&mut self, farewell: &Farewell, at_boundary: bool, patience: Duration);

    /// An error if the peer's host stopped answering while this side holds bytes for it:
    /// nothing acknowledged for longer than the link's liveness (`XCCL_LINK_TIMEOUT`), with
    /// data in flight or held back. A peer that is alive but not reading still acknowledges
    /// the kernel's window probes. Socket links only.
    fn unanswered(&self) -> Option<io::Error> {
        None
    }

    /// The most payload bytes one LL message may carry on this link (0: it has no LL
    /// channel, as sockets have not).
    fn ll_max(&self) -> usize {
        0
    }

    /// Sends one LL message labelled `label` with `payload` (at most `ll_max` bytes) if the
    /// channel has room for all of it; `Ok(false)`, having written nothing, otherwise. An
    /// error if the peer is gone and the channel stays full.
    fn ll_send(&mut self, _label: [u64; 2], _payload: &[u8]) -> io::Result<bool> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "this link has no LL channel"))
    }

    /// Receives the next LL message if it is labelled `label`, has `len` bytes and has
    /// arrived whole, handing its payload to `f` in one piece; at the end of the
    /// stream (nothing there and the peer gone) an error.
    fn ll_recv(&mut self, _label: [u64; 2], _len: usize, _f: &mut dyn FnMut(&[u8])) -> io::Result<LlRecv> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "this link has no LL channel"))
    }

    /// Whether an LL message has begun to arrive and has not been read.
    fn ll_pending(&mut self) -> bool {
        false
    }
}

/// What the executor waits for on one peer's link.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Interest {
    /// Incoming bytes would make progress.
    pub read: bool,
    /// Room for outgoing bytes would make progress.
    pub write: bool,
    /// The incoming stream is at a frame boundary, so a hangup can be examined.
    pub idle: bool,
}

/// Wakes a rank's executor out of [`Links::wait`] from any thread (when new work is issued
/// to a running point-to-point batch).
#[derive(Clone)]
pub(crate) struct Waker {
    /// An eventfd in the poll set, when there are socket links.
    event: Option<Arc<OwnedFd>>,
    /// The rank's doorbell, when there are memory links.
    bell: Option<(Arc<dyn RingHost>, usize)>,
}

impl Waker {
    pub fn wake(&self) {
        if let Some(fd) = &self.event {
            // A full counter (impossible in practice) or EAGAIN still leaves it readable.
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
        if let Some((host, me)) = &self.bell {
            host.bell(*me).ring();
        }
    }
}

/// How often a rank sleeping on memory links looks whether their processes still exist.
const LIVENESS: Duration = Duration::from_millis(100);

/// What a rank's memory links share.
pub(crate) struct Memory {
    /// The host of the rings, doorbells and statuses.
    pub host: Arc<dyn RingHost>,
    /// This rank's index in `host`.
    pub me: usize,
    /// How to poll before sleeping.
    pub polling: Polling,
    /// Processes behind memory links (shared memory): (rank, index in `host`, pid).
    pub procs: Vec<(usize, usize, i32)>,
    /// Each rank's index in `host`, for the ranks on memory links (and this one).
    index: Vec<Option<usize>>,
    /// When this rank last moved to another core (see [`idle`]).
    moved: Option<Instant>,
    /// When this rank last looked whether the host's ranks are spread over its cores.
    looked: Option<Instant>,
    /// The cores this rank may use (when it was made).
    cores: usize,
    /// How many threads of the system are runnable ([`idle::runnable`]; tests set their own).
    runnable: fn() -> Option<usize>,
}

impl Memory {
    /// The memory links of member `me` of `host`; `index[rank]` is each rank's member
    /// index, `procs` the processes to watch.
    pub fn new(
        host: Arc<dyn RingHost>,
        me: usize,
        index: Vec<Option<usize>>,
        procs: Vec<(usize, usize, i32)>,
    ) -> Memory {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let polling = polling_for(host.members(), cores);
        Memory { host, me, polling, procs, index, moved: None, looked: None, cores, runnable: idle::runnable }
    }
}

/// Turns rings of a doorbell into eventfd writes, so that a rank with socket and memory
/// links can wait on both with one `poll`.
struct Bridge {
    stop: Arc<std::sync::atomic::AtomicBool>,
    host: Arc<dyn RingHost>,
    me: usize,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Bridge {
    fn start(host: Arc<dyn RingHost>, me: usize, event: Arc<OwnedFd>) -> io::Result<Bridge> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (h, s) = (host.clone(), stop.clone());
        // Peers must ring even though the executor never arms this bell.
        host.bell(me).ring_always();
        let thread = std::thread::Builder::new().name("xccl-bridge".into()).spawn(move || {
            let bell = h.bell(me);
            let mut seen = bell.token();
            while !s.load(std::sync::atomic::Ordering::Acquire) {
                let armed = bell.arm();
                if armed.token() == seen {
                    bell.sleep(armed, LIVENESS);
                }
                let now = bell.token();
                if now != seen {
                    seen = now;
                    let _ = rustix::io::write(&*event, &1u64.to_ne_bytes());
                }
            }
        })?;
        Ok(Bridge { stop, host, me, thread: Some(thread) })
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.host.bell(self.me).ring();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One rank's links in one communicator, and the means to wait on them.
pub(crate) struct Links {
    rank: usize,
    links: Vec<Option<Box<dyn Link>>>,
    /// Peers known to have ended their side, and how.
    gone: Vec<Option<Closed>>,
    memory: Option<Memory>,
    /// Readable when the waker was used or (with a bridge) a doorbell rang; polled with the
    /// sockets.
    event: Option<Arc<OwnedFd>>,
    bridge: Option<Bridge>,
    /// Pidfds of the processes behind memory links: readable once the process has exited.
    pidfds: Vec<(usize, usize, OwnedFd)>,
    /// When memory links' processes were last checked.
    checked: Instant,
}

impl Links {
    /// Links of `rank`; `links[peer]` is `None` for `rank` itself.
    pub fn new(rank: usize, links: Vec<Option<Box<dyn Link>>>, memory: Option<Memory>) -> io::Result<Links> {
        let gone = vec![None; links.len()];
        let has_sockets = links.iter().flatten().any(|l| l.fd().is_some());
        let event = if has_sockets {
            Some(Arc::new(rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?))
        } else {
            None
        };
        let bridge = match (&memory, &event) {
            (Some(m), Some(ev)) => Some(Bridge::start(m.host.clone(), m.me, ev.clone())?),
            _ => None,
        };
        // A process that cannot be watched (no pidfd support) is still noticed by its
        // status word or, failing that, by the operation deadline.
        let pidfds = memory
            .iter()
            .flat_map(|m| m.procs.iter())
            .filter_map(|&(peer, idx, pid)| {
                let p = rustix::process::Pid::from_raw(pid)?;
                rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())
                    .ok()
                    .map(|fd| (peer, idx, fd))
            })
            .collect();
        Ok(Links { rank, links, gone, memory, event, bridge, pidfds, checked: Instant::now() })
    }

    /// A waker for this rank's waits.
    pub fn waker(&self) -> Waker {
        Waker { event: self.event.clone(), bell: self.memory.as_ref().map(|m| (m.host.clone(), m.me)) }
    }

    /// The link to `peer`.
    pub fn link(&mut self, peer: usize) -> io::Result<&mut (dyn Link + 'static)> {
        match self.links.get_mut(peer) {
            Some(Some(l)) => Ok(l.as_mut()),
            _ => Err(io::Error::other(format!("rank {} has no link to rank {peer}", self.rank))),
        }
    }

    /// How `peer` ended, if it did.
    pub fn gone(&self, peer: usize) -> Option<&Closed> {
        self.gone.get(peer).and_then(Option::as_ref)
    }

    /// Looks at once whether `peer` has ended its side, and records how; `at` is where its
    /// incoming stream stands (see [`Link::hangup`]).
    pub fn probe(&mut self, peer: usize, at: Within<'_>) {
        if self.gone.get(peer).is_some_and(Option::is_none)
            && let Some(Ok(Some(how))) = self.links[peer].as_mut().map(|l| l.hangup(at))
        {
            self.gone[peer] = Some(how);
        }
    }

    /// The first peer whose host stopped answering while this rank holds bytes for it (see
    /// [`Link::unanswered`]).
    pub fn unanswered(&self) -> Option<(usize, io::Error)> {
        self.links
            .iter()
            .enumerate()
            .find_map(|(p, l)| l.as_ref().and_then(|l| l.unanswered()).map(|e| (p, e)))
    }

    /// The first peer known to have failed (aborted or vanished), and how.
    pub fn first_failed(&self) -> Option<(usize, &Closed)> {
        self.gone.iter().enumerate().find_map(|(p, g)| match g {
            Some(c @ (Closed::Aborted { .. } | Closed::Vanished(_))) => Some((p, c)),
            _ => None,
        })
    }

    /// How to poll the links before sleeping, if at all: only memory links are worth
    /// polling (a socket costs a system call per look).
    pub fn polling(&self) -> Option<Polling> {
        match (&self.memory, &self.event) {
            (Some(m), None) => Some(m.polling),
            _ => None,
        }
    }

    /// Starts a spell of waiting on `peers` (see [`idle`]); `None` when the links are not
    /// worth polling.
    pub fn spell(&mut self, peers: &[usize]) -> Option<Spell> {
        match (&mut self.memory, &self.event) {
            (Some(m), None) => Some(m.spell(peers)),
            _ => None,
        }
    }

    /// One look at the links that found nothing, in `spell`: pauses, and returns whether to
    /// look again before sleeping.
    pub fn pause(&mut self, spell: &mut Spell, peers: &[usize], extra: std::time::Duration) -> bool {
        match (&mut self.memory, &self.event) {
            (Some(m), None) => m.pause(spell, peers, extra),
            _ => false,
        }
    }

    /// Whether a wait on `peers` should spin before it takes the slow path: memory links
    /// only, a core for every rank, and none of `peers` queued on this rank's core.
    pub fn may_spin(&self, peers: &[usize]) -> bool {
        match (&self.memory, &self.event) {
            (Some(m), None) => m.may_spin(peers),
            _ => false,
        }
    }

    /// Before sleeping: marks this rank as going to sleep (memory links only) and returns the
    /// token for [`Links::wait`]. Look at the links once more afterwards, and
    /// [`Links::disarm`] if that finds work.
    pub fn arm(&self) -> Armed {
        match (&self.memory, &self.event) {
            (Some(m), None) => m.host.bell(m.me).arm(),
            _ => Armed::default(),
        }
    }

    /// Takes back [`Links::arm`].
    pub fn disarm(&self) {
        if let (Some(m), None) = (&self.memory, &self.event) {
            m.host.bell(m.me).disarm();
        }
    }

    /// Marks the memory peers whose processes have exited as vanished, in their shared
    /// status, so that every reader of their rings sees the end.
    fn check_processes(&mut self, ready: &[usize]) {
        let Some(m) = &self.memory else { return };
        for &(peer, idx, ref fd) in &self.pidfds {
            let exited = ready.contains(&peer) || {
                let mut pfd = [PollFd::new(fd, PollFlags::IN)];
                matches!(rustix::event::poll(&mut pfd, Some(&rustix::time::Timespec::default())), Ok(1))
            };
            if exited {
                let reason =
                    format!("rank {peer}'s process exited without closing the communicator (killed?)");
                m.host.status(idx).set_vanished(&reason);
            }
        }
        self.checked = Instant::now();
    }

    /// Blocks until a link in `want` may be ready, a peer ends its side, or `timeout` passes;
    /// `token` comes from [`Links::arm`]. Returns the peers newly found gone. May return
    /// early for no reason.
    pub fn wait(
        &mut self,
        want: &[Interest],
        token: Armed,
        timeout: Duration,
    ) -> io::Result<Vec<(usize, Closed)>> {
        let mut borrowed = Vec::new();
        let mut memory_wanted = false;
        for (peer, link) in self.links.iter().enumerate() {
            let (Some(link), None) = (link, &self.gone[peer]) else { continue };
            let w = want.get(peer).copied().unwrap_or_default();
            match link.fd() {
                Some(fd) => {
                    let mut ev = PollFlags::RDHUP;
                    if w.read {
                        ev |= PollFlags::IN;
                    }
                    if w.write {
                        ev |= PollFlags::OUT;
                    }
                    borrowed.push((peer, fd, ev));
                }
                None => memory_wanted |= w.read || w.write,
            }
        }
        let mut hung_up = Vec::new();
        let mut exited = Vec::new();
        if borrowed.is_empty() && self.event.is_none() {
            // Memory links only: sleep on the (armed) doorbell, waking now and then to see
            // whether the processes behind the links still exist.
            if let Some(m) = &self.memory {
                let bell = m.host.bell(m.me);
                if memory_wanted {
                    let nap = if self.pidfds.is_empty() { timeout } else { timeout.min(LIVENESS) };
                    bell.sleep(token, nap);
                } else {
                    bell.disarm();
                }
            }
            if !self.pidfds.is_empty() && self.checked.elapsed() >= LIVENESS {
                exited.push(usize::MAX);
            }
        } else {
            // Sockets (and, through the bridge, doorbells) in one poll, with the processes
            // behind memory links.
            let mut fds: Vec<PollFd<'_>> = borrowed.iter().map(|(_, fd, ev)| PollFd::new(fd, *ev)).collect();
            if let Some(event) = &self.event {
                fds.push(PollFd::new(event.as_ref(), PollFlags::IN));
            }
            let first_pid = fds.len();
            for (_, _, fd) in &self.pidfds {
                fds.push(PollFd::new(fd, PollFlags::IN));
            }
            let ts = timespec(timeout);
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
            let down = PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR;
            for (f, (peer, _, _)) in fds.iter().zip(&borrowed) {
                if f.revents().intersects(down) {
                    hung_up.push(*peer);
                }
            }
            let woken = self.event.is_some() && !fds[borrowed.len()].revents().is_empty();
            for (f, (peer, _, _)) in fds[first_pid..].iter().zip(&self.pidfds) {
                if !f.revents().is_empty() {
                    exited.push(*peer);
                }
            }
            drop(fds);
            if let (true, Some(event)) = (woken, &self.event) {
                let mut count = [0u8; 8];
                let _ = rustix::io::read(event.as_ref(), &mut count);
            }
        }
        drop(borrowed);
        if !exited.is_empty() {
            // (`usize::MAX` alone: no pidfd reported an exit, but it is time to look.)
            self.check_processes(&exited);
        }
        let mut newly = Vec::new();
        for peer in 0..self.links.len() {
            let idle = want.get(peer).is_some_and(|w| w.idle);
            let Some(link) = self.links[peer].as_mut() else { continue };
            if self.gone[peer].is_some() || !idle || (link.fd().is_some() && !hung_up.contains(&peer)) {
                continue;
            }
            let how = match link.hangup(Within::BOUNDARY) {
                Ok(Some(how)) => how,
                Ok(None) => continue,
                // The socket itself failed (its host stopped answering, say): the peer is
                // gone, and the error says how.
                Err(e) => Closed::Vanished(explain_io(&e)),
            };
            self.gone[peer] = Some(how.clone());
            newly.push((peer, how));
        }
        Ok(newly)
    }

    /// Says `farewell` on every link and closes them, waiting at most `patience` in all for
    /// room to say it; `mid_frame[peer]` marks links with a half-written outgoing frame,
    /// where no notice can be inserted.
    pub fn close_all(&mut self, farewell: &Farewell, mid_frame: &[bool], patience: Duration) {
        let deadline = Instant::now() + patience;
        for (peer, link) in self.links.iter_mut().enumerate() {
            if let Some(link) = link {
                let left = deadline.saturating_duration_since(Instant::now());
                link.close(farewell, !mid_frame.get(peer).copied().unwrap_or(false), left);
            }
        }
        self.bridge = None;
    }

    /// After [`Links::close_all`], reads what the peers still send on socket links until
    /// each has ended its side, none has sent anything for `quiet`, or `deadline` passes.
    /// Closing a socket with bytes unread resets the connection, and a reset can reach a
    /// peer before the farewell that tells it why this rank left.
    pub fn linger(&mut self, quiet: Duration, deadline: Instant) {
        let mut open: Vec<usize> = (0..self.links.len()).collect();
        loop {
            open.retain(|&peer| {
                let Some(link) = self.links[peer].as_mut() else { return false };
                link.fd().is_some() && matches!(link.hangup(Within::BOUNDARY), Ok(None))
            });
            let left = deadline.saturating_duration_since(Instant::now());
            if open.is_empty() || left.is_zero() {
                return;
            }
            let borrowed: Vec<BorrowedFd<'_>> =
                open.iter().filter_map(|&p| self.links[p].as_ref().and_then(|l| l.fd())).collect();
            let mut fds: Vec<PollFd<'_>> =
                borrowed.iter().map(|fd| PollFd::new(fd, PollFlags::IN | PollFlags::RDHUP)).collect();
            let wait = left.min(quiet);
            let ts = timespec(wait);
            if matches!(rustix::event::poll(&mut fds, Some(&ts)), Ok(0)) {
                return;
            }
        }
    }
}

/// `d` as a `poll` timeout (saturating: no wait here is anywhere near the limit).
pub(crate) fn timespec(d: Duration) -> rustix::time::Timespec {
    rustix::time::Timespec::try_from(d).unwrap_or(rustix::time::Timespec { tv_sec: i64::MAX, tv_nsec: 0 })
}

/// A link's I/O error in words, saying what a timed-out socket means.
pub(crate) fn explain_io(e: &io::Error) -> String {
    if e.kind() == io::ErrorKind::TimedOut {
        format!("{e}: its host stopped answering (down, or the link cut; XCCL_LINK_TIMEOUT)")
    } else {
        e.to_string()
    }
}
