//! The simulator against closed forms worked by hand, on uncongested topologies (exactly),
//! and against contention (flows sharing links).

use xccl::CollKind;
use xccl::algo::tune::{CostModel, LinkCost};
use xccl::algo::{Algorithm, Shape};
use xccl_sim::engine::SEGMENT;
use xccl_sim::sweep::sweep;
use xccl_sim::{Call, Topology, simulate, simulate_calls};

/// No reduce or copy cost, `alpha` per message.
fn model(alpha: f64) -> CostModel {
    let mut costs = CostModel::default();
    costs.tcp.alpha = alpha;
    // 1.5 µs and 6 GB/s through a host's memory; reducing and copying cost nothing.
    costs.shm = LinkCost { alpha: 1.5e-6, beta: 1.0 / 6e9, gamma: 0.0, delta: 0.0 };
    costs
}

fn call(kind: CollKind, algo: Algorithm, shape: Shape) -> Call {
    Call { kind, algo, root: 0, shape, esize: 4 }
}

fn one_per_host(n: usize) -> Vec<usize> {
    (0..n).collect()
}

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-9 * want, "{what}: simulated {got:.9e}, closed form {want:.9e}");
}

#[test]
fn ring_all_reduce_on_a_ring_is_2_n_minus_1_alpha_plus_2_n_minus_1_over_n_s_over_b() {
    let (alpha, hop, bw) = (3e-6, 1e-6, 12.5e9);
    for n in [2, 5, 8, 16] {
        for count in [1024usize, 1 << 20, 3 << 20] {
            let s = 4.0 * count as f64;
            let t = simulate(
                &Topology::ring(n, bw, hop),
                &model(alpha),
                &one_per_host(n),
                &call(CollKind::AllReduce, Algorithm::Ring, Shape::Count(count)),
            )
            .unwrap()
            .time;
            // Blocks of count/n elements, the first count % n one larger: the largest sets the pace.
            let block = 4.0 * count.div_ceil(n) as f64;
            let steps = 2.0 * (n as f64 - 1.0);
            let want = steps * (alpha + hop + block / bw);
            if count % n == 0 {
                close(want, steps * (alpha + hop) + steps / n as f64 * s / bw, "the issue's form");
            }
            close(t, want, &format!("ring all-reduce n={n} S={s}"));
        }
    }
}

#[test]
fn recursive_doubling_on_a_hypercube_is_log_n_rounds_of_the_whole_buffer() {
    let (alpha, hop, bw) = (2e-6, 0.5e-6, 10e9);
    for dim in 1..=6u32 {
        let n = 1usize << dim;
        let count = 65536;
        let t = simulate(
            &Topology::hypercube(dim, bw, hop),
            &model(alpha),
            &one_per_host(n),
            &call(CollKind::AllReduce, Algorithm::RecursiveDoubling, Shape::Count(count)),
        )
        .unwrap()
        .time;
        close(
            t,
            f64::from(dim) * (alpha + hop + 4.0 * count as f64 / bw),
            &format!("recursive doubling n={n}"),
        );
    }
}

#[test]
fn binomial_broadcast_shares_the_senders_link_between_its_children() {
    // xccl's binomial tree sends to all of a rank's children at once, nearest first, so a
    // rank with c children feeds each at B/c. For n = 2^d behind one switch (two links of
    // latency `hop` per route) the last rank hears after the root's d children, its
    // farthest child's d-1, ..., one: sum over c of (hop·2 + c·S/B) = 2d·hop + d(d+1)/2·S/B.
    let (hop, bw) = (1e-6, 10e9);
    for d in 1..=5u32 {
        let n = 1usize << d;
        let count = 4096; // 16 KiB: below one segment, forwarded whole.
        let t = simulate(
            &Topology::star(n, bw, hop),
            &model(0.0),
            &one_per_host(n),
            &call(CollKind::Broadcast, Algorithm::Binomial, Shape::Count(count)),
        )
        .unwrap()
        .time;
        let dd = f64::from(d);
        close(
            t,
            2.0 * dd * hop + dd * (dd + 1.0) / 2.0 * 4.0 * count as f64 / bw,
            &format!("binomial n={n}"),
        );
    }
}

