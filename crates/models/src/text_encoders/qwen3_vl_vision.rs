//! The vision tower of `Qwen3VLForConditionalGeneration` (`model.visual.*`, or the older
//! `visual.*`), which turns the patches of Qwen-Image 2.1's condition images into merged image
//! embeddings and deepstack features: a patch embedding plus a learned position table resampled
//! bilinearly (corners aligned) to each picture's grid, pre-norm blocks (LayerNorm, GELU-tanh MLP,
//! 2-D rotary positions, full attention within each picture), a patch merger joining
//! `spatial_merge_size`² neighbours, and one deepstack merger per `deepstack_visual_indexes`
//! block whose output the language model adds to the image tokens' states after its first layers.
//!
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

/// Checkpoint parts that are not the vision tower.
const IGNORED_PREFIXES: &[&str] = &["model.", "lm_head."];
/// transformers 5 module names for the vision tower.
const RENAMED_PREFIXES: &[(&str, &str)] = &[("model.visual.", "visual.")];
/// The tower's layer norms use a fixed epsilon.
const NORM_EPS: f64 = 1e-6;

/// Mirror of transformers' `Qwen3VLVisionConfig` (`vision_config` of the checkpoint's
/// `config.json`), with its defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Qwen3VlVisionConfig {
    pub depth: usize,
    pub hidden_size: i64,
    pub hidden_act: String,
    pub intermediate_size: i64,
    pub num_heads: i64,
    pub in_channels: i64,
    pub patch_size: i64,
    pub spatial_merge_size: i64,
    pub temporal_patch_size: i64,
    pub out_hidden_size: i64,
    pub num_position_embeddings: i64,
    pub deepstack_visual_indexes: Vec<usize>,
    pub rope_parameters: Option<VisionRope>,
}

impl Default for Qwen3VlVisionConfig {
    fn default() -> Self {
        Self {
            depth: 27,
            hidden_size: 1152,
            hidden_act: "gelu_pytorch_tanh".into(),
            intermediate_size: 4304,
            num_heads: 16,
            in_channels: 3,
            patch_size: 16,
            spatial_merge_size: 2,
            temporal_patch_size: 2,
            out_hidden_size: 3584,
            num_position_embeddings: 2304,
            deepstack_visual_indexes: vec![8, 16, 24],
            rope_parameters: None,
        }
    }
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    vision_config: Qwen3VlVisionConfig,
}

impl Qwen3VlVisionConfig {
    /// Reads `vision_config` from a Qwen3-VL `config.json`, refusing what the tower does not run.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let config = read_config::<ConfigFile>(path)?.vision_config;
        let bad =
            |message: String| ModelError::Format { path: path.display().to_string(), message };
        if config.hidden_act != "gelu_pytorch_tanh" {
            return Err(bad(format!(
                "vision_config.hidden_act `{}` is not supported; expected gelu_pytorch_tanh",
                config.hidden_act
            )));
        }
        check_heads_and_rope(config.rope_parameters.as_ref(), config.hidden_size, config.num_heads)
            .map_err(bad)?;
        let side = config.side();
        if side < 1 || side * side != config.num_position_embeddings {
            return Err(bad(format!(
                "vision_config.num_position_embeddings {}: expected a positive square",
                config.num_position_embeddings
            )));
        }
        if let Some(&k) = config.deepstack_visual_indexes.iter().find(|&&k| k >= config.depth) {
            return Err(bad(format!(
                "vision_config.deepstack_visual_indexes {:?}: block {k} is beyond depth {}",
                config.deepstack_visual_indexes, config.depth
            )));
        }
        Ok(config)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> i64 {
        self.hidden_size / self.num_heads
    }

