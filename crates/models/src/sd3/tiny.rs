//! `flowtune make-tiny sd3`: a complete random-initialised `StableDiffusion3Pipeline` directory in
//! the exact diffusers layout (and loadable by diffusers), for tests and examples.

use std::path::Path;

use flowtune_sampling::SampleRng;
use serde::Serialize;
use serde_json::json;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::{Sd3Transformer, Sd3TransformerConfig};
use crate::text_encoders::clip::{ClipTextConfig, ClipTextModel};
use crate::text_encoders::t5::{T5Config, T5Encoder};
use crate::tokenizer::tiny;
use crate::vae::{AutoencoderKl, VaeConfig};
use crate::{write_json, ModelError};

/// Sizes of a tiny pipeline.
#[derive(Debug, Clone)]
pub struct TinySd3Spec {
    pub seed: u64,
    pub layers: usize,
    pub heads: i64,
    pub head_dim: i64,
    /// Latent height and width the position table covers (`sample_size`).
    pub latent_size: i64,
    pub dual_attention_layers: Vec<usize>,
    pub qk_norm: bool,
    /// VAE channels per level (the VAE downsamples 2^(levels−1)).
    pub vae_channels: Vec<i64>,
    pub latent_channels: i64,
    pub clip_l_width: i64,
    pub clip_g_width: i64,
    /// Width of T5's states, which is also the transformer's `joint_attention_dim`.
    pub t5_width: i64,
    pub text_layers: usize,
    pub patch_size: i64,
    /// No VAE: the transformer works on RGB pixels in [−1, 1] (`"vae": [null, null]`).
    pub pixel_space: bool,
    /// Write T5 (`text_encoder_3`); without it SD3 uses zeros in its place.
    pub t5: bool,
    /// Word-level CLIP tokenizers over these words (instead of byte-level BPE), with a context
    /// of `clip_length` tokens.
    pub vocabulary: Option<Vec<String>>,
    pub clip_length: usize,
    pub init: WeightInit,
    /// The scheduler's timestep `shift`.
    pub shift: f64,
    /// The dtype the transformer's weights are written in (a released checkpoint's is bf16).
    pub dtype: Kind,
    /// A real transformer config (e.g. with fewer blocks) used as it is instead of the one the
    /// sizes above build; the text encoders and the VAE take their widths from it.
    pub transformer: Option<Sd3TransformerConfig>,
}

/// How random weights are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WeightInit {
    /// Every variable N(0, σ²) (norm scales around 1): exercises every weight, for parity tests.
    Normal(f64),
    /// For training from scratch: matrices N(0, 1/fan-in), biases 0, norm scales 1, the
    /// transformer's output projection and modulations 0 (DiT's adaLN-zero), the position table
    /// the 2-D sin-cos table.
    FanIn,
}

impl Default for TinySd3Spec {
    fn default() -> Self {
        Self {
            seed: 0,
            layers: 2,
            heads: 2,
            head_dim: 16,
            latent_size: 32,
            dual_attention_layers: vec![],
            qk_norm: false,
            vae_channels: vec![16, 32],
            latent_channels: 4,
            clip_l_width: 16,
            clip_g_width: 32,
            t5_width: 64,
            text_layers: 2,
            patch_size: 2,
            pixel_space: false,
            t5: true,
            vocabulary: None,
            clip_length: 77,
            init: WeightInit::Normal(0.1),
            shift: 3.0,
            dtype: Kind::Float,
            transformer: None,
        }
    }
}

impl TinySd3Spec {
    /// The spec with the text widths, latent channels and size `transformer` implies (CLIP-L and
    /// CLIP-G split the pooled width evenly, T5 is the joint width).
    fn fitted(&self) -> Self {
        let Some(t) = &self.transformer else { return self.clone() };
        let clip_l_width = t.pooled_projection_dim / 4 * 2;
        Self {
            clip_l_width,
            clip_g_width: t.pooled_projection_dim - clip_l_width,
            t5_width: t.joint_attention_dim,
            latent_channels: t.in_channels,
            latent_size: t.sample_size,
            patch_size: t.patch_size,
            ..self.clone()
        }
    }
}

pub(crate) const DIFFUSERS_VERSION: &str = "0.42.1";

