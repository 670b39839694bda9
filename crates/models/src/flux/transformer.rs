//! `FluxTransformer2DModel`: packed 2×2 latent tokens and T5 states through double-stream, then
//! single-stream blocks, conditioned on timestep + CLIP pooled text (+ distilled guidance for
//! [dev]) through AdaLN, with 3-axis rotary positions.

use std::collections::HashMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::block::{FluxSingleTransformerBlock, FluxTransformerBlock};
use super::config::FluxTransformerConfig;
use super::rope::{position_ids, rotary_tables, THETA};
use crate::denoiser::{
    weights_and_frozen_copy, Denoiser, ExampleInputs, ExampleShape, TrainableDenoiser,
};
use crate::lora::LoraConfig;
use crate::model_weights::{ModelWeights, WeightsBuilder};
use crate::nn::{layer_norm, timestep_features, Linear, Mlp, TIMESTEP_CHANNELS};
use crate::packing::{pack, unpack};
use crate::sequence::{Role, SequenceParallel, Stream};
use crate::{ModelError, TextConditioning};

/// The conditioning extra of [dev]: the distilled guidance value per row, (B,).
pub const GUIDANCE: &str = "guidance";
/// The transformer scales σ-scale timesteps and guidance by this before the sinusoid.
const TIME_SCALE: f64 = 1000.0;
/// Side of the token patch the pipeline packs.
const PATCH: i64 = 2;

/// What sequence parallelism splits: text then image tokens (the joint attention's order, and
/// the single-stream blocks' joint stream on each rank) with their position ids.
const SEQUENCE: [Stream; 4] = [
    Stream { name: "text", dim: 1, role: Role::Keys },
    Stream { name: "image", dim: 1, role: Role::Keys },
    Stream { name: "txt_ids", dim: 0, role: Role::Follows },
    Stream { name: "img_ids", dim: 0, role: Role::Follows },
];

/// The FLUX.1 denoiser, predicting the flow-matching velocity.
pub struct FluxTransformer {
    pub config: FluxTransformerConfig,
    /// `time_text_embed.timestep_embedder`.
    pub timestep_embedder: Mlp,
    /// `time_text_embed.guidance_embedder` ([dev] only).
    pub guidance_embedder: Option<Mlp>,
    /// `time_text_embed.text_embedder`: CLIP pooled → width.
    pub text_embedder: Mlp,
    pub context_embedder: Linear,
    pub x_embedder: Linear,
    pub transformer_blocks: Vec<FluxTransformerBlock>,
    pub single_transformer_blocks: Vec<FluxSingleTransformerBlock>,
    /// `norm_out.linear` of the final continuous AdaLN: (scale, shift).
    pub norm_out: Linear,
    pub proj_out: Linear,
    pub weights: ModelWeights,
}

