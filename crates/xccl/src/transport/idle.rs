//! How a rank blocked on memory links spends the time before it sleeps: spin, yield, or
//! move to a free core.
//!
//! A peer about to answer is cheaper to catch by looking than by sleeping and being woken (a
//! wake-up costs tens of microseconds on a virtual machine), so a waiting rank first polls.
//! How it polls depends on where the peer it waits for runs:
//!
//! - on another core: spin, for [`SPIN`]; yielding would hand the core to whatever else runs
//!   there (a data loader, another job) for a whole time slice;
//! - on this core, behind this rank (the scheduler put both on one core, which it does at
//!   start and keeps doing while they wake each other): yield at every look, so that the peer
//!   runs now rather than when this rank's spin ends, and move this rank to a core no rank of
//!   the host uses, once, without pinning it;
//! - with more ranks on the host than cores, every rank yields (see [`polling_for`]), and a
//!   rank on a core that holds more of the host's ranks than their fair share moves to the
//!   core with the fewest, without pinning it: four ranks on two cores run an 8-byte
//!   all-reduce in 2.6-3.2 µs placed two and two, and up to 4.8 µs when the scheduler leaves
//!   them three and one.
//!
//! Every rank publishes, in its shared status, the core it last waited on; that is how its
//! peers tell. Without this, two ranks on one core spin away each other's time: each
//! operation then costs two spins and two wake-ups (120 µs instead of 0.3 µs for 8 bytes),
//! and the pair stays in that state for as long as the scheduler leaves them together.

use std::time::{Duration, Instant};

use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};

use super::Memory;

/// How a rank blocked on memory links polls them before it sleeps on its doorbell.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Polling {
    /// Every rank of the host has a core of its own: look again and again, for this long,
    /// yielding only to a peer found on this rank's core.
    Spin(Duration),
    /// More ranks than cores: give the core away between looks (the rank waited for may be
    /// the one that gets it), for this long. Being woken from a sleep instead would wait for
    /// the scheduler to preempt whoever holds the core.
    Yield(Duration),
}

/// How long a blocked memory-link waiter spins before it sleeps.
const SPIN: Duration = Duration::from_micros(50);

/// How long a blocked memory-link waiter yields before it sleeps.
const YIELD: Duration = Duration::from_millis(1);

/// Spins between looks at the clock and at the peers' cores.
const SPINS_PER_LOOK: u32 = 64;

/// The least time between two moves of one rank to a free core: the scheduler gets time to
/// settle, and a rank never chases its peer.
const MOVE_GAP: Duration = Duration::from_millis(2);

/// The least time between two looks of a rank on a crowded host at where the host's ranks
/// run: a look reads every rank's status, a few cache lines.
const LOOK_GAP: Duration = Duration::from_micros(100);

/// How `ranks` ranks sharing this host, each allowed `cores` cores, poll.
pub(crate) fn polling_for(ranks: usize, cores: usize) -> Polling {
    if ranks <= cores { Polling::Spin(SPIN) } else { Polling::Yield(YIELD) }
}

/// The core the calling thread runs on, if the system says.
fn current_cpu() -> Option<usize> {
    // SAFETY: `sched_getcpu` takes no arguments and only reads the thread's state (glibc
    // answers from its restartable-sequence area, without a system call).
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// How many threads of the whole system are runnable now (this one included), as the kernel
/// counts them in `/proc/loadavg`.
pub(super) fn runnable() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().nth(3)?.split('/').next()?.parse().ok()
}

/// One spell of waiting: from the first look that found nothing to the sleep (or progress).
#[derive(Debug)]
pub(crate) struct Spell {
    /// When the links stopped moving.
    pub since: Instant,
    looks: u32,
    /// Whether to yield at every look (a peer waits for this core, or the host is crowded).
    yielding: bool,
    /// How long to poll before sleeping.
    budget: Duration,
}

impl Memory {
    /// Starts a spell of waiting on `peers`: publishes this rank's core, and decides how to
    /// poll.
    pub(crate) fn spell(&mut self, peers: &[usize]) -> Spell {
        let cpu = current_cpu();
        // Written only when it changed: peers read this line while they wait.
        let status = self.host.status(self.me);
        if status.cpu() != cpu {
            status.set_cpu(cpu);
        }
        let mut spell = Spell { since: Instant::now(), looks: 0, yielding: false, budget: SPIN };
        match self.polling {
            Polling::Yield(budget) => {
                (spell.yielding, spell.budget) = (true, budget);
                if self.looked.is_none_or(|t| spell.since.duration_since(t) >= LOOK_GAP) {
                    self.looked = Some(spell.since);
                    self.spread(cpu);
                }
            }
            Polling::Spin(spin) => {
                spell.budget = spin;
                self.share_core(&mut spell, cpu, peers);
            }
        }
        spell
    }

