//! Finding the silent rank when an operation times out.
//!
//! A rank that times out knows only whom it waits for. When one rank is stopped (SIGSTOP,
//! a debugger, a process stuck outside xccl), its neighbours wait for it, their neighbours
//! wait for them, and so on: most ranks would name a peer that is itself waiting. So a rank
//! that times out posts whom it waits for on a [`Board`] every rank of the job reaches (the
//! job's store, outside the links that stalled), then follows the others' posts: a rank that
//! posts is alive and waiting, and the chain ends at the ranks that post nothing, which are
//! the silent ones. Ranks time out within moments of one another (a stall spreads as fast
//! as the schedule runs), so a rank is given [`patience`] to post before it is called
//! silent. If everyone reached posts, no rank is silent: the ranks wait for one another.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Why a board did not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NoAnswer {
    /// What failed.
    pub why: String,
    /// The board's process has ended (it refused the connection): it is not stopped.
    pub ended: bool,
}

impl From<&str> for NoAnswer {
    fn from(why: &str) -> NoAnswer {
        NoAnswer { why: why.to_string(), ended: false }
    }
}

/// Where ranks that time out say whom they wait for, and read what the others said.
pub(crate) trait Board: Send + Sync + std::fmt::Debug {
    /// Says that `rank` waits for `peers` (within `patience`).
    fn post(&self, rank: usize, peers: &[usize], patience: Duration) -> Result<(), NoAnswer>;
    /// What `rank` posted, or `None` if it has posted nothing yet (within `patience`).
    fn peek(&self, rank: usize, patience: Duration) -> Result<Option<Vec<usize>>, NoAnswer>;
    /// The rank whose process serves the board, if one of this communicator's does: when
    /// the board does not answer, that rank's process is not running.
    fn server(&self) -> Option<usize>;
}

/// What following the posts found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// These ranks posted nothing within the patience; `waiting` posted and wait (in the
    /// chain that led there).
    Silent {
        /// The silent ranks.
        silent: Vec<usize>,
        /// The ranks met on the way that posted.
        waiting: Vec<usize>,
    },
    /// Every rank reached posted: they wait for one another (mismatched calls, or a
    /// deadlock in the program).
    Cycle {
        /// The ranks that wait for one another.
        waiting: Vec<usize>,
    },
    /// The board did not answer.
    Unreachable {
        /// The rank that serves the board, if a rank does (then that rank is not running).
        server: Option<usize>,
        /// What failed.
        why: String,
    },
}

impl Verdict {
    /// The ranks to blame, if any.
    pub fn silent(&self) -> Vec<usize> {
        match self {
            Verdict::Silent { silent, .. } => silent.clone(),
            Verdict::Unreachable { server: Some(s), .. } => vec![*s],
            _ => Vec::new(),
        }
    }

    /// The verdict in words, to follow a timeout's detail.
    pub fn describe(&self) -> String {
        match self {
            Verdict::Silent { silent, waiting } => {
                let who = list(silent);
                let (is, they, waits, them) = if silent.len() == 1 {
                    ("is", "it", "waits", "it")
                } else {
                    ("are", "they", "wait", "them")
                };
                if waiting.is_empty() {
                    format!(
                        "{who} {is} silent (stopped, or stuck outside xccl): {they} did not say whom {they} {waits} for"
                    )
                } else {
                    let wait = if waiting.len() == 1 { "waits" } else { "wait" };
                    format!(
                        "{who} {is} silent (stopped, or stuck outside xccl): {} {wait} for {them} in turn",
                        list(waiting)
                    )
                }
            }
            Verdict::Cycle { waiting } => format!(
                "no rank is silent: {} wait in turn, and so on around (a link too slow to make progress \
                 within XCCL_TIMEOUT, or ranks waiting for one another in a deadlock)",
                list(waiting)
            ),
            Verdict::Unreachable { server: Some(s), why } => format!(
                "rank {s} is silent: the job's store, which its process serves, does not answer either ({why})"
            ),
            Verdict::Unreachable { server: None, why } => {
                format!("could not ask the other ranks whom they wait for: {why}")
            }
        }
    }
}

fn list(ranks: &[usize]) -> String {
    let names: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
    match names.len() {
        1 => format!("rank {}", names[0]),
        _ => format!("ranks {}", names.join(", ")),
    }
}