impl FluxTransformer {
    /// Builds the module tree for `config` on `device`, with adapters when `lora` is given.
    pub fn new(
        config: &FluxTransformerConfig,
        device: Device,
        kind: Kind,
        lora: Option<&LoraConfig>,
    ) -> Result<Self, ModelError> {
        config.validate().map_err(ModelError::Input)?;
        let weights = WeightsBuilder::new(device, kind, lora);
        let root = weights.root();
        let c = config;
        let (dim, heads, head_dim) = (c.inner_dim(), c.num_attention_heads, c.attention_head_dim);
        let embed = &root / "time_text_embed";
        let double = &root / "transformer_blocks";
        let single = &root / "single_transformer_blocks";
        Ok(Self {
            timestep_embedder: Mlp::new(&(&embed / "timestep_embedder"), TIMESTEP_CHANNELS, dim),
            guidance_embedder: c
                .guidance_embeds
                .then(|| Mlp::new(&(&embed / "guidance_embedder"), TIMESTEP_CHANNELS, dim)),
            text_embedder: Mlp::new(&(&embed / "text_embedder"), c.pooled_projection_dim, dim),
            context_embedder: (&root / "context_embedder").linear(c.joint_attention_dim, dim, true),
            x_embedder: (&root / "x_embedder").linear(c.in_channels, dim, true),
            transformer_blocks: (0..c.num_layers)
                .map(|i| FluxTransformerBlock::new(&(&double / i), dim, heads, head_dim))
                .collect(),
            single_transformer_blocks: (0..c.num_single_layers)
                .map(|i| FluxSingleTransformerBlock::new(&(&single / i), dim, heads, head_dim))
                .collect(),
            norm_out: (&(&root / "norm_out") / "linear").linear(dim, 2 * dim, true),
            proj_out: (&root / "proj_out").linear(dim, c.out_channels(), true),
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
            |c: &FluxTransformerConfig| Self::new(c, device, kind, lora),
            |m| &mut m.weights,
        )
    }

    /// diffusers' forward: packed tokens (B, S, in_channels), T5 states (B, L, joint_dim), CLIP
    /// pooled (B, pooled_dim), `timestep` (B,) as σ (t/1000), position ids `img_ids` (S, 3) and
    /// `txt_ids` (L, 3), and for [dev] the guidance value (B,). Returns (B, S, out_channels).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: &Tensor,
        pooled_projections: &Tensor,
        timestep: &Tensor,
        img_ids: &Tensor,
        txt_ids: &Tensor,
        guidance: Option<&Tensor>,
    ) -> Result<Tensor, ModelError> {
        self.check_inputs(
            hidden_states,
            encoder_hidden_states,
            pooled_projections,
            timestep,
            img_ids,
            txt_ids,
        )?;
        let image = self.x_embedder.forward(hidden_states);
        let kind = image.kind();
        let embed = |mlp: &Mlp, t: &Tensor| {
            let t = t.to_kind(kind) * TIME_SCALE;
            mlp.forward(
                &timestep_features(&t, TIMESTEP_CHANNELS, 1.0).to_kind(pooled_projections.kind()),
            )
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
        let temb = temb + self.text_embedder.forward(pooled_projections);
        let text = self.context_embedder.forward(encoder_hidden_states);
        // This rank's text and image tokens from here to the output (all without a group).
        let tokens = image.size()[1];
        let streams = [text, image, txt_ids.shallow_clone(), img_ids.shallow_clone()];
        let (split, [mut text, mut image, txt_ids, img_ids]) =
            self.weights.split_sequence(&SEQUENCE, streams, None);
        let keys = split.keys();
        let ids = Tensor::cat(&[txt_ids, img_ids], 0);
        let rope = rotary_tables(&self.config.axes_dims_rope, THETA, &ids);
        for (i, block) in self.transformer_blocks.iter().enumerate() {
            // Owned by the block's closure: a checkpointed block reruns it in backward.
            let (rope, keys) = (rope.shallow_clone(), keys.clone());
            let out = self.weights.run_block(
                "transformer_blocks",
                i,
                &[image, text, temb.shallow_clone()],
                move |t| {
                    let (image, text) = block.forward(&t[0], &t[1], &t[2], &rope, &keys);
                    vec![image, text]
                },
            )?;
            [image, text] = <[Tensor; 2]>::try_from(out).expect("a double block returns 2 streams");
        }
        let (l, s) = (text.size()[1], image.size()[1]);
        let mut joint = Tensor::cat(&[text, image], 1);
        for (i, block) in self.single_transformer_blocks.iter().enumerate() {
            let (rope, keys) = (rope.shallow_clone(), keys.clone());
            let out = self.weights.run_block(
                "single_transformer_blocks",
                i,
                &[joint, temb.shallow_clone()],
                move |t| vec![block.forward(&t[0], &t[1], &rope, &keys)],
            )?;
            [joint] = <[Tensor; 1]>::try_from(out).expect("a single block returns 1 stream");
        }
        let image = joint.narrow(1, l, s);
        let mods = self.norm_out.forward(&temb.silu()).chunk(2, 1);
        let image = layer_norm(&image, 1e-6) * (mods[0].unsqueeze(1) + 1.0) + mods[1].unsqueeze(1);
        split.gather(self.proj_out.forward(&image), tokens)
    }

    fn check_inputs(
        &self,
        x: &Tensor,
        text: &Tensor,
        pooled: &Tensor,
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
            return bad("hidden_states", xs, format!("[B, S, {}] (packed latents)", c.in_channels));
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
        if img_ids.size() != [xs[1], 3] {
            return bad("img_ids", img_ids.size(), format!("[{}, 3]", xs[1]));
        }
        if txt_ids.size() != [ts[1], 3] {
            return bad("txt_ids", txt_ids.size(), format!("[{}, 3]", ts[1]));
        }
        Ok(())
    }
}

impl Denoiser for FluxTransformer {
    /// Latents (B, C, H, W) are packed into 2×2 tokens with ids `[0, row, column]`, text ids are
    /// zeros; [dev] reads its guidance from the [`GUIDANCE`] extra.
    fn velocity(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &TextConditioning,
    ) -> Result<Tensor, ModelError> {
        let size = latents.size();
        let channels = self.config.latent_channels();
        if size.len() != 4 || size[1] != channels || size[2] % PATCH != 0 || size[3] % PATCH != 0 {
            return Err(ModelError::Input(format!(
                "latents have shape {size:?}, expected [B, {channels}, H, W] with H and W even"
            )));
        }
        let (h, w) = (size[2], size[3]);
        let kind = self.x_embedder.weight.kind();
        let device = latents.device();
        let pooled = text.pooled.as_ref().ok_or_else(|| {
            ModelError::Input("FLUX.1 needs the CLIP pooled text (TextConditioning.pooled)".into())
        })?;
        let l = text.embeds.size()[1];
        let ids = position_ids(0, h / PATCH, w / PATCH, device);
        let out = self.forward(
            &pack(&latents.to_kind(kind), PATCH),
            &text.embeds.to_kind(kind),
            &pooled.to_kind(kind),
            &(timestep / TIME_SCALE),
            &ids,
            &Tensor::zeros([l, 3], (Kind::Float, device)),
            text.extras.get(GUIDANCE),
        )?;
        Ok(unpack(&out, h, w, PATCH))
    }
}

impl TrainableDenoiser for FluxTransformer {
    weights_and_frozen_copy!();

