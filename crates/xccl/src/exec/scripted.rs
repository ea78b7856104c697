//! A scripted link for the executor's unit tests: each write takes at most the next
//! scripted number of bytes, each read gives at most the next scripted number of the bytes
//! it was loaded with, so a test can cut a stream anywhere.

use std::io::{self, IoSlice};
use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::transport::{Closed, Farewell, Link, Within};

/// A link whose writes and reads go as far as a script says; or one that fails them all.
pub(super) struct Scripted {
    /// Bytes each write may take, in turn (spent: nothing).
    takes: Vec<usize>,
    /// What the writes took.
    pub written: Vec<u8>,
    /// Bytes each read may give, in turn (spent: nothing), and what there is to give.
    gives: Vec<usize>,
    incoming: Vec<u8>,
    broken: bool,
}

impl Scripted {
    /// A link whose writes take `takes` bytes in turn.
    pub fn writes(takes: &[usize]) -> Scripted {
        Scripted {
            takes: takes.to_vec(),
            written: Vec::new(),
            gives: Vec::new(),
            incoming: Vec::new(),
            broken: false,
        }
    }

    /// A link that gives `incoming` to reads, `gives` bytes at a time in turn.
    pub fn reads(incoming: &[u8], gives: &[usize]) -> Scripted {
        Scripted {
            takes: Vec::new(),
            written: Vec::new(),
            gives: gives.to_vec(),
            incoming: incoming.to_vec(),
            broken: false,
        }
    }

    /// A link whose every write and read fails as a closed socket's would.
    pub fn broken() -> Scripted {
        Scripted { broken: true, ..Scripted::writes(&[]) }
    }

    fn next(script: &mut Vec<usize>) -> usize {
        if script.is_empty() { 0 } else { script.remove(0) }
    }

    fn check(&self) -> io::Result<()> {
        if self.broken { Err(io::Error::new(io::ErrorKind::BrokenPipe, "peer gone")) } else { Ok(()) }
    }
}

impl Link for Scripted {
    fn write(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        self.check()?;
        let mut room = Scripted::next(&mut self.takes);
        let before = self.written.len();
        for p in parts {
            let n = room.min(p.len());
            self.written.extend_from_slice(&p[..n]);
            room -= n;
        }
        Ok(self.written.len() - before)
    }

    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        self.check()?;
        let n = Scripted::next(&mut self.gives).min(dst.len()).min(self.incoming.len());
        dst[..n].copy_from_slice(&self.incoming[..n]);
        self.incoming.drain(..n);
        Ok(n)
    }

    fn read_with(&mut self, max: usize, align: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut buf = vec![0u8; max];
        let n = self.read(&mut buf)?;
        let n = n - n % align.max(1);
        f(&buf[..n]);
        Ok(n)
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn max_frame(&self) -> usize {
        1 << 20
    }

    fn hangup(&mut self, _at: Within<'_>) -> io::Result<Option<Closed>> {
        Ok(None)
    }

    fn close(&mut self, _farewell: &Farewell, _at_boundary: bool, _patience: Duration) {}
}
