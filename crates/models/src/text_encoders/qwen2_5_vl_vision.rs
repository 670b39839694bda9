//! The vision tower of `Qwen2_5_VLForConditionalGeneration` (`visual.*`), which turns the patches
//! of Qwen-Image-Edit's condition images into merged image embeddings: a patch embedding, pre-norm
//! blocks with 2-D rotary positions and window attention (full attention in
//! `fullatt_block_indexes`), and a patch merger joining `spatial_merge_size`² neighbours.
//!
//! Tokens run in the processor's order (row-major merge blocks of `merge`×`merge` patches); the
//! blocks see them regrouped window by window, and the merged outputs return to that order.

use std::path::Path;

use serde::Deserialize;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::nn::{attention, Linear, RmsNorm, Scope};
use crate::{read_config, ModelError};

/// Checkpoint parts that are not the vision tower.
const IGNORED_PREFIXES: &[&str] = &["model.", "lm_head."];
/// transformers 5 module names for the vision tower.
const RENAMED_PREFIXES: &[(&str, &str)] = &[("model.visual.", "visual.")];
/// The tower's RMS norms use a fixed epsilon.
const NORM_EPS: f64 = 1e-6;

/// Mirror of transformers' `Qwen2_5_VLVisionConfig` (`vision_config` of the checkpoint's
/// `config.json`), with its defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Qwen25VlVisionConfig {
    pub depth: usize,
    pub hidden_size: i64,
    pub hidden_act: String,
    pub intermediate_size: i64,
    pub num_heads: i64,
    #[serde(alias = "in_chans")]
    pub in_channels: i64,
    pub patch_size: i64,
    pub spatial_merge_size: i64,
    pub temporal_patch_size: i64,
    pub window_size: i64,
    pub out_hidden_size: i64,
    pub fullatt_block_indexes: Vec<usize>,
    pub rope_parameters: Option<VisionRope>,
}

/// `rope_parameters` of the vision config (axial RoPE; θ defaults to 10000).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct VisionRope {
    pub rope_theta: Option<f64>,
    pub rope_type: Option<String>,
}

impl Default for Qwen25VlVisionConfig {
    fn default() -> Self {
        Self {
            depth: 32,
            hidden_size: 3584,
            hidden_act: "silu".into(),
            intermediate_size: 3420,
            num_heads: 16,
            in_channels: 3,
            patch_size: 14,
            spatial_merge_size: 2,
            temporal_patch_size: 2,
            window_size: 112,
            out_hidden_size: 3584,
            fullatt_block_indexes: vec![7, 15, 23, 31],
            rope_parameters: None,
        }
    }
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    vision_config: Qwen25VlVisionConfig,
}

