//! The training loop, step by step as the algorithm reads: the algorithm's step (rollout and
//! rewards, then its update), validation, checkpoint — each under a named timer. Launched as
//! several ranks (torchrun, Slurm, `flowtune launch`), every rank runs this same loop on its share
//! of each step; rank 0 alone writes metrics, pictures, checkpoints and the exported weights. In a
//! job split into rollout and training ranks the training ranks run it, the rollout ranks
//! [`crate::split::Sampler`]'s loop.

use std::path::PathBuf;
use std::time::Instant;

use flowtune_config::Recipe;
use flowtune_objectives::Metrics;
use flowtune_rollout::Engine;
use tch::Device;

use crate::build::{Built, TrainOptions, Trainer};
use crate::checkpointer::Trained;
use crate::export::export_weights;
use crate::logging::{metric_line, progress_bar, step_line, summary_line, MetricLog};
use crate::optim::learning_rate;
use crate::run::Run;
use crate::step::Step;
use crate::validation::validate;
use crate::TrainError;

/// What a finished run leaves behind.
#[derive(Debug)]
pub struct TrainSummary {
    /// Metrics of each step run in this process.
    pub metrics: Vec<Metrics>,
    /// The exported weights: the LoRA (diffusers/PEFT layout) or, after full fine-tuning, the
    /// transformer's safetensors in a diffusers `transformer/` folder.
    pub export: PathBuf,
    pub steps_run: u64,
    /// This process's rank among the training ranks of a launched job (0 alone); none on a
    /// rollout rank (`trainer.rollout_ranks`).
    pub rank: Option<usize>,
    /// Why the run stopped before `trainer.total_steps` at a signal, with its checkpoint saved.
    pub stopped: Option<String>,
}

/// Runs `recipe` on `device` until `trainer.total_steps`, resuming as `trainer.resume` says. In a
/// launched job (see [`Comm::from_env`]) it joins the other ranks first; a CUDA run then computes
/// on `cuda:LOCAL_RANK`.
pub fn train(recipe: &Recipe, device: Device) -> Result<TrainSummary, TrainError> {
    train_with(recipe, device, TrainOptions::default())
}

/// [`train`] with `options`.
pub fn train_with(
    recipe: &Recipe,
    device: Device,
    options: TrainOptions,
) -> Result<TrainSummary, TrainError> {
    match Trainer::build(recipe, device, options)? {
        Built::Trains(trainer) => trainer.fit(),
        Built::Samples(sampler) => sampler.serve(),
    }
}

