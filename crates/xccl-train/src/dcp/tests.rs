//! Tests of the distributed checkpoint: the overlap copy against an element-by-element
//! reference, resharding, collective saves on thread ranks (replacement, crashes, failures),
//! the background saver, the reader's refusals.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use xccl::{Communicator, Config};

use super::write::FAIL_WRITES;
use super::*;
use crate::Result;

/// A fresh directory for test `name`.
fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xccl-dcp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Runs `f` on `n` thread ranks (a short timeout: a hang fails the test).
fn on_ranks<T: Send>(n: usize, f: impl Fn(&Communicator) -> T + Sync) -> Vec<T> {
    let config = Config { timeout: Duration::from_secs(20), ..Config::default() };
    let comms = Communicator::local_with(n, config).expect("communicators");
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = comms.into_iter().map(|c| s.spawn(move || f(&c))).collect();
        handles.into_iter().map(|h| h.join().expect("rank panicked")).collect()
    })
}

/// The global tensor `name` of `shape`: element `i` (row-major) is `seed + i / 8`.
fn global(shape: &[usize], seed: f32) -> Vec<f32> {
    (0..shape.iter().product::<usize>()).map(|i| seed + i as f32 / 8.0).collect()
}

/// The multi-index of position `at` of box `lengths` (row-major).
fn unravel(lengths: &[usize], mut at: usize) -> Vec<usize> {
    let mut idx = vec![0; lengths.len()];
    for j in (0..lengths.len()).rev() {
        idx[j] = at % lengths[j];
        at /= lengths[j];
    }
    idx
}

/// The row-major position of `idx` in a box of `lengths`.
fn ravel(lengths: &[usize], idx: &[usize]) -> usize {
    idx.iter().zip(lengths).fold(0, |at, (i, l)| at * l + i)
}

/// `piece`'s values cut from the global tensor of `shape`, element by element.
fn cut(piece: &Piece, shape: &[usize], values: &[f32]) -> Vec<f32> {
    piece
        .flat
        .clone()
        .map(|at| {
            let local = unravel(&piece.lengths, at);
            let g: Vec<usize> = local.iter().zip(&piece.offsets).map(|(i, o)| i + o).collect();
            values[ravel(shape, &g)]
        })
        .collect()
}

/// The element-by-element reference of the overlap: `(position in a, position in b)`.
fn naive_overlap(a: &Piece, b: &Piece) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for at in a.flat.clone() {
        let g: Vec<usize> = unravel(&a.lengths, at).iter().zip(&a.offsets).map(|(i, o)| i + o).collect();
        let inside = g.iter().zip(b.offsets.iter().zip(&b.lengths)).all(|(&x, (&o, &l))| x >= o && x < o + l);
        if !inside {
            continue;
        }
        let local: Vec<usize> = g.iter().zip(&b.offsets).map(|(x, o)| x - o).collect();
        let pos = ravel(&b.lengths, &local);
        if b.flat.contains(&pos) {
            out.push((at - a.flat.start, pos - b.flat.start));
        }
    }
    out
}

/// A random piece of a tensor of `shape`: a random box (whole in some dimensions, often;
/// empty rarely), and a random flat range of it (the whole box, often).
fn random_piece(rng: &mut ChaCha8Rng, shape: &[usize]) -> Piece {
    let mut offsets = Vec::new();
    let mut lengths = Vec::new();
    for &n in shape {
        let (o, l) = match rng.random_range(0..10) {
            0..3 => (0, n),
            3 => {
                let o = rng.random_range(0..=n);
                (o, 0)
            }
            _ => {
                let o = rng.random_range(0..n);
                (o, rng.random_range(1..=n - o))
            }
        };
        offsets.push(o);
        lengths.push(l);
    }
    let piece = Piece::boxed("t", offsets, lengths);
    let n = piece.box_len();
    if rng.random_range(0..3) == 0 {
        return piece;
    }
    let s = rng.random_range(0..=n / 2);
    let e = rng.random_range(s..=n);
    piece.with_flat(s..e)
}

