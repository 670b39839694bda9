//! Building a run: the checks that need no weights, the pipeline, the algorithm's own models, the
//! data, the reference, the parallel layout, the optimizer and whatever a checkpoint restores —
//! everything [`Trainer::fit`] needs, in the order a failure costs least.

use std::path::Path;
use std::time::{Duration, Instant};

use flowtune_config::{Finetune, Recipe, Sharding, StateOffload};
use flowtune_data::{PromptDataset, PromptRecord};
use flowtune_models::{Dtypes, FlowPipeline, PipelineOptions, RandomWeights};
use flowtune_rewards::JudgeBackend;
use tch::Device;

use crate::algorithms::Algorithm;
use crate::checkpointer::Checkpointer;
use crate::dist::Comm;
use crate::layout::Layout;
use crate::optim::{AdamW, Ema};
use crate::reference::Reference;
use crate::source::Source;
use crate::update::Learner;
use crate::validation::validation_sampler;
use crate::TrainError;

/// How a run goes besides its recipe (`flowtune bench step` measures with these).
#[derive(Debug, Clone, Copy)]
pub struct TrainOptions {
    /// Seeded random weights and stand-in prompt embeddings instead of the checkpoint files.
    pub random_weights: Option<RandomWeights>,
    /// Checkpoints and the exported weights are written (off: a measurement leaves nothing).
    pub write: bool,
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self { random_weights: None, write: true }
    }
}

/// A rank ready to run: a training rank, or a rollout rank of a split job.
pub(crate) enum Built<'r> {
    Trains(Box<Trainer<'r>>),
    Samples(Box<crate::split::Sampler<'r>>),
}

/// A run ready to train: loaded, laid out over the ranks and restored, no step taken.
pub(crate) struct Trainer<'r> {
    pub recipe: &'r Recipe,
    pub write: bool,
    pub comm: Comm,
    pub pipe: Box<dyn FlowPipeline>,
    pub latent_shape: Vec<i64>,
    pub algorithm: Box<dyn Algorithm>,
    pub source: Source,
    pub scorers: Vec<flowtune_rewards::Weighted>,
    pub val_records: Vec<PromptRecord>,
    pub reference: Option<Reference>,
    pub layout: Layout,
    pub learner: Learner,
    pub checkpointer: Checkpointer,
    /// The last step done (0: a fresh run) and its metric line as the checkpoint kept it.
    pub start: u64,
    pub saved_line: serde_json::Value,
}

impl<'r> Trainer<'r> {
    /// Everything `recipe` needs on `device` before its first step; on a rollout rank, what
    /// sampling needs.
    pub fn build(
        recipe: &'r Recipe,
        device: Device,
        options: TrainOptions,
    ) -> Result<Built<'r>, TrainError> {
        if recipe.auto.any() {
            return Err(TrainError::Invalid(
                "rollout.batch_size / trainer.micro_batch_size: auto is fitted to the device's                  memory by `flowtune train`; give numbers when training through the library"
                    .into(),
            ));
        }
        let registered = flowtune_objectives::algorithm(&recipe.algorithm)?;
        let mut algorithm = crate::algorithms::build(registered)?;
        let t = &recipe.trainer;
        let timeout = Duration::from_secs_f64(t.dist_timeout_s);
        let comm = Comm::from_env(device, timeout, t.sequence_parallel_size, t.rollout_ranks)?;
        check_shares(recipe, &comm)?;
        check_inputs(recipe)?;
        let device = comm.device();
        let validating = t.val_freq > 0 || t.val_before_train;
        if validating {
            validation_sampler(recipe, None).validate().map_err(|e| {
                TrainError::Invalid(format!(
                    "validation sampler (rollout.eval_steps {}): {e}",
                    recipe.rollout.eval_steps
                ))
            })?;
        }
        let out_dir = &t.output_dir;

