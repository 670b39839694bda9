//! `SD3Transformer2DModel`: patchify, embed, joint blocks, continuous AdaLN, unpatchify.

use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::block::JointTransformerBlock;
use super::config::Sd3TransformerConfig;
use super::embeddings::{PatchEmbed, TimeTextEmbed};
use crate::denoiser::{
    weights_and_frozen_copy, Denoiser, ExampleInputs, ExampleShape, TrainableDenoiser,
};
use crate::lora::LoraConfig;
use crate::model_weights::{ModelWeights, WeightsBuilder};
use crate::nn::{layer_norm, Linear};
use crate::sequence::{Role, SequenceParallel, Stream};
use crate::{ModelError, TextConditioning};

/// The position table's checkpoint name.
const POSITION_TABLE: &str = "pos_embed.pos_embed";

/// What sequence parallelism splits: image then context tokens, the joint attention's order.
const SEQUENCE: [Stream; 2] = [
    Stream { name: "image", dim: 1, role: Role::Keys },
    Stream { name: "context", dim: 1, role: Role::Keys },
];

/// The SD3 / SD3.5 denoiser, predicting the flow-matching velocity.
pub struct Sd3Transformer {
    pub config: Sd3TransformerConfig,
    pub pos_embed: PatchEmbed,
    pub time_text_embed: TimeTextEmbed,
    pub context_embedder: Linear,
    pub transformer_blocks: Vec<JointTransformerBlock>,
    /// `norm_out.linear` of the final continuous AdaLN.
    pub norm_out: Linear,
    pub proj_out: Linear,
    /// Base weights and, when built with LoRA, adapters.
    pub weights: ModelWeights,
}

impl Sd3Transformer {
    /// Builds the module tree for `config` on `device`, with adapters when `lora` is given.
    /// Weights start at zero; load them with [`Self::load`] or fill them for a fresh model.
    pub fn new(
        config: &Sd3TransformerConfig,
        device: Device,
        kind: Kind,
        lora: Option<&LoraConfig>,
    ) -> Result<Self, ModelError> {
        config.validate().map_err(ModelError::Input)?;
        let weights = WeightsBuilder::new(device, kind, lora);
        let root = weights.root();
        let c = config;
        let dim = c.inner_dim();
        let blocks = (0..c.num_layers)
            .map(|i| {
                let pre_only = i + 1 == c.num_layers;
                let dual = c.dual_attention_layers.contains(&i);
                let scope = &(&root / "transformer_blocks") / i;
                JointTransformerBlock::new(
                    &scope,
                    dim,
                    c.num_attention_heads,
                    c.attention_head_dim,
                    pre_only,
                    c.qk_norm.is_some(),
                    dual,
                )
            })
            .collect();
        Ok(Self {
            pos_embed: PatchEmbed::new(
                &(&root / "pos_embed"),
                c.in_channels,
                dim,
                c.patch_size,
                c.pos_embed_max_size,
            ),
            time_text_embed: TimeTextEmbed::new(
                &(&root / "time_text_embed"),
                dim,
                c.pooled_projection_dim,
            ),
            context_embedder: (&root / "context_embedder").linear(
                c.joint_attention_dim,
                c.caption_projection_dim,
                true,
            ),
            transformer_blocks: blocks,
            norm_out: (&(&root / "norm_out") / "linear").linear(dim, 2 * dim, true),
            proj_out: (&root / "proj_out").linear(
                dim,
                c.patch_size * c.patch_size * c.out_channels(),
                true,
            ),
            config: config.clone(),
            weights: weights.finish(&["transformer_blocks"])?,
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
            |c: &Sd3TransformerConfig| Self::new(c, device, kind, lora),
            |m| &mut m.weights,
        )
    }

    /// Velocity for latents (B, C, H, W), text tokens (B, L, joint_dim), pooled text (B, pooled_dim)
    /// and timesteps (B,) on the 0‥1000 scale.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: &Tensor,
        pooled: &Tensor,
        timestep: &Tensor,
    ) -> Result<Tensor, ModelError> {
        self.check_inputs(hidden_states, encoder_hidden_states, pooled, timestep)?;
        let c = &self.config;
        let (b, _, h, w) = hidden_states.size4()?;
        let x = self.pos_embed.forward(hidden_states);
        let temb = self.time_text_embed.forward(timestep, pooled);
        let context = self.context_embedder.forward(encoder_hidden_states);
        // This rank's image and context tokens from here to the output (all without a group).
        let tokens = x.size()[1];
        let (split, [mut x, context]) = self.weights.split_sequence(&SEQUENCE, [x, context], None);
        let (joint, image) = (split.keys(), split.keys_of("image"));
        let mut context = Some(context);
        for (i, block) in self.transformer_blocks.iter().enumerate() {
            let ctx = context.expect("only the last block ends the context stream");
            let inputs = [x, ctx, temb.shallow_clone()];
            // Owned by the block's closure: a checkpointed block reruns it in backward.
            let (joint, image) = (joint.clone(), image.clone());
            let mut out = self
                .weights
                .run_block("transformer_blocks", i, &inputs, move |t| {
                    let (x, c) = block.forward(&t[0], &t[1], &t[2], (&joint, &image));
                    std::iter::once(x).chain(c).collect()
                })?
                .into_iter();
            x = out.next().expect("a block returns its latent stream");
            context = out.next();
        }
        // AdaLayerNormContinuous: (scale, shift).
        let mods = self.norm_out.forward(&temb.silu()).chunk(2, 1);
        let x = layer_norm(&x, 1e-6) * (mods[0].unsqueeze(1) + 1.0) + mods[1].unsqueeze(1);
        let x = split.gather(self.proj_out.forward(&x), tokens)?;
        let (p, oc) = (c.patch_size, c.out_channels());
        let (gh, gw) = (h / p, w / p);
        Ok(x.reshape([b, gh, gw, p, p, oc]).permute([0, 5, 1, 3, 2, 4]).reshape([b, oc, h, w]))
    }