#[test]
fn a_pipelined_chain_pays_one_segment_per_hop_plus_the_message() {
    // Chain broadcast of S = 16 segments over 8 ranks in a ring: the last rank has it
    // (n-1)·(hop + seg/B) + (S - seg)/B after the start.
    let (hop, bw) = (1e-6, 10e9);
    let n = 8;
    let seg = SEGMENT;
    let count = (16.0 * seg / 4.0) as usize;
    let t = simulate(
        &Topology::ring(n, bw, hop),
        &model(0.0),
        &one_per_host(n),
        &call(CollKind::Broadcast, Algorithm::Chain, Shape::Count(count)),
    )
    .unwrap()
    .time;
    let s = 4.0 * count as f64;
    close(t, (n as f64 - 1.0) * (hop + seg / bw) + (s - seg) / bw, "chain broadcast");
}

#[test]
fn a_chain_in_a_loop_adds_one_message_time_per_call() {
    // Back to back, the root starts the next broadcast as soon as its send is out, while
    // the ranks down the chain still forward the last: the loop's links stay busy, and each
    // call adds S/B, not the single call's (n-1)·(hop + seg/B) + (S - seg)/B.
    let (hop, bw, n) = (1e-6, 10e9, 8);
    let count = (16.0 * SEGMENT / 4.0) as usize;
    let c = call(CollKind::Broadcast, Algorithm::Chain, Shape::Count(count));
    let run = |calls| {
        simulate_calls(&Topology::ring(n, bw, hop), &model(0.0), &one_per_host(n), &c, calls).unwrap().time
    };
    let s = 4.0 * count as f64;
    let one = (n as f64 - 1.0) * (hop + SEGMENT / bw) + (s - SEGMENT) / bw;
    close(run(1), one, "one call");
    for calls in [2, 5] {
        close(run(calls), one + (calls - 1) as f64 * s / bw, &format!("{calls} calls"));
    }
}

#[test]
fn a_root_folds_and_sends_back_segment_by_segment() {
    // reduce_broadcast on a star, a rank per host, nothing charged but the links: the
    // root's folds follow one another and its sends follow the last fold segment by
    // segment (the rule's Segments), so the results start down its link once the first
    // segment of every message is in, (n-1)·seg/B, and take (n-1)·S/B sharing it; the
    // whole exchange one way then the other would take 2(n-1)·S/B.
    let bw = 10e9;
    for n in [2usize, 3, 5] {
        let count = (8.0 * SEGMENT / 4.0) as usize;
        let t = simulate(
            &Topology::star(n, bw, 0.0),
            &model(0.0),
            &one_per_host(n),
            &call(CollKind::AllReduce, Algorithm::ReduceBroadcast, Shape::Count(count)),
        )
        .unwrap()
        .time;
        let s = 4.0 * count as f64;
        close(t, (n as f64 - 1.0) * (s + SEGMENT) / bw, &format!("reduce_broadcast n={n}"));
    }
}

#[test]
fn an_oversubscribed_fat_tree_halves_the_rate_across_leaves() {
    // Pairwise all-to-all on a leaf-spine of 4 leaves × 2 hosts: every round has a pair
    // across leaves, and with uplinks at half the host rate each such round takes twice as
    // long (no latency or per-message cost, so only bandwidth counts).
    let run = |over: f64| {
        let t = Topology::fat_tree(4, 2, over, 8, 10e9, 0.0).unwrap();
        simulate(
            &t,
            &model(0.0),
            &one_per_host(8),
            &call(CollKind::AllToAll, Algorithm::Pairwise, Shape::Count(8 << 16)),
        )
        .unwrap()
        .time
    };
    close(run(2.0), 2.0 * run(1.0), "oversubscription 2");
}

