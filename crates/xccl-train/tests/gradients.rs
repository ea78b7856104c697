//! Every parameter of every model receives a gradient, and backward block by block gives
//! the gradients of one backward through the whole model.

mod common;

use std::collections::BTreeMap;

use candle_core::{DType, Tensor, Var};
use xccl_train::data::{Task, TaskConfig};
use xccl_train::model::{self, Graph, Model, ModelConfig, ModelKind};
use xccl_train::optim::OptimConfig;
use xccl_train::trace::Trace;

fn models() -> Vec<ModelConfig> {
    let gpt = common::tiny(OptimConfig::sgd(0.1), common::ddp(), 1, 1, 1).model;
    vec![
        gpt.clone(),
        ModelConfig { tied: false, ..gpt.clone() },
        ModelConfig { kind: ModelKind::Mlp, layers: 2, width: 32, tied: false, ..gpt },
    ]
}

/// Gradient of every parameter (by name, flattened) for one batch, block by block or whole.
fn gradients(model: &Model, task: &dyn Task, graph: Graph) -> BTreeMap<String, Vec<f32>> {
    let batch = task.batch(5, 0, 6);
    let (ids, targets, mask) = batch.tensors().unwrap();
    let mut trace = Trace::new("test", false);
    let fwd = model.forward(&ids, graph, &mut trace).unwrap();
    let loss = model::loss(fwd.logits(), &targets, &mask, batch.counted() as f64).unwrap();
    let mut grads: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    let mut order = Vec::new();
    model
        .backward(fwd, &loss, &mut trace, |k, g| {
            order.push(k);
            for (i, t) in g {
                let name = model.params().slots()[i].param.name().to_string();
                let v = t.tensor()?.flatten_all()?.to_vec1::<f32>()?;
                let acc = grads.entry(name).or_insert_with(|| vec![0.0; v.len()]);
                for (a, x) in acc.iter_mut().zip(v) {
                    *a += x;
                }
            }
            Ok(())
        })
        .unwrap();
    let n = model.blocks().len();
    assert_eq!(order, (0..n).rev().collect::<Vec<_>>(), "blocks must finish backward last first");
    grads
}

#[test]
fn every_parameter_gets_a_nonzero_gradient() {
    let task = TaskConfig::Sums { digits: 2 }.load().unwrap();
    for cfg in models() {
        let model = Model::new(&cfg, 3).unwrap();
        let grads = gradients(&model, task.as_ref(), Graph::Blockwise);
        assert_eq!(grads.len(), model.params().slots().len(), "{cfg}");
        for (name, g) in &grads {
            let norm: f32 = g.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!(norm > 0.0 && norm.is_finite(), "{cfg}: parameter {name} got gradient norm {norm}");
        }
    }
}

#[test]
fn blockwise_backward_equals_whole_model_backward() {
    let task = TaskConfig::Sums { digits: 2 }.load().unwrap();
    for cfg in models() {
        let model = Model::new(&cfg, 3).unwrap();
        let whole = gradients(&model, task.as_ref(), Graph::Whole);
        for graph in [Graph::Blockwise, Graph::Recompute] {
            let blockwise = gradients(&model, task.as_ref(), graph);
            assert_eq!(blockwise.keys().collect::<Vec<_>>(), whole.keys().collect::<Vec<_>>());
            for (name, b) in &blockwise {
                assert_close(b, &whole[name], &format!("{cfg} {graph:?}: {name}"));
            }
        }
    }
}