    /// If a peer among `peers` waits for core `cpu` (this rank's), yields from now on and
    /// makes room.
    fn share_core(&mut self, spell: &mut Spell, cpu: Option<usize>, peers: &[usize]) {
        if self.sharing(cpu, peers) {
            spell.yielding = true;
            spell.budget = spell.budget.max(YIELD);
            self.make_room(cpu);
        }
    }

    /// Whether a peer among `peers` last waited on core `cpu` (this rank's) and is not
    /// asleep: it is queued behind this rank.
    fn sharing(&self, cpu: Option<usize>, peers: &[usize]) -> bool {
        cpu.is_some()
            && peers.iter().any(|&p| {
                self.index
                    .get(p)
                    .copied()
                    .flatten()
                    .is_some_and(|i| self.host.status(i).cpu() == cpu && !self.host.bell(i).armed())
            })
    }

    /// Whether a step waiting on `peers` should spin at all before it takes the slow path
    /// (the express lane's question).
    pub(crate) fn may_spin(&self, peers: &[usize]) -> bool {
        matches!(self.polling, Polling::Spin(_)) && !self.sharing(current_cpu(), peers)
    }

    /// One look that found nothing: pauses as the spell says, and returns whether to look
    /// again (`false`: time to sleep). `extra` lengthens the spell (bytes in flight that a
    /// peer is still copying).
    pub(crate) fn pause(&mut self, spell: &mut Spell, peers: &[usize], extra: Duration) -> bool {
        spell.looks += 1;
        if spell.yielding {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
            if !spell.looks.is_multiple_of(SPINS_PER_LOOK) {
                return true;
            }
            self.share_core(spell, current_cpu(), peers);
        }
        spell.since.elapsed() < spell.budget + extra
    }

    /// On a crowded host: if more of the host's ranks last waited on core `cpu` (this
    /// rank's) than their fair share of the cores this rank may use (rounded up), and this
    /// rank is not among the first that many there, moves it to the allowed core with the
    /// fewest of them, and lets it go again. Only while nothing but the host's awake ranks
    /// is runnable (`Memory::runnable`), tried at most once per [`MOVE_GAP`]; the look itself,
    /// every [`LOOK_GAP`] at most, makes no system call unless the rank is to move.
    /// Returns whether it moved.
    fn spread(&mut self, cpu: Option<usize>) -> bool {
        let Some(cpu) = cpu else { return false };
        let members = self.host.members();
        // Read where they are, not copied: this look runs every `LOOK_GAP` on a crowded host.
        let on_among =
            |c: usize, ranks: usize| (0..ranks).filter(|&i| self.host.status(i).cpu() == Some(c)).count();
        let on = |c: usize| on_among(c, members);
        let ahead = on_among(cpu, self.me.min(members));
        let fair = members.div_ceil(self.cores.max(1));
        if self.cores < 2 || ahead < fair || self.moved.is_some_and(|t| t.elapsed() < MOVE_GAP) {
            return false;
        }
        // What follows costs system calls (the mask, `/proc/loadavg`): tried once per gap
        // whether or not the rank moves, so that a rank kept in place by a busy system does
        // not pay them at every look.
        self.moved = Some(Instant::now());
        let Ok(allowed) = sched_getaffinity(None) else { return false };
        let Some(to) = (0..CpuSet::MAX_CPU).filter(|&c| allowed.is_set(c)).min_by_key(|&c| (on(c), c)) else {
            return false;
        };
        // Runnable threads beyond the host's ranks that are awake (a data loader, another
        // job, a CPU-bound process beside the job) are invisible in the ranks' statuses: the
        // scheduler places the ranks around them better than a count of ranks would.
        let awake = (0..members).filter(|&i| !self.host.bell(i).armed()).count();
        if on(to) + 1 > fair || (self.runnable)().is_none_or(|r| r > awake) {
            return false;
        }
        self.move_to(to, &allowed)
    }

