//! `xccl flight`: prints the flight records a failed job's ranks wrote (see
//! `xccl::flight`), every rank of each communicator side by side: its error, the operation
//! it was in and the ones before and after it, so one look says which rank stopped where.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::Value;

/// Arguments of `xccl flight`.
#[derive(clap::Args, Debug)]
pub struct FlightArgs {
    /// Flight record files, or directories of them (default: `$XCCL_FLIGHT_DIR`, else
    /// `$TMPDIR/xccl-flight`).
    pub paths: Vec<PathBuf>,
    /// Operations shown per rank, the latest last.
    #[arg(long, default_value_t = 6)]
    pub last: usize,
}

/// Runs `xccl flight`.
pub fn run(args: &FlightArgs) -> ExitCode {
    let paths = if args.paths.is_empty() {
        vec![
            std::env::var_os("XCCL_FLIGHT_DIR")
                .map_or_else(|| std::env::temp_dir().join("xccl-flight"), PathBuf::from),
        ]
    } else {
        args.paths.clone()
    };
    match load(&paths) {
        Ok(records) if records.is_empty() => {
            eprintln!("xccl flight: no flight records in {}", show(&paths));
            ExitCode::from(1)
        }
        Ok(records) => {
            print!("{}", render(&records, args.last));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xccl flight: {e}");
            ExitCode::from(1)
        }
    }
}

/// The table of the records in `dir`, if any (for `xccl run` when a job fails).
pub fn summary(dir: &Path, last: usize) -> Option<String> {
    load(&[dir.to_path_buf()]).ok().filter(|r| !r.is_empty()).map(|r| render(&r, last))
}

fn show(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// Every record under `paths`, by communicator and rank.
fn load(paths: &[PathBuf]) -> Result<BTreeMap<(String, u64), Value>, String> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let dir = std::fs::read_dir(p).map_err(|e| format!("{}: {e}", p.display()))?;
            files.extend(dir.flatten().map(|e| e.path()).filter(|f| is_record(f)));
        } else {
            files.push(p.clone());
        }
    }
    let mut out = BTreeMap::new();
    for f in files {
        let text = std::fs::read(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        let v: Value = serde_json::from_slice(&text)
            .map_err(|e| format!("{}: not a flight record: {e}", f.display()))?;
        let (Some(comm), Some(rank)) = (v["comm"].as_str(), v["rank"].as_u64()) else {
            return Err(format!("{}: not a flight record (no comm or rank)", f.display()));
        };
        out.insert((comm.to_string(), rank), v);
    }
    Ok(out)
}

fn is_record(f: &Path) -> bool {
    f.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("xccl-flight-") && n.ends_with(".json"))
}

/// The table: per communicator, per rank, its error and its last operations.
fn render(records: &BTreeMap<(String, u64), Value>, last: usize) -> String {
    let mut s = String::new();
    let mut comm = "";
    for ((c, rank), v) in records {
        if c != comm {
            comm = c;
            let size = v["size"].as_u64().unwrap_or(0);
            let have = records.keys().filter(|(k, _)| k == c).count();
            s += &format!("communicator {c}: {have} of {size} ranks wrote a record\n");
        }
        s += &format!("  rank {rank} (pid {}): {}\n", v["pid"], v["error"].as_str().unwrap_or("?"));
        let ops = v["ops"].as_array().map(Vec::as_slice).unwrap_or_default();
        for op in &ops[ops.len().saturating_sub(last)..] {
            let ms = |k: &str| op[k].as_f64().map_or_else(|| "-".to_string(), |t| format!("{t:.1}"));
            let took = match (op["started_ms"].as_f64(), op["finished_ms"].as_f64()) {
                (Some(a), Some(b)) => format!("{:.2} ms", b - a),
                (Some(a), None) => format!("{:.0} ms so far", v["written_ms"].as_f64().unwrap_or(a) - a),
                _ => String::new(),
            };
            s += &format!(
                "    {:<8} {:<60} start {:>9} ms  {took}\n",
                op["state"].as_str().unwrap_or("?"),
                op["op"].as_str().unwrap_or("?"),
                ms("started_ms"),
            );
        }
    }
    s
}
