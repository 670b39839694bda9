//! `flowtune make-tiny sd3|shapes|qwen-image|qwen-image21|z-image|flux|flux2|wan|ltx2 DIR`: a random-initialised pipeline in the diffusers layout.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use flowtune_models::flux::{write_tiny_flux, FluxTransformerConfig, TinyFluxSpec};
use flowtune_models::flux2::{write_tiny_flux2, Flux2TransformerConfig, TinyFlux2Spec};
use flowtune_models::ltx2::{write_tiny_ltx2, TinyLtx2Spec};
use flowtune_models::qwen_image::{
    write_tiny_qwen_image, QwenImageTransformerConfig, TinyQwenImageSpec,
};
use flowtune_models::qwen_image21::{write_tiny_qwen_image21, TinyQwenImage21Spec};
use flowtune_models::sd3::{write_tiny_sd3, Sd3TransformerConfig, TinySd3Spec, WeightInit};
use flowtune_models::text_encoders::qwen_tiny::TinyQwenTextSpec;
use flowtune_models::wan::{write_tiny_wan, TinyWanSpec, WanTransformerConfig};
use flowtune_models::z_image::{write_tiny_z_image, TinyZImageSpec, ZImageTransformerConfig};
use flowtune_models::{read_config, Dtype, ModelError};

use crate::Failure;

#[derive(Subcommand)]
pub enum MakeTiny {
    /// A StableDiffusion3Pipeline: transformer, VAE, CLIP-L, CLIP-G, T5, tokenizers, scheduler.
    Sd3(Sd3Args),
    /// The shapes-world base model before pre-training: a pixel-space SD3 pipeline (no VAE, no
    /// T5) with word-level CLIP tokenizers over the shapes vocabulary, initialised for training.
    Shapes(ShapesArgs),
    /// A QwenImagePipeline: transformer, VAE (AutoencoderKLQwenImage), Qwen2.5-VL text encoder,
    /// a small Qwen2 BPE tokenizer, scheduler; diffusers loads and runs it.
    QwenImage(QwenImageArgs),
    /// A QwenImage21Pipeline (Qwen-Image 2.1): block-causal transformer, AutoencoderKLQwenImage21,
    /// a Qwen3VLForConditionalGeneration config with the language model's weights, a
    /// Qwen3VLProcessor (small Qwen2 BPE tokenizer), scheduler, author-set sample_sigmas.
    QwenImage21(QwenImage21Args),
    /// A ZImagePipeline: transformer, VAE (AutoencoderKL with scaling and shift factors), Qwen3
    /// text encoder, a small Qwen2 BPE tokenizer with a Qwen3 chat template, scheduler;
    /// diffusers loads and runs it.
    ZImage(ZImageArgs),
    /// A FluxPipeline (FLUX.1 [dev], or [schnell]): transformer, VAE, CLIPTextModel, T5,
    /// tokenizers, scheduler; diffusers loads and runs it.
    Flux(FluxArgs),
    /// A Flux2KleinPipeline (FLUX.2 [klein]): transformer, VAE (AutoencoderKLFlux2), a 27-layer
    /// Qwen3 text encoder, a small Qwen2 BPE tokenizer with a Qwen3 chat template, scheduler; or
    /// with `--dev` a Flux2Pipeline (FLUX.2 [dev]: guidance embedding, a 30-layer Mistral3 text
    /// encoder, a PixtralProcessor); diffusers loads and runs it.
    Flux2(Flux2Args),
    /// A WanPipeline (Wan2.2-TI2V-style: residual VAE with 2×2 pixel patches, per-token
    /// timesteps; or Wan2.1-style): transformer, AutoencoderKLWan, UMT5 text encoder, T5
    /// tokenizer, UniPC scheduler; diffusers loads and runs it.
    Wan(WanArgs),
    /// An LTX2Pipeline (LTX-2.0's layout, or LTX-2.3's with `--ltx23`): the audio-video
    /// transformer, both VAEs, the vocoder, a Gemma-3 text encoder with a small BPE tokenizer,
    /// the connectors, scheduler; diffusers loads and runs it.
    Ltx2(Ltx2Args),
}