    /// Migrates this thread to core `to`, then gives it back its mask `allowed` (which
    /// leaves it where it is), and publishes its new core.
    fn move_to(&self, to: usize, allowed: &CpuSet) -> bool {
        let mut only = CpuSet::new();
        only.set(to);
        // Setting the mask migrates the thread at once; restoring it leaves the thread where
        // it is. If the first call fails nothing moved; if the second fails the thread
        // stays bound to `to`, a core it was allowed, so either is harmless.
        let moved = sched_setaffinity(None, &only).is_ok();
        if moved {
            let _ = sched_setaffinity(None, allowed);
            self.host.status(self.me).set_cpu(Some(to));
        }
        moved
    }

    /// Moves this thread to a core that no rank of the host last waited on, if there is one
    /// it may use and the system has no more runnable threads than it may use cores
    /// (`Memory::runnable`), and lets it go again (the scheduler may place it anywhere later,
    /// as before). Only the higher-numbered rank of a pair moves, at most once per
    /// [`MOVE_GAP`].
    fn make_room(&mut self, cpu: Option<usize>) {
        let Some(cpu) = cpu else { return };
        if self.moved.is_some_and(|t| t.elapsed() < MOVE_GAP) {
            return;
        }
        let members = self.host.members();
        let statuses: Vec<Option<usize>> = (0..members).map(|i| self.host.status(i).cpu()).collect();
        // The lowest-numbered rank on this core stays.
        if statuses.iter().position(|&c| c == Some(cpu)).is_none_or(|first| first >= self.me) {
            return;
        }
        self.moved = Some(Instant::now());
        let Ok(allowed) = sched_getaffinity(None) else { return };
        // A core no rank uses may still be busy (a data loader, another job): moving there
        // would queue this rank behind it, and the scheduler would soon put it back.
        if allowed.count() < members as u32 || (self.runnable)().is_none_or(|r| r > allowed.count() as usize)
        {
            return;
        }
        let free = (0..CpuSet::MAX_CPU).find(|&c| allowed.is_set(c) && !statuses.contains(&Some(c)));
        let Some(free) = free else { return };
        self.move_to(free, &allowed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::local::LocalMesh;

    /// Member `me` of a fresh two-member mesh, polling as if every member had a core.
    fn member(me: usize) -> Memory {
        let mesh = LocalMesh::new(2);
        let mut m = Memory::new(mesh, me, vec![Some(0), Some(1)], Vec::new());
        m.polling = Polling::Spin(SPIN);
        m
    }

    /// Member `me` of a fresh mesh of `n`, polling as on a host with more ranks than cores,
    /// on a system where nothing else runs.
    fn crowded(me: usize, n: usize) -> Memory {
        let mut m = Memory::new(LocalMesh::new(n), me, (0..n).map(Some).collect(), Vec::new());
        m.polling = Polling::Yield(YIELD);
        m.runnable = || Some(1);
        m
    }

    /// Runs `f` on a thread bound to the core it starts on, and restores nothing: the thread
    /// ends with `f`.
    fn on_one_core<T: Send>(f: impl FnOnce(usize) -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                let cpu = current_cpu().expect("sched_getcpu");
                let mut only = CpuSet::new();
                only.set(cpu);
                sched_setaffinity(None, &only).expect("bind");
                f(cpu)
            })
            .join()
            .expect("thread")
        })
    }

    #[test]
    fn spins_while_the_peer_runs_elsewhere_and_yields_when_it_waits_here() {
        on_one_core(|cpu| {
            let mut m = member(0);
            m.host.status(1).set_cpu(Some(cpu + 1));
            let s = m.spell(&[1]);
            assert!(!s.yielding && s.budget == SPIN, "peer on another core: spin");
            assert_eq!(m.host.status(0).cpu(), Some(cpu), "the spell publishes this rank's core");
            m.host.status(1).set_cpu(Some(cpu));
            let s = m.spell(&[1]);
            assert!(s.yielding && s.budget >= YIELD, "peer queued on this core: yield");
            assert!(!m.may_spin(&[1]));
            let _ = m.host.bell(1).arm();
            assert!(m.may_spin(&[1]), "an asleep peer does not need this core");
            m.host.bell(1).disarm();
            m.host.status(1).set_cpu(None);
            assert!(m.may_spin(&[1]), "a peer whose core is unknown does not make a rank yield");
        });
    }

    #[test]
    fn a_crowded_host_always_yields() {
        let mut m = member(0);
        m.polling = Polling::Yield(YIELD);
        assert!(m.spell(&[1]).yielding);
        assert!(!m.may_spin(&[1]));
    }

    #[test]
    fn the_higher_rank_moves_to_a_free_core_and_is_not_left_bound() {
        let allowed = sched_getaffinity(None).expect("affinity");
        if allowed.count() < 2 {
            eprintln!("one core: nothing to move to");
            return;
        }
        // Rank 1 finds rank 0 on its core: it moves, and its old mask is back. The scheduler
        // may move the thread between the looks at its core: then try again.
        let moved = (0..100).find_map(|_| {
            let mut m = member(1);
            m.runnable = || Some(1);
            let here = current_cpu();
            m.host.status(0).set_cpu(here);
            let s = m.spell(&[0]);
            assert_eq!(sched_getaffinity(None).expect("affinity"), allowed, "the mask is back");
            let (to, now) = (m.host.status(1).cpu(), current_cpu());
            (s.yielding && to.is_some() && to != here && now == to).then_some(to)
        });
        assert!(moved.is_some(), "rank 1 moved to another core, and runs there");
        // A system with more runnable threads than cores: no move.
        let stayed = (0..100).find_map(|_| {
            let mut m = member(1);
            m.runnable = || Some(1000);
            let here = current_cpu();
            m.host.status(0).set_cpu(here);
            let s = m.spell(&[0]);
            s.yielding.then(|| m.host.status(1).cpu() == here)
        });
        assert_eq!(stayed, Some(true), "a busy system keeps the rank where it is");
        // The lower rank in the same place stays.
        on_one_core(|cpu| {
            let mut m = member(0);
            m.runnable = || Some(1);
            m.host.status(1).set_cpu(Some(cpu));
            m.spell(&[1]);
            assert_eq!(m.host.status(0).cpu(), Some(cpu), "the lower rank keeps its core");
        });
    }

    #[test]
    fn on_a_crowded_host_a_rank_beyond_its_cores_fair_share_moves_to_the_emptiest() {
        let allowed = sched_getaffinity(None).expect("affinity");
        let cores: Vec<usize> = (0..CpuSet::MAX_CPU).filter(|&c| allowed.is_set(c)).collect();
        if cores.len() != 2 {
            eprintln!("the case below is for two cores, this test has {}", cores.len());
            return;
        }
        // Four ranks, three of them (0, 1 and 2) last seen on one core: rank 2 moves to the
        // other one and runs there, its mask unchanged. The scheduler may move the thread
        // between the looks at its core: then try again.
        let moved = (0..100).find_map(|_| {
            let mut m = crowded(2, 4);
            let here = current_cpu()?;
            let other = cores.iter().copied().find(|&c| c != here)?;
            for (i, c) in [here, here, here, other].into_iter().enumerate() {
                m.host.status(i).set_cpu(Some(c));
            }
            assert!(m.spell(&[0]).yielding);
            assert_eq!(sched_getaffinity(None).expect("affinity"), allowed, "the mask is back");
            let now = current_cpu();
            (now == Some(other) && m.host.status(2).cpu() == Some(other)).then_some(other)
        });
        assert!(moved.is_some(), "rank 2 moved to the core with one rank");
        // Rank `me` on whatever core the scheduler has just put this thread, the others on
        // it where `here` says, else on the other core.
        let stays = |me: usize, here: [bool; 4], runnable: fn() -> Option<usize>| {
            let mut m = crowded(me, 4);
            m.runnable = runnable;
            // Rank 3 is asleep: four runnable threads are one more than the awake ranks.
            let _ = m.host.bell(3).arm();
            let (cpu, other) = (cores[0], cores[1]);
            for (i, on) in here.into_iter().enumerate() {
                m.host.status(i).set_cpu(Some(if on || i == me { cpu } else { other }));
            }
            !m.spread(Some(cpu))
        };
        let idle = || Some(3);
        assert!(stays(1, [true, true, false, false], idle), "two and two: the second on a core stays");
        assert!(stays(3, [false, false, true, true], idle), "two and two, on the other core");
        assert!(stays(1, [true, true, true, false], idle), "three and one: the first two stay");
        assert!(!stays(2, [true, true, true, false], idle), "three and one: the third moves");
        assert_eq!(sched_getaffinity(None).expect("affinity"), allowed, "the mask is back");
        assert!(stays(2, [true, true, true, false], || Some(4)), "something else runnable: it stays");
    }
}
