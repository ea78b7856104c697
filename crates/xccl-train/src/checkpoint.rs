//! Checkpoints: parameters, optimiser state and metadata in one safetensors file, written
//! atomically (a temporary file in the same directory, fsync, rename, fsync of the
//! directory), so a crash leaves either the previous checkpoint or the new one.
//!
//! Tensors are `param.<name>` and `optim.<state>.<name>` (e.g. `optim.m.h00.attn.qkv.weight`)
//! with the parameter's full shape, f32: a tensor-parallel run saves its shards gathered
//! into the full tensors, without the vocabulary's padding, so a checkpoint written at any
//! tensor-parallel size loads at any other. Metadata: the step, the optimiser's step count, the
//! configuration fingerprint (a resumed run must have the same one) and the loss history.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::error::{Error, Result};
use crate::optim::OptimConfig;
use crate::params::ParamSet;

/// The checkpoint file's name inside a run's output directory.
pub const FILE_NAME: &str = "checkpoint.safetensors";

const FORMAT: &str = "xccl-train checkpoint 1";

/// The training state after `step` steps.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// Steps done.
    pub step: u64,
    /// Describes everything that determines the training trajectory.
    pub fingerprint: String,
    /// Parameters, full (unsharded) and flat, in [`ParamSet`] order.
    pub params: Vec<f32>,
    /// The optimiser's state vectors (named by [`OptimConfig::state_names`]), full and flat.
    pub state: Vec<Vec<f32>>,
    /// `(step, global loss)` of every step so far.
    pub losses: Vec<(u64, f64)>,
}

fn bytes_of(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes `ck` to `path` atomically. `set`'s layout gives names and full shapes.
pub fn save(path: &Path, set: &ParamSet, optim: &OptimConfig, ck: &Checkpoint) -> Result<()> {
    let bad = |msg: String| Error::Checkpoint { path: path.to_path_buf(), msg };
    if ck.params.len() != set.full_len() || ck.state.len() != optim.state_names().len() {
        return Err(bad("the state does not match the model and optimizer".into()));
    }
    let mut named: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for e in set.layout().entries() {
        let (r, shape) = (e.range(), e.shape.clone());
        named.push((format!("param.{}", e.name), shape.clone(), bytes_of(&ck.params[r.clone()])));
        for (state, values) in optim.state_names().iter().zip(&ck.state) {
            let part =
                values.get(r.clone()).ok_or_else(|| bad(format!("optimizer state {state} is too short")))?;
            named.push((format!("optim.{state}.{}", e.name), shape.clone(), bytes_of(part)));
        }
    }
    let views = named
        .iter()
        .map(|(n, shape, data)| Ok((n.clone(), TensorView::new(Dtype::F32, shape.clone(), data)?)))
        .collect::<std::result::Result<Vec<_>, safetensors::SafeTensorError>>()
        .map_err(|e| bad(e.to_string()))?;
    let losses = serde_json::to_string(&ck.losses).map_err(|e| bad(e.to_string()))?;
    let meta = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("step".to_string(), ck.step.to_string()),
        ("fingerprint".to_string(), ck.fingerprint.clone()),
        ("losses".to_string(), losses),
    ]);
    let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| bad(e.to_string()))?;
    write_atomically(path, &bytes)
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io("cannot create", &tmp, e))?;
        f.write_all(bytes).map_err(|e| Error::io("cannot write", &tmp, e))?;
        f.sync_all().map_err(|e| Error::io("cannot sync", &tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io("cannot rename the new file onto", path, e))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    // Make the rename itself durable.
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("cannot sync directory", &dir, e))
}

/// Tensors by name: shape and f32 values.
pub type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// Every tensor of a safetensors file (f32 only) by name, with its shape, and the metadata.
pub fn read_tensors(path: &Path) -> Result<(Tensors, HashMap<String, String>)> {
    let bad = |msg: String| Error::Checkpoint { path: path.to_path_buf(), msg };
    let bytes = std::fs::read(path).map_err(|e| Error::io("cannot read", path, e))?;
    let (_, meta) =
        SafeTensors::read_metadata(&bytes).map_err(|e| bad(format!("not a safetensors file: {e}")))?;
    let meta = meta.metadata().clone().unwrap_or_default();
    let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("not a safetensors file: {e}")))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        if view.dtype() != Dtype::F32 {
            return Err(bad(format!("tensor {name} is {:?}, expected F32", view.dtype())));
        }
        let values =
            view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        out.insert(name, (view.shape().to_vec(), values));
    }
    Ok((out, meta))
}