    /// Length of one row of `pixel_values`: channels × temporal patch × patch².
    pub fn patch_dim(&self) -> i64 {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Side of the square learned position table.
    fn side(&self) -> i64 {
        (self.num_position_embeddings as f64).sqrt().round() as i64
    }

    fn rope_theta(&self) -> f64 {
        self.rope_parameters.as_ref().and_then(|r| r.rope_theta).unwrap_or(10000.0)
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

/// `Qwen3VLVisionPatchMerger`: a layer norm over each token (`merger`) or over the joined
/// merge² tokens (the deepstack mergers' `use_postshuffle_norm`), then a GELU MLP.
struct Merger {
    norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    postshuffle: bool,
}

impl Merger {
    fn new(scope: &Scope<'_>, config: &Qwen3VlVisionConfig, postshuffle: bool) -> Self {
        let d = config.hidden_size;
        let joined = d * config.spatial_merge_size * config.spatial_merge_size;
        Self {
            norm: LayerNorm::new(&(scope / "norm"), if postshuffle { joined } else { d }, NORM_EPS),
            fc1: (scope / "linear_fc1").linear(joined, joined, true),
            fc2: (scope / "linear_fc2").linear(joined, config.out_hidden_size, true),
            postshuffle,
        }
    }

    /// (N, hidden) tokens → (N / merge², out_hidden_size).
    fn forward(&self, x: &Tensor) -> Tensor {
        let joined = self.fc1.weight.size()[1];
        let x = if self.postshuffle {
            self.norm.forward(&x.view([-1, joined]))
        } else {
            self.norm.forward(x).view([-1, joined])
        };
        self.fc2.forward(&self.fc1.forward(&x).gelu("none"))
    }
}

/// The tower's outputs for a list of pictures.
pub struct VisionFeatures {
    /// Merged embeddings (Σ t·h·w / merge², out_hidden_size): `pooler_output`.
    pub embeds: Tensor,
    /// One (Σ t·h·w / merge², out_hidden_size) per deepstack block, in order.
    pub deepstack: Vec<Tensor>,
}

/// The vision tower with module names `visual.patch_embed.proj`, `visual.pos_embed`,
/// `visual.blocks.N.…`, `visual.merger.…`, `visual.deepstack_merger_list.K.…`.
pub struct Qwen3VlVision {
    pub config: Qwen3VlVisionConfig,
    /// `patch_embed.proj`: a Conv3d with stride = kernel, run as a linear map of each patch.
    patch_weight: Tensor,
    patch_bias: Tensor,
    pos_embed: Tensor,
    blocks: Vec<Block>,
    merger: Merger,
    deepstack_mergers: Vec<Merger>,
    pub store: VarStore,
}

impl Qwen3VlVision {
    /// Variables for `config` (zeros until loaded).
    pub fn new(config: &Qwen3VlVisionConfig, device: Device, kind: Kind) -> Self {
        let store = super::store(device, kind);
        let root = Scope::root(store.root(), None);
        let visual = &root / "visual";
        let (d, inter) = (config.hidden_size, config.intermediate_size);
        let blocks = (0..config.depth)
            .map(|i| {
                let block = &(&visual / "blocks") / i;
                let (attn, mlp) = (&block / "attn", &block / "mlp");
                Block {
                    norm1: LayerNorm::new(&(&block / "norm1"), d, NORM_EPS),
                    norm2: LayerNorm::new(&(&block / "norm2"), d, NORM_EPS),
                    qkv: (&attn / "qkv").linear(d, 3 * d, true),
                    proj: (&attn / "proj").linear(d, d, true),
                    fc1: (&mlp / "linear_fc1").linear(d, inter, true),
                    fc2: (&mlp / "linear_fc2").linear(inter, d, true),
                }
            })
            .collect();
        let (p, tp) = (config.patch_size, config.temporal_patch_size);
        let proj = &(&visual / "patch_embed") / "proj";
        let deepstack = &visual / "deepstack_merger_list";
        Self {
            patch_weight: proj.var("weight", &[d, config.in_channels, tp, p, p]),
            patch_bias: proj.var("bias", &[d]),
            pos_embed: (&visual / "pos_embed").var("weight", &[config.num_position_embeddings, d]),
            blocks,
            merger: Merger::new(&(&visual / "merger"), config, false),
            deepstack_mergers: (0..config.deepstack_visual_indexes.len())
                .map(|k| Merger::new(&(&deepstack / k), config, true))
                .collect(),
            config: config.clone(),
            store,
        }
    }

    /// Loads the `model.visual.*` (or `visual.*`) tensors of a Qwen3-VL directory (`config.json`
    /// + safetensors), frozen; the language model and `lm_head` are skipped.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let config = Qwen3VlVisionConfig::from_file(&dir.join("config.json"))?;
        let mut model = Self::new(&config, device, kind);
        super::load_frozen(&mut model.store, dir, kind, IGNORED_PREFIXES, RENAMED_PREFIXES)?;
        Ok(model)
    }

    /// The learned position table resampled to each patch (N, hidden) in f32: transformers'
    /// bilinear taps with corners aligned (`get_vision_interpolation_indices_and_weights`).
    fn position_embeds(&self, grids: &[(i64, i64, i64)], positions: &[[i64; 2]]) -> Tensor {
        let side = self.config.side();
        // Taps and weights along one axis of `size` patches, in f32 as transformers computes them.
        let axis = |index: i64, size: i64| {
            let src = index as f32 * (side - 1) as f32 / (size - 1).max(1) as f32;
            let floor = src.floor();
            let tap = |o: i64| {
                (
                    (floor as i64 + o).clamp(0, side - 1),
                    0f32.max(1.0 - (src - floor - o as f32).abs()),
                )
            };
            [tap(0), tap(1)]
        };
        let sizes =
            grids.iter().flat_map(|&(t, h, w)| std::iter::repeat_n((h, w), (t * h * w) as usize));
        let (mut indices, mut weights) = (vec![], vec![]);
        for (&[row, col], (h, w)) in positions.iter().zip(sizes) {
            for (ri, rw) in axis(row, h) {
                for (ci, cw) in axis(col, w) {
                    indices.push(ri * side + ci);
                    weights.push(rw * cw);
                }
            }
        }
        let device = self.pos_embed.device();
        let n = positions.len() as i64;
        let table = self.pos_embed.index_select(0, &Tensor::from_slice(&indices).to_device(device));
        let weights = Tensor::from_slice(&weights).to_device(device).view([n, 4, 1]);
        (table.view([n, 4, -1]).to_kind(Kind::Float) * weights).sum_dim_intlist(
            1,
            false,
            Kind::Float,
        )
    }

    /// The merged embeddings and deepstack features of `pixel_values` (Σ t·h·w, C·T·P·P) laid out
    /// as the image processor writes them, one `(t, h, w)` patch grid per picture:
    /// transformers' `model.visual(pixel_values, grid_thw)` `pooler_output` and
    /// `deepstack_features`.
    pub fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[(i64, i64, i64)],
    ) -> Result<VisionFeatures, ModelError> {
        let c = &self.config;
        check_patch_grids("Qwen3-VL", pixel_values, grid_thw, c.patch_dim(), c.spatial_merge_size)?;
        let device = self.pos_embed.device();
        let kind = self.pos_embed.kind();
        let (n, d) = (pixel_values.size()[0], c.hidden_size);
        let positions = merge_block_positions(grid_thw, c.spatial_merge_size);
        let weight = self.patch_weight.view([d, -1]);
        let x =
            pixel_values.to_device(device).to_kind(kind).linear(&weight, Some(&self.patch_bias));
        let mut x = x + self.position_embeds(grid_thw, &positions).to_kind(kind);
        let (cos, sin) = axial_rotary(c.head_dim(), c.rope_theta(), &positions, device);
        let frames: Vec<i64> =
            grid_thw.iter().flat_map(|&(t, h, w)| std::iter::repeat_n(h * w, t as usize)).collect();
        let mut deepstack = vec![];
        for (i, block) in self.blocks.iter().enumerate() {
            let qkv = block.qkv.forward(&block.norm1.forward(&x)).view([n, 3, c.num_heads, -1]);
            // Attention within each picture's frame.
            let attn = segment_attention(&qkv, &cos, &sin, &frames);
            x = &x + block.proj.forward(&attn);
            let h = block.fc1.forward(&block.norm2.forward(&x)).gelu("tanh");
            x = &x + block.fc2.forward(&h);
            if let Some(k) = c.deepstack_visual_indexes.iter().position(|&b| b == i) {
                deepstack.push(self.deepstack_mergers[k].forward(&x));
            }
        }
        Ok(VisionFeatures { embeds: self.merger.forward(&x), deepstack })
    }
}