    fn check_inputs(
        &self,
        x: &Tensor,
        text: &Tensor,
        pooled: &Tensor,
        t: &Tensor,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let bad = |what: &str, found: Vec<i64>, expected: String| {
            Err(ModelError::Input(format!("{what} has shape {found:?}, expected {expected}")))
        };
        let xs = x.size();
        if xs.len() != 4 || xs[1] != c.in_channels {
            return bad("hidden_states", xs, format!("[B, {}, H, W]", c.in_channels));
        }
        let (b, h, w) = (xs[0], xs[2], xs[3]);
        if h % c.patch_size != 0
            || w % c.patch_size != 0
            || h / c.patch_size > c.pos_embed_max_size
            || w / c.patch_size > c.pos_embed_max_size
        {
            return bad(
                "hidden_states",
                xs,
                format!(
                    "H and W multiples of {} and at most {}",
                    c.patch_size,
                    c.patch_size * c.pos_embed_max_size
                ),
            );
        }
        let ts = text.size();
        if ts.len() != 3 || ts[0] != b || ts[2] != c.joint_attention_dim {
            return bad(
                "encoder_hidden_states",
                ts,
                format!("[{b}, L, {}]", c.joint_attention_dim),
            );
        }
        if pooled.size() != [b, c.pooled_projection_dim] {
            return bad(
                "pooled_projections",
                pooled.size(),
                format!("[{b}, {}]", c.pooled_projection_dim),
            );
        }
        if t.size() != [b] {
            return bad("timestep", t.size(), format!("[{b}]"));
        }
        Ok(())
    }
}

impl Denoiser for Sd3Transformer {
    fn velocity(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &TextConditioning,
    ) -> Result<Tensor, ModelError> {
        let pooled = text
            .pooled
            .as_ref()
            .ok_or_else(|| ModelError::Input("SD3 needs pooled text embeddings".into()))?;
        // The model's dtype inside (bf16 weights take bf16 activations), the caller's outside.
        let kind = self.context_embedder.weight.kind();
        let (x, embeds, pooled) =
            (latents.to_kind(kind), text.embeds.to_kind(kind), pooled.to_kind(kind));
        Ok(self.forward(&x, &embeds, &pooled, timestep)?.to_kind(latents.kind()))
    }
}

impl TrainableDenoiser for Sd3Transformer {
    weights_and_frozen_copy!();

    /// Joint (and SD3.5-M's image-only) attention through Ulysses: image and text tokens are
    /// both split over the ranks.
    fn sequence_parallel(&self, group: SequenceParallel) -> Result<(), ModelError> {
        self.weights.sequence_parallel("SD3", self.config.num_attention_heads, group)
    }

    fn buffers(&self) -> &'static [&'static str] {
        &[POSITION_TABLE]
    }

    fn example_inputs(&self, shape: ExampleShape) -> ExampleInputs {
        let ExampleShape { batch, height, width, text_len, .. } = shape;
        let c = &self.config;
        let kind = self.context_embedder.weight.kind();
        let opts = (kind, self.weights.base.device());
        ExampleInputs {
            latents: Tensor::randn([batch, c.in_channels, height, width], opts),
            timestep: Tensor::full([batch], 500.0, (Kind::Float, self.weights.base.device())),
            text: TextConditioning::new(
                Tensor::randn([batch, text_len, c.joint_attention_dim], opts),
                Some(Tensor::randn([batch, c.pooled_projection_dim], opts)),
            ),
            tokens: batch * (height / c.patch_size) * (width / c.patch_size),
        }
    }

    fn describe(&self) -> String {
        format!(
            "SD3 transformer {} layers × {} dim",
            self.config.num_layers,
            self.config.inner_dim()
        )
    }
}