        let write = options.write;
        let options =
            PipelineOptions { random: options.random_weights, ..pipeline_options(recipe, device) };
        // Sharded blocks are read as this rank's slices only, never whole.
        let load = || flowtune_models::load_pipeline(&recipe.model.path, &options);
        let (loaded, rss_before) = (Instant::now(), crate::perf::status_bytes("VmRSS:"));
        let mut pipe = match comm.shards_blocks(recipe) {
            true => flowtune_models::shard_load::with_deferred_blocks(load)?,
            false => load()?,
        };
        let latent_shape = pipe
            .latent_shape(recipe.model.resolution, recipe.model.resolution)
            .map_err(|e| TrainError::Invalid(format!("model.resolution {e}")))?;
        if !comm.is_rollout() {
            algorithm.load(recipe, &options, pipe.as_ref())?;
        }
        // The run folder appears once the recipe is known to run here.
        std::fs::create_dir_all(out_dir).map_err(|e| TrainError::io(out_dir, e))?;
        let mut source = Source::for_recipe(recipe)?;
        let scorers = flowtune_rewards::build_on(&recipe.reward, device)?;
        let mut val_records = vec![];
        for f in &recipe.data.val_files {
            val_records.extend(PromptDataset::load(f)?.records);
        }
        if validating && val_records.is_empty() {
            return Err(TrainError::Invalid(
                "trainer.val_freq > 0 and trainer.val_before_train need prompts in data.val_files"
                    .into(),
            ));
        }

        if device == Device::Cpu {
            let said = crate::threads::fit(
                pipe.denoiser().store().variables().values().map(|t| t.numel() as f64).sum(),
                rows_per_forward(recipe, &comm) as f64,
                latent_shape.iter().skip(1).product::<i64>() as f64 / 4.0,
            );
            if let (Some(line), true) = (said, comm.is_main()) {
                crate::logging::line(&line);
            }
        }
        let keeps_reference = registered.needs.keeps_reference(recipe.actor.use_kl_loss);
        let keeps_reference = keeps_reference && !comm.is_rollout();
        let (reference, layout) = parallelize(recipe, pipe.as_ref(), keeps_reference, &comm)?;
        if comm.is_rollout() {
            comm.barrier()?;
            let sampler =
                crate::split::Sampler { recipe, comm, pipe, latent_shape, source, scorers, layout };
            return Ok(Built::Samples(Box::new(sampler)));
        }
        crate::logging::line(&crate::perf::load_line(
            device,
            loaded.elapsed().as_secs_f64(),
            rss_before,
        ));
        let params = pipe.denoiser().trainable_parameters();
        // `trainer.offload`: the optimizer's state and the weight copies in host memory.
        let host = t.offload != StateOffload::None;
        let ema = t.ema_decay.map(|d| Ema::new("ema", d, &params, host));
        // A copy the update refreshes in full each step: its decay is 0.
        let lagged = (t.off_policy_lag > 0).then(|| Ema::new("lagged", 0.0, &params, host));
        algorithm.start(&params, host);
        let optimizer = AdamW::new(params, t.betas, t.eps, t.weight_decay, host);
        let optimizer = shard_optimizer(recipe, pipe.as_ref(), optimizer, &comm);
        let mut learner = Learner { ema, optimizer, lagged };
        let checkpointer = Checkpointer::new(t, write);
        let (mut start, mut saved_line) = (0, serde_json::Value::Null);
        let model = pipe.denoiser_mut();
        let resumed = checkpointer.resume(
            &t.resume,
            model,
            &mut learner,
            algorithm.as_mut(),
            &mut source,
            &comm,
        )?;
        if let Some(state) = resumed {
            start = state.step;
            saved_line = state.metrics;
            check_recipe_unchanged(recipe, out_dir)?;
        }
        // Later checkpoints would be the future of another run: kept aside, never deleted.
        checkpointer.set_aside_after(start, &comm)?;
        if comm.is_main() && write {
            let resolved = out_dir.join(flowtune_config::RESOLVED);
            std::fs::write(&resolved, recipe.to_yaml())
                .map_err(|e| TrainError::io(&resolved, e))?;
        }
        comm.barrier()?;
        Ok(Built::Trains(Box::new(Self {
            recipe,
            write,
            comm,
            pipe,
            latent_shape,
            algorithm,
            source,
            scorers,
            val_records,
            reference,
            layout,
            learner,
            checkpointer,
            start,
            saved_line,
        })))
    }
}