/// How long a rank waits for the others to post, for an operation timeout of `timeout`.
pub(crate) fn patience(timeout: Duration) -> Duration {
    (timeout / 2).min(Duration::from_secs(3))
}

/// The pause between looks at the board.
const LOOK_EVERY: Duration = Duration::from_millis(25);

/// Posts that `me` waits for `waits_for`, then follows the posts of the ranks it waits for
/// (and of those they wait for) for at most `patience`.
pub(crate) fn find_silent(board: &dyn Board, me: usize, waits_for: &[usize], patience: Duration) -> Verdict {
    let deadline = Instant::now() + patience;
    let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    if let Err(e) = board.post(me, waits_for, left()) {
        // A board that does not answer is served by a stopped process; one that refuses, by
        // one that ended (and said why on its links).
        let server = board.server().filter(|&s| s != me && !e.ended);
        return Verdict::Unreachable { server, why: e.why };
    }
    // Every rank reached, and what it posted (`None`: nothing yet).
    let mut reached: BTreeMap<usize, Option<Vec<usize>>> = BTreeMap::new();
    reached.insert(me, Some(waits_for.to_vec()));
    for &r in waits_for {
        reached.entry(r).or_insert(None);
    }
    loop {
        let pending: Vec<usize> = reached.iter().filter(|(_, p)| p.is_none()).map(|(&r, _)| r).collect();
        if pending.is_empty() {
            let waiting = reached.keys().copied().filter(|&r| r != me).collect();
            return Verdict::Cycle { waiting };
        }
        // A board that took this rank's post and then fails went away (rank 0 serving it
        // ended, having found the answer first): what was read so far is the answer.
        let mut gone = false;
        for r in pending {
            match board.peek(r, left()) {
                Ok(Some(peers)) => {
                    for &q in &peers {
                        reached.entry(q).or_insert(None);
                    }
                    reached.insert(r, Some(peers));
                }
                Ok(None) => {}
                Err(_) => {
                    gone = true;
                    break;
                }
            }
        }
        if gone || Instant::now() >= deadline {
            let silent: Vec<usize> = reached.iter().filter(|(_, p)| p.is_none()).map(|(&r, _)| r).collect();
            if silent.is_empty() {
                continue;
            }
            let waiting = reached.iter().filter(|&(&r, p)| p.is_some() && r != me).map(|(&r, _)| r).collect();
            return Verdict::Silent { silent, waiting };
        }
        std::thread::sleep(LOOK_EVERY.min(left()));
    }
}

/// A post's value: the ranks, comma-separated.
pub(crate) fn encode(peers: &[usize]) -> Vec<u8> {
    peers.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(",").into_bytes()
}

