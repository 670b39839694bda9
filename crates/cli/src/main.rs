//! `flowtune`: online RL post-training of flow-matching diffusion models.

mod commands;
mod device;
mod threads;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use commands::{config::ConfigCommand, debug::DebugCommand};
use device::DeviceArg;

/// Online RL post-training (FlowGRPO and family) of flow-matching diffusion models.
#[derive(Parser)]
#[command(name = "flowtune", version, about, max_term_width = 100)]
struct Cli {
    /// Where tensors live: cpu, cuda or cuda:N (default: cpu; `train` takes `trainer.device`, else
    /// a GPU when torch sees one; `launch` passes it to every rank).
    #[arg(long, global = true, value_parser = device::parse)]
    device: Option<DeviceArg>,

    /// CPU threads for tensor work (default: `OMP_NUM_THREADS` if set, else one per core).
    #[arg(long, global = true, value_parser = threads::parse)]
    threads: Option<usize>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train with online RL from a recipe.
    Train(commands::train::TrainArgs),
    /// Run a command (e.g. `train`) as several data-parallel processes on this machine.
    Launch(commands::launch::LaunchArgs),
    /// The shapes-world demo: FlowGRPO on the shipped base model, pictures and accuracy before/after.
    Demo(commands::demo::DemoArgs),
    /// Pre-train every weight of a pipeline with the flow-matching loss (shapes world).
    Pretrain(commands::pretrain::PretrainArgs),
    /// Generate images (ODE sampling, batched) with an optional LoRA.
    Sample(commands::sample::SampleArgs),
    /// Score a folder of images with a registered reward: one JSON line per image.
    Score(commands::score::ScoreArgs),
    /// Write a checkpoint's LoRA in the diffusers/PEFT layout (`pipe.load_lora_weights`).
    ExportLora {
        /// A checkpoint directory (`checkpoints/step_NNNNNN`).
        checkpoint: std::path::PathBuf,
        /// Output .safetensors file.
        out: std::path::PathBuf,
    },
    /// Show the torch build, CUDA devices and threads flowtune sees.
    Env,
    /// List the registered algorithms, SDE types and pipelines.
    List,
    /// Resolve and inspect recipes.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Prepare prompt sets in the reference layout.
    #[command(subcommand)]
    Data(commands::data::DataCommand),
    /// Benchmarks (timings as throughput; compare with the PyTorch anchors under scripts/).
    #[command(subcommand)]
    Bench(commands::bench::BenchCommand),
    /// The shapes-world task: prompt files, ground-truth pictures, scoring per category.
    #[command(subcommand)]
    Shapes(commands::shapes::ShapesCommand),
    /// What a training step holds per GPU (from the pipeline's configs alone) and whether it fits.
    Plan(commands::plan::PlanArgs),
    /// Write a small random-initialised pipeline in the diffusers layout.
    #[command(subcommand)]
    MakeTiny(commands::make_tiny::MakeTiny),
    /// Tools for people porting models and checking the math.
    #[command(subcommand)]
    Debug(DebugCommand),
}

/// A failure, split by who has to act: bad input (exit 2) or a failure while running (exit 1).
pub enum Failure {
    BadInput(anyhow::Error),
    Runtime(anyhow::Error),
}

impl Failure {
    /// Wraps any error as bad input.
    pub fn input(e: impl Into<anyhow::Error>) -> Self {
        Self::BadInput(e.into())
    }

    /// A training failure, split by [`flowtune_trainer::TrainError::is_bad_input`].
    pub fn training(e: flowtune_trainer::TrainError) -> Self {
        if e.is_bad_input() {
            Self::BadInput(e.into())
        } else {
            Self::Runtime(e.into())
        }
    }
}

/// The error and its causes on one line, leaving out a cause whose text is already shown (errors
/// that print their source as part of their own message).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !line.contains(&text) {
            line = format!("{line}: {text}");
        }
    }
    line
}

fn main() -> ExitCode {
    threads::passive_wait();
    let cli = Cli::parse();
    threads::configure(cli.threads);
    // Commands that only print (no sockets) end quietly when their reader goes away
    // (`flowtune plan --json | head`), as Unix tools do; the others keep Rust's ignored SIGPIPE,
    // so a peer or a reward server that hangs up is an error that names it.
    if matches!(cli.command, Command::Env | Command::List | Command::Config(_) | Command::Plan(_)) {
        // SAFETY: restores the default disposition of one signal before any thread writes.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let named = cli.device;
    let cpu = || named.unwrap_or(DeviceArg(tch::Device::Cpu));
    let result = match cli.command {
        Command::Env => commands::env::run(&cpu()),
        Command::Train(a) => commands::train::run(a, named),
        Command::Launch(a) => commands::launch::run(a, named),
        Command::Sample(a) => commands::sample::sample(a, &cpu()),
        Command::Score(a) => commands::score::run(a),
        Command::ExportLora { checkpoint, out } => commands::sample::export_lora(&checkpoint, &out),
        Command::Pretrain(a) => commands::pretrain::run(a, &cpu()),
        Command::Shapes(c) => commands::shapes::run(c),
        Command::Demo(a) => commands::demo::run(a, &cpu()),
        Command::List => commands::list::run(),
        Command::Config(c) => commands::config::run(c),
        Command::Data(c) => commands::data::run(c),
        Command::Debug(c) => commands::debug::run(c, &cpu()),
        Command::MakeTiny(c) => commands::make_tiny::run(c),
        Command::Plan(a) => commands::plan::run(a),
        Command::Bench(c) => commands::bench::run(c, &cpu()),
    };
    // In a launched job, each rank's errors say which rank it is.
    let who = std::env::var("RANK").map_or(String::new(), |r| format!("rank {r}: "));
    let (code, e) = match result {
        Ok(()) => return ExitCode::SUCCESS,
        Err(Failure::BadInput(e)) => (ExitCode::from(2), e),
        Err(Failure::Runtime(e)) => (ExitCode::FAILURE, e),
    };
    // One write for the whole line: stderr is unbuffered, and the ranks of a job share it, so a
    // line written in pieces could interleave with another rank's.
    let line = format!("{who}error: {}\n", one_line(&e));
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
    code
}
