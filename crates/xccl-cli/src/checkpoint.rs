//! `xccl checkpoint info|export|import`: looks into a distributed checkpoint
//! ([`xccl_train::dcp`]), exports its parameters as one safetensors file, or imports one as
//! a checkpoint.
//!
//! Names: a checkpoint's tensor `param.<name>` is the parameter `<name>` (e.g.
//! `param.h00.attn.qkv.weight` is `h00.attn.qkv.weight`); the optimiser's state
//! (`optim.<state>.<name>`) is not exported. `export` writes every `param.<name>` whole
//! under `<name>`, `f32`, sorted by name, without `__metadata__`, so the same checkpoint
//! always gives the same bytes, loadable by `safetensors.torch.load_file` or
//! `safetensors.numpy.load_file`. `import` does the reverse: each `f32` tensor `<name>` of
//! the file becomes `param.<name>` of a checkpoint at step 0 with the `extra` entry
//! `origin` = `"import of FILE"`, without optimiser state or fingerprint.
//!
//! Exit status: 0 on success, 2 when the input cannot be used (no checkpoint, not a
//! safetensors file, a tensor that is not `f32`, an occupied target), 1 when the output
//! cannot be written.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use xccl::Communicator;
use xccl_train::dcp::{self, Piece, Reader, Snapshot};

/// Arguments of `xccl checkpoint`.
#[derive(clap::Args, Debug)]
pub struct CheckpointArgs {
    #[command(subcommand)]
    command: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// Print a checkpoint's step, extra entries (mesh, fingerprint, ...), tensors with their
    /// shapes and sizes, and files with their pieces.
    Info {
        /// The checkpoint directory (the step `latest` names is read), or a step directory.
        dir: PathBuf,
        /// List every piece of every file.
        #[arg(long)]
        pieces: bool,
    },
    /// Write the parameters of a checkpoint to one safetensors file.
    ///
    /// Each tensor `param.<name>` of the checkpoint is written whole under `<name>` (e.g.
    /// `param.h00.attn.qkv.weight` as `h00.attn.qkv.weight`), f32, sorted by name, without
    /// `__metadata__`: the same checkpoint always gives the same bytes. The optimiser state
    /// (`optim.<state>.<name>`) is left out. Load the file with
    /// `safetensors.torch.load_file` or `safetensors.numpy.load_file`.
    Export {
        /// The checkpoint directory (the step `latest` names is read), or a step directory.
        dir: PathBuf,
        /// The safetensors file to write.
        out: PathBuf,
    },
    /// Make a checkpoint at step 0 from a safetensors file of parameters.
    ///
    /// Each tensor `<name>` of the file (f32 only: convert others first) becomes the
    /// checkpoint's `param.<name>`, with the `extra` entry `origin` = "import of FILE" and
    /// no optimiser state or fingerprint: a starting point for training. DIR must not hold
    /// a checkpoint yet.
    Import {
        /// The safetensors file to read.
        file: PathBuf,
        /// The checkpoint directory to create.
        dir: PathBuf,
    },
}

/// Why a command failed: its input cannot be used (exit status 2) or its output cannot be
/// written (1).
enum Failure {
    Input(String),
    Output(String),
}

/// Runs `xccl checkpoint`.
pub fn run(args: &CheckpointArgs) -> ExitCode {
    let done = match &args.command {
        Action::Info { dir, pieces } => info(dir, *pieces),
        Action::Export { dir, out } => export(dir, out),
        Action::Import { file, dir } => import(file, dir),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Input(msg)) => {
            eprintln!("xccl checkpoint: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Output(msg)) => {
            eprintln!("xccl checkpoint: {msg}");
            ExitCode::from(1)
        }
    }
}

fn open(dir: &Path) -> Result<Reader, Failure> {
    Reader::open(dir).map_err(|e| Failure::Input(e.to_string()))
}

/// `1234567` as `1.2 MiB`.
fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = bytes as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < units.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{bytes} B") } else { format!("{x:.1} {}", units[u]) }
}

/// A JSON value on one line, cut to about `max` characters.
fn short(value: &serde_json::Value, max: usize) -> String {
    let text = value.to_string();
    let n = text.chars().count();
    if n <= max {
        text
    } else {
        format!("{}… ({n} characters)", text.chars().take(max).collect::<String>())
    }
}