/// Fills every variable as `init` says, from a seeded stream that is the same on every machine.
pub(crate) fn randomize(
    store: &VarStore,
    rng: &mut SampleRng,
    init: WeightInit,
) -> Result<(), ModelError> {
    let mut vars: Vec<(String, Tensor)> = store.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let _guard = tch::no_grad_guard();
    for (name, var) in vars {
        let size = var.size();
        let noise = rng.normal(&size, var.device());
        let is_norm_scale = name.ends_with(".weight")
            && (name.contains("norm") || name.contains("layer_norm"))
            && var.dim() == 1;
        let value = match init {
            WeightInit::Normal(scale) if is_norm_scale => noise * scale + 1.0,
            WeightInit::Normal(scale) => noise * scale,
            WeightInit::FanIn if name == "pos_embed.pos_embed" => sincos_table(&size),
            WeightInit::FanIn if is_norm_scale => noise.ones_like(),
            WeightInit::FanIn
                if var.dim() == 1
                    || name.starts_with("proj_out")
                    || name.contains("norm1.linear")
                    || name.contains("norm1_context.linear")
                    || name.contains("norm_out.linear") =>
            {
                noise.zeros_like()
            }
            WeightInit::FanIn => {
                let fan_in: i64 =
                    if name.contains("embedding") { 1 } else { size[1..].iter().product() };
                noise / (fan_in as f64).sqrt()
            }
        };
        var.shallow_clone().f_copy_(&value)?;
    }
    Ok(())
}

/// SD3's position table (1, M², D): for the cell at row i, column j of an M × M grid, the 1-D
/// sin-cos embedding of j in the first D/2 channels and of i in the rest.
fn sincos_table(size: &[i64]) -> Tensor {
    let (cells, dim) = (size[1], size[2]);
    let m = (cells as f64).sqrt() as i64;
    let half = dim / 2;
    let omega = (Tensor::arange(half / 2, (tch::Kind::Double, Device::Cpu)) / (half / 2) as f64
        * -(10_000f64.ln()))
    .exp();
    let embed = |pos: &Tensor| {
        let angles = pos.unsqueeze(1) * omega.unsqueeze(0);
        Tensor::cat(&[angles.sin(), angles.cos()], 1)
    };
    let idx = Tensor::arange(cells, (tch::Kind::Double, Device::Cpu));
    let (rows, cols) = ((&idx / m as f64).floor(), idx.remainder(m as f64));
    Tensor::cat(&[embed(&cols), embed(&rows)], 1).unsqueeze(0).to_kind(tch::Kind::Float)
}

fn save(store: &VarStore, dir: &Path, file: &str) -> Result<(), ModelError> {
    let mut named: Vec<(String, Tensor)> = store.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    Tensor::write_safetensors(&named, dir.join(file))?;
    Ok(())
}

/// A component folder: its weights (`file`) and `config.json`.
pub(crate) fn write_component(
    out: &Path,
    store: &VarStore,
    file: &str,
    config: &serde_json::Value,
) -> Result<(), ModelError> {
    mkdir(out)?;
    save(store, out, file)?;
    write_json(&out.join("config.json"), config)
}

/// A diffusers model folder: `store` as `diffusion_pytorch_model.safetensors` and `config` with
/// `_diffusers_version`.
pub(crate) fn write_model(
    out: &Path,
    store: &VarStore,
    config: &impl Serialize,
) -> Result<(), ModelError> {
    let mut cfg = serde_json::to_value(config).expect("config");
    cfg["_diffusers_version"] = json!(DIFFUSERS_VERSION);
    write_component(out, store, "diffusion_pytorch_model.safetensors", &cfg)
}

/// `scheduler/scheduler_config.json` of the pipeline folder `dir`.
pub(crate) fn write_scheduler(dir: &Path, config: &serde_json::Value) -> Result<(), ModelError> {
    let out = dir.join("scheduler");
    mkdir(&out)?;
    write_json(&out.join("scheduler_config.json"), config)
}

fn mkdir(dir: &Path) -> Result<(), ModelError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| ModelError::Io { path: dir.display().to_string(), message: e.to_string() })
}