#[test]
fn two_senders_into_one_host_take_twice_as_long() {
    // Linear gather on a star: every rank sends its block to the root at once, and the
    // root's one link carries them all: (n-1)·S/B after the latency.
    let (hop, bw) = (1e-6, 10e9);
    let n = 3;
    let count = 1 << 18;
    let t = simulate(
        &Topology::star(n, bw, hop),
        &model(0.0),
        &one_per_host(n),
        &call(CollKind::Gather, Algorithm::Linear, Shape::Count(count)),
    );
    let t = t.unwrap().time;
    close(t, 2.0 * hop + 2.0 * (4.0 * count as f64) / bw, "two flows into one link");
}

#[test]
fn every_algorithm_of_every_collective_finishes_on_64_ranks() {
    let topo = Topology::fat_tree(8, 3, 2.0, 32, 12.5e9, 0.5e-6).unwrap();
    let placement: Vec<usize> = (0..64).map(|r| r / 2).collect();
    for kind in xccl::CollKind::COLLECTIVES.iter() {
        let rows = sweep(&topo, &CostModel::default(), &placement, *kind, None, &[4096, 1 << 22], 1);
        for row in rows {
            let out = row.outcome.unwrap_or_else(|e| panic!("{kind} by {}: {e}", row.algo));
            assert!(out.time > 0.0 || *kind == CollKind::Barrier, "{kind} by {} took no time", row.algo);
        }
    }
}

#[test]
fn rabenseifner_on_two_hosts_of_two_ranks_sends_the_buffer_once_each_way_between_them() {
    // Its halving rounds pair ranks 1 apart first (inside a host, half the buffer each),
    // then 2 apart (across, a quarter each): each host's link carries S/2 per direction in
    // the reduce-scatter and S/2 in the all-gather, so S/B in all, against the ring's 3S/2B
    // (and 2S/B for halving from the farthest partner first).
    let bw = 0.25e9;
    let count = 16usize << 20;
    let s = 4.0 * count as f64;
    let placement = vec![0, 0, 1, 1];
    let t = |algo| {
        simulate(
            &Topology::star(2, bw, 0.0),
            &model(0.0),
            &placement,
            &call(CollKind::AllReduce, algo, Shape::Count(count)),
        )
        .unwrap()
        .time
    };
    // Inside the hosts, two rounds in which both ranks of a host move S/2 through its memory
    // (6 GB/s, shared), 1.5 µs each.
    let inside = 2.0 * (1.5e-6 + s / 6e9);
    let rab = t(Algorithm::Rabenseifner);
    assert!(
        (rab - (s / bw + inside)).abs() <= 0.01 * rab,
        "rabenseifner {rab:.6} s, closed form {:.6}",
        s / bw + inside
    );
    assert!(
        rab < 0.75 * t(Algorithm::Ring),
        "rabenseifner {rab:.6} s against the ring's {:.6}",
        t(Algorithm::Ring)
    );
}

#[test]
fn a_host_memory_faster_than_the_clock_can_tell_still_finishes() {
    // A fitted tuning file once put shared memory at 3.1·10²¹ B/s (a constant its records
    // could not pin down): a segment's last bytes then took less than the clock can tell at
    // the time of day, and the probe for it was put back at the same instant forever. Every
    // all-reduce algorithm, 2 hosts × 2 ranks, must finish, and no faster than its link
    // between hosts allows.
    let mut costs = model(90e-6);
    costs.shm = LinkCost { alpha: 67.8e-6, beta: 1.0 / 3.1e21, gamma: 1.0 / 0.19e9, delta: 1.0 / 14e9 };
    let bw = 0.25e9;
    let (done, got) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let topo = Topology::star(2, bw, 0.0);
        let rows =
            sweep(&topo, &costs, &[0, 0, 1, 1], CollKind::AllReduce, None, &[1024, 1 << 20, 64 << 20], 1);
        let _ = done.send(rows);
    });
    let rows = got.recv_timeout(std::time::Duration::from_secs(120)).expect("the simulations finish");
    for row in rows {
        let out = row.outcome.unwrap_or_else(|e| panic!("{}: {e}", row.algo));
        // At least the bytes half the buffer needs to cross one link (any algorithm moves
        // that much between the hosts).
        assert!(out.time >= row.bytes as f64 / 2.0 / bw, "{} at {} B: {} s", row.algo, row.bytes, out.time);
    }
}
