//! The prediction's arithmetic against hand-computed cases.

use clap::Parser;

use super::*;
use crate::sim_train::measure::BlockTimes;
use crate::sim_train::spread::Spread;
use crate::train::TrainArgs;
use xccl::algo::tune::LinkCost;

#[derive(Parser)]
struct Wrap {
    #[command(flatten)]
    args: TrainArgs,
}

fn config(flags: &[&str]) -> TrainConfig {
    let mut argv = vec!["x", "--digits", "2", "--heads", "2", "--width", "16"];
    argv.extend_from_slice(flags);
    Wrap::try_parse_from(argv).unwrap().args.config().unwrap().1
}

/// `n` blocks of `f` forward and `b` backward seconds, `params` elements each, no tp.
fn profile(n: usize, f: f64, b: f64, params: usize) -> Profile {
    Profile {
        blocks: (0..n)
            .map(|k| BlockTimes {
                name: format!("b{k}"),
                fwd: f,
                bwd: b,
                out_elems: 1000,
                params,
                saved: 0,
                tp_fwd: vec![],
                tp_bwd: vec![],
                wait_fwd: 0.0,
                wait_bwd: 0.0,
            })
            .collect(),
        slots: (0..n).map(|k| (k, params)).collect(),
        optim_per_elem: 0.0,
        spread: Spread::default(),
        source: "test".into(),
    }
}

/// A network where messages are free.
fn free() -> (Topology, CostModel) {
    let mut costs = CostModel::default();
    costs.tcp.alpha = 0.0;
    costs.shm = LinkCost { alpha: 0.0, beta: 1e-30, gamma: 0.0, delta: 0.0 };
    (Topology::star(4, 1e30, 0.0), costs)
}