impl Qwen25VlVisionConfig {
    /// Reads `vision_config` from a Qwen2.5-VL `config.json` (either layout nests it).
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let config = read_config::<ConfigFile>(path)?.vision_config;
        let bad =
            |message: String| ModelError::Format { path: path.display().to_string(), message };
        if config.hidden_act != "silu" {
            return Err(bad(format!(
                "vision_config.hidden_act `{}` is not supported; expected silu",
                config.hidden_act
            )));
        }
        check_heads_and_rope(config.rope_parameters.as_ref(), config.hidden_size, config.num_heads)
            .map_err(bad)?;
        if config.window_size / config.spatial_merge_size / config.patch_size < 1 {
            return Err(bad(format!(
                "vision_config.window_size {}: expected at least spatial_merge_size × patch_size",
                config.window_size
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

    fn rope_theta(&self) -> f64 {
        self.rope_parameters.as_ref().and_then(|r| r.rope_theta).unwrap_or(10000.0)
    }
}

/// The checks both vision towers make of `vision_config`: axial rotary positions, and heads whose
/// width splits into the four rotary quarters.
pub(crate) fn check_heads_and_rope(
    rope: Option<&VisionRope>,
    hidden_size: i64,
    heads: i64,
) -> Result<(), String> {
    let rope_type = rope.and_then(|r| r.rope_type.as_deref());
    if rope_type.is_some_and(|t| t != "axial") {
        return Err(format!(
            "vision_config.rope_parameters.rope_type `{}` is not supported; expected axial",
            rope_type.unwrap_or_default()
        ));
    }
    if heads <= 0 || hidden_size % heads != 0 || (hidden_size / heads) % 4 != 0 {
        return Err(format!(
            "vision_config.hidden_size {hidden_size} / num_heads {heads}: expected a head width \
             divisible by 4"
        ));
    }
    Ok(())
}

/// Checks that `pixel_values` are (Σ t·h·w, `patch_dim`) rows of `grids` whose sides are multiples
/// of `merge`; `model` names the tower in the error.
pub(crate) fn check_patch_grids(
    model: &str,
    pixel_values: &Tensor,
    grids: &[(i64, i64, i64)],
    patch_dim: i64,
    merge: i64,
) -> Result<(), ModelError> {
    let size = pixel_values.size();
    let tokens: i64 = grids.iter().map(|(t, h, w)| t * h * w).sum();
    if grids.is_empty() || size.len() != 2 || size[1] != patch_dim || size[0] != tokens {
        return Err(ModelError::Input(format!(
            "{model} pixel_values must be (Σ t·h·w = {tokens}, {patch_dim}) over at least one \
             grid, got {size:?}"
        )));
    }
    let bad_grid = |(t, h, w): &&(i64, i64, i64)| {
        *t < 1 || *h < 1 || *w < 1 || h % merge != 0 || w % merge != 0
    };
    if let Some(g) = grids.iter().find(bad_grid) {
        return Err(ModelError::Input(format!(
            "{model} grid_thw {g:?}: expected t ≥ 1 and h, w positive multiples of {merge}"
        )));
    }
    Ok(())
}

/// Attention of a block's fused `qkv` output (N, 3, heads, head_dim) with the axial rotary `cos`
/// and `sin` (N, head_dim, applied in f32), within each run of `segments` tokens: (N, hidden).
pub(crate) fn segment_attention(
    qkv: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    segments: &[i64],
) -> Tensor {
    let (cos, sin) = (cos.unsqueeze(1), sin.unsqueeze(1));
    let rotate = |t: &Tensor| {
        let t32 = t.to_kind(Kind::Float);
        let half = t32.size()[2] / 2;
        let rotated = Tensor::cat(&[-t32.narrow(2, half, half), t32.narrow(2, 0, half)], 2);
        (t32 * &cos + rotated * &sin).to_kind(t.kind())
    };
    // (heads, N, head_dim) each.
    let q = rotate(&qkv.select(1, 0)).transpose(0, 1);
    let k = rotate(&qkv.select(1, 1)).transpose(0, 1);
    let v = qkv.select(1, 2).transpose(0, 1);
    let parts: Vec<Tensor> = q
        .split_with_sizes(segments, 1)
        .iter()
        .zip(k.split_with_sizes(segments, 1))
        .zip(v.split_with_sizes(segments, 1))
        .map(|((q, k), v)| {
            attention(&q.unsqueeze(0), &k.unsqueeze(0), &v.unsqueeze(0), None, false, None)
                .squeeze_dim(0)
        })
        .collect();
    let n = qkv.size()[0];
    Tensor::cat(&parts, 1).transpose(0, 1).reshape([n, -1])
}

/// cos and sin (N, head_dim) in f32 of the vision towers' axial rotary angles at (row, column)
/// `positions`: a quarter of the head's frequencies per axis, rows then columns, repeated for both
/// rotated halves.
pub(crate) fn axial_rotary(
    head_dim: i64,
    theta: f64,
    positions: &[[i64; 2]],
    device: Device,
) -> (Tensor, Tensor) {
    let half = head_dim / 2;
    let exponents = Tensor::arange_start_step(0, half, 2, (Kind::Float, device)) / half as f64;
    let inv_freq = Tensor::pow_scalar(theta, &exponents).reciprocal();
    let flat: Vec<i64> = positions.iter().flatten().copied().collect();
    let pos = Tensor::from_slice(&flat).view([-1, 2, 1]).to_device(device).to_kind(Kind::Float);
    // (N, 2, F) → rows then columns (N, 2F), repeated for both rotated halves.
    let freqs = (pos * inv_freq.view([1, 1, -1])).view([positions.len() as i64, -1]);
    let angles = Tensor::cat(&[&freqs, &freqs], -1);
    (angles.cos(), angles.sin())
}

/// (row, column) of every patch of `grids` in the processor's merge-block order (`merge`×`merge`
/// patches per merged token, row-major).
pub(crate) fn merge_block_positions(grids: &[(i64, i64, i64)], m: i64) -> Vec<[i64; 2]> {
    let mut positions = vec![];
    for &(t, h, w) in grids {
        for _ in 0..t {
            for y in 0..h / m {
                for x in 0..w / m {
                    for i in 0..m {
                        for j in 0..m {
                            positions.push([y * m + i, x * m + j]);
                        }
                    }
                }
            }
        }
    }
    positions
}

struct Block {
    norm1: RmsNorm,
    norm2: RmsNorm,
    qkv: Linear,
    proj: Linear,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

/// The vision tower with module names `visual.patch_embed.proj`, `visual.blocks.N.…`,
/// `visual.merger.…`.
pub struct Qwen25VlVision {
    pub config: Qwen25VlVisionConfig,
    patch_embed: Tensor,
    blocks: Vec<Block>,
    ln_q: RmsNorm,
    merger_in: Linear,
    merger_out: Linear,
    pub store: VarStore,
}

/// The token order the blocks work in, for a list of grids.
struct Layout {
    /// Merge units (groups of merge² tokens) in window order: `order[k]` is the unit at slot k.
    order: Vec<i64>,
    /// Token lengths of the windows, in window order.
    windows: Vec<i64>,
    /// Token lengths of the frames (full attention), which window order keeps contiguous.
    frames: Vec<i64>,
    /// (row, column) of each token in window order.
    positions: Vec<[i64; 2]>,
}

impl Layout {
    fn new(config: &Qwen25VlVisionConfig, grids: &[(i64, i64, i64)]) -> Self {
        let m = config.spatial_merge_size;
        let window = config.window_size / m / config.patch_size;
        let (mut order, mut windows, mut frames, mut positions) = (vec![], vec![], vec![], vec![]);
        let mut offset = 0;
        for &(t, h, w) in grids {
            let (mh, mw) = (h / m, w / m);
            for frame in 0..t {
                frames.push(h * w);
                let base = offset + frame * mh * mw;
                for wy in (0..mh).step_by(window as usize) {
                    for wx in (0..mw).step_by(window as usize) {
                        let (ys, xs) = (wy..(wy + window).min(mh), wx..(wx + window).min(mw));
                        windows.push(ys.clone().count() as i64 * xs.clone().count() as i64 * m * m);
                        for y in ys {
                            for x in xs.clone() {
                                order.push(base + y * mw + x);
                                for i in 0..m {
                                    for j in 0..m {
                                        positions.push([y * m + i, x * m + j]);
                                    }
                                }
                            }
                        }
                    }
                }
            }
            offset += t * mh * mw;
        }
        Self { order, windows, frames, positions }
    }
}

impl Qwen25VlVision {
    /// Variables for `config` (zeros until loaded).
    pub fn new(config: &Qwen25VlVisionConfig, device: Device, kind: Kind) -> Self {
        let store = super::store(device, kind);
        let root = Scope::root(store.root(), None);
        let visual = &root / "visual";
        let (d, inter) = (config.hidden_size, config.intermediate_size);
        let blocks = (0..config.depth)
            .map(|i| {
                let block = &(&visual / "blocks") / i;
                let (attn, mlp) = (&block / "attn", &block / "mlp");
                Block {
                    norm1: RmsNorm::new(&(&block / "norm1"), d, NORM_EPS),
                    norm2: RmsNorm::new(&(&block / "norm2"), d, NORM_EPS),
                    qkv: (&attn / "qkv").linear(d, 3 * d, true),
                    proj: (&attn / "proj").linear(d, d, true),
                    gate_proj: (&mlp / "gate_proj").linear(d, inter, true),
                    up_proj: (&mlp / "up_proj").linear(d, inter, true),
                    down_proj: (&mlp / "down_proj").linear(inter, d, true),
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
            ln_q: RmsNorm::new(&(&merger / "ln_q"), d, NORM_EPS),
            merger_in: (&mlp / 0).linear(merged, merged, true),
            merger_out: (&mlp / 2).linear(merged, config.out_hidden_size, true),
            config: config.clone(),
            store,
        }
    }

    /// Loads the `visual.*` (or `model.visual.*`) tensors of a Qwen2.5-VL directory
    /// (`config.json` + safetensors), frozen; the language model and `lm_head` are skipped.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let config = Qwen25VlVisionConfig::from_file(&dir.join("config.json"))?;
        let mut model = Self::new(&config, device, kind);
        super::load_frozen(&mut model.store, dir, kind, IGNORED_PREFIXES, RENAMED_PREFIXES)?;
        Ok(model)
    }

    /// The merged image embeddings (Σ t·h·w / merge², out_hidden_size) of `pixel_values`
    /// (Σ t·h·w, C·T·P·P) laid out as the image processor writes them, one `(t, h, w)` patch grid
    /// per image: transformers' `model.visual(pixel_values, grid_thw).pooler_output`.
    pub fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[(i64, i64, i64)],
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        check_patch_grids(
            "Qwen2.5-VL",
            pixel_values,
            grid_thw,
            c.patch_dim(),
            c.spatial_merge_size,
        )?;
        let device = self.patch_embed.device();
        let kind = self.patch_embed.kind();
        let unit = c.spatial_merge_size * c.spatial_merge_size;
        let (n, d) = (pixel_values.size()[0], c.hidden_size);
        let layout = Layout::new(c, grid_thw);
        let order = Tensor::from_slice(&layout.order).to_device(device);

        // The Conv3d with stride = kernel is a linear map of each flattened patch.
        let x = pixel_values
            .to_device(device)
            .to_kind(kind)
            .linear::<Tensor>(&self.patch_embed.view([d, -1]), None);
        let mut x = x.view([n / unit, unit, d]).index_select(0, &order).view([n, d]);
        let (cos, sin) = axial_rotary(c.head_dim(), c.rope_theta(), &layout.positions, device);
        let heads = c.num_heads;
        for (i, block) in self.blocks.iter().enumerate() {
            let segments =
                if c.fullatt_block_indexes.contains(&i) { &layout.frames } else { &layout.windows };
            let qkv = block.qkv.forward(&block.norm1.forward(&x)).view([n, 3, heads, -1]);
            let attn = segment_attention(&qkv, &cos, &sin, segments);
            x = &x + block.proj.forward(&attn);
            let h = block.norm2.forward(&x);
            let gated = block.gate_proj.forward(&h).silu() * block.up_proj.forward(&h);
            x = &x + block.down_proj.forward(&gated);
        }
        let merged = self.ln_q.forward(&x).view([n / unit, unit * d]);
        let merged = self.merger_out.forward(&self.merger_in.forward(&merged).gelu("none"));
        let mut back = vec![0i64; layout.order.len()];
        for (slot, &unit_index) in layout.order.iter().enumerate() {
            back[unit_index as usize] = slot as i64;
        }
        Ok(merged.index_select(0, &Tensor::from_slice(&back).to_device(device)))
    }
}