/// `|ours − reference| ≤ 1e-5·|reference|` (Euclidean norms).
fn assert_close(ours: &[f32], reference: &[f32], what: &str) {
    assert_eq!(ours.len(), reference.len(), "{what}: lengths");
    let diff: f32 = ours.iter().zip(reference).map(|(x, y)| (x - y).powi(2)).sum::<f32>().sqrt();
    let norm: f32 = reference.iter().map(|y| y * y).sum::<f32>().sqrt();
    assert!(diff <= 1e-5 * norm.max(1e-12), "{what}: |ours - reference| = {diff:e}, |reference| = {norm:e}");
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Each block's own backward (input half, then the deferred weight half) against candle's
/// autograd through the same block's `forward`, on every gradient: the input's and each
/// parameter's, for an output gradient that weights every element differently.
#[test]
fn every_blocks_backward_equals_candles_autograd() {
    let task = TaskConfig::Sums { digits: 2 }.load().unwrap();
    let batch = task.batch(5, 0, 6);
    let (ids, _, _) = batch.tensors().unwrap();
    for cfg in models() {
        let model = Model::new(&cfg, 3).unwrap();
        let mut x = ids.clone();
        for b in model.blocks() {
            let (y, saved) = b.forward_saved(&x).unwrap();
            let g = Tensor::from_vec(
                (0..y.elem_count()).map(|i| ((i * 7919) % 13) as f32 / 13.0 - 0.5).collect::<Vec<_>>(),
                y.dims(),
                y.device(),
            )
            .unwrap();
            // Reference: candle's autograd on a leaf input.
            let leaf = (x.dtype() == DType::F32).then(|| Var::from_tensor(&x).unwrap());
            let reference = b.forward(leaf.as_ref().map_or(&x, |v| v.as_tensor())).unwrap();
            assert_close(&values(&y), &values(&reference), &format!("{cfg}: {} forward", b.name()));
            let store = (reference * &g).unwrap().sum_all().unwrap().backward().unwrap();
            let (gx, deferred) = b.backward_input(saved, &g).unwrap();
            match (&leaf, gx) {
                (Some(v), Some(gx)) => {
                    let want = values(store.get(v.as_tensor()).unwrap());
                    assert_close(&values(&gx), &want, &format!("{cfg}: {} input", b.name()));
                }
                (None, None) => {}
                (l, gx) => panic!(
                    "{cfg}: {}: input is a variable: {}, gradient: {}",
                    b.name(),
                    l.is_some(),
                    gx.is_some()
                ),
            }
            let mut got: BTreeMap<String, Vec<f32>> = BTreeMap::new();
            for (p, t) in deferred.run().unwrap() {
                let v = values(&t.tensor().unwrap());
                let acc = got.entry(p.name().to_string()).or_insert_with(|| vec![0.0; v.len()]);
                acc.iter_mut().zip(v).for_each(|(a, x)| *a += x);
            }
            let used: Vec<_> = b.params().iter().chain(b.shared()).collect();
            assert_eq!(got.len(), used.len(), "{cfg}: {}: gradients for {:?}", b.name(), got.keys());
            for p in used {
                let want = values(store.get(&p.tensor()).unwrap());
                assert_close(&got[p.name()], &want, &format!("{cfg}: {} {}", b.name(), p.name()));
            }
            x = y;
        }
    }
}

#[test]
fn the_tied_head_adds_both_uses_of_the_embedding() {
    let task = TaskConfig::Sums { digits: 2 }.load().unwrap();
    let model = Model::new(&models()[0], 3).unwrap();
    let head = model.blocks().last().unwrap();
    assert_eq!(head.shared().len(), 1);
    assert_eq!(head.shared()[0].name(), "embed.tok");
    // The whole-graph gradient of the embedding differs from the embedding lookup's part
    // alone, so the head's part is really there (and the equality above includes it).
    let batch = task.batch(5, 0, 6);
    let (ids, targets, mask) = batch.tensors().unwrap();
    let mut trace = Trace::new("test", false);
    let fwd = model.forward(&ids, Graph::Blockwise, &mut trace).unwrap();
    let loss = model::loss(fwd.logits(), &targets, &mask, batch.counted() as f64).unwrap();
    let mut tok_parts = 0;
    model
        .backward(fwd, &loss, &mut trace, |_, g| {
            tok_parts +=
                g.iter().filter(|(i, _)| model.params().slots()[*i].param.name() == "embed.tok").count();
            Ok(())
        })
        .unwrap();
    assert_eq!(tok_parts, 2, "the embedding's gradient must come from the embedding and the head");
}
