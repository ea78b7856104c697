//! What the bootstrap's protocols (the handshake of [`auth`](super::auth), the store's two
//! protocols) run over: a [`Conn`], which is a TCP socket in every real use. The trait
//! exists so that the fuzzer can hand the very same code a connection whose peer's bytes
//! are in memory ([`Replayed`]) and run millions of inputs a second without sockets.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

/// Bytes in a handshake nonce.
pub(crate) const NONCE: usize = 16;

/// A byte stream to one peer, with the few socket controls the bootstrap's servers use.
pub(crate) trait Conn: Read + Write {
    /// Bounds every later read by `patience` (`None`: reads block until bytes come).
    fn set_patience(&mut self, patience: Option<Duration>) -> io::Result<()>;

    /// The next byte the peer sent, left unread; `None` at the end of the stream. Waits at
    /// most `patience` for it (zero: not at all), then fails with `WouldBlock` or `TimedOut`.
    fn peek_byte(&mut self, patience: Duration) -> io::Result<Option<u8>>;

    /// Closes both directions (errors ignored: the connection is being dropped).
    fn close(&mut self);

    /// The nonce this side of a handshake contributes: fresh random bytes.
    fn nonce(&mut self) -> io::Result<[u8; NONCE]> {
        let mut n = [0u8; NONCE];
        getrandom::fill(&mut n)
            .map_err(|e| io::Error::other(format!("no randomness for the handshake: {e}")))?;
        Ok(n)
    }
}

impl Conn for TcpStream {
    fn set_patience(&mut self, patience: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(patience)
    }

    fn peek_byte(&mut self, patience: Duration) -> io::Result<Option<u8>> {
        let mut b = [0u8; 1];
        let peeked = if patience.is_zero() {
            self.set_nonblocking(true)?;
            let peeked = self.peek(&mut b);
            self.set_nonblocking(false)?;
            peeked
        } else {
            self.set_read_timeout(Some(patience))?;
            let peeked = self.peek(&mut b);
            let _ = self.set_read_timeout(None);
            peeked
        };
        Ok((peeked? == 1).then_some(b[0]))
    }

    fn close(&mut self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

/// The first bytes a [`Replayed`] connection keeps of what is written to it.
const KEPT: usize = 64 << 10;

/// A connection whose peer already sent everything it will (`input`), then closed its side;
/// what this side writes is counted, its first bytes kept. Nonces are zeros, so that a run
/// replays exactly (the fuzzer's inputs can carry a valid proof of the secret). Never used
/// for a real connection.
pub(crate) struct Replayed<'a> {
    input: &'a [u8],
    /// Bytes written to the peer.
    pub written: usize,
    /// The first of them (up to 64 KiB).
    pub kept: Vec<u8>,
}

impl<'a> Replayed<'a> {
    /// A connection on which the peer sent `input` and closed.
    pub fn new(input: &'a [u8]) -> Replayed<'a> {
        Replayed { input, written: 0, kept: Vec::new() }
    }
}

impl Read for Replayed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Replayed<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let keep = buf.len().min(KEPT.saturating_sub(self.kept.len()));
        self.kept.extend_from_slice(&buf[..keep]);
        self.written += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Conn for Replayed<'_> {
    fn set_patience(&mut self, _patience: Option<Duration>) -> io::Result<()> {
        Ok(())
    }

    fn peek_byte(&mut self, _patience: Duration) -> io::Result<Option<u8>> {
        Ok(self.input.first().copied())
    }

    fn close(&mut self) {
        self.input = &[];
    }

    fn nonce(&mut self) -> io::Result<[u8; NONCE]> {
        Ok([0; NONCE])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replayed_connection_reads_its_input_then_ends() {
        let mut c = Replayed::new(b"abc");
        assert_eq!(c.peek_byte(Duration::ZERO).unwrap(), Some(b'a'));
        let mut two = [0u8; 2];
        c.read_exact(&mut two).unwrap();
        assert_eq!(&two, b"ab");
        c.write_all(b"xyz").unwrap();
        assert_eq!((c.written, &c.kept[..]), (3, &b"xyz"[..]));
        assert!(c.read_exact(&mut two).is_err(), "past the end");
        assert_eq!(c.peek_byte(Duration::ZERO).unwrap(), None);
    }
}