/// Reads a checkpoint for parameters `set` (its whole model's layout) and optimiser `optim`:
/// full tensors, whatever the mesh that wrote it or that `set` belongs to.
pub fn load(path: &Path, set: &ParamSet, optim: &OptimConfig) -> Result<Checkpoint> {
    let bad = |msg: String| Error::Checkpoint { path: path.to_path_buf(), msg };
    let (mut tensors, meta) = read_tensors(path)?;
    let field = |k: &str| {
        meta.get(k).ok_or_else(|| bad(format!("metadata has no '{k}': not an xccl-train checkpoint")))
    };
    if field("format")? != FORMAT {
        return Err(bad(format!("format '{}' is not '{FORMAT}'", field("format")?)));
    }
    let number =
        |k: &str| field(k)?.parse::<u64>().map_err(|_| bad(format!("metadata '{k}' is not a number")));
    let mut take = |name: String, shape: &[usize]| {
        let (s, v) = tensors
            .remove(&name)
            .ok_or_else(|| bad(format!("no tensor {name}: it was written for another model or optimizer")))?;
        if s != shape {
            return Err(bad(format!("tensor {name} has shape {s:?}, the model needs {shape:?}")));
        }
        Ok(v)
    };
    let names = optim.state_names();
    let mut params = Vec::with_capacity(set.full_len());
    let mut state = vec![Vec::with_capacity(set.full_len()); names.len()];
    for e in set.layout().entries() {
        params.extend(take(format!("param.{}", e.name), &e.shape)?);
        for (n, v) in names.iter().zip(&mut state) {
            v.extend(take(format!("optim.{n}.{}", e.name), &e.shape)?);
        }
    }
    if let Some(extra) = tensors.keys().next() {
        return Err(bad(format!("unexpected tensor {extra}: it was written for another model or optimizer")));
    }
    let losses = serde_json::from_str(field("losses")?).map_err(|e| bad(format!("bad loss history: {e}")))?;
    Ok(Checkpoint {
        step: number("step")?,
        fingerprint: field("fingerprint")?.clone(),
        params,
        state,
        losses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Model, ModelConfig, ModelKind};

    #[test]
    fn round_trip_and_refusals() {
        let cfg = ModelConfig {
            kind: ModelKind::Gpt,
            vocab: 12,
            context: 8,
            width: 8,
            layers: 1,
            heads: 2,
            tied: true,
        };
        let model = Model::new(&cfg, 3).unwrap();
        let set = model.params();
        let optim = OptimConfig::adamw(1e-3);
        let ck = Checkpoint {
            step: 7,
            fingerprint: "fp".into(),
            params: set.read().unwrap(),
            state: vec![vec![0.5; set.len()], (0..set.len()).map(|i| i as f32).collect()],
            losses: vec![(0, 2.5), (1, 2.25)],
        };
        let dir = std::env::temp_dir().join(format!("xccl-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(FILE_NAME);
        save(&path, set, &optim, &ck).unwrap();
        assert_eq!(load(&path, set, &optim).unwrap(), ck);
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        let sgd = load(&path, set, &OptimConfig::sgd(0.1)).unwrap_err().to_string();
        assert!(sgd.contains("no tensor optim.momentum"), "{sgd}");
        let other = Model::new(&ModelConfig { width: 16, ..cfg }, 3).unwrap();
        let shape = load(&path, other.params(), &optim).unwrap_err().to_string();
        assert!(shape.contains("shape"), "{shape}");
        std::fs::write(&path, b"garbage").unwrap();
        assert!(load(&path, set, &optim).unwrap_err().to_string().contains("not a safetensors file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