#[test]
fn overlap_matches_the_element_by_element_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut shared = 0;
    for case in 0..10_000 {
        let dims = rng.random_range(0..=3);
        let shape: Vec<usize> = (0..dims).map(|_| rng.random_range(1..=7)).collect();
        let a = random_piece(&mut rng, &shape);
        let b = random_piece(&mut rng, &shape);
        a.validate(&shape).expect("valid a");
        b.validate(&shape).expect("valid b");
        let mut runs = Vec::new();
        a.overlap(&b, |x, y, n| runs.push((x, y, n)));
        let fast: Vec<(usize, usize)> =
            runs.iter().flat_map(|&(x, y, n)| (0..n).map(move |t| (x + t, y + t))).collect();
        assert_eq!(fast, naive_overlap(&a, &b), "case {case}: shape {shape:?}, a {a}, b {b}, runs {runs:?}");
        assert!(runs.iter().all(|r| r.2 > 0), "case {case}: empty run");
        // The copy gives the values the global tensor has there.
        let values = global(&shape, 1.0);
        let src = cut(&a, &shape, &values);
        let mut dst = vec![f32::NAN; b.len()];
        let n = copy_overlap(&a, &src, &b, &mut dst).expect("copy");
        assert_eq!(n, fast.len());
        shared += usize::from(n > 0);
        let want = cut(&b, &shape, &values);
        for &(_, y) in &fast {
            assert_eq!(dst[y], want[y], "case {case}");
        }
    }
    assert!(shared > 2500, "only {shared} of 10000 cases share elements");
}

#[test]
fn overlap_merges_whole_trailing_dimensions_into_one_run() {
    let shape = [6, 4, 5];
    let rows = Piece::boxed("t", vec![1, 0, 0], vec![3, 4, 5]);
    let mut runs = Vec::new();
    Piece::whole("t", &shape).overlap(&rows, |a, b, n| runs.push((a, b, n)));
    assert_eq!(runs, [(20, 0, 60)]);
    let cols = Piece::boxed("t", vec![0, 0, 1], vec![6, 4, 2]);
    runs.clear();
    Piece::whole("t", &shape).overlap(&cols, |a, b, n| runs.push((a, b, n)));
    assert_eq!(runs.len(), 24, "one run per row of the last dimension");
    // A small flat range of a big box visits only its rows.
    let big = [1000, 1000];
    let shard = Piece::whole("t", &big).with_flat(500_010..500_020);
    let mut visited = 0;
    Piece::boxed("t", vec![0, 3], vec![1000, 500]).overlap(&shard, |_, _, _| visited += 1);
    assert_eq!(visited, 1);
}

#[test]
fn pieces_are_validated_against_the_shape() {
    let shape = [4, 6];
    assert!(Piece::whole("t", &shape).validate(&shape).is_ok());
    assert!(Piece::boxed("t", vec![2, 3], vec![2, 3]).with_flat(1..6).validate(&shape).is_ok());
    let past = Piece::boxed("t", vec![3, 0], vec![2, 6]).validate(&shape).unwrap_err();
    assert!(past.contains("runs past its shape") && past.contains("dimension 0"), "{past}");
    let flat = Piece::boxed("t", vec![0, 0], vec![2, 2]).with_flat(2..5).validate(&shape).unwrap_err();
    assert!(flat.contains("flat range runs past its box of 4"), "{flat}");
    let dims = Piece::boxed("t", vec![0], vec![4]).validate(&shape).unwrap_err();
    assert!(dims.contains("1 offsets and 1 lengths, not 2"), "{dims}");
    assert!(Piece::boxed("t", vec![usize::MAX, 0], vec![2, 1]).validate(&shape).is_err());
    assert!(Piece::whole("s", &[]).validate(&[]).is_ok());
    assert_eq!(Piece::whole("s", &[]).len(), 1);
}

/// Three ranks' pieces of tensors `a` `[7, 5]` and `b` `[10]`, cut tensor-parallel-like
/// (uneven boxes of `a` along dimension `dim`) and then ZeRO-like (each box's flat range
/// cut in two, unevenly, one half per "dp rank": ranks hold such halves of different boxes).
fn cut_snapshot(rank: usize, dim: usize, step: u64) -> Snapshot {
    let tensors = vec![("a".to_string(), vec![7, 5]), ("b".to_string(), vec![10]), ("s".to_string(), vec![])];
    let a = global(&[7, 5], 0.0);
    let b = global(&[10], 100.0);
    let bounds: &[usize] = if dim == 0 { &[0, 3, 4, 7] } else { &[0, 2, 5] };
    let mut boxes = Vec::new();
    for w in bounds.windows(2) {
        let mut offsets = vec![0, 0];
        let mut lengths = vec![7, 5];
        offsets[dim] = w[0];
        lengths[dim] = w[1] - w[0];
        let p = Piece::boxed("a", offsets, lengths);
        let half = p.box_len() / 3;
        boxes.push(p.clone().with_flat(0..half));
        boxes.push(p.clone().with_flat(half..p.box_len()));
    }
    let mut pieces: Vec<(Piece, Vec<f32>)> = boxes
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 3 == rank)
        .map(|(_, p)| {
            let v = cut(&p, &[7, 5], &a);
            (p, v)
        })
        .collect();
    // `b` replicated on every rank (written once), a scalar on rank 2 only.
    let whole = Piece::whole("b", &[10]);
    pieces.push((whole.clone(), b.clone()));
    if rank == 2 {
        pieces.push((Piece::whole("s", &[]), vec![42.0]));
    }
    let extra =
        BTreeMap::from([("mesh".to_string(), serde_json::json!({"dp": 3})), ("rank".into(), rank.into())]);
    Snapshot { step, tensors, pieces, extra }
}

