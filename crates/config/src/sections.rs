//! The recipe sections that belong to no single library crate: model, data and trainer.

use std::path::PathBuf;

use flowtune_models::lora::LoraConfig;
use flowtune_models::Dtype;
pub use flowtune_models::Offload;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `model:` — the pipeline directory, dtypes and adapters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// A diffusers pipeline directory (`model_index.json`).
    pub path: PathBuf,
    /// f32 | bf16 | f16 for the transformer (scheduler math stays f32).
    pub dtype: Dtype,
    /// f32 | bf16 | f16 for the text encoders and VAE.
    pub frozen_dtype: Dtype,
    /// What trains: LoRA adapters (default) or every transformer weight.
    pub finetune: Finetune,
    pub lora: LoraConfig,
    /// Text tokens of the family's long text encoder (the T5 part of SD3 prompts).
    pub max_sequence_length: usize,
    /// The distilled guidance value of a guidance-embedding model (FLUX.1 [dev], fed through its
    /// guidance embedder, not CFG); unset: the family's default (3.5 for FLUX.1 [dev]).
    pub guidance: Option<f64>,
    /// Image height and width in pixels.
    pub resolution: i64,
    /// Pixel frames of a video family's samples (Wan: 4k+1); unset: the family's default (81 for
    /// Wan, as diffusers' WanPipeline). Image families refuse it.
    pub num_frames: Option<usize>,
    /// Frames per second of a family with sound (LTX-2): how long a sample lasts, so how much
    /// audio it holds, and the rate its positions are conditioned on; unset: the family's
    /// default (24). Other families refuse it.
    pub frame_rate: Option<f64>,
    /// The side whose square condition pictures are sized to (Qwen-Image 2.1's
    /// `output_resolution`, whatever `resolution` is); unset: the pipeline's 1024. Other
    /// families refuse it.
    pub output_resolution: Option<i64>,
    /// Which frozen components live off the training device: `none`, `encoders` (text encoders)
    /// or `encoders_and_vae`.
    pub offload: Offload,
    /// Rows of padded prompt states run without their padding where the family's forward gives
    /// the same velocities (Qwen-Image, Z-Image: rows grouped by token count; Qwen-Image 2.1: a
    /// mask every row fills dropped), so attention runs unmasked on SDPA's fastest kernels.
    pub unpadded_attention: bool,
    /// Layers on one input (queries, keys and values; a SwiGLU's two input projections) run as
    /// one GEMM, and so do their LoRA A matrices, while their base weights are frozen (LoRA).
    /// The weights and adapters keep their names and files.
    pub fused_projections: bool,
    /// On-policy distillation: a frozen teacher pipeline of the same family and scheduler.
    pub teacher_path: Option<PathBuf>,
    /// On-policy distillation from several teachers, each scoring the prompts its filter selects.
    pub teachers: Vec<TeacherSection>,
}

/// One frozen teacher of `model.teachers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TeacherSection {
    /// A diffusers pipeline directory of the student's family, with the same scheduler.
    pub path: PathBuf,
    /// The prompts it scores: those whose `data_source` equals this; unset: every prompt no
    /// earlier teacher took.
    #[serde(default)]
    pub data_source: Option<String>,
    /// Its distillation term's weight.
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

impl ModelSection {
    /// The teachers: `teachers`, or `teacher_path` as one teacher of every prompt.
    pub fn all_teachers(&self) -> Vec<TeacherSection> {
        match &self.teacher_path {
            Some(path) => {
                vec![TeacherSection { path: path.clone(), data_source: None, weight: 1.0 }]
            }
            None => self.teachers.clone(),
        }
    }
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            path: PathBuf::new(),
            dtype: Dtype::F32,
            frozen_dtype: Dtype::F32,
            finetune: Finetune::Lora,
            lora: LoraConfig::default(),
            max_sequence_length: 256,
            guidance: None,
            resolution: 512,
            num_frames: None,
            frame_rate: None,
            output_resolution: None,
            offload: Offload::None,
            unpadded_attention: true,
            fused_projections: true,
            teacher_path: None,
            teachers: vec![],
        }
    }
}

/// `data:` — prompt files and how they are served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DataSection {
    /// Text (one prompt per line) or JSONL files.
    pub train_files: Vec<PathBuf>,
    /// Validation prompts, in the formats of `train_files` (see `trainer.val_freq`).
    pub val_files: Vec<PathBuf>,
    /// JSONL preference pairs for offline DPO: `prompt`, `chosen` and `rejected` image paths
    /// (relative to the file), optional `chosen_score` / `rejected_score`.
    pub preference_files: Vec<PathBuf>,
    /// Prompts per training step (each sampled `rollout.n` times).
    pub prompts_per_step: usize,
    /// Visit the training prompts in a new seeded order each epoch (false: file order).
    pub shuffle: bool,
    /// Skip an epoch's last prompts when they do not fill a step (false: a shorter last step).
    pub drop_last: bool,
}

