//! Measuring the links between hosts when a job starts, so that the tuner prices them as
//! they are rather than as the reference machine's loopback.
//!
//! The probe runs once per job, right after the ranks have connected, and only where it can
//! matter: when the ranks span more than one host, some link between hosts leaves the
//! machine (a loopback address is the reference machine's case, which the built-in constants
//! already describe) and nobody gave the TCP constants (`XCCL_TUNE_TCP`, or a `link tcp`
//! line of `XCCL_TUNE_FILE`). `XCCL_LINK_PROBE=1` forces it, `0` turns it off.
//!
//! The first rank of each host (its leader) passes messages around a ring of the leaders,
//! every leader sending to the next and receiving from the previous at once, as a ring step
//! of an all-reduce does: a host's link carries traffic both ways. Eight-byte rounds give
//! the latency; then the size doubles from 1 MiB until a round takes [`LONG_ENOUGH`] (so a
//! token bucket's burst does not pass for bandwidth) or reaches [`MAX_BYTES`]. Each round's
//! time is the slowest leader's, agreed by an all-reduce, so every rank ends with the same
//! constants and the tuner's choices stay identical across ranks.

use std::time::{Duration, Instant};

use super::Communicator;
use crate::algo::tune::LinkCost;
use crate::error::Result;
use crate::reduce::ReduceOp;

/// A bandwidth round long enough to measure a rate rather than a buffer.
const LONG_ENOUGH: Duration = Duration::from_millis(25);
/// The largest bandwidth round.
const MAX_BYTES: usize = 64 << 20;
/// Latency rounds.
const PINGS: usize = 10;
/// The tag of the probe's messages (before the communicator is handed out, so no user
/// message can meet them).
const TAG: u32 = 0x7072_6f62;

/// Whether a job should measure its links: `forced` is `XCCL_LINK_PROBE` (`None`: decide),
/// `remote` whether some link between hosts leaves the machine, `given` whether the TCP
/// constants were set by the user.
pub(super) fn wanted(forced: Option<bool>, hosts: &[usize], remote: bool, given: bool) -> bool {
    let several = hosts.iter().any(|&h| h != hosts[0]);
    several && forced.unwrap_or(remote && !given)
}

/// The TCP link constants measured between the hosts of `comm` (collective: every rank
/// calls it): the latency and rate of a host's link with every leader busy, and the
/// reduce and copy rates of `base`, which the probe does not measure.
pub(super) fn measure(comm: &Communicator, base: LinkCost) -> Result<LinkCost> {
    let hosts = &comm.inner.group.hosts;
    let leaders: Vec<usize> =
        (0..hosts.len()).filter(|&r| hosts[..r].iter().all(|&h| h != hosts[r])).collect();
    let me = leaders.iter().position(|&l| l == comm.rank());
    let ring = me.map(|i| {
        let h = leaders.len();
        (leaders[(i + 1) % h], leaders[(i + h - 1) % h])
    });
    let round = |bytes: usize| -> Result<f64> {
        let Some((next, prev)) = ring else { return Ok(0.0) };
        let started = Instant::now();
        let sent = comm.isend(vec![0u8; bytes], next, TAG);
        comm.irecv(vec![0u8; bytes], prev, TAG).wait()?;
        sent.wait()?;
        Ok(started.elapsed().as_secs_f64())
    };
    let slowest = |t: f64| -> Result<f64> {
        let mut v = [t];
        comm.all_reduce(&mut v, ReduceOp::Max)?;
        Ok(v[0])
    };
    let mut pings = (0..PINGS).map(|_| round(8)).collect::<Result<Vec<f64>>>()?;
    pings.sort_by(f64::total_cmp);
    let alpha = slowest(pings[PINGS / 2])?;
    let mut bytes = 1 << 20;
    let rate = loop {
        let t = slowest(round(bytes)?)?;
        if t >= LONG_ENOUGH.as_secs_f64() || bytes >= MAX_BYTES {
            break bytes as f64 / (t - alpha).max(1e-9);
        }
        bytes *= 2;
    };
    Ok(LinkCost { alpha, beta: 1.0 / rate, ..base })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_runs_only_where_it_can_matter() {
        // One host: nothing to measure, even when forced.
        assert!(!wanted(Some(true), &[0, 0, 0], true, false));
        // Hosts on loopback: the built-in constants describe them.
        assert!(!wanted(None, &[0, 1], false, false));
        // A real network, constants not given: measure.
        assert!(wanted(None, &[0, 0, 1, 1], true, false));
        // The user's constants win.
        assert!(!wanted(None, &[0, 1], true, true));
        // Forced either way.
        assert!(wanted(Some(true), &[0, 1], false, true));
        assert!(!wanted(Some(false), &[0, 1], true, false));
    }
}
