//! `xccl verify`: runs the symbolic verifier over every algorithm and world size and prints
//! a table of algorithms × world sizes.

use std::io::Write;
use std::process::ExitCode;

use xccl::verify::{self, Cell};

/// Arguments of `xccl verify`.
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// Largest world size to verify.
    #[arg(long, default_value_t = 64)]
    pub max_ranks: usize,
}

/// Runs `xccl verify`.
pub fn run(args: &VerifyArgs) -> ExitCode {
    let n = args.max_ranks.max(1);
    println!("Symbolic verification of every schedule on world sizes 1..{n}, every root,");
    println!("counts 1 and 2n+3, in place and out of place, uneven layouts for the v variants.");
    println!(
        "'.' verified, 'X' failed, ' ' not applicable (e.g. recursive doubling all-gather needs 2^k ranks).\n"
    );
    let ruler: String =
        (1..=n).map(|k| if k % 10 == 0 { char::from(b'0' + (k / 10 % 10) as u8) } else { ' ' }).collect();
    let units: String = (1..=n).map(|k| char::from(b'0' + (k % 10) as u8)).collect();
    println!("{:<34} {ruler}", "");
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
    if failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) }
}