impl Default for DataSection {
    fn default() -> Self {
        Self {
            train_files: vec![],
            val_files: vec![],
            preference_files: vec![],
            prompts_per_step: 2,
            shuffle: true,
            drop_last: true,
        }
    }
}

/// How the LR changes over training.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LrSchedule {
    /// `trainer.lr` at every step.
    #[default]
    Constant,
    /// Linear warm-up over `warmup_steps`, then constant.
    Warmup,
    /// Linear warm-up, then cosine decay to 0 at `total_steps`.
    Cosine,
}

/// What the trainer updates.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Finetune {
    /// LoRA adapters on `model.lora.target_modules`; the reference policy is the base model.
    #[default]
    Lora,
    /// Every transformer weight; the reference policy is a frozen copy of the starting model.
    Full,
}

/// Where old log-probs come from.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OldLogProb {
    /// Recomputed by the trainer before any update (default).
    #[default]
    Recompute,
    /// Taken from the rollout (saves a forward pass).
    Bypass,
}

/// Where a run starts, as `trainer.resume` says: `auto`, `none` or a checkpoint directory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Resume {
    /// The newest complete checkpoint in the output directory, if there is one.
    #[default]
    Auto,
    /// From scratch, whatever the output directory holds.
    None,
    /// This checkpoint directory (`checkpoints/step_NNNNNN`).
    Path(PathBuf),
}

impl Serialize for Resume {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Auto => s.serialize_str("auto"),
            Self::None => s.serialize_str("none"),
            Self::Path(p) => p.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Resume {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Ok(match text.as_str() {
            "auto" => Self::Auto,
            "none" => Self::None,
            "" => {
                return Err(serde::de::Error::custom(
                    "trainer.resume is empty; expected auto, none or a checkpoint directory",
                ))
            }
            _ => Self::Path(PathBuf::from(text)),
        })
    }
}

impl schemars::JsonSchema for Resume {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Resume".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Where a run starts: `auto`, `none` or a checkpoint directory.",
            "anyOf": [
                { "type": "string", "enum": ["auto", "none"] },
                { "type": "string", "title": "a checkpoint directory", "minLength": 1 }
            ]
        })
    }
}