/// Writes the pipeline into `dir` (created if missing).
pub fn write_tiny_sd3(dir: &Path, spec: &TinySd3Spec) -> Result<(), ModelError> {
    let spec = &spec.fitted();
    let mut rng = SampleRng::new(spec.seed);
    let device = Device::Cpu;
    let (clip_tok, clip_vocab) = match &spec.vocabulary {
        Some(words) => tiny::clip_words(words)?,
        None => crate::clip::tokenizer::tiny()?,
    };

    // Text encoders and tokenizers (SD3's CLIP-G pads with "!", which word vocabularies lack).
    let pad_g = if spec.vocabulary.is_some() { "<|endoftext|>" } else { "!" };
    for (name, width, tokenizer_dir, pad) in [
        ("text_encoder", spec.clip_l_width, "tokenizer", "<|endoftext|>"),
        ("text_encoder_2", spec.clip_g_width, "tokenizer_2", pad_g),
    ] {
        let clip = TinyClip {
            tokenizer: &clip_tok,
            vocab: clip_vocab,
            width,
            layers: spec.text_layers,
            length: spec.clip_length,
            projection: true,
            pad,
        };
        clip.write(&dir.join(name), &dir.join(tokenizer_dir), spec.init, &mut rng)?;
    }
    if spec.t5 {
        write_t5(dir, spec, &mut rng)?;
    }

    // Transformer.
    let latent_channels = if spec.pixel_space { 3 } else { spec.latent_channels };
    let transformer_config = spec.transformer.clone().unwrap_or_else(|| Sd3TransformerConfig {
        class_name: Some("SD3Transformer2DModel".into()),
        sample_size: spec.latent_size,
        patch_size: spec.patch_size,
        in_channels: latent_channels,
        num_layers: spec.layers,
        attention_head_dim: spec.head_dim,
        num_attention_heads: spec.heads,
        joint_attention_dim: spec.t5_width,
        caption_projection_dim: spec.heads * spec.head_dim,
        pooled_projection_dim: spec.clip_l_width + spec.clip_g_width,
        out_channels: Some(latent_channels),
        pos_embed_max_size: spec.latent_size / spec.patch_size,
        dual_attention_layers: spec.dual_attention_layers.clone(),
        qk_norm: spec.qk_norm.then(|| "rms_norm".to_string()),
    });
    let transformer = Sd3Transformer::new(&transformer_config, device, spec.dtype, None)?;
    randomize(&transformer.weights.base, &mut rng, spec.init)?;
    write_model(&dir.join("transformer"), &transformer.weights.base, &transformer_config)?;

    if !spec.pixel_space {
        write_vae(dir, spec, &mut rng)?;
    }

    // Scheduler and index.
    write_scheduler(
        dir,
        &json!({"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": DIFFUSERS_VERSION, "num_train_timesteps": 1000, "shift": spec.shift}),
    )?;
    write_json(
        &dir.join("model_index.json"),
        &json!({
            "_class_name": "StableDiffusion3Pipeline",
            "_diffusers_version": DIFFUSERS_VERSION,
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
            "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
            "text_encoder_3": optional(spec.t5, "transformers", "T5EncoderModel"),
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "tokenizer_2": ["transformers", "CLIPTokenizer"],
            "tokenizer_3": optional(spec.t5, "transformers", "T5Tokenizer"),
            "transformer": ["diffusers", "SD3Transformer2DModel"],
            "vae": optional(!spec.pixel_space, "diffusers", "AutoencoderKL"),
            "image_encoder": [null, null],
            "feature_extractor": [null, null],
        }),
    )
}

/// A tiny CLIP text encoder over a tiny CLIP tokenizer.
pub(crate) struct TinyClip<'a> {
    pub tokenizer: &'a tokenizers::Tokenizer,
    pub vocab: usize,
    pub width: i64,
    pub layers: usize,
    /// Context length (`max_position_embeddings`, the tokenizer's `model_max_length`).
    pub length: usize,
    /// `CLIPTextModelWithProjection` (else `CLIPTextModel`).
    pub projection: bool,
    pub pad: &'a str,
}

impl TinyClip<'_> {
    /// Writes the encoder into `encoder_dir` and the tokenizer into `tokenizer_dir`.
    pub(crate) fn write(
        &self,
        encoder_dir: &Path,
        tokenizer_dir: &Path,
        init: WeightInit,
        rng: &mut SampleRng,
    ) -> Result<(), ModelError> {
        let eos = (self.vocab - 1) as i64;
        let config = ClipTextConfig {
            vocab_size: self.vocab as i64,
            hidden_size: self.width,
            intermediate_size: 4 * self.width,
            projection_dim: self.width,
            num_hidden_layers: self.layers,
            num_attention_heads: 2,
            max_position_embeddings: self.length as i64,
            hidden_act: "quick_gelu".into(),
            layer_norm_eps: 1e-5,
            bos_token_id: eos - 1,
            eos_token_id: eos,
            pad_token_id: 1,
        };
        let model = ClipTextModel::new(&config, Device::Cpu, Kind::Float, self.projection)?;
        randomize(&model.store, rng, init)?;
        let mut cfg = serde_json::to_value(&config).expect("config");
        let class = if self.projection { "CLIPTextModelWithProjection" } else { "CLIPTextModel" };
        cfg["architectures"] = json!([class]);
        cfg["model_type"] = json!("clip_text_model");
        cfg["dtype"] = json!("float32");
        write_component(encoder_dir, &model.store, "model.safetensors", &cfg)?;
        tiny::write(
            tokenizer_dir,
            self.tokenizer,
            json!({
                "tokenizer_class": "CLIPTokenizer",
                "bos_token": "<|startoftext|>",
                "eos_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
                "pad_token": self.pad,
                "model_max_length": self.length,
            }),
        )
    }
}