/// Lays the trained model out over the ranks, in this order: activation checkpointing; the
/// reference policy (when `keeps_reference`: a frozen copy under full fine-tuning, taken here so
/// that it is laid out as the model is); then the ranks' split of every sample's tokens (sequence
/// parallelism) and of the blocks' weights (`trainer.sharding`) for both, as
/// [`Comm::shard_blocks`] applies them. The optimizer's share follows in [`shard_optimizer`], once
/// the parameters exist.
fn parallelize(
    recipe: &Recipe,
    pipe: &dyn FlowPipeline,
    keeps_reference: bool,
    comm: &Comm,
) -> Result<(Option<Reference>, Layout), TrainError> {
    pipe.denoiser().set_gradient_checkpointing(recipe.trainer.gradient_checkpointing);
    pipe.denoiser().set_unpadded_attention(recipe.model.unpadded_attention);
    pipe.denoiser().set_fused_projections(recipe.model.fused_projections);
    let reference = Reference::for_recipe(recipe, pipe, keeps_reference)?;
    comm.shard_blocks(recipe, pipe.denoiser(), reference.as_ref())?;
    let layout = Layout {
        sharded_blocks: comm.shards_blocks(recipe),
        sharded_bytes: pipe.denoiser().sharded_bytes(),
    };
    Ok((reference, layout))
}

/// The optimizer's part of the layout: a sharded block's parameters are this rank's slices;
/// under `trainer.sharding: optimizer` each rank keeps its share of the Adam moments (ZeRO-1);
/// `trainer.f32_master_weights` keeps f32 copies of what this rank updates.
fn shard_optimizer(
    recipe: &Recipe,
    pipe: &dyn FlowPipeline,
    mut optimizer: AdamW,
    comm: &Comm,
) -> AdamW {
    if let Some(blocks) = pipe.denoiser().sharded().filter(|s| s.trains()) {
        optimizer.set_local(blocks.masters().into_keys().collect());
    }
    if recipe.sharding() == Sharding::Optimizer && comm.size() > 1 {
        optimizer.shard(comm.rank(), comm.size());
    }
    if recipe.trainer.f32_master_weights {
        optimizer.keep_f32_masters();
    }
    optimizer
}

/// How `recipe` loads its pipeline on `device`.
fn pipeline_options(recipe: &Recipe, device: Device) -> PipelineOptions {
    let m = &recipe.model;
    PipelineOptions {
        device,
        dtypes: Dtypes {
            transformer: m.dtype.kind(),
            text_encoders: m.frozen_dtype.kind(),
            vae: m.frozen_dtype.kind(),
        },
        lora: (m.finetune == Finetune::Lora).then(|| m.lora.clone()),
        max_sequence_length: Some(m.max_sequence_length),
        embedded_guidance: m.guidance,
        num_frames: m.num_frames,
        frame_rate: m.frame_rate,
        output_resolution: m.output_resolution,
        offload: m.offload,
        random: None,
    }
}

/// Refuses to resume with a recipe that computes otherwise than the one the run folder's
/// checkpoints were trained with (its `recipe.resolved.yaml`), naming the keys, unless
/// `trainer.allow_recipe_change`.
fn check_recipe_unchanged(recipe: &Recipe, out_dir: &Path) -> Result<(), TrainError> {
    let path = out_dir.join(flowtune_config::RESOLVED);
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(()) };
    let earlier = Recipe::from_yaml(&text, &path.display().to_string(), &[])
        .map_err(|e| TrainError::Invalid(e.to_string()))?;
    let changes = recipe.math_changes(&earlier);
    if changes.is_empty() || recipe.trainer.allow_recipe_change {
        return Ok(());
    }
    Err(TrainError::Invalid(format!(
        "resuming with a recipe that changes what {} was trained with: {}; set \
         trainer.allow_recipe_change=true to go on with the change",
        path.display(),
        changes.join(", ")
    )))
}

