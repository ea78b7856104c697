//! Socket links: one TCP connection per pair of ranks, non-blocking, `TCP_NODELAY`.
//!
//! Payloads are written straight from the caller's buffer (`sendmsg` of header, payload and
//! padding in one call) and plain receives read straight into the destination; only a
//! receive that reduces goes through a small staging buffer, one segment at a time, so no
//! message is ever copied whole into a temporary.

use std::io::{self, IoSlice};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendFlags, Shutdown, sockopt};

use super::{Closed, Farewell, Link, Within, timespec};

/// Bytes staged for one reducing read.
const STAGE: usize = 256 << 10;
/// The most a closed peer's leftover stream may hold (a socket buffer's worth, generously).
const MAX_LEFTOVER: usize = 64 << 20;

/// The incoming side of a socket: the socket itself, then what was left in it at hangup.
struct Source {
    sock: TcpStream,
    /// What was left in the stream when the peer hung up, read out to find its last word.
    leftover: Vec<u8>,
    leftover_at: usize,
    eof: bool,
}

/// How a byte stream's last words are said and read. The format is that of whoever frames
/// the stream (the executor's `frame.rs`); the link only carries bytes.
pub(crate) trait LastWords: Send {
    /// The bytes that end a stream with `farewell`.
    fn say(&self, farewell: &Farewell) -> Vec<u8>;

    /// How a peer ended its stream, from `rest`, the bytes it left unread (starting at a
    /// message boundary) when it hung up.
    fn read(&self, rest: &[u8]) -> Closed;
}

/// A link over one connected TCP socket.
pub(crate) struct TcpLink {
    src: Source,
    /// Words, so that staged payloads are aligned for every element type.
    stage: Vec<u64>,
    staged: usize,
    /// How the stream's last words are said and read.
    words: Box<dyn LastWords>,
    max_frame: usize,
    /// How long the peer's host may leave this side's bytes unacknowledged.
    liveness: Duration,
}

fn would_block(e: Errno) -> bool {
    e == Errno::AGAIN || e == Errno::INTR
}

impl Source {
    fn eof_error() -> io::Error {
        io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed")
    }

    /// Reads from the leftover buffer, then the socket.
    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        if self.leftover_at < self.leftover.len() {
            let n = dst.len().min(self.leftover.len() - self.leftover_at);
            dst[..n].copy_from_slice(&self.leftover[self.leftover_at..self.leftover_at + n]);
            self.leftover_at += n;
            return Ok(n);
        }
        if self.eof {
            return Err(Self::eof_error());
        }
        if dst.is_empty() {
            return Ok(0);
        }
        match rustix::net::recv(&self.sock, dst, RecvFlags::DONTWAIT) {
            Ok((0, _)) => {
                self.eof = true;
                Err(Self::eof_error())
            }
            Ok((n, _)) => Ok(n),
            Err(e) if would_block(e) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads everything up to the end of the stream into `leftover`.
    fn drain(&mut self) -> io::Result<bool> {
        let mut buf = [0u8; 64 << 10];
        loop {
            match rustix::net::recv(&self.sock, &mut buf[..], RecvFlags::DONTWAIT) {
                Ok((0, _)) => {
                    self.eof = true;
                    return Ok(true);
                }
                Ok((n, _)) => {
                    if self.leftover.len() - self.leftover_at + n > MAX_LEFTOVER {
                        return Err(io::Error::other("peer left more than 64 MiB unread"));
                    }
                    self.leftover.extend_from_slice(&buf[..n]);
                }
                Err(e) if would_block(e) => return Ok(false),
                Err(e) if e == Errno::CONNRESET => {
                    self.eof = true;
                    return Ok(true);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl TcpLink {
    /// Wraps a connected, authenticated socket whose stream ends with `words`; frames carry
    /// at most `max_frame` payload bytes. A peer that stops answering (its host gone, the link cut)
    /// is reported lost after about `liveness`: when the link is idle, by keep-alive probes
    /// every quarter of it; when this side holds bytes for the peer, by [`Link::unanswered`],
    /// which the executor asks while it waits. Not by the kernel's `TCP_USER_TIMEOUT`: since
    /// Linux 5.11 that also ends a connection whose peer keeps its window closed, alive but
    /// busy elsewhere, which a rank that runs ahead of a slower one must survive. A peer
    /// that is alive but stalled (stopped, overloaded) still answers the kernel: the
    /// operation's own `XCCL_TIMEOUT` catches that.
    pub fn new(
        sock: TcpStream,
        words: Box<dyn LastWords>,
        max_frame: usize,
        liveness: Duration,
    ) -> io::Result<TcpLink> {
        sock.set_nodelay(true)?;
        sock.set_nonblocking(true)?;
        let quarter = (liveness / 4).max(Duration::from_secs(1));
        sockopt::set_socket_keepalive(&sock, true)?;
        sockopt::set_tcp_keepidle(&sock, quarter)?;
        sockopt::set_tcp_keepintvl(&sock, quarter)?;
        sockopt::set_tcp_keepcnt(&sock, 3)?;
        let src = Source { sock, leftover: Vec::new(), leftover_at: 0, eof: false };
        Ok(TcpLink { src, stage: vec![0u64; STAGE / 8], staged: 0, words, max_frame, liveness })
    }

    /// Writes all of `bytes` within `patience`, waiting for room.
    fn write_fully(&mut self, bytes: &[u8], patience: Duration) -> io::Result<()> {
        let deadline = Instant::now() + patience;
        let mut done = 0;
        while done < bytes.len() {
            let n = self.write(&[IoSlice::new(&bytes[done..])])?;
            done += n;
            if n == 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "no room to say goodbye"));
                }
                let ts = timespec(left.max(Duration::from_millis(1)));
                let mut fds = [PollFd::new(&self.src.sock, PollFlags::OUT)];
                let _ = rustix::event::poll(&mut fds, Some(&ts));
            }
        }
        Ok(())
    }
}

/// What the kernel knows of the peer's answers: packets sent and not acknowledged, window
/// probes not answered, and the time since the peer last acknowledged anything; `None` if
/// the socket cannot tell.
fn answers(sock: &TcpStream) -> Option<(u32, u8, Duration)> {
    use std::os::fd::AsRawFd;
    // SAFETY: tcp_info is plain integers, for which all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the descriptor is the socket `sock` owns, open during the call; `info` is
    // writable for `len` bytes, and the kernel writes at most `len`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    (rc == 0).then(|| {
        (info.tcpi_unacked, info.tcpi_probes, Duration::from_millis(u64::from(info.tcpi_last_ack_recv)))
    })
}

