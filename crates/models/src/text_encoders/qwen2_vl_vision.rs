//! The vision tower of `Qwen2VLForConditionalGeneration` (`visual.*`, or transformers 5's
//! `model.visual.*`): a bias-free patch embedding, pre-norm blocks (LayerNorm, a fused biased qkv,
//! 2-D rotary positions, full attention within each picture's frame, an MLP with QuickGELU) and a
//! patch merger (LayerNorm, then an MLP with GELU) joining `spatial_merge_size`² neighbours.
//! Tokens run in the processor's order (row-major merge blocks of `merge`×`merge` patches).

use std::path::Path;

use serde::Deserialize;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::qwen2_5_vl_vision::{
    axial_rotary, check_heads_and_rope, check_patch_grids, merge_block_positions,
    segment_attention, VisionRope,
};
use crate::nn::{LayerNorm, Linear, Scope};
use crate::{read_config, ModelError};

const IGNORED_PREFIXES: &[&str] = &["model.", "lm_head.", "rm_head."];
const RENAMED_PREFIXES: &[(&str, &str)] = &[("model.visual.", "visual.")];
const NORM_EPS: f64 = 1e-6;

/// Mirror of transformers' `Qwen2VLVisionConfig`, with its defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Qwen2VlVisionConfig {
    pub depth: usize,
    pub embed_dim: i64,
    /// Width of the merged embeddings (the language model's).
    pub hidden_size: i64,
    pub hidden_act: String,
    pub mlp_ratio: f64,
    pub num_heads: i64,
    #[serde(alias = "in_chans")]
    pub in_channels: i64,
    pub patch_size: i64,
    pub spatial_merge_size: i64,
    pub temporal_patch_size: i64,
    pub rope_parameters: Option<VisionRope>,
}

impl Default for Qwen2VlVisionConfig {
    fn default() -> Self {
        Self {
            depth: 32,
            embed_dim: 1280,
            hidden_size: 3584,
            hidden_act: "quick_gelu".into(),
            mlp_ratio: 4.0,
            num_heads: 16,
            in_channels: 3,
            patch_size: 14,
            spatial_merge_size: 2,
            temporal_patch_size: 2,
            rope_parameters: None,
        }
    }
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    vision_config: Qwen2VlVisionConfig,
}

impl Qwen2VlVisionConfig {
    /// Reads `vision_config` of a Qwen2-VL `config.json`, refusing what the tower does not run.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let config = read_config::<ConfigFile>(path)?.vision_config;
        let bad =
            |message: String| ModelError::Format { path: path.display().to_string(), message };
        if config.hidden_act != "quick_gelu" {
            return Err(bad(format!(
                "vision_config.hidden_act `{}` is not supported; expected quick_gelu",
                config.hidden_act
            )));
        }
        check_heads_and_rope(config.rope_parameters.as_ref(), config.embed_dim, config.num_heads)
            .map_err(bad)?;
        Ok(config)
    }

    /// Length of one row of `pixel_values`: channels × temporal patch × patch².
    pub fn patch_dim(&self) -> i64 {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }
}

struct Block {
    norm1: LayerNorm,
    norm2: LayerNorm,
    qkv: Linear,
    proj: Linear,
    fc1: Linear,
    fc2: Linear,
}

/// The tower with module names `visual.patch_embed.proj`, `visual.blocks.N.…`, `visual.merger.…`.
pub struct Qwen2VlVision {
    pub config: Qwen2VlVisionConfig,
    patch_embed: Tensor,
    blocks: Vec<Block>,
    ln_q: LayerNorm,
    merger_in: Linear,
    merger_out: Linear,
    pub store: VarStore,
}

impl Qwen2VlVision {
    /// Variables for `config` (zeros until loaded).
    pub fn new(config: &Qwen2VlVisionConfig, device: Device, kind: Kind) -> Self {
        let store = super::store(device, kind);
        let root = Scope::root(store.root(), None);
        let visual = &root / "visual";
        let d = config.embed_dim;
        let inner = (d as f64 * config.mlp_ratio) as i64;
        let blocks = (0..config.depth)
            .map(|i| {
                let block = &(&visual / "blocks") / i;
                let (attn, mlp) = (&block / "attn", &block / "mlp");
                Block {
                    norm1: LayerNorm::new(&(&block / "norm1"), d, NORM_EPS),
                    norm2: LayerNorm::new(&(&block / "norm2"), d, NORM_EPS),
                    qkv: (&attn / "qkv").linear(d, 3 * d, true),
                    proj: (&attn / "proj").linear(d, d, true),
                    fc1: (&mlp / "fc1").linear(d, inner, true),
                    fc2: (&mlp / "fc2").linear(inner, d, true),
                }
            })
            .collect();
        let (p, tp) = (config.patch_size, config.temporal_patch_size);
        let merged = d * config.spatial_merge_size * config.spatial_merge_size;
        let merger = &visual / "merger";
        let mlp = &merger / "mlp";
        Self {
            patch_embed: (&(&visual / "patch_embed") / "proj")
                .var("weight", &[d, config.in_channels, tp, p, p]),
            blocks,
            ln_q: LayerNorm::new(&(&merger / "ln_q"), d, NORM_EPS),
            merger_in: (&mlp / 0).linear(merged, merged, true),
            merger_out: (&mlp / 2).linear(merged, config.hidden_size, true),
            config: config.clone(),
            store,
        }
    }

    /// Loads the tower's tensors of a Qwen2-VL directory, frozen; the rest is skipped.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let config = Qwen2VlVisionConfig::from_file(&dir.join("config.json"))?;
        let mut model = Self::new(&config, device, kind);
        super::load_frozen(&mut model.store, dir, kind, IGNORED_PREFIXES, RENAMED_PREFIXES)?;
        Ok(model)
    }

    /// The merged embeddings (Σ t·h·w / merge², hidden_size) of `pixel_values` (Σ t·h·w,
    /// C·T·P·P) laid out as the image processor writes them, one `(t, h, w)` grid per picture.
    pub fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[(i64, i64, i64)],
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        check_patch_grids("Qwen2-VL", pixel_values, grid_thw, c.patch_dim(), c.spatial_merge_size)?;
        let device = self.patch_embed.device();
        let kind = self.patch_embed.kind();
        let (n, d) = (pixel_values.size()[0], c.embed_dim);
        let weight = self.patch_embed.view([d, -1]);
        let mut x = pixel_values.to_device(device).to_kind(kind).linear::<Tensor>(&weight, None);
        let positions = merge_block_positions(grid_thw, c.spatial_merge_size);
        let (cos, sin) = axial_rotary(d / c.num_heads, 10000.0, &positions, device);
        let frames: Vec<i64> =
            grid_thw.iter().flat_map(|&(t, h, w)| std::iter::repeat_n(h * w, t as usize)).collect();
        for block in &self.blocks {
            let qkv = block.qkv.forward(&block.norm1.forward(&x)).view([n, 3, c.num_heads, -1]);
            x = &x + block.proj.forward(&segment_attention(&qkv, &cos, &sin, &frames));
            let h = block.fc1.forward(&block.norm2.forward(&x));
            let quick_gelu = &h * (&h * 1.702).sigmoid();
            x = &x + block.fc2.forward(&quick_gelu);
        }
        let unit = c.spatial_merge_size * c.spatial_merge_size;
        let merged = self.ln_q.forward(&x).view([n / unit, unit * d]);
        Ok(self.merger_out.forward(&self.merger_in.forward(&merged).gelu("none")))
    }
}