/// Where every pipeline goes, and its seed.
#[derive(Args)]
pub struct Out {
    /// Output directory (created if missing).
    dir: PathBuf,
    /// Seed of the random weights (the same on every machine).
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// A real transformer's width with fewer blocks, and the dtype of its weights.
#[derive(Args)]
pub struct RealWidth {
    /// A transformer `config.json` (e.g. examples/models/qwen-image/transformer/config.json):
    /// its widths with `--layers` blocks instead of the size flags; the text encoders and the VAE
    /// stay tiny at the widths it reads.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The transformer's weights as f32, bf16 (a released checkpoint's) or f16.
    #[arg(long, default_value = "f32", value_parser = super::bench_common::parse_dtype)]
    dtype: Dtype,
}

impl RealWidth {
    /// The config file read as `T` with `layers` applied, if one was given.
    fn read<T>(
        &self,
        read: fn(&Path) -> Result<T, ModelError>,
        layers: impl FnOnce(&mut T),
    ) -> Result<Option<T>, Failure> {
        let Some(path) = &self.config else { return Ok(None) };
        let mut config = read(path).map_err(Failure::input)?;
        layers(&mut config);
        Ok(Some(config))
    }
}

impl Out {
    /// Writes the pipeline with `write` into the directory and says so.
    fn write(self, write: impl FnOnce(&Path) -> Result<(), ModelError>) -> Result<(), Failure> {
        write(&self.dir).map_err(Failure::input)?;
        println!("wrote {}", self.dir.display());
        Ok(())
    }
}

#[derive(Args)]
pub struct ZImageArgs {
    #[command(flatten)]
    out: Out,
    #[command(flatten)]
    real: RealWidth,
    /// Main single-stream blocks (the refiners keep `--config`'s count).
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Transformer width.
    #[arg(long, default_value_t = 64)]
    dim: i64,
    /// Attention heads (the rotary axes split the head width 1:1.5:1.5).
    #[arg(long, default_value_t = 2)]
    heads: i64,
}

#[derive(Args)]
pub struct QwenImage21Args {
    #[command(flatten)]
    out: Out,
    #[arg(long, default_value_t = 2)]
    layers: usize,
    #[arg(long, default_value_t = 2)]
    heads: i64,
    /// Width of one head (the rotary axes split it 1:1.5:1.5).
    #[arg(long, default_value_t = 16)]
    head_dim: i64,
}

#[derive(Args)]
pub struct Flux2Args {
    #[command(flatten)]
    out: Out,
    #[command(flatten)]
    real: RealWidth,
    /// Double-stream blocks (with `--config` too).
    #[arg(long, default_value_t = 1)]
    layers: usize,
    /// Single-stream blocks (with `--config` too).
    #[arg(long, default_value_t = 2)]
    single_layers: usize,
    #[arg(long, default_value_t = 2)]
    heads: i64,
    /// Width of one head (a multiple of 8: four equal rotary axes).
    #[arg(long, default_value_t = 16)]
    head_dim: i64,
    /// A step-distilled [klein] (`is_distilled`: no CFG).
    #[arg(long)]
    distilled: bool,
    /// FLUX.2 [dev] (`Flux2Pipeline`): a Mistral3 text encoder with a PixtralProcessor, and a
    /// guidance embedding (implied by a `--config` with `guidance_embeds`).
    #[arg(long, conflicts_with = "distilled")]
    dev: bool,
}

#[derive(Args)]
pub struct WanArgs {
    #[command(flatten)]
    out: Out,
    #[command(flatten)]
    real: RealWidth,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    #[arg(long, default_value_t = 2)]
    heads: i64,
    /// Width of one head.
    #[arg(long, default_value_t = 16)]
    head_dim: i64,
    /// Width of the feed-forward layers.
    #[arg(long, default_value_t = 64)]
    ffn_dim: i64,
    /// Width of the UMT5 text encoder (the transformer's `text_dim`).
    #[arg(long, default_value_t = 32)]
    text_width: i64,
    /// Wan2.1's VAE (z 16, 8× spatial) and per-sample timesteps.
    #[arg(long)]
    wan21: bool,
    /// Wan2.2-T2V-A14B's layout: Wan2.1's VAE and two experts, `transformer_2` below
    /// `boundary_ratio` 0.875.
    #[arg(long, conflicts_with = "wan21")]
    a14b: bool,
}

#[derive(Args)]
pub struct Ltx2Args {
    #[command(flatten)]
    out: Out,
    /// LTX-2.3's layout: gated attention, text modulation, per-modality connector projections,
    /// split rotary, the bandwidth-extending vocoder.
    #[arg(long)]
    ltx23: bool,
    /// The transformer's weights as f32, bf16 (a released checkpoint's) or f16.
    #[arg(long, default_value = "f32", value_parser = super::bench_common::parse_dtype)]
    dtype: Dtype,
}

#[derive(Args)]
pub struct FluxArgs {
    #[command(flatten)]
    out: Out,
    #[command(flatten)]
    real: RealWidth,
    /// Double-stream transformer blocks.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Single-stream transformer blocks.
    #[arg(long, default_value_t = 2)]
    single_layers: usize,
    /// FLUX.1 [schnell]: no guidance embedding, no dynamic shift.
    #[arg(long)]
    schnell: bool,
}

#[derive(Args)]
pub struct QwenImageArgs {
    #[command(flatten)]
    out: Out,
    #[command(flatten)]
    real: RealWidth,
    /// Dual-stream transformer blocks.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    #[arg(long, default_value_t = 2)]
    heads: i64,
    /// Width of one head (the rotary axes split it 1:1.5:1.5).
    #[arg(long, default_value_t = 16)]
    head_dim: i64,
    /// Width of the text encoder (the transformer's joint_attention_dim).
    #[arg(long, default_value_t = 32)]
    text_width: i64,
    /// Give condition-image tokens timestep 0 (the Edit models' `zero_cond_t`).
    #[arg(long)]
    zero_cond_t: bool,
    /// A QwenImageEditPlusPipeline (condition pictures through the vision tower and the VAE).
    #[arg(long)]
    edit: bool,
}

#[derive(Args)]
pub struct ShapesArgs {
    #[command(flatten)]
    out: Out,
    /// Joint transformer blocks.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    #[arg(long, default_value_t = 4)]
    heads: i64,
    #[arg(long, default_value_t = 32)]
    head_dim: i64,
    /// Pixels per patch side.
    #[arg(long, default_value_t = 4)]
    patch_size: i64,
    /// Image height and width in pixels.
    #[arg(long, default_value_t = 32)]
    resolution: i64,
    /// Width of each CLIP text encoder.
    #[arg(long, default_value_t = 64)]
    text_width: i64,
    /// Layers of each CLIP text encoder.
    #[arg(long, default_value_t = 2)]
    text_layers: usize,
    /// The scheduler's timestep shift (1 suits small images).
    #[arg(long, default_value_t = 1.0)]
    shift: f64,
}

#[derive(Args)]
pub struct Sd3Args {
    #[command(flatten)]
    out: Out,
    #[command(flatten)]
    real: RealWidth,
    /// Joint transformer blocks.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 2)]
    heads: i64,
    /// Width of one head.
    #[arg(long, default_value_t = 16)]
    head_dim: i64,
    /// Largest latent height/width (the position table covers it).
    #[arg(long, default_value_t = 32)]
    latent_size: i64,
    /// Blocks with SD3.5's second attention, comma-separated.
    #[arg(long, value_delimiter = ',')]
    dual_attention_layers: Vec<usize>,
    /// RMS-normalise queries and keys (SD3.5).
    #[arg(long)]
    qk_norm: bool,
    /// VAE channels per level, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "16,32")]
    vae_channels: Vec<i64>,
}

pub fn run(command: MakeTiny) -> Result<(), Failure> {
    match command {
        MakeTiny::ZImage(a) => {
            let head_dim = a.dim / a.heads;
            let frame = (head_dim / 8) * 2;
            let side = (head_dim - frame) / 4 * 2;
            let spec = TinyZImageSpec {
                seed: a.out.seed,
                layers: a.layers,
                dim: a.dim,
                heads: a.heads,
                axes_dims: vec![head_dim - 2 * side, side, side],
                dtype: a.real.dtype.kind(),
                transformer: a
                    .real
                    .read(read_config::<ZImageTransformerConfig>, |c| c.n_layers = a.layers)?,
                ..Default::default()
            };
            a.out.write(|dir| write_tiny_z_image(dir, &spec))
        }
        MakeTiny::Flux2(a) => {
            let transformer = a.real.read(read_config::<Flux2TransformerConfig>, |c| {
                (c.num_layers, c.num_single_layers) = (a.layers, a.single_layers)
            })?;
            let spec = TinyFlux2Spec {
                seed: a.out.seed,
                layers: a.layers,
                single_layers: a.single_layers,
                heads: a.heads,
                head_dim: a.head_dim,
                axes_dims_rope: vec![a.head_dim / 4; 4],
                distilled: a.distilled,
                dev: a.dev || transformer.as_ref().is_some_and(|c| c.guidance_embeds),
                dtype: a.real.dtype.kind(),
                transformer,
                ..Default::default()
            };
            a.out.write(|dir| write_tiny_flux2(dir, &spec))
        }
        MakeTiny::QwenImage21(a) => {
            let side = (a.head_dim * 3 / 8) / 2 * 2;
            let spec = TinyQwenImage21Spec {
                seed: a.out.seed,
                layers: a.layers,
                heads: a.heads,
                head_dim: a.head_dim,
                axes_dims_rope: [a.head_dim - 2 * side, side, side],
                ..Default::default()
            };
            a.out.write(|dir| write_tiny_qwen_image21(dir, &spec))
        }
        MakeTiny::QwenImage(a) => {
            let frame = (a.head_dim / 8) * 2;
            let side = (a.head_dim - frame) / 4 * 2;
            let spec = TinyQwenImageSpec {
                seed: a.out.seed,
                layers: a.layers,
                heads: a.heads,
                head_dim: a.head_dim,
                axes_dims_rope: [a.head_dim - 2 * side, side, side],
                text: TinyQwenTextSpec { hidden_size: a.text_width, ..Default::default() },
                zero_cond_t: a.zero_cond_t,
                edit: a.edit,
                dtype: a.real.dtype.kind(),
                transformer: a
                    .real
                    .read(read_config::<QwenImageTransformerConfig>, |c| c.num_layers = a.layers)?,
                ..Default::default()
            };
            a.out.write(|dir| write_tiny_qwen_image(dir, &spec))
        }
        MakeTiny::Wan(a) => {
            let spec = TinyWanSpec {
                seed: a.out.seed,
                layers: a.layers,
                heads: a.heads,
                head_dim: a.head_dim,
                ffn_dim: a.ffn_dim,
                text_width: a.text_width,
                wan21: a.wan21 || a.a14b,
                two_experts: a.a14b,
                dtype: a.real.dtype.kind(),
                transformer: a
                    .real
                    .read(read_config::<WanTransformerConfig>, |c| c.num_layers = a.layers)?,
                ..Default::default()
            };
            a.out.write(|dir| write_tiny_wan(dir, &spec))
        }
        MakeTiny::Ltx2(a) => {
            let spec =
                TinyLtx2Spec { seed: a.out.seed, ltx23: a.ltx23, dtype: Some(a.dtype.kind()) };
            a.out.write(|dir| write_tiny_ltx2(dir, &spec))
        }
        MakeTiny::Flux(a) => {
            let spec = TinyFluxSpec {
                seed: a.out.seed,
                layers: a.layers,
                single_layers: a.single_layers,
                schnell: a.schnell,
                dtype: a.real.dtype.kind(),
                transformer: a.real.read(read_config::<FluxTransformerConfig>, |c| {
                    c.num_layers = a.layers;
                    c.num_single_layers = a.single_layers;
                })?,
                ..Default::default()
            };
            a.out.write(|dir| write_tiny_flux(dir, &spec))
        }
        MakeTiny::Sd3(a) => {
            let spec = TinySd3Spec {
                seed: a.out.seed,
                layers: a.layers,
                heads: a.heads,
                head_dim: a.head_dim,
                latent_size: a.latent_size,
                dual_attention_layers: a.dual_attention_layers,
                qk_norm: a.qk_norm,
                vae_channels: a.vae_channels,
                dtype: a.real.dtype.kind(),
                transformer: a.real.read(read_config::<Sd3TransformerConfig>, |c| {
                    c.num_layers = a.layers;
                    c.dual_attention_layers.retain(|&i| i < a.layers);
                })?,
                ..Default::default()
            };
            a.out.write(|dir| write_tiny_sd3(dir, &spec))
        }
        MakeTiny::Shapes(a) => {
            let spec = TinySd3Spec {
                seed: a.out.seed,
                layers: a.layers,
                heads: a.heads,
                head_dim: a.head_dim,
                latent_size: a.resolution,
                patch_size: a.patch_size,
                pixel_space: true,
                t5: false,
                clip_l_width: a.text_width,
                clip_g_width: a.text_width,
                // The joint width only sizes the (zero) T5 slot and the CLIP padding.
                t5_width: 2 * a.text_width,
                text_layers: a.text_layers,
                vocabulary: Some(flowtune_shapes::vocabulary()),
                clip_length: flowtune_shapes::MAX_PROMPT_WORDS + 2,
                init: WeightInit::FanIn,
                shift: a.shift,
                ..Default::default()
            };
            a.out.write(|dir| write_tiny_sd3(dir, &spec))
        }
    }
}