impl Link for TcpLink {
    fn unanswered(&self) -> Option<io::Error> {
        // Data in flight that is not acknowledged, or a closed window whose probes are not
        // answered. A peer that is alive acknowledges both (probes come further apart as
        // they back off, so the time alone would not tell).
        let (unacked, probes, silence) = answers(&self.src.sock)?;
        ((unacked > 0 || probes > 0) && silence > self.liveness).then(|| {
            let what = if unacked > 0 {
                format!("{unacked} packets to it unacknowledged")
            } else {
                format!("{probes} window probes unanswered")
            };
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{what}, nothing heard from its host for {:.1} s", silence.as_secs_f64()),
            )
        })
    }

    fn write(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut control = rustix::net::SendAncillaryBuffer::default();
        match rustix::net::sendmsg(
            &self.src.sock,
            parts,
            &mut control,
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        ) {
            Ok(n) => Ok(n),
            Err(e) if would_block(e) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        debug_assert_eq!(self.staged, 0, "plain read in the middle of a staged payload");
        self.src.read(dst)
    }

    fn read_with(&mut self, max: usize, align: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let want = max.min(STAGE);
        if self.staged < want {
            let stage: &mut [u8] = bytemuck::cast_slice_mut(&mut self.stage);
            self.staged += self.src.read(&mut stage[self.staged..want])?;
        }
        let usable = self.staged - self.staged % align;
        if usable == 0 {
            return Ok(0);
        }
        let stage: &mut [u8] = bytemuck::cast_slice_mut(&mut self.stage);
        f(&stage[..usable]);
        stage.copy_within(usable..self.staged, 0);
        self.staged -= usable;
        Ok(usable)
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.src.sock.as_fd())
    }

    fn max_frame(&self) -> usize {
        self.max_frame
    }

    fn hangup(&mut self, at: Within<'_>) -> io::Result<Option<Closed>> {
        if !self.src.drain()? {
            return Ok(None);
        }
        let left = &self.src.leftover[self.src.leftover_at..];
        // The current frame's bytes still in the stream (a reducing read holds some staged).
        let Some(after) = left.get(at.rest.saturating_sub(self.staged)..) else {
            return Ok(Some(Closed::Vanished("connection closed in the middle of a frame".into())));
        };
        if at.head.is_empty() {
            return Ok(Some(self.words.read(after)));
        }
        let mut rest = at.head.to_vec();
        rest.extend_from_slice(after);
        Ok(Some(self.words.read(&rest)))
    }

    fn close(&mut self, farewell: &Farewell, at_boundary: bool, patience: Duration) {
        if at_boundary {
            let bytes = self.words.say(farewell);
            let _ = self.write_fully(&bytes, patience);
        }
        let _ = rustix::net::shutdown(&self.src.sock, Shutdown::Write);
        // Read what is already here, so closing does not reset the connection under a peer
        // that is still reading our last bytes.
        let _ = self.src.drain();
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;
    use crate::frame::{Farewells, FrameKind, HEADER_LEN, Header, pad_for};
    use crate::transport::Links;

    const COMM: u64 = 7;

    /// Two ends of one loopback connection, framed as the executor frames its streams.
    fn pair() -> (TcpLink, TcpLink) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        let link = |s| {
            TcpLink::new(s, Box::new(Farewells { comm: COMM }), 1 << 20, Duration::from_secs(30)).unwrap()
        };
        (link(a), link(b))
    }

    /// A data frame of `len` payload bytes, padded.
    fn data_frame(len: usize) -> Vec<u8> {
        let mut bytes = Header::control(FrameKind::Data, COMM, len).encode().to_vec();
        bytes.extend((0..len + pad_for(len)).map(|i| i as u8));
        bytes
    }

    fn abort() -> Farewell {
        Farewell::Abort { origin: 3, reason: "rank 2: lost rank 3".into() }
    }

    fn read_exactly(link: &mut TcpLink, n: usize) {
        let mut buf = vec![0u8; n];
        let mut got = 0;
        while got < n {
            got += link.read(&mut buf[got..]).unwrap();
        }
    }

    /// Waits until `link`'s peer has hung up, reading it from where `at` says.
    fn ended(link: &mut TcpLink, at: Within<'_>) -> Closed {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(how) = link.hangup(at).unwrap() {
                return how;
            }
            assert!(Instant::now() < deadline, "the peer never hung up");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_farewell_behind_a_frame_being_read_is_found() {
        let len = 1001;
        for (read, at_header) in [(HEADER_LEN + 100, false), (10, true), (HEADER_LEN + len, false)] {
            let (mut a, mut b) = pair();
            a.write_fully(&data_frame(len), Duration::from_secs(5)).unwrap();
            a.write_fully(&data_frame(24), Duration::from_secs(5)).unwrap();
            a.close(&abort(), true, Duration::from_secs(1));
            // `b` has read part of the first frame: its header, or some of it.
            let mut head = [0u8; HEADER_LEN];
            let mut got = 0;
            while got < read.min(HEADER_LEN) {
                got += b.read(&mut head[got..read.min(HEADER_LEN)]).unwrap();
            }
            read_exactly(&mut b, read.saturating_sub(HEADER_LEN));
            let at = if at_header {
                Within { head: &head[..read], rest: 0 }
            } else {
                Within { head: &[], rest: HEADER_LEN + len + pad_for(len) - read }
            };
            let how = ended(&mut b, at);
            assert_eq!(
                how,
                Closed::Aborted { origin: 3, reason: "rank 2: lost rank 3".into() },
                "read {read}"
            );
            // Read as if between frames, the rest of the frame is taken for a header.
            if read > HEADER_LEN && read < HEADER_LEN + len {
                assert!(matches!(ended(&mut b, Within::BOUNDARY), Closed::Vanished(_)));
            }
        }
    }

    #[test]
    fn an_abort_to_a_peer_that_does_not_read_is_given_up_after_its_patience() {
        // A stopped peer holds a failing rank's exit up for the patience, not longer.
        let (mut a, _b) = pair();
        let frame = data_frame(64 << 10);
        while a.write(&[IoSlice::new(&frame)]).unwrap() > 0 {}
        let start = Instant::now();
        a.close(&abort(), true, Duration::from_millis(300));
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(290) && waited < Duration::from_secs(3), "waited {waited:?}");
    }

    #[test]
    fn a_rank_that_aborts_reads_what_its_peers_still_send_so_they_read_its_farewell() {
        // `b` aborts while `a` is still sending it more than the sockets hold: had `b` closed
        // with those bytes unread, the connection would be reset and `a`'s send would fail
        // before `a` read why.
        let (mut a, b) = pair();
        let mut links = Links::new(1, vec![Some(Box::new(b) as Box<dyn Link>), None], None).unwrap();
        links.close_all(&abort(), &[false, false], Duration::from_secs(1));
        let closer = std::thread::spawn(move || {
            links.linger(Duration::from_secs(1), Instant::now() + Duration::from_secs(10));
            drop(links);
        });
        let frame = data_frame(1 << 20);
        for _ in 0..16 {
            a.write_fully(&frame, Duration::from_secs(10)).unwrap();
        }
        a.close(&Farewell::Goodbye, true, Duration::from_secs(1));
        closer.join().unwrap();
        let how = ended(&mut a, Within::BOUNDARY);
        assert!(matches!(how, Closed::Aborted { origin: 3, .. }), "{how:?}");
    }
}
