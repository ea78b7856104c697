//! Tensor and sequence parallelism against the unsharded computation: each communication
//! op, each parallel layer and the whole GPT (logits, loss and every parameter's gradient)
//! on tp ∈ {1, 2, 3, 4} thread ranks equal the single-rank result to 1e-6, with and
//! without sequence parallelism, tied and untied head, and a vocabulary that does not
//! divide by tp (whose padding gets no probability and no gradient).

use candle_core::{Device, Tensor, Var};
use xccl::Communicator;
use xccl_train::model::block::{Init, Linear};
use xccl_train::model::{self, Graph, Model, ModelConfig, ModelKind};
use xccl_train::params::{Param, Shard};
use xccl_train::tp::{self, ColumnParallelLinear, RowParallelLinear, Tp, VocabParallelEmbedding};
use xccl_train::trace::Trace;

const TOL: f64 = 1e-6;

/// Runs `f(tp)` on `n` thread ranks of one tensor-parallel group.
fn on_ranks<T: Send>(n: usize, sp: bool, f: impl Fn(Tp) -> T + Sync) -> Vec<T> {
    let comms = Communicator::local(n).unwrap();
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(move || f(Tp::new(c, sp)))).collect();
        hs.into_iter().map(|h| h.join().expect("rank panicked")).collect()
    })
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// ‖a − b‖ / ‖b‖ (0 for two zero vectors).
fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let d: f64 = a.iter().zip(b).map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2)).sum();
    let n: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    if n == 0.0 { d.sqrt() } else { (d / n).sqrt() }
}

fn close(what: &str, a: &[f32], b: &[f32]) {
    let r = rel(a, b);
    assert!(r < TOL, "{what}: relative difference {r:e}");
}

fn input(shape: &[usize], seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0) - 1.0).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// A fixed weighting of an output, so that gradients are not all ones.
fn weigh(y: &Tensor) -> Tensor {
    (y * input(y.dims(), 99)).unwrap().sum_all().unwrap()
}

#[test]
fn communication_ops_match_their_definitions() {
    for n in 1..=4 {
        // Rank r's tensor differs per rank; shapes [2, 4n, 3].
        let results = on_ranks(n, true, |tp| {
            let r = tp.rank();
            let x = Var::from_tensor(&input(&[2, 4 * n, 3], r)).unwrap();
            let scattered = tp::comm::scatter_seq(&tp, x.as_tensor()).unwrap();
            let g = weigh(&scattered).backward().unwrap();
            let gx = values(g.get(x.as_tensor()).unwrap());
            let piece = Var::from_tensor(&input(&[2, 4, 3], r + 10)).unwrap();
            let gathered = tp::comm::gather_seq(&tp, piece.as_tensor()).unwrap();
            let g2 = weigh(&gathered).backward().unwrap();
            let reduced = tp::comm::reduce_from(&tp, &input(&[5], r)).unwrap();
            (
                values(&scattered),
                gx,
                values(&gathered),
                values(g2.get(piece.as_tensor()).unwrap()),
                values(&reduced),
            )
        });
        let sum: Tensor = (0..n).map(|r| input(&[2, 4 * n, 3], r)).reduce(|a, b| (a + b).unwrap()).unwrap();
        let pieces: Vec<Tensor> = (0..n).map(|r| input(&[2, 4, 3], r + 10)).collect();
        let gathered = Tensor::cat(&pieces, 1).unwrap();
        let w_scat = input(&[2, 4, 3], 99);
        let w_gath = input(&[2, 4 * n, 3], 99);
        for (r, (scattered, gx, gath, gpiece, reduced)) in results.iter().enumerate() {
            close("reduce-scatter forward", scattered, &values(&sum.narrow(1, 4 * r, 4).unwrap()));
            // Backward of a reduce-scatter: the all-gather of every rank's (equal) weights.
            close("reduce-scatter backward", gx, &values(&Tensor::cat(&vec![w_scat.clone(); n], 1).unwrap()));
            close("all-gather forward", gath, &values(&gathered));
            // Backward of an all-gather: the sum over ranks of their gradients, this rank's piece.
            let summed = (w_gath.clone() * n as f64).unwrap();
            close("all-gather backward", gpiece, &values(&summed.narrow(1, 4 * r, 4).unwrap()));
            let all: Tensor = (0..n).map(|q| input(&[5], q)).reduce(|a, b| (a + b).unwrap()).unwrap();
            close("all-reduce forward", reduced, &values(&all));
        }
    }
}

/// The unsharded value of every rank's piece of a parameter (pieces in rank order).
fn assemble(shard: Shard, full: &[usize], pieces: &[Vec<f32>]) -> Vec<f32> {
    let mut out = vec![0.0; full.iter().product()];
    for (r, p) in pieces.iter().enumerate() {
        shard.for_rank(r).place(full, p, &mut out);
    }
    out
}

