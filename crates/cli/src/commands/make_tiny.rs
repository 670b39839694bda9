//! `flowtune make-tiny sd3 DIR`: a random-initialised pipeline in the diffusers layout.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use flowtune_models::sd3::{write_tiny_sd3, TinySd3Spec};

use crate::Failure;

#[derive(Subcommand)]
pub enum MakeTiny {
    /// A StableDiffusion3Pipeline: transformer, VAE, CLIP-L, CLIP-G, T5, tokenizers, scheduler.
    Sd3(Sd3Args),
}

#[derive(Args)]
pub struct Sd3Args {
    /// Output directory (created if missing).
    dir: PathBuf,
    /// Seed of the random weights (the same on every machine).
    #[arg(long, default_value_t = 0)]
    seed: u64,
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
        MakeTiny::Sd3(a) => {
            let spec = TinySd3Spec {
                seed: a.seed,
                layers: a.layers,
                heads: a.heads,
                head_dim: a.head_dim,
                latent_size: a.latent_size,
                dual_attention_layers: a.dual_attention_layers,
                qk_norm: a.qk_norm,
                vae_channels: a.vae_channels,
                ..Default::default()
            };
            write_tiny_sd3(&a.dir, &spec).map_err(Failure::input)?;
            println!("wrote {}", a.dir.display());
            Ok(())
        }
    }
}
