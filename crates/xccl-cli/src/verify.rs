//! `xccl verify`: runs the symbolic verifier over every algorithm and world size and prints
//! a table of algorithms × world sizes, then checks every pipeline schedule on every shape and
//! prints a table of schedules × pipeline stages.

use std::io::Write;
use std::process::ExitCode;

use xccl::verify::{self, Cell};
use xccl_train::pipeline::check;
use xccl_train::pipeline::schedule::Kind;

/// Arguments of `xccl verify`.
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// Largest world size to verify.
    #[arg(long, default_value_t = 64)]
    pub max_ranks: usize,
    /// Largest number of pipeline stages to check the pipeline schedules on.
    #[arg(long, default_value_t = 16)]
    pub max_stages: usize,
    /// Largest number of micro-batches to check the pipeline schedules on.
    #[arg(long, default_value_t = 64)]
    pub max_micro_batches: usize,
    /// Largest number of model chunks per stage to check the interleaved schedule on.
    #[arg(long, default_value_t = 4)]
    pub max_virtual_stages: usize,
}

/// Runs `xccl verify`: fails if any algorithm or schedule does.
pub fn run(args: &VerifyArgs) -> ExitCode {
    let algorithms = algorithms(args.max_ranks.max(1));
    println!();
    let pipelines = pipelines(args);
    if algorithms && pipelines { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

/// The two header lines of a table with columns `1..=n`: tens, then units.
fn ruler(n: usize) -> (String, String) {
    let tens =
        (1..=n).map(|k| if k % 10 == 0 { char::from(b'0' + (k / 10 % 10) as u8) } else { ' ' }).collect();
    let units = (1..=n).map(|k| char::from(b'0' + (k % 10) as u8)).collect();
    (tens, units)
}

/// The collective algorithms on world sizes `1..=n`; whether all verified.
fn algorithms(n: usize) -> bool {
    println!("Symbolic verification of every schedule on world sizes 1..{n}, every root,");
    println!("counts 1 and 2n+3, in place and out of place, uneven layouts for the v variants.");
    println!(
        "'.' verified, 'X' failed, ' ' not applicable (e.g. recursive doubling all-gather needs 2^k ranks).\n"
    );
    let (tens, units) = ruler(n);
    println!("{:<34} {tens}", "");
    println!("{:<34} {units}", "collective / algorithm");
    let mut failures = Vec::new();
    let mut row = String::new();
    let mut cases = 0;
    let mut current = None;
    let mut out = std::io::stdout();
    verify::verify_all(n, |cell: Cell| {
        let key = (cell.kind, cell.algo);
        if current != Some(key) {
            if let Some((k, a)) = current {
                let _ = writeln!(out, "{:<34} {row}", format!("{k} / {a}"));
            }
            row.clear();
            current = Some(key);
        }
        cases += cell.cases;
        row.push(match (&cell.failure, cell.cases) {
            (Some(_), _) => 'X',
            (None, 0) => ' ',
            (None, _) => '.',
        });
        if let Some(f) = cell.failure {
            failures.push(f);
        }
        let _ = out.flush();
    });
    if let Some((k, a)) = current {
        println!("{:<34} {row}", format!("{k} / {a}"));
    }
    println!("\n{cases} cases, {} failed", failures.len());
    for f in &failures {
        println!("FAILED: {f}");
    }
    failures.is_empty()
}

/// The pipeline schedules on every shape the arguments allow; whether all checked.
fn pipelines(args: &VerifyArgs) -> bool {
    let stages = args.max_stages.max(1);
    let micro_batches = args.max_micro_batches.max(1);
    let virtual_stages = args.max_virtual_stages.max(1);
    println!("Pipeline schedules: every rank's list run with asynchronous sends and blocking receives");
    println!(
        "on 1..{stages} stages, 1..{micro_batches} micro-batches, 1..{virtual_stages} chunks per stage \
         (interleaved):"
    );
    println!("complete, sends matched to receives, no deadlock, activations within the bound, the");
    println!(
        "simulated bubble (forward 1, backward 2 or, split by zb-h1 and zb-v, input gradient 1 and weight"
    );
    println!("gradient 1, free communication) equal to the closed form.");
    println!(
        "'.' verified for every micro-batch count, 'X' failed, ' ' not applicable (interleaved with\n\
         v > 1 needs 2 stages or more and a multiple of the stages as micro-batch count; zb-v, v = 2,\n\
         2 stages or more and at least 2·p − 1 micro-batches).\n"
    );
    let rows: Vec<(Kind, usize)> = Kind::ALL
        .into_iter()
        .flat_map(|kind| {
            let vs = match kind.chunks() {
                Some(v) => v..=v,
                None if kind == Kind::Interleaved => 1..=virtual_stages,
                None => 1..=1,
            };
            vs.map(move |v| (kind, v))
        })
        .collect();
    let mut cells = vec![vec![' '; stages]; rows.len()];
    let mut failures = Vec::new();
    let mut checked = 0;
    let skipped = check::check_all(stages, micro_batches, virtual_stages, |kind, shape, result| {
        checked += 1;
        let Some(row) = rows.iter().position(|&r| r == (kind, shape.virtual_stages)) else { return };
        let cell = &mut cells[row][shape.stages - 1];
        match result {
            Ok(_) if *cell == ' ' => *cell = '.',
            Ok(_) => {}
            Err(violation) => {
                *cell = 'X';
                let (p, m, v) = (shape.stages, shape.micro_batches, shape.virtual_stages);
                failures.push(format!("{kind} p={p} m={m} v={v}: {violation}"));
            }
        }
    });
    let (tens, units) = ruler(stages);
    println!("{:<34} {tens}", "");
    println!("{:<34} {units}", "schedule / pipeline stages");
    for (&(kind, v), row) in rows.iter().zip(&cells) {
        let label = if kind == Kind::Interleaved { format!("{kind}, v = {v}") } else { kind.to_string() };
        println!("{label:<34} {}", row.iter().collect::<String>());
    }
    println!("\n{checked} schedules, {} failed ({skipped} shapes not applicable)", failures.len());
    for f in &failures {
        println!("FAILED: {f}");
    }
    failures.is_empty()
}