    /// Double- and single-stream attention through Ulysses: text and image tokens are both split
    /// over the ranks (the single-stream blocks' joint stream is each rank's text then image).
    fn sequence_parallel(&self, group: SequenceParallel) -> Result<(), ModelError> {
        self.weights.sequence_parallel("FLUX.1", self.config.num_attention_heads, group)
    }

    fn example_inputs(&self, shape: ExampleShape) -> ExampleInputs {
        let ExampleShape { batch, height, width, text_len, .. } = shape;
        let c = &self.config;
        let device = self.weights.base.device();
        let opts = (self.x_embedder.weight.kind(), device);
        let mut text = TextConditioning::new(
            Tensor::randn([batch, text_len, c.joint_attention_dim], opts),
            Some(Tensor::randn([batch, c.pooled_projection_dim], opts)),
        );
        if c.guidance_embeds {
            text.extras.insert(GUIDANCE.into(), Tensor::full([batch], 3.5, (Kind::Float, device)));
        }
        ExampleInputs {
            latents: Tensor::randn([batch, c.latent_channels(), height, width], opts),
            timestep: Tensor::full([batch], 500.0, (Kind::Float, device)),
            text,
            tokens: batch * (height / PATCH) * (width / PATCH),
        }
    }

    /// diffusers' forward on its argument names: packed `hidden_states`, `timestep` as σ,
    /// `img_ids` / `txt_ids` (S, 3) / (L, 3), `guidance` for [dev].
    fn forward_named(&self, inputs: &HashMap<String, Tensor>) -> Result<Tensor, ModelError> {
        let get = |name: &str| {
            inputs.get(name).ok_or_else(|| ModelError::Input(format!("no input `{name}`")))
        };
        self.forward(
            get("hidden_states")?,
            get("encoder_hidden_states")?,
            get("pooled_projections")?,
            get("timestep")?,
            get("img_ids")?,
            get("txt_ids")?,
            inputs.get("guidance"),
        )
    }

    fn describe(&self) -> String {
        format!(
            "FLUX.1 transformer {} double + {} single blocks × {} dim{}",
            self.config.num_layers,
            self.config.num_single_layers,
            self.config.inner_dim(),
            if self.config.guidance_embeds { ", guidance embedding" } else { "" }
        )
    }
}