/// A post read back; an error for anything but comma-separated ranks below `size`.
pub(crate) fn decode(bytes: &[u8], size: usize) -> Result<Vec<usize>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "a post that is not text".to_string())?;
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|f| match f.parse::<usize>() {
            Ok(r) if r < size => Ok(r),
            _ => Err(format!("a post naming '{f:.20}', not a rank below {size}")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A board in memory: each rank's post becomes visible at a given time after the start.
    #[derive(Debug)]
    struct Scripted {
        start: Instant,
        posts: Mutex<BTreeMap<usize, (Duration, Vec<usize>)>>,
        down: bool,
        ended: bool,
        server: Option<usize>,
    }

    impl Scripted {
        fn new(posts: &[(usize, u64, &[usize])]) -> Scripted {
            let posts =
                posts.iter().map(|&(r, ms, p)| (r, (Duration::from_millis(ms), p.to_vec()))).collect();
            Scripted {
                start: Instant::now(),
                posts: Mutex::new(posts),
                down: false,
                ended: false,
                server: None,
            }
        }
    }

    impl Board for Scripted {
        fn post(&self, rank: usize, peers: &[usize], _: Duration) -> Result<(), NoAnswer> {
            if self.down {
                return Err(NoAnswer { why: "no answer".into(), ended: self.ended });
            }
            self.posts.lock().unwrap().insert(rank, (Duration::ZERO, peers.to_vec()));
            Ok(())
        }
        fn peek(&self, rank: usize, _: Duration) -> Result<Option<Vec<usize>>, NoAnswer> {
            let posts = self.posts.lock().unwrap();
            Ok(posts.get(&rank).filter(|(at, _)| self.start.elapsed() >= *at).map(|(_, p)| p.clone()))
        }
        fn server(&self) -> Option<usize> {
            self.server
        }
    }

    const PATIENCE: Duration = Duration::from_millis(300);

    #[test]
    fn a_chain_of_waiting_ranks_leads_to_the_one_that_posts_nothing() {
        // 3 is stopped; 2 waits for 3, 1 for 2, 0 (this rank) for 1; 1 posts late.
        let board = Scripted::new(&[(2, 0, &[3]), (1, 100, &[2])]);
        let v = find_silent(&board, 0, &[1], PATIENCE);
        assert_eq!(v, Verdict::Silent { silent: vec![3], waiting: vec![1, 2] });
        assert_eq!(v.silent(), vec![3]);
        assert!(v.describe().starts_with("rank 3 is silent"), "{}", v.describe());
    }

    #[test]
    fn a_rank_that_waits_directly_names_the_silent_one() {
        let board = Scripted::new(&[(2, 0, &[3])]);
        let v = find_silent(&board, 1, &[3, 2], PATIENCE);
        assert_eq!(v, Verdict::Silent { silent: vec![3], waiting: vec![2] });
    }

    #[test]
    fn ranks_that_all_post_wait_for_one_another_and_nobody_is_blamed() {
        let board = Scripted::new(&[(1, 0, &[2]), (2, 50, &[0])]);
        let start = Instant::now();
        let v = find_silent(&board, 0, &[1], Duration::from_secs(5));
        assert_eq!(v, Verdict::Cycle { waiting: vec![1, 2] });
        assert!(v.silent().is_empty());
        // A cycle is known as soon as every post is in, without waiting out the patience.
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn a_rank_that_posts_too_late_is_called_silent_and_the_wait_is_bounded() {
        let board = Scripted::new(&[(1, 5_000, &[2])]);
        let start = Instant::now();
        let v = find_silent(&board, 0, &[1], PATIENCE);
        assert_eq!(v, Verdict::Silent { silent: vec![1], waiting: vec![] });
        assert!(start.elapsed() < PATIENCE + Duration::from_millis(200));
    }

    #[test]
    fn a_board_that_does_not_answer_blames_the_rank_serving_it() {
        let mut board = Scripted::new(&[]);
        board.down = true;
        board.server = Some(0);
        let v = find_silent(&board, 2, &[1], PATIENCE);
        assert_eq!(v.silent(), vec![0]);
        assert!(v.describe().contains("rank 0 is silent"), "{}", v.describe());
        // The server itself blames nobody for its own board.
        let v = find_silent(&board, 0, &[1], PATIENCE);
        assert!(v.silent().is_empty(), "{v:?}");
        // A board whose process ended (it refuses) blames nobody either: that rank said why
        // it failed on its links.
        board.ended = true;
        let v = find_silent(&board, 2, &[1], PATIENCE);
        assert!(v.silent().is_empty(), "{v:?}");
    }

    #[test]
    fn a_board_that_goes_away_after_the_post_leaves_what_was_read() {
        // 2 posted that it waits for 3; then the board's server ends (it found 3 first).
        #[derive(Debug)]
        struct Closing(Scripted);
        impl Board for Closing {
            fn post(&self, rank: usize, peers: &[usize], t: Duration) -> Result<(), NoAnswer> {
                self.0.post(rank, peers, t)
            }
            fn peek(&self, rank: usize, t: Duration) -> Result<Option<Vec<usize>>, NoAnswer> {
                if rank == 3 { Err("connection closed".into()) } else { self.0.peek(rank, t) }
            }
            fn server(&self) -> Option<usize> {
                Some(0)
            }
        }
        let board = Closing(Scripted::new(&[(2, 0, &[3])]));
        let start = Instant::now();
        let v = find_silent(&board, 1, &[2], Duration::from_secs(5));
        assert_eq!(v, Verdict::Silent { silent: vec![3], waiting: vec![2] });
        assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn posts_round_trip_and_garbage_is_refused() {
        assert_eq!(decode(&encode(&[3, 0, 12]), 13), Ok(vec![3, 0, 12]));
        assert_eq!(decode(&encode(&[]), 4), Ok(vec![]));
        assert!(decode(b"1,x", 4).is_err());
        assert!(decode(b"9", 4).is_err());
        assert!(decode(&[0xff], 4).is_err());
    }
}