fn info(dir: &Path, pieces: bool) -> Result<(), Failure> {
    let reader = open(dir)?;
    let meta = reader.metadata();
    println!("checkpoint {}", reader.dir().display());
    println!("step {}, format {} version {}", meta.step, meta.format, meta.version);
    if meta.extra.is_empty() {
        println!("extra: none");
    } else {
        println!("extra:");
        let width = meta.extra.keys().map(|k| k.len()).max().unwrap_or(0);
        for (k, v) in &meta.extra {
            println!("  {k:<width$}  {}", short(v, 100));
        }
    }
    let elements: usize = meta.tensors.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    println!("tensors: {} ({elements} elements, {})", meta.tensors.len(), human(4 * elements as u64));
    let width = meta.tensors.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    for (name, shape) in &meta.tensors {
        let n: usize = shape.iter().product();
        println!("  {name:<width$}  {:<16}  {n:>10}  {:>10}", format!("{shape:?}"), human(4 * n as u64));
    }
    let bytes: u64 = meta.files.iter().map(|f| f.bytes).sum();
    println!("files: {} ({})", meta.files.len(), human(bytes));
    for f in &meta.files {
        let held: usize = f.pieces.iter().map(|s| s.piece.len()).sum();
        println!(
            "  {}  rank {}  {}  {} pieces  {held} elements",
            f.name,
            f.rank,
            human(f.bytes),
            f.pieces.len()
        );
        if pieces {
            for s in &f.pieces {
                println!("    {}  {}  {}", s.key, s.piece, s.piece.len());
            }
        }
    }
    Ok(())
}

fn export(dir: &Path, out: &Path) -> Result<(), Failure> {
    let reader = open(dir)?;
    let mut params: Vec<(&str, &[usize])> = reader
        .tensors()
        .iter()
        .filter_map(|(n, s)| n.strip_prefix("param.").map(|plain| (plain, s.as_slice())))
        .collect();
    if params.is_empty() {
        return Err(Failure::Input(format!(
            "{}: the checkpoint has no parameters (tensors named param.<name>)",
            reader.dir().display()
        )));
    }
    params.sort();
    let mut data = Vec::with_capacity(params.len());
    for (name, shape) in &params {
        let values = reader
            .read(&Piece::whole(format!("param.{name}"), shape))
            .map_err(|e| Failure::Input(e.to_string()))?;
        data.push(values.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    }
    let views = params
        .iter()
        .zip(&data)
        .map(|((name, shape), bytes)| TensorView::new(Dtype::F32, shape.to_vec(), bytes).map(|v| (*name, v)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Failure::Output(format!("cannot lay out {}: {e}", out.display())))?;
    safetensors::serialize_to_file(views, None, out)
        .map_err(|e| Failure::Output(format!("cannot write {}: {e}", out.display())))?;
    std::fs::File::open(out)
        .and_then(|f| f.sync_all())
        .map_err(|e| Failure::Output(format!("cannot sync {}: {e}", out.display())))?;
    let elements: usize = params.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    println!(
        "exported {} parameters ({elements} elements) of step {} to {}",
        params.len(),
        reader.step(),
        out.display()
    );
    Ok(())
}

fn import(file: &Path, dir: &Path) -> Result<(), Failure> {
    if dir.join(dcp::LATEST).exists() || dir.join(dcp::METADATA).exists() {
        return Err(Failure::Input(format!(
            "{} already holds a checkpoint: import into a new directory",
            dir.display()
        )));
    }
    let bytes =
        std::fs::read(file).map_err(|e| Failure::Input(format!("cannot read {}: {e}", file.display())))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| Failure::Input(format!("{} is not a safetensors file: {e}", file.display())))?;
    let mut names = st.names();
    names.sort();
    if names.is_empty() {
        return Err(Failure::Input(format!("{} holds no tensors", file.display())));
    }
    let mut snapshot = Snapshot::default();
    for name in names {
        let view = st.tensor(name).map_err(|e| Failure::Input(format!("{}: {name}: {e}", file.display())))?;
        if view.dtype() != Dtype::F32 {
            return Err(Failure::Input(format!(
                "{}: tensor {name} is {:?}; only F32 tensors can be imported (convert the file first, e.g. with \
                 PyTorch: {{k: v.float() for k, v in tensors.items()}})",
                file.display(),
                view.dtype()
            )));
        }
        let values: Vec<f32> =
            view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let tensor = format!("param.{name}");
        snapshot.tensors.push((tensor.clone(), view.shape().to_vec()));
        snapshot.pieces.push((Piece::whole(tensor, view.shape()), values));
    }
    snapshot.extra.insert("origin".into(), format!("import of {}", file.display()).into());
    let n = snapshot.tensors.len();
    let comm = Communicator::local(1)
        .map_err(|e| Failure::Output(format!("cannot start a communicator: {e}")))?
        .pop()
        .ok_or_else(|| Failure::Output("no communicator".into()))?;
    let step_dir = dcp::save(&comm, dir, snapshot).map_err(|e| Failure::Output(e.to_string()))?;
    println!("imported {n} tensors from {} as {}", file.display(), step_dir.display());
    Ok(())
}
