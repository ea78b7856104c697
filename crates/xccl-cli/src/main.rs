//! The `xccl` command: `train` trains a model with data parallelism on local ranks (the main
//! job; under a launcher, as one of its ranks), `run` launches ranks (and restarts failed jobs), `bench` measures collectives, `demo` runs and checks every
//! collective on local ranks, `verify` proves the algorithms correct, `tune` calibrates the
//! algorithm tuner, `checkpoint` inspects, exports and imports distributed checkpoints, `flight` prints what
//! every rank of a failed job was doing, `sim` simulates collectives on modelled networks
//! (`sim train`: predicts a training step's time).

mod bench;
mod checkpoint;
mod demo;
mod flight;
mod pipeline_svg;
mod plan;
mod run;
mod sim;
mod sim_train;
mod train;
mod tune;
mod tune_pull;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// xccl: collective communication and parallel training.
#[derive(Parser, Debug)]
#[command(name = "xccl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train a model on local ranks with data (DDP, ZeRO, parameter server), tensor, sequence
    /// and pipeline parallelism (the main job); started by a launcher (xccl run, torchrun,
    /// mpirun, srun), one of its ranks.
    Train(Box<train::TrainArgs>),
    /// Launch N ranks of a program as local processes: `xccl run -n 4 -- PROGRAM ARGS`
    /// (`--max-restarts K`: start the job again when a rank fails).
    Run(run::RunArgs),
    /// Measure a collective, nccl-tests style (under `xccl run`, or with --local N).
    Bench(bench::BenchArgs),
    /// Launch local ranks and run and check every collective.
    Demo(demo::DemoArgs),
    /// Prove every algorithm correct on every world size, and every pipeline schedule free of
    /// deadlock with its closed-form bubble, symbolically.
    Verify(verify::VerifyArgs),
    /// Calibrate the tuner's cost model on this machine (measure, then fit).
    Tune(tune::TuneArgs),
    /// Inspect a distributed checkpoint, export its parameters to one safetensors file, or
    /// import one as a checkpoint.
    Checkpoint(checkpoint::CheckpointArgs),
    /// Print the flight records a failed job's ranks wrote: what every rank was doing.
    Flight(flight::FlightArgs),
    /// Simulate collectives on a modelled network (ring, torus, hypercube, fat-tree,
    /// dragonfly...) with the executor's own schedules.
    Sim(sim::SimArgs),
    /// Find the fastest ways to train a model on N ranks: every dp x tp x pp, schedule,
    /// micro-batch count, ZeRO stage and recomputation, predicted by `xccl sim train`, within
    /// a memory limit per rank, each with its `xccl train` command.
    Plan(Box<plan::PlanArgs>),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("XCCL_DEBUG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Train(args) => train::run(&args),
        Command::Run(args) => run::run(args),
        Command::Bench(args) => match bench::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("xccl bench: {e}");
                ExitCode::from(1)
            }
        },
        Command::Demo(args) => demo::run(&args),
        Command::Verify(args) => verify::run(&args),
        Command::Tune(args) => tune::run(&args),
        Command::Checkpoint(args) => checkpoint::run(&args),
        Command::Flight(args) => flight::run(&args),
        Command::Sim(args) => sim::run(&args),
        Command::Plan(args) => plan::run(&args),
    }
}
