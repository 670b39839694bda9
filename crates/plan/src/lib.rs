//! `flowtune plan`: what one training step holds per rank — weights, adapters, gradients,
//! optimizer state, activations, trajectories, frozen encoders on the device or the host — from a
//! pipeline's `config.json` files alone, and whether it fits a GPU. Every figure is a formula of
//! `docs/plan.md`. Torch-free: nothing here loads a weight.

pub mod audio;
pub mod denoisers;
pub mod inventory;
pub mod json;
pub mod judges;
pub mod ltx2;
pub mod memory;
pub mod pipeline;
pub mod text;
pub mod vae;
pub mod verdict;

pub use flowtune_lora_match::Patterns;
pub use memory::{plan, Item, Phase, Place, Plan};
pub use pipeline::Pipeline;
pub use verdict::{verdict, Verdict};

/// Bytes in a GiB.
pub const GIB: f64 = (1u64 << 30) as f64;

/// Why a pipeline could not be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("{path}: {key}: {message}")]
    Key { path: String, key: String, message: String },
}

/// Storage type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    Bf16,
    F16,
}

impl Dtype {
    pub fn bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
        }
    }
}

/// Which frozen components live on the host (`model.offload`), cheapest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Offload {
    None,
    Encoders,
    EncodersAndVae,
}

/// The recipe settings a plan depends on.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Full fine-tuning (every denoiser weight) instead of LoRA.
    pub full: bool,
    pub dtype: Dtype,
    pub frozen_dtype: Dtype,
    /// `model.lora`: `rank` on the `target_modules`, or a module's `rank_pattern` rank.
    pub lora_rank: u64,
    pub lora_targets: Vec<String>,
    pub lora_rank_pattern: Patterns<u64>,
    pub offload: Offload,
    /// Pixels per side (square samples).
    pub resolution: u64,
    /// Pixel frames of a video sample (Wan, LTX-2); `None` for images or the family default.
    pub num_frames: Option<u64>,
    /// Frames per second of a sample with sound (LTX-2's `model.frame_rate`); `None` is 24.
    pub frame_rate: Option<f64>,
    /// Text tokens the long text encoder gives (`model.max_sequence_length`).
    pub text_tokens: u64,
    /// The condition pictures of the prompt row that adds the most tokens, each as its (width,
    /// height) in pixels when VAE-encoded into image-stream tokens (editing, FLUX.2 references).
    pub condition_pictures: Vec<(u64, u64)>,
    /// Tokens those pictures add to the text sequence beyond `text_tokens` (vision tokens of a
    /// pipeline that does not cut the prompt at `max_sequence_length`).
    pub condition_text_tokens: u64,
    pub micro_batch: u64,
    /// Rows the rollout samples per model batch (`rollout.batch_size`; 0: all of a rank's rows).
    pub rollout_batch: u64,
    pub gradient_checkpointing: bool,
    pub f32_master_weights: bool,
    /// Classifier-free guidance (`rollout.guidance_scale > 1`): two branches per sample.
    pub cfg: bool,
    /// A frozen copy of the denoiser as the reference policy (full fine-tuning with a KL term,
    /// DPO, DiffusionNFT).
    pub reference_copy: bool,
    /// Extra copies of the trained weights: an EMA, DiffusionNFT's old policy, the sampling copy
    /// of `trainer.off_policy_lag`, DMD2's fake score (and its Adam moments, two more).
    pub weight_copies: u64,
    /// Prompts per step (all ranks) and samples per prompt.
    pub prompts_per_step: u64,
    pub samples_per_prompt: u64,
    /// Recorded SDE-window steps per sample.
    pub window_steps: u64,
    pub gpus: u64,
    pub gpu_memory_gib: f64,
    /// `trainer.sequence_parallel_size` (S): groups of S ranks share their samples, each rank
    /// holding 1/S of every sample's tokens.
    pub sequence_parallel: u64,
    /// `trainer.sharding`, resolved: what each rank keeps only 1/N of.
    pub sharding: Sharding,
    /// `trainer.exact_gradient_sum`: sharded blocks' gradient sums in f64.
    pub exact_gradient_sum: bool,
    /// `trainer.offload`.
    pub state_offload: StateOffload,
    /// Frozen teacher pipelines (on-policy distillation), loaded whole with the model's dtypes
    /// and offload.
    pub teachers: Vec<Pipeline>,
    /// Reward models that run in the training process.
    pub judges: Vec<judges::Judge>,
    /// `trainer.rollout_ranks`: ranks besides `gpus` that only sample; the training ranks then
    /// take each step's samples whole from them.
    pub rollout_ranks: u64,
    /// Plans one of those rollout ranks instead: whole weights and adapters, the frozen parts,
    /// its share of the samples and the rollout's activations; nothing of the update.
    pub samples_only: bool,
}

impl Setup {
    /// The setup of one of the rollout ranks of a split job.
    pub fn rollout_rank(&self) -> Self {
        Self {
            gpus: self.rollout_ranks.max(1),
            sequence_parallel: 1,
            samples_only: true,
            ..self.clone()
        }
    }

    /// The adapter rank of the linear layer `module`; `None` where LoRA adds no adapter.
    pub fn lora_rank_of(&self, module: &str) -> Option<u64> {
        let targeted = flowtune_lora_match::targets(&self.lora_targets, module);
        targeted.then(|| self.lora_rank_pattern.value_for(module).unwrap_or(self.lora_rank))
    }

    /// Samples a rank draws in one step (its sequence-parallel group's).
    pub fn samples(&self) -> u64 {
        let groups = (self.gpus / self.sequence_parallel.max(1)).max(1);
        self.prompts_per_step.div_ceil(groups) * self.samples_per_prompt
    }

    /// Rows per model batch of the rollout (`rollout.batch_size`, 0: all of the rank's rows).
    pub fn rollout_rows(&self) -> u64 {
        match self.rollout_batch {
            0 => self.samples(),
            b => b.min(self.samples()),
        }
        .max(1)
    }
}

/// What of the trained state lives on the host (`trainer.offload`), cheapest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StateOffload {
    None,
    /// Adam moments, f32 masters, EMA and old-policy copies.
    Optimizer,
    /// Also the sharded blocks' slices and gradient sums.
    All,
}

/// What each rank keeps only a share of (`trainer.sharding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharding {
    None,
    /// Masters and Adam moments of full fine-tuning (ZeRO-1).
    Optimizer,
    /// The frozen block weights of LoRA, one block gathered at a time.
    Frozen,
    /// Full fine-tuning: block weights as f32 master slices, their gradient sums and moments.
    Full,
}
