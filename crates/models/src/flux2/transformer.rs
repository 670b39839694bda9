//! `Flux2Transformer2DModel`: latent tokens (2×2 patches of the VAE latent, one per cell) and the
//! text encoder's stacked states through double-stream, then single-stream blocks, all modulated
//! by shared AdaLN projections of the timestep (+ distilled guidance for [dev]) embedding, with
//! 4-axis rotary positions.

use std::collections::HashMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::block::{Flux2SingleTransformerBlock, Flux2TransformerBlock};
use super::config::{Flux2TransformerConfig, AXES};
use crate::denoiser::{
    weights_and_frozen_copy, Denoiser, ExampleInputs, ExampleShape, TrainableDenoiser,
};
use crate::flux::rope::rotary_tables;
use crate::flux::GUIDANCE;
use crate::lora::LoraConfig;
use crate::model_weights::{ModelWeights, WeightsBuilder};
use crate::nn::{layer_norm, timestep_features, Linear, Mlp, Scope};
use crate::sequence::{Role, SequenceParallel, Stream};
use crate::{ModelError, TextConditioning};

/// The transformer scales σ-scale timesteps and guidance by this before the sinusoid.
const TIME_SCALE: f64 = 1000.0;

/// What sequence parallelism splits: text then image tokens (the joint attention's order, and
/// the single-stream blocks' joint stream on each rank) with their position ids.
const SEQUENCE: [Stream; 4] = [
    Stream { name: "text", dim: 1, role: Role::Keys },
    Stream { name: "image", dim: 1, role: Role::Keys },
    Stream { name: "txt_ids", dim: 0, role: Role::Follows },
    Stream { name: "img_ids", dim: 0, role: Role::Follows },
];
/// Reference-image tokens (B, N, in_channels), packed after the latent tokens: the
/// conditioning extra of [klein]'s reference images.
pub const REFERENCE_TOKENS: &str = "reference_tokens";
/// Position ids (B, N, 4) of [`REFERENCE_TOKENS`].
pub const REFERENCE_IDS: &str = "reference_ids";

/// The FLUX.2 denoiser, predicting the flow-matching velocity.
pub struct Flux2Transformer {
    pub config: Flux2TransformerConfig,
    /// `time_guidance_embed.timestep_embedder`.
    pub timestep_embedder: Mlp,
    /// `time_guidance_embed.guidance_embedder` ([dev] only).
    pub guidance_embedder: Option<Mlp>,
    /// `double_stream_modulation_img.linear`, `…_txt.linear`: SiLU(temb) → 2 × (shift, scale,
    /// gate), shared by every double-stream block.
    pub modulation_image: Linear,
    pub modulation_text: Linear,
    /// `single_stream_modulation.linear`: SiLU(temb) → (shift, scale, gate).
    pub modulation_single: Linear,
    pub x_embedder: Linear,
    pub context_embedder: Linear,
    pub transformer_blocks: Vec<Flux2TransformerBlock>,
    pub single_transformer_blocks: Vec<Flux2SingleTransformerBlock>,
    /// `norm_out.linear` of the final continuous AdaLN: (scale, shift).
    pub norm_out: Linear,
    pub proj_out: Linear,
    pub weights: ModelWeights,
}

/// `TimestepEmbedding` without biases.
fn embedder(scope: &Scope<'_>, input: i64, dim: i64) -> Mlp {
    Mlp {
        linear_1: (scope / "linear_1").linear(input, dim, false),
        linear_2: (scope / "linear_2").linear(dim, dim, false),
    }
}