/// Messages between hosts cost only the links' time; 1.5 µs and 6 GB/s through a host's
/// memory; reducing and copying cost nothing.
fn links_only() -> CostModel {
    let mut costs = CostModel::default();
    costs.tcp.alpha = 0.0;
    costs.shm = LinkCost { alpha: 1.5e-6, beta: 1.0 / 6e9, gamma: 0.0, delta: 0.0 };
    costs
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

#[test]
fn gpipe_and_1f1b_bubble_is_the_closed_form_with_equal_stages_and_free_messages() {
    let (topo, costs) = free();
    let net = Net { topo: &topo, costs: &costs };
    for schedule in ["gpipe", "1f1b"] {
        for (p, m, layers) in [(2, 4, 4), (4, 8, 6), (2, 1, 2)] {
            let per = (layers + 2) / p;
            let balance = vec![per.to_string(); p].join(",");
            let (ps, ms) = (p.to_string(), m.to_string());
            let flags = [
                "--layers",
                &layers.to_string(),
                "--dp",
                "1",
                "--pp",
                &ps,
                "--micro-batches",
                &ms,
                "--batch",
                &ms,
                "--schedule",
                schedule,
                "--pp-balance",
                &balance,
            ];
            let cfg = config(&flags);
            let prof = profile(layers + 2, 1e-3, 2e-3, 100);
            let layout = Layout { dp: 1, pp: p, tp: 1, ranks_per_host: 1 };
            let pred = predict(&cfg, &prof, layout, &net, 1.0).unwrap();
            let stage = per as f64 * 3e-3;
            let expect = (m + p - 1) as f64 * stage;
            assert!(close(pred.step, expect, 1e-6), "{schedule} p={p} m={m}: {} vs {expect}", pred.step);
            let bubble = (p - 1) as f64 / (m + p - 1) as f64;
            assert!(close(pred.bubble / pred.step, bubble, 1e-6), "{schedule} p={p} m={m}: {}", pred.bubble);
            assert!(close(pred.compute, m as f64 * stage, 1e-6));
        }
    }
}

#[test]
fn zb_h1_splits_the_backward_evenly_and_leaves_a_third_of_the_bubble() {
    let (topo, costs) = free();
    let net = Net { topo: &topo, costs: &costs };
    // A block's backward (2 ms) is costed as two 1 ms halves: with a forward of 1 ms, a
    // stage's F, Bi and W take the same time, and ZB-H1's step is 3·m + p − 1 of them
    // (2·m + 2·p − 1 when m < p), 1F1B's 3·(m + p − 1).
    for (p, m, layers) in [(2, 4, 4), (4, 8, 6), (4, 4, 6), (2, 1, 2)] {
        let per = (layers + 2) / p;
        let balance = vec![per.to_string(); p].join(",");
        let (ps, ms, ls) = (p.to_string(), m.to_string(), layers.to_string());
        let flags = |schedule| {
            let f = ["--layers", &ls, "--dp", "1", "--pp", &ps, "--micro-batches", &ms, "--batch", &ms];
            let mut f = f.map(String::from).to_vec();
            f.extend(["--schedule", schedule, "--pp-balance", &balance].map(String::from));
            f
        };
        let prof = profile(layers + 2, 1e-3, 2e-3, 100);
        let layout = Layout { dp: 1, pp: p, tp: 1, ranks_per_host: 1 };
        let run = |schedule| {
            let f = flags(schedule);
            let f: Vec<&str> = f.iter().map(String::as_str).collect();
            predict(&config(&f), &prof, layout, &net, 1.0).unwrap()
        };
        let (zb, one) = (run("zb-h1"), run("1f1b"));
        let unit = per as f64 * 1e-3;
        let expect = (3 * m + p - 1 + p.saturating_sub(m)) as f64 * unit;
        assert!(close(zb.step, expect, 1e-6), "p={p} m={m}: {} vs {expect}", zb.step);
        assert!(close(zb.compute, 3.0 * m as f64 * unit, 1e-6), "p={p} m={m}: {}", zb.compute);
        assert!(close(one.step, 3.0 * (m + p - 1) as f64 * unit, 1e-6));
        if m >= p {
            assert!(close(3.0 * zb.bubble, one.bubble, 1e-6), "p={p} m={m}: {} {}", zb.bubble, one.bubble);
        }
    }
}

#[test]
fn ddp_overlaps_buckets_with_backward_and_one_bucket_does_not() {
    // Two ranks on two hosts of a star: 1 GB/s links, nothing else costs.
    let topo = Topology::star(2, 1e9, 0.0);
    let costs = links_only();
    let net = Net { topo: &topo, costs: &costs };
    let layout = Layout { dp: 2, pp: 1, tp: 1, ranks_per_host: 1 };
    // 4 blocks (2 layers) of 1 ms backward, 1 MiB of parameters each.
    let prof = profile(4, 0.5e-3, 1e-3, 1 << 18);
    let ar = |bytes: usize| {
        let mut sim = Sim { net: &net, layout, cache: HashMap::new(), tally: BTreeMap::new() };
        sim.time("dp", CollKind::AllReduce, &[0, 1], bytes, 1).unwrap()
    };
    let compute = 4.0 * 1.5e-3;
    // One bucket of everything: it starts when backward ends.
    let one = predict(
        &config(&["--layers", "2", "--bucket-mb", "64", "--first-bucket-mb", "64"]),
        &prof,
        layout,
        &net,
        1.0,
    )
    .unwrap();
    let expect = compute + ar(4 << 20) + ar(8);
    assert!(close(one.step, expect, 1e-9), "{} vs {expect}", one.step);
    // A bucket per block: each starts as its block's backward ends, so all but the last
    // hide behind backward when a bucket takes less than a block's backward, and the step
    // is max(compute, stream) = compute + one bucket.
    let per = predict(
        &config(&["--layers", "2", "--bucket-mb", "1", "--first-bucket-mb", "1"]),
        &prof,
        layout,
        &net,
        1.0,
    )
    .unwrap();
    let bucket = ar(1 << 20);
    let ready: Vec<f64> = (1..=4).map(|i| 2e-3 + i as f64 * 1e-3).collect();
    let stream = timeline::stream(&ready, &[bucket; 4]);
    let expect = compute.max(stream) + ar(8);
    assert!(close(per.step, expect, 1e-9), "{} vs {expect}", per.step);
    assert!(per.step < one.step);
    assert!(close(per.exposed + per.compute, per.step, 1e-9));
    let row = per.colls.iter().find(|r| r.bytes == 1 << 20).unwrap();
    assert_eq!((row.group, row.count), ("dp", 4));
}

#[test]
fn zero_stages_communicate_more_than_ddp_never_less() {
    let topo = Topology::star(2, 1e9, 0.0);
    let costs = links_only();
    let net = Net { topo: &topo, costs: &costs };
    let layout = Layout { dp: 2, pp: 1, tp: 1, ranks_per_host: 1 };
    let prof = profile(4, 0.5e-3, 1e-3, 1 << 18);
    let step = |f: &[&str]| predict(&config(f), &prof, layout, &net, 1.0).unwrap();
    let z1 = step(&["--layers", "2", "--zero", "1"]);
    let z3 = step(&["--layers", "2", "--zero", "3"]);
    let again = step(&["--layers", "2", "--zero", "3", "--recompute"]);
    assert!(z1.step >= 6e-3, "{}", z1.step);
    // ZeRO-3 computes what DDP does, and with recomputation runs forwards again in backward
    // (3 of the 4 blocks: the last keeps its parameters to its backward); it gathers twice.
    assert!(close(z3.compute, 6e-3, 1e-9), "{}", z3.compute);
    assert!(close(again.compute, 6e-3 + 3.0 * 0.5e-3, 1e-9), "{}", again.compute);
    let gathers =
        |p: &Prediction| p.colls.iter().filter(|r| r.kind == "all_gather").map(|r| r.count).sum::<usize>();
    assert_eq!((gathers(&z3), gathers(&again)), (7, 7));
}

/// Ranks that computed unevenly stretch the step by the wait for the slowest: with free
/// messages, DDP's step is its compute times the spread's factor for the job's ranks, and
/// a job of one rank waits for nobody.
#[test]
fn uneven_ranks_stretch_compute_by_the_wait_for_the_slowest() {
    let (topo, costs) = free();
    let net = Net { topo: &topo, costs: &costs };
    let mut prof = profile(4, 0.5e-3, 1e-3, 1 << 10);
    let even = prof.clone();
    // Two ranks measured at once, one of them 20% slower in every other iteration.
    let a = vec![1.0; 10];
    let b: Vec<f64> = (0..10).map(|i| if i % 2 == 0 { 1.2 } else { 1.0 }).collect();
    prof.spread = Spread::from_iterations(&[a, b]);
    let factor = prof.spread.wait_factor(2);
    assert!(factor > 1.0 && factor <= 1.2, "{factor}");
    let step = |f: &[&str], layout: Layout, p: &Profile| predict(&config(f), p, layout, &net, 1.0).unwrap();
    let two = Layout { dp: 2, pp: 1, tp: 1, ranks_per_host: 2 };
    let flags = ["--layers", "2"];
    let (base, slow) = (step(&flags, two, &even), step(&flags, two, &prof));
    assert!(close(slow.compute, base.compute * factor, 1e-9), "{} {}", slow.compute, base.compute);
    assert!(close(slow.step, base.step * factor, 1e-6), "{} {}", slow.step, base.step);
    let one = Layout { dp: 1, pp: 1, tp: 1, ranks_per_host: 1 };
    let flags = ["--layers", "2", "--dp", "1"];
    assert_eq!(step(&flags, one, &prof).step, step(&flags, one, &even).step);
}

/// A tensor-parallel group's wait for its slowest rank inside a block's operations lies on
/// the critical path: with free messages, each micro-batch adds every block's waits to the
/// step, counted as tensor-parallel time.
#[test]
fn tensor_parallel_waits_add_to_the_step_once_per_block_and_micro_batch() {
    let (topo, costs) = free();
    let net = Net { topo: &topo, costs: &costs };
    let layout = Layout { dp: 1, pp: 1, tp: 2, ranks_per_host: 2 };
    let cfg = config(&["--layers", "2", "--dp", "1", "--tp", "2", "--accum", "2"]);
    let even = profile(4, 0.5e-3, 1e-3, 1 << 10);
    let mut uneven = even.clone();
    for b in &mut uneven.blocks {
        (b.wait_fwd, b.wait_bwd) = (20e-6, 50e-6);
    }
    let (a, b) = (
        predict(&cfg, &even, layout, &net, 1.0).unwrap(),
        predict(&cfg, &uneven, layout, &net, 1.0).unwrap(),
    );
    let waits = 2.0 * 4.0 * 70e-6;
    assert!(close(b.tp_comm - a.tp_comm, waits, 1e-9), "{} {}", b.tp_comm, a.tp_comm);
    assert!(close(b.step - a.step, waits, 1e-6), "{} {}", b.step, a.step);
    assert_eq!(a.compute, b.compute);
}

/// With free messages a GPipe stage computes m of its m + p − 1 slots whatever the slowdown,
/// so on crowded hosts the ranks computing at a time crowd the cores `crowd · m / (m + p − 1)`
/// times (never below 1): the slowdown and the step in closed form.
#[test]
fn crowded_cores_slow_compute_by_the_ranks_computing_at_a_time() {
    let (topo, costs) = free();
    let net = Net { topo: &topo, costs: &costs };
    let (p, layers) = (2, 4);
    let per = (layers + 2) / p;
    let balance = vec![per.to_string(); p].join(",");
    for (m, crowd) in [(4usize, 2.0f64), (4, 1.0), (1, 2.0), (8, 3.0)] {
        let ms = m.to_string();
        let cfg = config(&[
            "--layers",
            "4",
            "--dp",
            "1",
            "--pp",
            "2",
            "--micro-batches",
            &ms,
            "--batch",
            &ms,
            "--schedule",
            "gpipe",
            "--pp-balance",
            &balance,
        ]);
        let prof = profile(layers + 2, 1e-3, 2e-3, 100);
        let layout = Layout { dp: 1, pp: p, tp: 1, ranks_per_host: 1 };
        let (pred, s) = predict_crowded(&cfg, &prof, layout, &net, crowd).unwrap();
        let want = (crowd * m as f64 / (m + p - 1) as f64).max(1.0);
        assert!(close(s, want, 1e-3), "m={m} crowd={crowd}: slowdown {s}, closed form {want}");
        let stage = per as f64 * 3e-3;
        assert!(
            close(pred.step, (m + p - 1) as f64 * stage * want, 1e-3),
            "m={m} crowd={crowd}: {}",
            pred.step
        );
    }
}