impl Trainer<'_> {
    /// Runs the steps from the one after `start` to `trainer.total_steps` (or a stop), then
    /// exports the weights.
    pub fn fit(self) -> Result<TrainSummary, TrainError> {
        let Trainer {
            recipe,
            write,
            comm,
            pipe,
            latent_shape,
            mut algorithm,
            mut source,
            scorers,
            val_records,
            reference,
            layout,
            mut learner,
            checkpointer,
            start,
            saved_line,
        } = self;
        let trainer = &recipe.trainer;
        let (device, out_dir) = (comm.device(), &trainer.output_dir);
        let bar = progress_bar(trainer.total_steps, start);
        if !comm.is_main() {
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        let world = comm.size();
        let run = Run {
            recipe,
            engine: Engine::new(pipe.as_ref(), &recipe.rollout, latent_shape, recipe.seed)?,
            reference,
            scorers,
            bar,
            comm,
            layout,
        };
        let comm = &run.comm;
        let mut log =
            if comm.is_main() { Some(MetricLog::open(out_dir, start, &saved_line)?) } else { None };
        // SIGTERM, SIGUSR1 and Ctrl-C finish the current step, save a checkpoint and return.
        let stop_request = crate::signals::StopRequest::listen(comm.is_main());
        // Rollout ranks, if any, learn where the run starts.
        crate::split::start(&run, &learner, &source, start)?;
        // Validation samples as the trained model is meant to (a few-step student on its grid).
        let grid = algorithm.sampling_grid();
        let mut all = vec![];
        let (mut last, mut stopped) = (start, None);
        if trainer.val_before_train && start == 0 {
            run.status("validation");
            let mut before = Step::new(0, 0.0);
            let scores =
                before.timers.time("testing", || validate(&run, &val_records, 0, grid.as_ref()))?;
            before.metrics.extend(scores);
            let metrics = before.into_metrics();
            if let Some(log) = log.as_mut() {
                log.log(0, &metrics)?;
                run.say(format!("validation before training: {}", summary_line(&metrics)));
            }
        }
        let training = Instant::now();
        for number in start + 1..=trainer.total_steps {
            let step_start = Instant::now();
            let perf = crate::perf::start_step(device);
            let lr = learning_rate(
                trainer.lr_schedule,
                trainer.lr,
                number - 1,
                trainer.warmup_steps,
                trainer.total_steps,
            );
            let mut step = Step::new(number, lr);
            run.status("rollout + reward");
            let samples = algorithm.step(&run, &mut learner, &mut source, &mut step)?;
            step.metrics.insert("actor/lr".into(), lr);

            // Every rank stops at the same step: when any of them is out of time or interrupted.
            let out_of_time = comm
                .any(trainer.time_limit_s.is_some_and(|l| training.elapsed().as_secs_f64() >= l))?;
            let last_step = number == trainer.total_steps || out_of_time;

            // testing
            if trainer.val_freq > 0 && (number.is_multiple_of(trainer.val_freq) || last_step) {
                run.status("validation");
                // Validation sees the EMA weights when there are some.
                let params = &learner.optimizer.params;
                let scores = step.timers.time("testing", || match learner.ema.as_mut() {
                    Some(ema) => ema.with_swapped(params, || {
                        validate(&run, &val_records, number, grid.as_ref())
                    }),
                    None => validate(&run, &val_records, number, grid.as_ref()),
                });
                step.metrics.extend(scores?);
            }

            // checkpoint
            let stop = comm.any(stop_request.received().is_some())?;
            let trained = Trained {
                model: pipe.denoiser(),
                learner: &learner,
                algorithm: algorithm.as_ref(),
                source: &source,
            };
            // The line as known now: the step's metrics and timers but the save's own.
            let line = metric_line(number, &step.timers.snapshot(&step.metrics));
            let save = || checkpointer.save_if_due(number, last_step || stop, trained, line, comm);
            step.timers.time("save_checkpoint", save)?;
            let mut metrics = step.into_metrics();
            let elapsed = step_start.elapsed().as_secs_f64();
            metrics.insert("timing_s/step".into(), elapsed);
            // Images per second per rank (per GPU; a sequence-parallel group shares its samples).
            let per_rank = samples as f64 / comm.sequence_size() as f64;
            metrics.insert("perf/throughput".into(), per_rank / elapsed);
            // The kernel SDPA took for the step's largest attention, said once.
            if let Some(code) = flowtune_models::nn::take_attention_backend() {
                metrics.insert("perf/attention_backend".into(), code as f64);
                if number == start + 1 {
                    let name = flowtune_models::nn::attention_backend_name(code);
                    run.say(format!("attention: SDPA runs the largest attention on {name}"));
                }
            }
            let kind = recipe.model.dtype.kind();
            crate::perf::step_metrics(&perf, elapsed, trainer.peak_tflops, kind, &mut metrics);
            metrics.insert("dist/world_size".into(), world as f64);
            metrics.insert("dist/sequence_parallel_size".into(), comm.sequence_size() as f64);
            if let Some((kept, block)) = run.layout.sharded_bytes {
                metrics.insert("dist/sharded_weights_gb".into(), kept as f64 / (1u64 << 30) as f64);
                metrics.insert("dist/gathered_block_gb".into(), block as f64 / (1u64 << 30) as f64);
            }

            if let Some(log) = log.as_mut() {
                log.log(number, &metrics)?;
            }
            run.bar.inc(1);
            run.say(step_line(number, trainer.total_steps, &metrics, elapsed));
            if metrics.contains_key("timing_s/testing") {
                run.say(format!("validation at step {number}: {}", summary_line(&metrics)));
            }
            all.push(metrics);
            last = number;
            if stop {
                let by =
                    stop_request.received().map_or("another rank's signal", crate::signals::name);
                stopped = Some(format!(
                    "stopped by {by} after step {number}, with a checkpoint saved for it; rerun with \
                     trainer.resume: auto to continue"
                ));
                break;
            }
            if out_of_time && number < trainer.total_steps {
                run.say(format!("trainer.time_limit_s reached after step {number}; stopping"));
                break;
            }
        }
        run.bar.finish_and_clear();
        crate::split::release(&run, last)?;
        let main = comm.is_main();
        if !write {
            comm.barrier()?;
            let export = PathBuf::new();
            return Ok(TrainSummary {
                metrics: all,
                export,
                steps_run: last - start,
                rank: Some(comm.rank()),
                stopped,
            });
        }
        let export = export_weights(pipe.as_ref(), out_dir, false, main)?;
        let mut exported = vec![export.clone()];
        if let Some(ema) = learner.ema.as_mut() {
            exported.push(ema.with_swapped(&learner.optimizer.params, || {
                export_weights(pipe.as_ref(), out_dir, true, main)
            })?);
        }
        let sampling = crate::export::Sampling::of(recipe, grid.as_ref());
        let manifest = match main {
            true => {
                crate::export::write_manifest(recipe, pipe.as_ref(), &exported, last, &sampling)
            }
            false => Ok(()),
        };
        // The other ranks return once the exported weights are on disk (also when the manifest
        // failed, which rank 0 then reports).
        comm.barrier()?;
        manifest?;
        let steps_run = last - start;
        Ok(TrainSummary { metrics: all, export, steps_run, rank: Some(comm.rank()), stopped })
    }
}