impl Flux2Transformer {
    /// Builds the module tree for `config` on `device`, with adapters when `lora` is given.
    pub fn new(
        config: &Flux2TransformerConfig,
        device: Device,
        kind: Kind,
        lora: Option<&LoraConfig>,
    ) -> Result<Self, ModelError> {
        config.validate().map_err(ModelError::Input)?;
        let weights = WeightsBuilder::new(device, kind, lora);
        let root = weights.root();
        let c = config;
        let (dim, heads, head_dim) = (c.inner_dim(), c.num_attention_heads, c.attention_head_dim);
        let (hidden, eps, channels) = (c.mlp_hidden(), c.eps, c.timestep_guidance_channels);
        let embed = &root / "time_guidance_embed";
        let modulation =
            |name: &str, sets: i64| (&(&root / name) / "linear").linear(dim, 3 * sets * dim, false);
        let double = &root / "transformer_blocks";
        let single = &root / "single_transformer_blocks";
        Ok(Self {
            timestep_embedder: embedder(&(&embed / "timestep_embedder"), channels, dim),
            guidance_embedder: c
                .guidance_embeds
                .then(|| embedder(&(&embed / "guidance_embedder"), channels, dim)),
            modulation_image: modulation("double_stream_modulation_img", 2),
            modulation_text: modulation("double_stream_modulation_txt", 2),
            modulation_single: modulation("single_stream_modulation", 1),
            x_embedder: (&root / "x_embedder").linear(c.in_channels, dim, false),
            context_embedder: (&root / "context_embedder").linear(
                c.joint_attention_dim,
                dim,
                false,
            ),
            transformer_blocks: (0..c.num_layers)
                .map(|i| {
                    Flux2TransformerBlock::new(&(&double / i), dim, heads, head_dim, hidden, eps)
                })
                .collect(),
            single_transformer_blocks: (0..c.num_single_layers)
                .map(|i| {
                    Flux2SingleTransformerBlock::new(
                        &(&single / i),
                        dim,
                        heads,
                        head_dim,
                        hidden,
                        eps,
                    )
                })
                .collect(),
            norm_out: (&(&root / "norm_out") / "linear").linear(dim, 2 * dim, false),
            proj_out: (&root / "proj_out").linear(dim, c.out_channels(), false),
            config: config.clone(),
            weights: weights.finish(&["transformer_blocks", "single_transformer_blocks"])?,
        })
    }

    /// Loads a diffusers `transformer/` directory (config.json + safetensors, sharded or not).
    pub fn load(
        dir: &Path,
        device: Device,
        kind: Kind,
        lora: Option<&LoraConfig>,
    ) -> Result<Self, ModelError> {
        crate::denoiser::load_component(
            dir,
            kind,
            |c: &Flux2TransformerConfig| Self::new(c, device, kind, lora),
            |m| &mut m.weights,
        )
    }