#[test]
fn parallel_layers_match_the_plain_ones() {
    let (inputs, outputs, vocab) = (6, 12, 10);
    for n in 1..=4 {
        for sp in [false, true] {
            let ranks = on_ranks(n, sp, |tp| {
                let mut init = Init::new(5);
                let mut params: Vec<Param> = Vec::new();
                let col = ColumnParallelLinear::new(
                    &mut init,
                    &mut params,
                    "c",
                    (inputs, outputs),
                    0.3,
                    true,
                    1,
                    &tp,
                )
                .unwrap()
                .gather_output();
                let row =
                    RowParallelLinear::new(&mut init, &mut params, "r", (outputs, inputs), 0.3, &tp).unwrap();
                let emb = VocabParallelEmbedding::new(&mut init, &mut params, "e", (vocab, inputs), 0.3, &tp)
                    .unwrap();
                let ids = Tensor::from_vec(
                    (0..24u32).map(|i| (i * 3) % vocab as u32).collect(),
                    (2, 12),
                    &Device::Cpu,
                )
                .unwrap();
                // With sequence parallelism the column layer takes this rank's positions.
                let x = input(&[2, 12, inputs], 1);
                let x = if tp.sp() {
                    x.narrow(1, tp.rank() * 12 / tp.size(), 12 / tp.size()).unwrap()
                } else {
                    x
                };
                let x = Var::from_tensor(&x).unwrap();
                let hidden = col.forward(x.as_tensor()).unwrap();
                // The row layer takes this rank's features of the gathered output.
                let k = outputs / tp.size();
                let y = row.forward(&hidden.narrow(2, tp.rank() * k, k).unwrap()).unwrap();
                let e = emb.forward(&ids).unwrap();
                // Under sequence parallelism y and e are this rank's positions: weigh them as
                // the same positions of the whole are weighed.
                let weigh_mine = |t: &Tensor| {
                    let mut full = t.dims().to_vec();
                    full[1] = 12;
                    let w = input(&full, 99);
                    let w = if tp.sp() {
                        w.narrow(1, tp.rank() * 12 / tp.size(), 12 / tp.size()).unwrap()
                    } else {
                        w
                    };
                    (t * w).unwrap().sum_all().unwrap()
                };
                let grads = (weigh_mine(&y) + weigh_mine(&e)).unwrap().backward().unwrap();
                let gp: Vec<(Shard, Vec<usize>, Vec<f32>)> = params
                    .iter()
                    .map(|p| (p.shard(), p.full_shape().to_vec(), values(grads.get(&p.tensor()).unwrap())))
                    .collect();
                (values(&hidden), values(&y), values(&e), values(grads.get(x.as_tensor()).unwrap()), gp)
            });
            // The plain layers on the same draws.
            let mut init = Init::new(5);
            let cw = init.normal("c.weight".into(), &[outputs, inputs], 0.3).unwrap();
            let cb = init.constant("c.bias".into(), &[outputs], 0.0).unwrap();
            let rw = init.normal("r.weight".into(), &[inputs, outputs], 0.3).unwrap();
            let rb = init.constant("r.bias".into(), &[inputs], 0.0).unwrap();
            let ew = init.normal("e".into(), &[vocab, inputs], 0.3).unwrap();
            let x = Var::from_tensor(&input(&[2, 12, inputs], 1)).unwrap();
            let col = Linear::new(cw.clone(), Some(cb.clone()));
            let row = Linear::new(rw.clone(), Some(rb.clone()));
            let hidden = candle_core::Module::forward(&col, x.as_tensor()).unwrap();
            let y = candle_core::Module::forward(&row, &hidden).unwrap();
            let ids =
                Tensor::from_vec((0..24u32).map(|i| (i * 3) % vocab as u32).collect(), (2, 12), &Device::Cpu)
                    .unwrap();
            let e = ew
                .tensor()
                .index_select(&ids.flatten_all().unwrap(), 0)
                .unwrap()
                .reshape((2, 12, inputs))
                .unwrap();
            let grads = (weigh(&y) + weigh(&e)).unwrap().backward().unwrap();
            let expect_params = [&cw, &cb, &rw, &rb, &ew];
            let what = format!("tp {n}, sp {sp}");
            for (r, (hid, yr, er, gx, _)) in ranks.iter().enumerate() {
                close(&format!("column output ({what})"), hid, &values(&hidden));
                let (y_mine, e_mine, gx_mine) = if sp {
                    let m = |t: &Tensor| values(&t.narrow(1, r * 12 / n, 12 / n).unwrap());
                    (m(&y), m(&e), m(grads.get(x.as_tensor()).unwrap()))
                } else {
                    (values(&y), values(&e), values(grads.get(x.as_tensor()).unwrap()))
                };
                close(&format!("row output ({what})"), yr, &y_mine);
                close(&format!("embedding ({what})"), er, &e_mine);
                if !sp {
                    close(&format!("input gradient ({what})"), gx, &gx_mine);
                }
            }
            if sp {
                // Each rank has the gradient of its positions: together, the whole.
                let all: Vec<f32> = (0..2)
                    .flat_map(|b| {
                        ranks
                            .iter()
                            .flat_map(move |rk| rk.3[b * rk.3.len() / 2..(b + 1) * rk.3.len() / 2].to_vec())
                    })
                    .collect();
                close(&format!("input gradient ({what})"), &all, &values(grads.get(x.as_tensor()).unwrap()));
            }
            for (i, p) in expect_params.iter().enumerate() {
                let (shard, full, _) = &ranks[0].4[i];
                let pieces: Vec<Vec<f32>> = ranks.iter().map(|rk| rk.4[i].2.clone()).collect();
                let got = match shard {
                    // A replicated parameter under sequence parallelism: partial per rank.
                    Shard::Replicated if sp => {
                        (0..pieces[0].len()).map(|j| pieces.iter().map(|p| p[j]).sum()).collect()
                    }
                    _ => assemble(*shard, full, &pieces),
                };
                close(
                    &format!("gradient of {} ({what})", p.name()),
                    &got,
                    &values(grads.get(&p.tensor()).unwrap()),
                );
            }
        }
    }
}