fn save_on_ranks(n: usize, dir: &Path, snapshot: impl Fn(usize) -> Snapshot + Sync) -> Vec<Result<PathBuf>> {
    on_ranks(n, |c| save(c, dir, snapshot(c.rank())))
}

#[test]
fn a_checkpoint_cut_one_way_reads_back_cut_another() {
    for dim in [0, 1] {
        let dir = temp_dir(&format!("reshard-{dim}"));
        for r in save_on_ranks(3, &dir, |r| cut_snapshot(r, dim, 5)) {
            assert_eq!(r.expect("save"), dir.join("step-00000005"));
        }
        let reader = Reader::open(&dir).expect("open");
        assert_eq!(reader.step(), 5);
        assert_eq!(reader.extra()["mesh"], serde_json::json!({"dp": 3}));
        assert_eq!(reader.extra()["rank"], 0, "rank 0's extra is kept");
        assert_eq!(reader.tensors()[0], ("a".to_string(), vec![7, 5]));
        assert!(reader.has("b") && !reader.has("c"));
        let a = global(&[7, 5], 0.0);
        assert_eq!(reader.read(&Piece::whole("a", &[7, 5])).unwrap(), a);
        assert_eq!(reader.read(&Piece::whole("b", &[10])).unwrap(), global(&[10], 100.0));
        assert_eq!(reader.read(&Piece::whole("s", &[])).unwrap(), [42.0]);
        // Other boxes and flat ranges.
        let mut rng = ChaCha8Rng::seed_from_u64(dim as u64);
        for _ in 0..300 {
            let p = Piece { tensor: "a".into(), ..random_piece(&mut rng, &[7, 5]) };
            assert_eq!(reader.read(&p).unwrap(), cut(&p, &[7, 5], &a), "{p}");
        }
        // `b` was identical on every rank: only rank 0 wrote it.
        let meta = reader.metadata();
        let holders: Vec<usize> = meta
            .files
            .iter()
            .filter(|f| f.pieces.iter().any(|s| s.piece.tensor == "b"))
            .map(|f| f.rank)
            .collect();
        assert_eq!(holders, [0]);
        let err = reader.read(&Piece::whole("c", &[1])).unwrap_err().to_string();
        assert!(err.contains("has no tensor c"), "{err}");
        let err = reader.read(&Piece::boxed("a", vec![5, 0], vec![3, 5])).unwrap_err().to_string();
        assert!(err.contains("runs past its shape"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Every file under `dir` (relative name → bytes).
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

#[test]
fn saves_replace_each_other_with_identical_bytes() {
    let (one, two) = (temp_dir("bytes-1"), temp_dir("bytes-2"));
    save_on_ranks(3, &one, |r| cut_snapshot(r, 1, 3)).into_iter().for_each(|r| drop(r.unwrap()));
    save_on_ranks(3, &two, |r| cut_snapshot(r, 1, 3)).into_iter().for_each(|r| drop(r.unwrap()));
    let first = files(&one);
    assert_eq!(
        first.keys().cloned().collect::<Vec<_>>(),
        [
            "latest",
            "step-00000003/metadata.json",
            "step-00000003/rank-00000.safetensors",
            "step-00000003/rank-00001.safetensors",
            "step-00000003/rank-00002.safetensors"
        ]
    );
    assert_eq!(first, files(&two), "the same snapshots give the same bytes");
    assert_eq!(first["latest"], b"step-00000003\n");
    // The same step again: replaced, same bytes.
    save_on_ranks(3, &one, |r| cut_snapshot(r, 1, 3)).into_iter().for_each(|r| drop(r.unwrap()));
    assert_eq!(files(&one), first);
    // The same step with other values: replaced.
    save_on_ranks(3, &one, |r| {
        let mut s = cut_snapshot(r, 1, 3);
        s.pieces.iter_mut().for_each(|(_, v)| v.iter_mut().for_each(|x| *x += 1.0));
        s
    })
    .into_iter()
    .for_each(|r| drop(r.unwrap()));
    let reader = Reader::open(&one).unwrap();
    assert_eq!(reader.read(&Piece::whole("b", &[10])).unwrap(), global(&[10], 101.0));
    // A later step: the older directory goes.
    save_on_ranks(3, &one, |r| cut_snapshot(r, 0, 4)).into_iter().for_each(|r| drop(r.unwrap()));
    let names: Vec<String> = files(&one).into_keys().collect();
    assert!(names.iter().all(|n| n == "latest" || n.starts_with("step-00000004/")), "{names:?}");
    assert_eq!(Reader::open(&one).unwrap().step(), 4);
    // Reading a step directory directly works too.
    assert_eq!(Reader::open(&one.join("step-00000004")).unwrap().step(), 4);
    std::fs::remove_dir_all(&one).unwrap();
    std::fs::remove_dir_all(&two).unwrap();
}

#[test]
fn ranks_holding_only_replicated_copies_write_nothing() {
    let dir = temp_dir("replicated");
    let tensors = vec![("w".to_string(), vec![3, 4])];
    let w = global(&[3, 4], 5.0);
    let results = save_on_ranks(4, &dir, |_| Snapshot {
        step: 9,
        tensors: tensors.clone(),
        pieces: vec![(Piece::whole("w", &[3, 4]), w.clone())],
        extra: BTreeMap::new(),
    });
    results.into_iter().for_each(|r| drop(r.unwrap()));
    let names: Vec<String> = files(&dir).into_keys().collect();
    assert_eq!(names, ["latest", "step-00000009/metadata.json", "step-00000009/rank-00000.safetensors"]);
    let reader = Reader::open(&dir).unwrap();
    assert_eq!(reader.read(&Piece::whole("w", &[3, 4])).unwrap(), w);
    assert!(reader.extra().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tensor_parallel_shards_are_pieces_and_read_back_with_padding() {
    use crate::params::Shard;
    let dir = temp_dir("shards");
    // (full shape, split dimension, groups, parts): a padded vocabulary, a fused q/k/v,
    // columns with padding, a middle dimension, more parts than rows.
    let cases = [
        (vec![12, 4], 0, 1, 8),
        (vec![6, 5], 0, 3, 2),
        (vec![4, 9], 1, 1, 2),
        (vec![2, 7, 3], 1, 1, 3),
        (vec![3], 0, 1, 4),
    ];
    let mut snapshot = Snapshot { step: 1, ..Snapshot::default() };
    for (case, (full, dim, groups, parts)) in cases.iter().enumerate() {
        let name = format!("t{case}");
        let values = global(full, case as f32);
        snapshot.tensors.push((name.clone(), full.clone()));
        for index in 0..*parts {
            let shard = Shard::Split { dim: *dim, groups: *groups, parts: *parts, index };
            let local = shard.slice(full, &values);
            let pieces = shard_pieces(&name, full, shard, &local).unwrap();
            for (p, v) in &pieces {
                p.validate(full).unwrap();
                assert_eq!(v, &cut(p, full, &values), "case {case} rank {index}: {p}");
            }
            snapshot.pieces.extend(pieces);
        }
    }
    snapshot.tensors.push(("r".into(), vec![2, 2]));
    snapshot.pieces.extend(shard_pieces("r", &[2, 2], Shard::Replicated, &[1.0, 2.0, 3.0, 4.0]).unwrap());
    let snapshot = &snapshot;
    on_ranks(1, |c| save(c, &dir, snapshot.clone())).pop().unwrap().unwrap();
    let reader = Reader::open(&dir).unwrap();
    for (case, (full, dim, groups, parts)) in cases.iter().enumerate() {
        let values = global(full, case as f32);
        for index in 0..*parts {
            let shard = Shard::Split { dim: *dim, groups: *groups, parts: *parts, index };
            let local = read_shard(&reader, &format!("t{case}"), shard).unwrap();
            assert_eq!(local, shard.slice(full, &values), "case {case} rank {index}");
        }
    }
    assert_eq!(read_shard(&reader, "r", Shard::Replicated).unwrap(), [1.0, 2.0, 3.0, 4.0]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_step_directory_is_replaced_by_renames_where_it_cannot_be_exchanged() {
    let dir = temp_dir("renames");
    let (new, old) = (dir.join("step-00000001.partial"), dir.join("step-00000001"));
    std::fs::create_dir_all(&new).unwrap();
    std::fs::create_dir_all(&old).unwrap();
    std::fs::write(new.join("f"), b"new").unwrap();
    std::fs::write(old.join("f"), b"old").unwrap();
    super::write::install_by_renames(&new, &old).unwrap();
    assert_eq!(std::fs::read(old.join("f")).unwrap(), b"new");
    assert_eq!(std::fs::read(dir.join("step-00000001.replaced/f")).unwrap(), b"old");
    assert!(!new.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_crash_leaves_the_previous_checkpoint_and_the_next_save_cleans_up() {
    let dir = temp_dir("crash");
    save_on_ranks(3, &dir, |r| cut_snapshot(r, 0, 1)).into_iter().for_each(|r| drop(r.unwrap()));
    // A save of step 2 interrupted after the shard files were written.
    let partial = dir.join("step-00000002.partial");
    std::fs::create_dir(&partial).unwrap();
    std::fs::write(partial.join("rank-00000.safetensors"), b"half a file").unwrap();
    // One interrupted during the commit, metadata written, rename not done: also ignored.
    std::fs::copy(dir.join("step-00000001/metadata.json"), partial.join(METADATA)).unwrap();
    let reader = Reader::open(&dir).unwrap();
    assert_eq!(reader.step(), 1);
    assert_eq!(reader.read(&Piece::whole("a", &[7, 5])).unwrap(), global(&[7, 5], 0.0));
    save_on_ranks(3, &dir, |r| cut_snapshot(r, 0, 3)).into_iter().for_each(|r| drop(r.unwrap()));
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(names, ["latest", "step-00000003"]);
    // A stale partial of the very step being saved is replaced.
    std::fs::create_dir(dir.join("step-00000004.partial")).unwrap();
    std::fs::write(dir.join("step-00000004.partial/junk"), b"x").unwrap();
    save_on_ranks(3, &dir, |r| cut_snapshot(r, 0, 4)).into_iter().for_each(|r| drop(r.unwrap()));
    assert!(!dir.join("step-00000004/junk").exists());
    assert_eq!(Reader::open(&dir).unwrap().step(), 4);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failure_on_one_rank_fails_the_save_everywhere() {
    let dir = temp_dir("fail");
    save_on_ranks(3, &dir, |r| cut_snapshot(r, 0, 1)).into_iter().for_each(|r| drop(r.unwrap()));

    // Rank 1 cannot write its shard file.
    FAIL_WRITES.lock().unwrap().push((dir.clone(), 1));
    let results = save_on_ranks(3, &dir, |r| cut_snapshot(r, 0, 2));
    FAIL_WRITES.lock().unwrap().retain(|(d, _)| d != &dir);
    for (r, res) in results.iter().enumerate() {
        let err = res.as_ref().expect_err("the save must fail on every rank").to_string();
        if r == 1 {
            assert!(err.contains("injected failure"), "rank 1: {err}");
        } else {
            assert!(err.contains("rank 1: ") && err.contains("injected failure"), "rank {r}: {err}");
        }
    }
    assert!(!dir.join("step-00000002").exists() && !dir.join("step-00000002.partial").exists());
    assert_eq!(Reader::open(&dir).unwrap().step(), 1, "the previous checkpoint stays");

    // Rank 2's snapshot is inconsistent: nobody writes anything.
    let results = save_on_ranks(3, &dir, |r| {
        let mut s = cut_snapshot(r, 0, 2);
        if r == 2 {
            s.pieces[0].1.pop();
        }
        s
    });
    for (r, res) in results.iter().enumerate() {
        let err = res.as_ref().expect_err("must fail").to_string();
        assert!(err.contains("values for") && (r == 2 || err.contains("rank 2: ")), "rank {r}: {err}");
    }

    // Ranks disagree on the tensors, or leave an element out.
    let results = save_on_ranks(2, &dir, |r| {
        let mut s = cut_snapshot(r, 0, 2);
        if r == 1 {
            s.tensors[1].1 = vec![11];
            s.pieces.retain(|(p, _)| p.tensor != "b");
        }
        s
    });
    for res in &results {
        let err = res.as_ref().expect_err("must fail").to_string();
        assert!(err.contains("rank 1's list of tensors differs"), "{err}");
    }
    let results = save_on_ranks(2, &dir, |r| cut_snapshot(r, 0, 2));
    for res in &results {
        let err = res.as_ref().expect_err("a third of `a` is missing").to_string();
        assert!(err.contains("of tensor a (shape [7, 5]) is in no rank's pieces"), "{err}");
    }

    // Rank 0 cannot even create the directory.
    let file = dir.join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    for (r, res) in save_on_ranks(3, &file, |r| cut_snapshot(r, 0, 2)).iter().enumerate() {
        let err = res.as_ref().expect_err("must fail").to_string();
        assert!(err.contains("cannot create checkpoint directory"), "rank {r}: {err}");
        assert!(r == 0 || err.contains("rank 0 could not start the checkpoint"), "rank {r}: {err}");
    }
    assert_eq!(Reader::open(&dir).unwrap().step(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_saver_writes_in_the_background_and_reports_failures() {
    let dir = temp_dir("saver");
    let outcomes = on_ranks(3, |comm| -> Result<Vec<Option<PathBuf>>> {
        let mut saver = Saver::new(comm.dup_with(comm.config().clone())?);
        let mut done = Vec::new();
        saver.submit(&dir, cut_snapshot(comm.rank(), 1, 10))?;
        // Training goes on on the original communicator meanwhile.
        let mut x = [comm.rank() as u64];
        comm.all_reduce(&mut x, xccl::ReduceOp::Sum)?;
        assert_eq!(x[0], 3);
        saver.submit(&dir, cut_snapshot(comm.rank(), 0, 20))?;
        done.push(saver.wait()?);
        done.push(saver.wait()?);
        // A failed save is reported by the next submit, which then saves nothing.
        if comm.rank() == 0 {
            FAIL_WRITES.lock().unwrap().push((dir.clone(), 2));
        }
        comm.barrier()?;
        saver.submit(&dir, cut_snapshot(comm.rank(), 0, 30))?;
        let failed = saver.submit(&dir, cut_snapshot(comm.rank(), 0, 40));
        assert!(failed.unwrap_err().to_string().contains("injected failure"));
        assert_eq!(saver.wait()?, None);
        Ok(done)
    });
    FAIL_WRITES.lock().unwrap().retain(|(d, _)| d != &dir);
    for o in outcomes {
        assert_eq!(o.expect("saver"), [Some(dir.join("step-00000020")), None]);
    }
    assert_eq!(Reader::open(&dir).unwrap().step(), 20);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_reader_says_what_is_wrong() {
    let dir = temp_dir("refusals");
    let err = |d: &Path| Reader::open(d).unwrap_err().to_string();
    assert!(err(&dir).contains("does not exist"), "{}", err(&dir));
    std::fs::create_dir_all(&dir).unwrap();
    assert!(err(&dir).contains("no checkpoint here"), "{}", err(&dir));
    std::fs::write(dir.join(LATEST), "step-00000007\n").unwrap();
    assert!(err(&dir).contains("names step-00000007, which does not exist"), "{}", err(&dir));
    std::fs::write(dir.join(LATEST), "../elsewhere\n").unwrap();
    assert!(err(&dir).contains("not a step directory"), "{}", err(&dir));

    save_on_ranks(3, &dir, |r| cut_snapshot(r, 1, 7)).into_iter().for_each(|r| drop(r.unwrap()));
    let step = dir.join("step-00000007");
    let meta = std::fs::read_to_string(step.join(METADATA)).unwrap();
    std::fs::write(step.join(METADATA), "{not json").unwrap();
    assert!(err(&dir).contains("unreadable metadata"), "{}", err(&dir));
    std::fs::write(step.join(METADATA), meta.replace("\"version\":1", "\"version\":99")).unwrap();
    assert!(err(&dir).contains("format version 99; this build reads version 1"), "{}", err(&dir));
    std::fs::write(step.join(METADATA), meta.replace("xccl-dcp", "other")).unwrap();
    assert!(err(&dir).contains("not an xccl distributed checkpoint"), "{}", err(&dir));
    std::fs::write(step.join(METADATA), &meta).unwrap();
    let shard = step.join("rank-00001.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 4]).unwrap();
    assert!(err(&dir).contains("truncated or replaced"), "{}", err(&dir));
    std::fs::remove_file(&shard).unwrap();
    assert!(err(&dir).contains("rank-00001.safetensors: is missing"), "{}", err(&dir));
    std::fs::write(&shard, &bytes).unwrap();
    assert!(Reader::open(&dir).is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}