    /// diffusers' forward: tokens (B, S, in_channels), text states (B, L, joint_dim), `timestep`
    /// (B,) as σ (t/1000), position ids `img_ids` (S, 4) and `txt_ids` (L, 4) (or the same with a
    /// leading batch dimension, whose first row is used, as diffusers does), and for [dev] the
    /// guidance value (B,). Returns (B, S, out_channels).
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: &Tensor,
        timestep: &Tensor,
        img_ids: &Tensor,
        txt_ids: &Tensor,
        guidance: Option<&Tensor>,
    ) -> Result<Tensor, ModelError> {
        let first = |ids: &Tensor| if ids.dim() == 3 { ids.get(0) } else { ids.shallow_clone() };
        let (img_ids, txt_ids) = (first(img_ids), first(txt_ids));
        self.check_inputs(hidden_states, encoder_hidden_states, timestep, &img_ids, &txt_ids)?;
        let kind = hidden_states.kind();
        let channels = self.config.timestep_guidance_channels;
        let embed = |mlp: &Mlp, t: &Tensor| {
            let t = t.to_kind(kind) * TIME_SCALE;
            mlp.forward(&timestep_features(&t, channels, 1.0).to_kind(kind))
        };
        let mut temb = embed(&self.timestep_embedder, timestep);
        match (&self.guidance_embedder, guidance) {
            (Some(embedder), Some(g)) => temb += embed(embedder, g),
            (Some(_), None) => {
                return Err(ModelError::Input(
                    "guidance_embeds: true ([dev]) needs a guidance value per row".into(),
                ))
            }
            (None, _) => {}
        }
        let act = temb.silu();
        let mod_image = self.modulation_image.forward(&act);
        let mod_text = self.modulation_text.forward(&act);
        let mod_single = self.modulation_single.forward(&act);
        let image = self.x_embedder.forward(hidden_states);
        let text = self.context_embedder.forward(encoder_hidden_states);
        // This rank's text and image tokens from here to the output (all without a group).
        let tokens = image.size()[1];
        let (split, [mut text, mut image, txt_ids, img_ids]) =
            self.weights.split_sequence(&SEQUENCE, [text, image, txt_ids, img_ids], None);
        let keys = split.keys();
        let ids = Tensor::cat(&[txt_ids, img_ids], 0);
        let rope = rotary_tables(&self.config.axes_dims_rope, self.config.rope_theta, &ids);
        for (i, block) in self.transformer_blocks.iter().enumerate() {
            // Owned by the block's closure: a checkpointed block reruns it in backward.
            let (rope, keys) = (rope.shallow_clone(), keys.clone());
            let inputs = [image, text, mod_image.shallow_clone(), mod_text.shallow_clone()];
            let out = self.weights.run_block("transformer_blocks", i, &inputs, move |t| {
                let (image, text) = block.forward(&t[0], &t[1], (&t[2], &t[3]), &rope, &keys);
                vec![image, text]
            })?;
            [image, text] = <[Tensor; 2]>::try_from(out).expect("a double block returns 2 streams");
        }
        let (l, s) = (text.size()[1], image.size()[1]);
        let mut joint = Tensor::cat(&[text, image], 1);
        for (i, block) in self.single_transformer_blocks.iter().enumerate() {
            let (rope, keys) = (rope.shallow_clone(), keys.clone());
            let out = self.weights.run_block(
                "single_transformer_blocks",
                i,
                &[joint, mod_single.shallow_clone()],
                move |t| vec![block.forward(&t[0], &t[1], &rope, &keys)],
            )?;
            [joint] = <[Tensor; 1]>::try_from(out).expect("a single block returns 1 stream");
        }
        let image = joint.narrow(1, l, s);
        let mods = self.norm_out.forward(&act).chunk(2, 1);
        let image = layer_norm(&image, self.config.eps) * (mods[0].unsqueeze(1) + 1.0)
            + mods[1].unsqueeze(1);
        split.gather(self.proj_out.forward(&image), tokens)
    }

    fn check_inputs(
        &self,
        x: &Tensor,
        text: &Tensor,
        t: &Tensor,
        img_ids: &Tensor,
        txt_ids: &Tensor,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let bad = |what: &str, found: Vec<i64>, expected: String| {
            Err(ModelError::Input(format!("{what} has shape {found:?}, expected {expected}")))
        };
        let xs = x.size();
        if xs.len() != 3 || xs[2] != c.in_channels {
            return bad("hidden_states", xs, format!("[B, S, {}] (latent tokens)", c.in_channels));
        }
        let b = xs[0];
        let ts = text.size();
        if ts.len() != 3 || ts[0] != b || ts[2] != c.joint_attention_dim {
            return bad(
                "encoder_hidden_states",
                ts,
                format!("[{b}, L, {}]", c.joint_attention_dim),
            );
        }
        if t.size() != [b] {
            return bad("timestep", t.size(), format!("[{b}]"));
        }
        let axes = AXES as i64;
        if img_ids.size() != [xs[1], axes] {
            return bad("img_ids", img_ids.size(), format!("[{}, {axes}]", xs[1]));
        }
        if txt_ids.size() != [ts[1], axes] {
            return bad("txt_ids", txt_ids.size(), format!("[{}, {axes}]", ts[1]));
        }
        Ok(())
    }
}

/// Position ids (H·W, 4) of an `rows × cols` token grid at time coordinate `time`:
/// `(time, row, column, 0)`, row-major.
pub fn grid_ids(time: i64, rows: i64, cols: i64, device: Device) -> Tensor {
    let opts = (Kind::Int64, device);
    let row = Tensor::arange(rows, opts).view([rows, 1]).expand([rows, cols], false);
    let col = Tensor::arange(cols, opts).view([1, cols]).expand([rows, cols], false);
    let (time, zeros) = (row.full_like(time), row.zeros_like());
    Tensor::stack(&[time, row, col, zeros], 2).reshape([rows * cols, 4])
}

/// Position ids (L, 4) of `len` text tokens: `(0, 0, 0, index)`.
pub fn text_ids(len: i64, device: Device) -> Tensor {
    let index = Tensor::arange(len, (Kind::Int64, device));
    let zeros = index.zeros_like();
    Tensor::stack(&[&zeros, &zeros, &zeros, &index], 1)
}