/// `trainer:` — optimisation, schedule and checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerSection {
    /// Training steps (rollout, rewards and updates) in the run.
    pub total_steps: u64,
    /// AdamW learning rate (the peak under `lr_schedule` warmup or cosine).
    pub lr: f64,
    /// AdamW's decoupled weight decay: each step multiplies the weights by 1 − lr × this.
    pub weight_decay: f64,
    /// AdamW's β₁ and β₂: decay rates of the first and second moment estimates.
    pub betas: [f64; 2],
    /// AdamW's ε, added to the root of the second moment.
    pub eps: f64,
    /// Before each optimizer step, gradients with a larger global L2 norm are scaled down to it.
    pub max_grad_norm: f64,
    pub lr_schedule: LrSchedule,
    /// Steps of linear LR warm-up under `lr_schedule` warmup or cosine.
    pub warmup_steps: u64,
    /// Passes over a step's samples, each in a new seeded order of mini-batches.
    pub ppo_epochs: usize,
    /// Prompt groups per optimizer step (`ppo_mini_batch_size × n` samples).
    pub ppo_mini_batch_size: usize,
    /// Samples per forward/backward pass; `auto`: the largest the plan fits in the device's memory
    /// (`auto_memory_gib`), said when the run starts.
    pub micro_batch_size: usize,
    pub old_log_prob: OldLogProb,
    /// Updates between the weights a step samples with and those its update starts from: 0
    /// samples with the trained weights (on-policy); 1 samples with the weights of one update
    /// before, kept as a copy, as a rollout that runs while the previous step trains would
    /// (one-step off-policy). The ratio to the sampling policy is then corrected by
    /// `rollout_correction` against the recomputed old log-probs. The lag acts as momentum of
    /// its own: lower `betas`' β₁ with it (`docs/distributed.md` measures how far).
    pub off_policy_lag: u64,
    /// Ranks of a launched job that only sample and score (the first ones); the others train.
    /// Rollout ranks sample step k's prompts while the training ranks update on step k − 1's
    /// samples (with `off_policy_lag: 1`; with 0 they wait for the update), hand the samples over
    /// and take the new weights; 0 (the default): every rank samples and trains.
    pub rollout_ranks: usize,
    /// Where training runs: `cpu`, `cuda` or `cuda:N` (a launched job's ranks take
    /// `cuda:LOCAL_RANK`); `--device` wins; unset: a GPU when torch sees one, else the CPU.
    pub device: Option<String>,
    /// Output directory: metrics, checkpoints, the exported LoRA.
    pub output_dir: PathBuf,
    /// Save a checkpoint every this many steps (0: only at the end).
    pub save_freq: u64,
    /// Checkpoints kept.
    pub keep_last: usize,
    /// `auto` (newest complete checkpoint in output_dir), `none`, or a checkpoint directory.
    pub resume: Resume,
    /// Save a grid of the step's training images every this many steps (0: never).
    pub image_freq: u64,
    /// Validate (η = 0, `rollout.eval_steps`, seed 42) on `data.val_files` every this many steps (0: never).
    pub val_freq: u64,
    /// Validate once before the first step (logged as step 0), as the reference's
    /// `val_before_train`; needs `data.val_files`.
    pub val_before_train: bool,
    /// Keep an EMA of the trainable weights with this decay, used for validation and exported
    /// beside the LoRA (`lora/ema_lora_weights.safetensors`); none by default.
    pub ema_decay: Option<f64>,
    /// Stop after the step that crosses this many seconds of training (validating and saving
    /// as at the last step); none by default. For job time limits and equal-time comparisons.
    pub time_limit_s: Option<f64>,
    /// Let a resume go on with a recipe that changes what the run computes (see
    /// `recipe.resolved.yaml` in the run folder); refused by default, naming the keys.
    pub allow_recipe_change: bool,
    /// On a GPU, `train` plans the recipe for the job's GPUs before anything loads and refuses
    /// one that does not fit (the plan's verdict names the change that does); false skips it.
    pub memory_check: bool,
    /// GiB of memory per device that `auto` sizes (`rollout.batch_size`,
    /// `trainer.micro_batch_size`) are fitted to by the plan; unset: what the device has free
    /// when the run starts (host memory on the CPU).
    pub auto_memory_gib: Option<f64>,
    /// Under several ranks, how long a collective waits for the others before the run stops
    /// with an error (a rank that died or hangs).
    pub dist_timeout_s: f64,
    /// Recompute each transformer block's activations in backward instead of keeping them: less
    /// memory for one more block forward per backward; the same gradients.
    pub gradient_checkpointing: bool,
    /// The device's peak matmul throughput in TFLOP/s for `perf/mfu`; when absent, the known
    /// peak of the GPU for the model's dtype (none on a CPU or an unknown GPU: no `perf/mfu`).
    pub peak_tflops: Option<f64>,
    /// Under full fine-tuning in bf16 or f16, keep an f32 copy of every trained weight: AdamW
    /// updates the copy and the model gets it rounded, so steps smaller than the model dtype's
    /// resolution add up instead of rounding away. Checkpointed beside the Adam moments.
    pub f32_master_weights: bool,
    /// What is split over the ranks of a job: `none`, `optimizer` (the Adam moments, ZeRO-1),
    /// `frozen` (LoRA: each rank keeps 1/N of every transformer block's frozen weights and
    /// gathers a block just before it runs) or `full` (full fine-tuning: the blocks' weights,
    /// gradients and moments in 1/N slices). Unset: `optimizer` under full fine-tuning, `none`
    /// under LoRA.
    pub sharding: Option<Sharding>,
    /// Sum the gradients of a step's micro-batches and ranks in f64, ranks in rank order, and
    /// round once: the sum then does not depend on how the rows are split over ranks and
    /// micro-batches (exact unless the parts differ by more than 2²⁹ in scale), so runs with
    /// different world sizes train bit for bit alike. Costs an f64 copy of the trained weights
    /// and, during the reduction, one per rank.
    pub exact_gradient_sum: bool,
    /// What of the trained state lives in host memory instead of on the device: `none`,
    /// `optimizer` (Adam moments, f32 masters, the EMA and old-policy copies; AdamW steps there)
    /// or `all` (also the sharded blocks' weight slices and gradient sums; needs
    /// `trainer.sharding` frozen or full). The update's arithmetic is the same either way.
    pub offload: StateOffload,
    /// Sequence parallelism (Ulysses): the ranks split into groups of this many consecutive
    /// ranks; a group works on the same samples, each rank on 1/S of every sample's tokens, and
    /// attention exchanges them. Data parallelism runs across the groups. Must divide the world
    /// size and the model's attention heads; 1 (the default) turns it off.
    pub sequence_parallel_size: usize,
}

/// `trainer.offload`: what of the trained state lives in host memory.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum StateOffload {
    /// Everything on the device.
    #[default]
    None,
    /// The optimizer's state and the weight copies.
    Optimizer,
    /// That and the sharded blocks' slices and their gradient sums.
    All,
}