/// The files and pipelines a recipe names, checked before anything loads; a missing one is named
/// by its key (with the folder a relative path is taken from).
fn check_inputs(recipe: &Recipe) -> Result<(), TrainError> {
    let whence = |path: &Path| match (path.is_relative(), std::env::current_dir()) {
        (true, Ok(cwd)) => format!(
            " (from the working directory {}; a relative path in a recipe file is taken from the \
             file's folder, one in an override from the working directory)",
            cwd.display()
        ),
        _ => String::new(),
    };
    let d = &recipe.data;
    let files = [("data.train_files", &d.train_files), ("data.val_files", &d.val_files)];
    let files = files.into_iter().chain([("data.preference_files", &d.preference_files)]);
    for (key, list) in files {
        if let Some((i, f)) = list.iter().enumerate().find(|(_, f)| !f.exists()) {
            let message = format!("{key}[{i}]: {} does not exist{}", f.display(), whence(f));
            return Err(TrainError::Invalid(message));
        }
    }
    let teachers = recipe.model.all_teachers().into_iter().enumerate();
    let pipelines = std::iter::once(("model.path".to_string(), recipe.model.path.clone()))
        .chain(teachers.map(|(i, t)| (format!("model.teachers[{i}].path"), t.path)));
    for (key, path) in pipelines {
        flowtune_models::pipeline::PipelineDir::open(&path)
            .map_err(|e| TrainError::Invalid(format!("{key}: {e}{}", whence(&path))))?;
    }
    // In-process judges and preference models: a folder (or Hub id in the cache) with a
    // config.json.
    for (i, f) in recipe.reward.functions.iter().enumerate() {
        let native = f.vlm.as_ref().filter(|v| v.backend == JudgeBackend::Native);
        let (key, model) = match (native, &f.hpsv3) {
            (Some(vlm), _) => ("vlm", &vlm.model),
            (None, Some(hpsv3)) => ("hpsv3", &hpsv3.model),
            (None, None) => continue,
        };
        let key = format!("reward.functions[{i}].{key}.model");
        let path = Path::new(model);
        let dir = flowtune_models::hub::resolve(path)
            .map_err(|e| TrainError::Invalid(format!("{key}: {e}{}", whence(path))))?;
        if !dir.join("config.json").is_file() {
            return Err(TrainError::Invalid(format!(
                "{key}: {} has no config.json; expected a transformers Qwen2-VL, Qwen2.5-VL or \
                 Qwen3-VL folder{}",
                dir.display(),
                whence(path)
            )));
        }
    }
    Ok(())
}

/// Rows of one rollout forward on this rank: `rollout.batch_size`, or all of its rows (0).
fn rows_per_forward(recipe: &Recipe, comm: &Comm) -> usize {
    let rows = recipe.data.prompts_per_step.div_ceil(comm.groups()) * recipe.rollout.n;
    match recipe.rollout.batch_size {
        0 => rows,
        b => b.min(rows),
    }
}

/// How many prompt groups (or offline pairs) a step has: every rank needs at least one.
fn check_shares(recipe: &Recipe, comm: &Comm) -> Result<(), TrainError> {
    let (per_step, ranks) = (recipe.data.prompts_per_step, comm.groups());
    if ranks > 1 && per_step < ranks {
        return Err(TrainError::Invalid(format!(
            "data.prompts_per_step {per_step} is less than the {ranks} ranks of this job; every rank needs at least one prompt group per step"
        )));
    }
    if comm.shards_blocks(recipe) && per_step % ranks != 0 {
        return Err(TrainError::Invalid(format!(
            "data.prompts_per_step {per_step} does not divide by the {ranks} ranks of this job; trainer.sharding: {} gathers each block on all ranks together, so every rank must sample as many prompt groups",
            sharding_name(recipe)
        )));
    }
    if ranks > 1 && !recipe.data.drop_last {
        return Err(TrainError::Invalid(format!(
            "data.drop_last: false with {ranks} ranks: an epoch's last, short step could leave a rank without prompts; set data.drop_last: true"
        )));
    }
    Ok(())
}

/// `trainer.sharding` as the recipe would spell it.
fn sharding_name(recipe: &Recipe) -> String {
    serde_json::to_value(recipe.sharding())
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}