/// T5 and its tokenizer.
fn write_t5(dir: &Path, spec: &TinySd3Spec, rng: &mut SampleRng) -> Result<(), ModelError> {
    write_tiny_t5(
        &dir.join("text_encoder_3"),
        &dir.join("tokenizer_3"),
        "t5",
        spec.t5_width,
        spec.text_layers,
        spec.init,
        rng,
    )
}

/// A tiny `T5EncoderModel` (`model_type` `t5`) or `UMT5EncoderModel` (`umt5`) of width `width`
/// in `encoder_dir` and the tiny T5 tokenizer in `tokenizer_dir`.
pub(crate) fn write_tiny_t5(
    encoder_dir: &Path,
    tokenizer_dir: &Path,
    model_type: &str,
    width: i64,
    layers: usize,
    init: WeightInit,
    rng: &mut SampleRng,
) -> Result<(), ModelError> {
    let (t5_tok, t5_vocab) = tiny::t5()?;
    // Inner widths capped, so that a T5 at a real transformer's text width stays small.
    let t5_config = T5Config {
        vocab_size: t5_vocab as i64,
        d_model: width,
        d_kv: (width / 2).min(32),
        d_ff: (2 * width).min(128),
        num_layers: layers,
        num_heads: 2,
        relative_attention_num_buckets: 8,
        relative_attention_max_distance: 16,
        layer_norm_epsilon: 1e-6,
        feed_forward_proj: "gated-gelu".into(),
        model_type: Some(model_type.into()),
    };
    let t5 = T5Encoder::new(&t5_config, Device::Cpu, Kind::Float)?;
    let class = if t5_config.bias_per_block() { "UMT5EncoderModel" } else { "T5EncoderModel" };
    randomize(&t5.store, rng, init)?;
    let mut cfg = serde_json::to_value(&t5_config).expect("config");
    for (k, v) in [
        ("architectures", json!([class])),
        ("dense_act_fn", json!("gelu_new")),
        ("is_gated_act", json!(true)),
        ("pad_token_id", json!(0)),
        ("eos_token_id", json!(1)),
        ("decoder_start_token_id", json!(0)),
        ("is_encoder_decoder", json!(false)),
        ("use_cache", json!(false)),
        ("dtype", json!("float32")),
    ] {
        cfg[k] = v;
    }
    write_component(encoder_dir, &t5.store, "model.safetensors", &cfg)?;
    tiny::write(
        tokenizer_dir,
        &t5_tok,
        json!({
            "tokenizer_class": "T5Tokenizer",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "pad_token": "<pad>",
            "extra_ids": 0,
            "model_max_length": 512,
        }),
    )
}

/// The VAE.
fn write_vae(dir: &Path, spec: &TinySd3Spec, rng: &mut SampleRng) -> Result<(), ModelError> {
    let levels = spec.vae_channels.len();
    let vae_config = VaeConfig {
        latent_channels: spec.latent_channels,
        block_out_channels: spec.vae_channels.clone(),
        down_block_types: vec!["DownEncoderBlock2D".into(); levels],
        up_block_types: vec!["UpDecoderBlock2D".into(); levels],
        layers_per_block: 1,
        norm_num_groups: 4,
        sample_size: spec.latent_size << (levels - 1),
        ..Default::default()
    };
    let vae = AutoencoderKl::new(&vae_config, Device::Cpu, Kind::Float)?;
    randomize(&vae.store, rng, spec.init)?;
    write_model(&dir.join("vae"), &vae.store, &vae_config)?;

    Ok(())
}

/// An index entry, or `[null, null]` for an absent optional component.
fn optional(present: bool, library: &str, class: &str) -> serde_json::Value {
    if present {
        json!([library, class])
    } else {
        json!([null, null])
    }
}