impl Denoiser for Flux2Transformer {
    /// Latents (B, C, H, W) become one token per cell with ids `(0, row, column, 0)`, text ids
    /// `(0, 0, 0, index)`; reference-image tokens ([`REFERENCE_TOKENS`], [`REFERENCE_IDS`]) join
    /// after the latent tokens, and only the latent tokens' velocity is kept; [dev] reads its
    /// guidance from the [`GUIDANCE`] extra.
    fn velocity(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &TextConditioning,
    ) -> Result<Tensor, ModelError> {
        let size = latents.size();
        let channels = self.config.in_channels;
        if size.len() != 4 || size[1] != channels {
            return Err(ModelError::Input(format!(
                "latents have shape {size:?}, expected [B, {channels}, H, W]"
            )));
        }
        let (b, h, w) = (size[0], size[2], size[3]);
        let kind = self.x_embedder.weight.kind();
        let device = latents.device();
        let mut tokens = latents.to_kind(kind).flatten(2, 3).transpose(1, 2);
        let mut ids = grid_ids(0, h, w, device);
        if let (Some(refs), Some(ref_ids)) =
            (text.extras.get(REFERENCE_TOKENS), text.extras.get(REFERENCE_IDS))
        {
            // One rotary table serves the batch: every row's reference grid must be the same.
            let first = ref_ids.get(0);
            if b > 1 && ref_ids.eq_tensor(&first.unsqueeze(0)).all().int64_value(&[]) == 0 {
                return Err(ModelError::Input(
                    "rows of one batch have reference images of different token grids; give one \
                     batch pictures of one size"
                        .into(),
                ));
            }
            tokens = Tensor::cat(&[tokens, refs.to_kind(kind)], 1);
            ids = Tensor::cat(&[ids, first], 0);
        }
        let out = self.forward(
            &tokens,
            &text.embeds.to_kind(kind),
            &(timestep / TIME_SCALE),
            &ids,
            &text_ids(text.embeds.size()[1], device),
            text.extras.get(GUIDANCE),
        )?;
        Ok(out.narrow(1, 0, h * w).transpose(1, 2).reshape([b, channels, h, w]))
    }

    /// A step-distilled [klein] (`is_distilled`) and guidance-distilled [dev] never run CFG, as
    /// their pipelines decide ([dev] embeds the guidance value instead).
    fn runs_cfg(&self, scale: f64) -> bool {
        !self.config.is_distilled && !self.config.guidance_embeds && scale > 1.0
    }
}

impl TrainableDenoiser for Flux2Transformer {
    weights_and_frozen_copy!();

    /// Double- and single-stream attention through Ulysses, as FLUX.1's.
    fn sequence_parallel(&self, group: SequenceParallel) -> Result<(), ModelError> {
        self.weights.sequence_parallel("FLUX.2", self.config.num_attention_heads, group)
    }

    fn example_inputs(&self, shape: ExampleShape) -> ExampleInputs {
        let ExampleShape { batch, height, width, text_len, .. } = shape;
        let c = &self.config;
        let device = self.weights.base.device();
        let opts = (self.x_embedder.weight.kind(), device);
        let mut text = TextConditioning::new(
            Tensor::randn([batch, text_len, c.joint_attention_dim], opts),
            None,
        );
        if c.guidance_embeds {
            text.extras.insert(GUIDANCE.into(), Tensor::full([batch], 4.0, (Kind::Float, device)));
        }
        ExampleInputs {
            latents: Tensor::randn([batch, c.in_channels, height / 2, width / 2], opts),
            timestep: Tensor::full([batch], 500.0, (Kind::Float, device)),
            text,
            tokens: batch * (height / 2) * (width / 2),
        }
    }

    /// diffusers' forward on its argument names: `hidden_states` tokens, `timestep` as σ,
    /// `img_ids` / `txt_ids`, `guidance` for [dev].
    fn forward_named(&self, inputs: &HashMap<String, Tensor>) -> Result<Tensor, ModelError> {
        let get = |name: &str| {
            inputs.get(name).ok_or_else(|| ModelError::Input(format!("no input `{name}`")))
        };
        self.forward(
            get("hidden_states")?,
            get("encoder_hidden_states")?,
            get("timestep")?,
            get("img_ids")?,
            get("txt_ids")?,
            inputs.get("guidance"),
        )
    }

    fn describe(&self) -> String {
        format!(
            "FLUX.2 transformer {} double + {} single blocks × {} dim{}",
            self.config.num_layers,
            self.config.num_single_layers,
            self.config.inner_dim(),
            if self.config.guidance_embeds { ", guidance embedding" } else { "" }
        )
    }
}