/// `trainer.sharding`: what each rank keeps only a share of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Sharding {
    /// Every rank keeps everything.
    None,
    /// The Adam moments (and f32 masters) of full fine-tuning (ZeRO-1).
    Optimizer,
    /// The frozen base weights of the transformer blocks under LoRA.
    Frozen,
    /// Full fine-tuning: the transformer blocks' weights as f32 master slices, their gradients
    /// and Adam moments (FSDP's full sharding).
    Full,
}

impl Default for TrainerSection {
    fn default() -> Self {
        Self {
            total_steps: 100,
            lr: 3e-4,
            weight_decay: 1e-4,
            betas: [0.9, 0.999],
            eps: 1e-8,
            max_grad_norm: 1.0,
            lr_schedule: LrSchedule::Constant,
            warmup_steps: 0,
            ppo_epochs: 1,
            ppo_mini_batch_size: 1,
            micro_batch_size: 4,
            old_log_prob: OldLogProb::Recompute,
            off_policy_lag: 0,
            rollout_ranks: 0,
            device: None,
            output_dir: PathBuf::from("runs/flowtune"),
            save_freq: 10,
            keep_last: 2,
            resume: Resume::Auto,
            image_freq: 10,
            val_freq: 0,
            val_before_train: false,
            ema_decay: None,
            time_limit_s: None,
            allow_recipe_change: false,
            memory_check: true,
            auto_memory_gib: None,
            dist_timeout_s: 1800.0,
            gradient_checkpointing: false,
            peak_tflops: None,
            f32_master_weights: false,
            sharding: None,
            exact_gradient_sum: false,
            offload: StateOffload::None,
            sequence_parallel_size: 1,
        }
    }
}

impl TrainerSection {
    /// Checks ranges; the error is the key and what is wrong with it.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |key: &str, value: String, expected: &str| {
            Err((format!("trainer.{key}"), format!("{value} is not allowed; expected {expected}")))
        };
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return bad("lr", self.lr.to_string(), "a finite number > 0");
        }
        if !self.betas.iter().all(|b| (0.0..1.0).contains(b)) {
            return bad("betas", format!("{:?}", self.betas), "two numbers in [0, 1)");
        }
        if !(self.eps > 0.0 && self.eps.is_finite()) {
            return bad("eps", self.eps.to_string(), "a finite number > 0");
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return bad("weight_decay", self.weight_decay.to_string(), "a finite number ≥ 0");
        }
        if !(self.max_grad_norm > 0.0 && self.max_grad_norm.is_finite()) {
            return bad("max_grad_norm", self.max_grad_norm.to_string(), "> 0");
        }
        for (key, v) in [
            ("ppo_epochs", self.ppo_epochs),
            ("ppo_mini_batch_size", self.ppo_mini_batch_size),
            ("micro_batch_size", self.micro_batch_size),
            ("keep_last", self.keep_last),
            ("sequence_parallel_size", self.sequence_parallel_size),
        ] {
            if v == 0 {
                return bad(key, v.to_string(), "≥ 1");
            }
        }
        if let Some(d) = self.ema_decay {
            if !(0.0..1.0).contains(&d) {
                return bad("ema_decay", d.to_string(), "in [0, 1)");
            }
        }
        if let Some(limit) = self.time_limit_s {
            if !(limit > 0.0 && limit.is_finite()) {
                return bad("time_limit_s", limit.to_string(), "a finite number of seconds > 0");
            }
        }
        if let Some(peak) = self.peak_tflops {
            if !(peak > 0.0 && peak.is_finite()) {
                return bad("peak_tflops", peak.to_string(), "a finite number of TFLOP/s > 0");
            }
        }
        if !(self.dist_timeout_s > 0.0 && self.dist_timeout_s.is_finite()) {
            let v = self.dist_timeout_s.to_string();
            return bad("dist_timeout_s", v, "a finite number of seconds > 0");
        }
        if self.total_steps == 0 {
            return bad("total_steps", "0".into(), "≥ 1");
        }
        if self.off_policy_lag > 1 {
            return bad("off_policy_lag", self.off_policy_lag.to_string(), "0 or 1");
        }
        if self.rollout_ranks > 0 && self.sequence_parallel_size > 1 {
            let k = self.rollout_ranks.to_string();
            return bad(
                "rollout_ranks",
                k,
                "0 under sequence parallelism (rollout ranks do not split samples yet)",
            );
        }
        if self.rollout_ranks > 0 && self.sharding == Some(Sharding::Full) {
            let k = self.rollout_ranks.to_string();
            return bad("rollout_ranks", k, "0 under trainer.sharding: full (rollout ranks take whole weights; use optimizer sharding or LoRA)");
        }
        if let Some(gib) = self.auto_memory_gib.filter(|g| !(*g > 0.0 && g.is_finite())) {
            return bad("auto_memory_gib", gib.to_string(), "a finite number of GiB > 0");
        }
        Ok(())
    }
}