fn gpt(vocab: usize, tied: bool) -> ModelConfig {
    ModelConfig { kind: ModelKind::Gpt, vocab, context: 12, width: 24, layers: 2, heads: 12, tied }
}

/// Forward, loss and backward of the whole GPT on one batch; returns the full logits, the
/// loss and every parameter's gradient as this rank holds it.
fn gpt_step(model: &Model, ids: &Tensor, targets: &Tensor, mask: &Tensor) -> (Vec<f32>, f32, Vec<Vec<f32>>) {
    let mut trace = Trace::new("test", false);
    let logits = values(&model.logits(ids).unwrap());
    let fwd = model.forward(ids, Graph::Blockwise, &mut trace).unwrap();
    let loss = model.loss(fwd.logits(), targets, mask, 17.0).unwrap();
    let mut grads = vec![Vec::new(); model.params().slots().len()];
    model
        .backward(fwd, &loss, &mut trace, |_, g| {
            for (i, t) in g {
                let v = values(&t.tensor().unwrap());
                if grads[i].is_empty() {
                    grads[i] = v;
                } else {
                    grads[i].iter_mut().zip(v).for_each(|(a, b)| *a += b);
                }
            }
            Ok(())
        })
        .unwrap();
    (logits, loss.to_scalar::<f32>().unwrap(), grads)
}

#[test]
fn the_sharded_gpt_matches_the_unsharded_one() {
    // 13 tokens: not divisible by 2, 3 or 4, so the vocabulary is padded.
    for (vocab, tied) in [(13, true), (13, false), (12, true)] {
        let cfg = gpt(vocab, tied);
        let (b, t) = (3, 12);
        let ids: Vec<u32> = (0..b * t).map(|i| ((i * 5 + 3) % vocab) as u32).collect();
        let tg: Vec<u32> = (0..b * t).map(|i| ((i * 7 + 1) % vocab) as u32).collect();
        let mk: Vec<f32> = (0..b * t).map(|i| if i % 3 == 0 { 0.0 } else { 1.0 }).collect();
        let ids = Tensor::from_vec(ids, (b, t), &Device::Cpu).unwrap();
        let targets = Tensor::from_vec(tg, (b, t), &Device::Cpu).unwrap();
        let mask = Tensor::from_vec(mk, (b, t), &Device::Cpu).unwrap();
        let single = Model::new(&cfg, 3).unwrap();
        let (logits, loss, grads) = gpt_step(&single, &ids, &targets, &mask);
        // The fused cross-entropy against candle's log-softmax and gather.
        let reference = model::loss(&single.logits(&ids).unwrap(), &targets, &mask, 17.0).unwrap();
        let r = reference.to_scalar::<f32>().unwrap();
        assert!((f64::from(loss - r) / f64::from(r)).abs() < TOL, "fused loss {loss}, candle's {r}");
        for n in 1..=4 {
            for sp in [false, true] {
                let what = format!("vocab {vocab}, tied {tied}, tp {n}, sp {sp}");
                let ranks = on_ranks(n, sp, |tp| {
                    let m = Model::with_tp(&cfg, 3, &tp).unwrap();
                    let out = gpt_step(&m, &ids, &targets, &mask);
                    let layout: Vec<(Shard, Vec<usize>)> = m
                        .params()
                        .slots()
                        .iter()
                        .map(|s| (s.param.shard(), s.param.full_shape().to_vec()))
                        .collect();
                    (out, layout, m.params().len())
                });
                for ((l, lo, _), _, _) in &ranks {
                    close(&format!("logits ({what})"), l, &logits);
                    assert!(
                        (f64::from(lo - loss) / f64::from(loss)).abs() < TOL,
                        "loss {lo} vs {loss} ({what})"
                    );
                }
                for (i, s) in single.params().slots().iter().enumerate() {
                    let (shard, full) = &ranks[0].1[i];
                    let pieces: Vec<Vec<f32>> = ranks.iter().map(|r| r.0.2[i].clone()).collect();
                    if let Shard::Split { .. } = shard {
                        // Padding rows (vocabulary past 13) get exactly no gradient.
                        let real = assemble(*shard, full, &pieces);
                        let held: usize = pieces.iter().map(Vec::len).sum();
                        let nonzero_total: f64 = pieces.iter().flatten().map(|v| f64::from(v.abs())).sum();
                        let nonzero_real: f64 = real.iter().map(|v| f64::from(v.abs())).sum();
                        assert!(
                            (nonzero_total - nonzero_real).abs() <= 1e-9 * nonzero_real,
                            "padding got gradient ({what})"
                        );
                        assert!(held >= real.len());
                        close(&format!("gradient of {} ({what})", s.param.name()), &real, &grads[i]);
                    } else {
                        for p in &pieces {
                            close(&format!("gradient of {} ({what})", s.param.name()), p, &grads[i]);
                        }
                    }
                }
                if n > 1 {
                    assert!(ranks[0].2 < single.params().len(), "a rank of {n} holds the whole model");
                }
            }
        }
    }
}

