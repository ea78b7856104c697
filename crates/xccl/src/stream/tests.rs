//! The stream's order under threads that issue at once: blocking calls that run inline and
//! queued ones take turns on the backend, one at a time, in the order of their numbers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::coll::CollKind;
use crate::dtype::DType;
use crate::exec::P2pFeed;
use crate::flight::FlightConfig;
use crate::frame::OpDesc;

/// A backend that notes the numbers it runs and fails if two runs overlap.
struct Notes {
    ran: Arc<Mutex<Vec<u64>>>,
    inside: AtomicBool,
}

struct Tick;

impl Task for Tick {
    fn name(&self, seq: u64) -> String {
        format!("tick #{seq}")
    }
    fn span(&self) -> SpanOp {
        SpanOp::Collective { kind: CollKind::Barrier, dtype: DType::U8, count: 0 }
    }
    fn bytes(&self) -> usize {
        0
    }
    fn flight(&self, _seq: u64) -> Option<(OpDesc, usize)> {
        None
    }
}

impl Backend for Notes {
    type Task = Tick;
    const THREAD: &'static str = "xccl-test";

    fn run(&mut self, _task: &Tick, seq: u64) -> Result<()> {
        assert!(!self.inside.swap(true, Ordering::SeqCst), "two operations ran at once");
        self.ran.lock().unwrap().push(seq);
        for _ in 0..50 {
            std::hint::spin_loop();
        }
        self.inside.store(false, Ordering::SeqCst);
        Ok(())
    }
    fn p2p(&mut self, _feed: &mut dyn P2pFeed) -> Result<()> {
        Ok(())
    }
    fn dead(&self) -> Option<&Error> {
        None
    }
    fn fail(&mut self, _error: Error) {}
    fn close(&mut self, _farewell: Farewell) {}
    fn signals(&self) -> Option<Signals> {
        None
    }
}

#[test]
fn inline_and_queued_operations_take_turns_in_the_order_of_their_numbers() {
    let ran = Arc::new(Mutex::new(Vec::new()));
    let backend = Notes { ran: ran.clone(), inside: AtomicBool::new(false) };
    let cfg = FlightConfig { records: 0, dir: std::env::temp_dir() };
    let stream = Stream::start(0, backend, Recorder::new(cfg, 0, 1, 0)).unwrap();
    let (threads, each) = (4, 3000);
    let seqs: Vec<Vec<u64>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let stream = &stream;
                s.spawn(move || {
                    let mut mine = Vec::new();
                    let mut pending = Vec::new();
                    for i in 0..each {
                        if (i + t) % 3 == 0 {
                            let done = Arc::new(Completion::default());
                            mine.push(stream.submit(|seq| JobOp::Task { task: Tick, seq }, done.clone()));
                            pending.push(done);
                        } else {
                            let (seq, result) = stream.run(|seq| JobOp::Task { task: Tick, seq });
                            result.unwrap();
                            mine.push(seq);
                        }
                        if i % 7 == 0 {
                            stream.run_unsequenced(JobOp::Marker).unwrap();
                        }
                    }
                    for d in pending {
                        d.wait_result().unwrap();
                    }
                    mine
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let total = (threads * each) as u64;
    // Each thread's numbers rise, and together they are every number once.
    let mut all: Vec<u64> = seqs.iter().flatten().copied().collect();
    assert!(seqs.iter().all(|m| m.windows(2).all(|w| w[0] < w[1])));
    all.sort_unstable();
    assert_eq!(all, (0..total).collect::<Vec<_>>());
    // The backend ran them one at a time, in that order.
    drop(stream);
    assert_eq!(*ran.lock().unwrap(), (0..total).collect::<Vec<_>>());
}