#[test]
fn sharded_initialisation_is_a_slice_of_the_unsharded_one() {
    let cfg = gpt(13, false);
    let single = Model::new(&cfg, 9).unwrap().params().read().unwrap();
    for n in [2, 3, 4] {
        let ranks = on_ranks(n, false, |tp| {
            let m = Model::with_tp(&cfg, 9, &tp).unwrap();
            let local = m.params().read().unwrap();
            tp.gather_full(m.params(), &local).unwrap()
        });
        for full in ranks {
            assert_eq!(full, single, "tp {n}: the pieces are not the unsharded parameters");
        }
    }
}

/// The activations a GPT forward keeps per rank (counted from what its blocks saved), with
/// and without sequence parallelism, against the count of the tensors each layer keeps:
/// per layer its input, both norms' outputs and the residual (`[b, s', h]` each, `s' = s`,
/// or `s / t` with sequence parallelism: Megatron-LM's saving), q, k, v, the attention's
/// output and the MLP's two activations (`12·b·s·h / t`), the attention weights
/// (`b·(a/t)·s²`); the head keeps its input and its norm's output (`2·b·s'·h`), the
/// embedding the token ids. Sequence parallelism must keep at most 0.82 of the rest
/// (Megatron-LM's analysis: 0.80 for t = 2, a = 8, s = 64, h = 512; the ratio depends on
/// a·s/h, the same here).
#[test]
fn sequence_parallelism_keeps_a_shard_of_each_layers_input() {
    let (b, s, h, a, l, t) = (2, 8, 64, 8, 2, 2);
    let cfg = ModelConfig {
        kind: ModelKind::Gpt,
        vocab: 16,
        context: s,
        width: h,
        layers: l,
        heads: a,
        tied: false,
    };
    let ids: Vec<u32> = (0..b * s).map(|i| (i * 5 % 16) as u32).collect();
    let ids = Tensor::from_vec(ids, (b, s), &Device::Cpu).unwrap();
    let counted = |sp: bool| {
        let bytes = on_ranks(t, sp, |tp| {
            let model = Model::with_tp(&cfg, 3, &tp).unwrap();
            model.forward(&ids, Graph::Blockwise, &mut Trace::new("test", false)).unwrap().saved_bytes()
        });
        assert!(bytes.iter().all(|&n| n == bytes[0]), "ranks keep the same: {bytes:?}");
        bytes[0]
    };
    let expect = |sp: bool| {
        let local = if sp { s / t } else { s };
        let layer = 4 * b * local * h + 12 * b * s * h / t + b * (a / t) * s * s;
        4 * (l * layer + 2 * b * local * h + b * s)
    };
    let (tp_only, with_sp) = (counted(false), counted(true));
    assert_eq!(tp_only, expect(false), "tensor parallelism alone");
    assert_eq!(with_sp, expect(true), "with sequence parallelism");
    let ratio = with_sp as f64 / tp_only as f64;
    assert!(ratio <= 0.82, "sequence parallelism keeps {ratio:.3} of tensor parallelism's activations");
}
