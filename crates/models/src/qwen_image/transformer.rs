//! `QwenImageTransformer2DModel`: packed 2×2 latent tokens and text states through dual-stream
//! blocks, continuous AdaLN, projection back to packed latent channels.

use std::collections::HashMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::block::QwenImageTransformerBlock;
use super::config::QwenImageTransformerConfig;
use super::rope::{rotary_angles, ImageShape, RotaryAngles};
use crate::denoiser::{
    weights_and_frozen_copy, Denoiser, ExampleInputs, ExampleShape, TrainableDenoiser,
};
use crate::lora::LoraConfig;
use crate::model_weights::{ModelWeights, WeightsBuilder};
use crate::nn::{layer_norm, timestep_features, Linear, Mlp, RmsNorm, TIMESTEP_CHANNELS};
use crate::packing;
use crate::sequence::{Role, SequenceParallel, Stream};
use crate::{rescaled_guidance, ModelError, TextConditioning, Unpadding};

/// The rotary base of every axis.
const ROPE_THETA: f64 = 10_000.0;

/// What sequence parallelism splits: text (masked where the caller's mask is zero) then image
/// tokens, the joint attention's order, with their rotary angles.
const SEQUENCE: [Stream; 4] = [
    Stream { name: "text", dim: 1, role: Role::MaskedKeys },
    Stream { name: "image", dim: 1, role: Role::Keys },
    Stream { name: "rope.text", dim: 0, role: Role::Follows },
    Stream { name: "rope.image", dim: 0, role: Role::Follows },
];

/// The Edit models' `zero_cond_t` selector (B, S), split with the image tokens.
const SELECT: Stream = Stream { name: "select", dim: 1, role: Role::Follows };

/// `QwenTimestepProjEmbeddings` feeds `1000·t` to the sinusoid (the pipeline passes `t/1000`).
const TIMESTEP_SCALE: f64 = 1000.0;

/// Extras of an image-to-image (Edit) conditioning: the condition images' packed latents
/// (B, S_c, in_channels) and their token grids (B, n, 3) as (frames, rows, columns).
pub const CONDITION_LATENTS: &str = "condition_latents";
pub const CONDITION_SHAPES: &str = "condition_shapes";

/// The Qwen-Image denoiser, predicting the flow-matching velocity.
pub struct QwenImageTransformer {
    pub config: QwenImageTransformerConfig,
    /// `time_text_embed.timestep_embedder`.
    pub timestep_embedder: Mlp,
    pub txt_norm: RmsNorm,
    pub img_in: Linear,
    pub txt_in: Linear,
    pub transformer_blocks: Vec<QwenImageTransformerBlock>,
    /// `norm_out.linear` of the final continuous AdaLN: (scale, shift).
    pub norm_out: Linear,
    pub proj_out: Linear,
    pub weights: ModelWeights,
}

impl QwenImageTransformer {
    /// Builds the module tree for `config` on `device`, with adapters when `lora` is given.
    pub fn new(
        config: &QwenImageTransformerConfig,
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
                QwenImageTransformerBlock::new(
                    &(&(&root / "transformer_blocks") / i),
                    dim,
                    c.num_attention_heads,
                    c.attention_head_dim,
                )
            })
            .collect();
        Ok(Self {
            timestep_embedder: Mlp::new(
                &(&(&root / "time_text_embed") / "timestep_embedder"),
                TIMESTEP_CHANNELS,
                dim,
            ),
            txt_norm: RmsNorm::new(&(&root / "txt_norm"), c.joint_attention_dim, 1e-6),
            img_in: (&root / "img_in").linear(c.in_channels, dim, true),
            txt_in: (&root / "txt_in").linear(c.joint_attention_dim, dim, true),
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
            |c: &QwenImageTransformerConfig| Self::new(c, device, kind, lora),
            |m| &mut m.weights,
        )
    }

    /// diffusers' forward: packed tokens (B, S, in_channels), text states (B, L, joint_dim) with
    /// an optional mask (B, L) (nonzero = token), `timestep` (B,) as the pipeline passes it
    /// (σ, i.e. t/1000), and the token grids of the images on the stream (the target first;
    /// with `zero_cond_t` the others are condition images at timestep 0). Returns (B, S, p²·out).
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: &Tensor,
        mask: Option<&Tensor>,
        timestep: &Tensor,
        img_shapes: &[ImageShape],
    ) -> Result<Tensor, ModelError> {
        self.check_inputs(hidden_states, encoder_hidden_states, mask, timestep, img_shapes)?;
        let (b, s) = (hidden_states.size()[0], hidden_states.size()[1]);
        let device = hidden_states.device();
        let image = self.img_in.forward(hidden_states);
        let kind = image.kind();
        let mut t = timestep.to_kind(kind);
        let select = self.config.zero_cond_t.then(|| {
            let (f, h, w) = img_shapes[0];
            t = Tensor::cat(&[&t, &(&t * 0.0)], 0);
            let target = f * h * w;
            Tensor::cat(
                &[
                    Tensor::zeros([b, target], (Kind::Int64, device)),
                    Tensor::ones([b, s - target], (Kind::Int64, device)),
                ],
                1,
            )
        });
        let text = self.txt_in.forward(&self.txt_norm.forward(encoder_hidden_states));
        let l = text.size()[1];
        let features = timestep_features(&t, TIMESTEP_CHANNELS, TIMESTEP_SCALE).to_kind(kind);
        let temb = self.timestep_embedder.forward(&features);
        let rope = rotary_angles(&self.config.axes_dims_rope, ROPE_THETA, img_shapes, l, device);
        // This rank's text and image tokens from here to the output (all without a group).
        let streams = [text, image, rope.text, rope.image];
        let (split, [mut text, mut image, rope_text, rope_image]) =
            self.weights.split_sequence(&SEQUENCE, streams, mask);
        let rope = RotaryAngles { image: rope_image, text: rope_text };
        let select = select.map(|t| split.split(&SELECT, &t));
        let keys = split.keys();
        for (i, block) in self.transformer_blocks.iter().enumerate() {
            let (keys, rope) = (keys.clone(), rope.shallow_clone());
            let select = select.as_ref().map(Tensor::shallow_clone);
            let out = self.weights.run_block(
                "transformer_blocks",
                i,
                &[image, text, temb.shallow_clone()],
                move |t| {
                    let (image, text) =
                        block.forward(&t[0], &t[1], &t[2], &rope, select.as_ref(), &keys);
                    vec![image, text]
                },
            )?;
            [image, text] = <[Tensor; 2]>::try_from(out).expect("a block returns 2 streams");
        }
        let temb = if select.is_some() { temb.chunk(2, 0)[0].shallow_clone() } else { temb };
        let mods = self.norm_out.forward(&temb.silu()).chunk(2, 1);
        let image = layer_norm(&image, 1e-6) * (mods[0].unsqueeze(1) + 1.0) + mods[1].unsqueeze(1);
        split.gather(self.proj_out.forward(&image), s)
    }

    fn check_inputs(
        &self,
        x: &Tensor,
        text: &Tensor,
        mask: Option<&Tensor>,
        t: &Tensor,
        img_shapes: &[ImageShape],
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let bad = |what: &str, found: Vec<i64>, expected: String| {
            Err(ModelError::Input(format!("{what} has shape {found:?}, expected {expected}")))
        };
        let xs = x.size();
        if xs.len() != 3 || xs[2] != c.in_channels {
            return bad("hidden_states", xs, format!("[B, S, {}] (packed latents)", c.in_channels));
        }
        let tokens: i64 = img_shapes.iter().map(|(f, h, w)| f * h * w).sum();
        if img_shapes.is_empty() || tokens != xs[1] {
            return Err(ModelError::Input(format!(
                "img_shapes {img_shapes:?} cover {tokens} tokens, hidden_states has {}",
                xs[1]
            )));
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
        if let Some(m) = mask {
            if m.size() != [b, ts[1]] {
                return bad("encoder_hidden_states_mask", m.size(), format!("[{b}, {}]", ts[1]));
            }
        }
        if t.size() != [b] {
            return bad("timestep", t.size(), format!("[{b}]"));
        }
        Ok(())
    }

    /// (B, C, H, W) latents → (B, (H/p)(W/p), C·p²) tokens ([`crate::packing::pack`]).
    pub fn pack(&self, latents: &Tensor) -> Tensor {
        packing::pack(latents, self.config.patch_size)
    }

    /// The inverse of [`Self::pack`] for a (B, S, C·p²) prediction of an `h × w` latent.
    pub fn unpack(&self, tokens: &Tensor, h: i64, w: i64) -> Tensor {
        packing::unpack(tokens, h, w, self.config.patch_size)
    }
}

impl Denoiser for QwenImageTransformer {
    /// Latents (B, C, H, W) are packed here; Edit conditionings append their condition tokens
    /// (extras [`CONDITION_LATENTS`], [`CONDITION_SHAPES`]) and the prediction keeps the target's.
    fn velocity(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &TextConditioning,
    ) -> Result<Tensor, ModelError> {
        let size = latents.size();
        let p = self.config.patch_size;
        if size.len() != 4
            || size[1] != self.config.latent_channels()
            || size[2] % p != 0
            || size[3] % p != 0
        {
            return Err(ModelError::Input(format!(
                "latents have shape {size:?}, expected [B, {}, H, W] with H and W multiples of {p}",
                self.config.latent_channels()
            )));
        }
        let (h, w) = (size[2], size[3]);
        let kind = self.img_in.weight.kind();
        let target = self.pack(&latents.to_kind(kind));
        let mut shapes = vec![(1, h / p, w / p)];
        let tokens = match text.extras.get(CONDITION_LATENTS) {
            Some(condition) => {
                let grids = text.extras.get(CONDITION_SHAPES).ok_or_else(|| {
                    ModelError::Input(format!("{CONDITION_LATENTS} without {CONDITION_SHAPES}"))
                })?;
                let grids = Vec::<i64>::try_from(grids.get(0).reshape([-1]))?;
                shapes.extend(grids.chunks(3).map(|g| (g[0], g[1], g[2])));
                Tensor::cat(&[&target, &condition.to_kind(kind)], 1)
            }
            None => target,
        };
        let out = self.forward(
            &tokens,
            &text.embeds.to_kind(kind),
            text.mask.as_ref(),
            &(timestep / 1000.0),
            &shapes,
        )?;
        let out = out.narrow(1, 0, (h / p) * (w / p));
        Ok(self.unpack(&out, h, w))
    }

    /// The two CFG branches have their own text lengths: two forwards, as diffusers does.
    fn batched_cfg(&self) -> bool {
        false
    }

    /// Padding lies at the end of each row's text and nothing else depends on its length.
    fn unpadding(&self) -> Unpadding {
        self.weights.unpadding(Unpadding::Regroup)
    }

    /// "True CFG": `n + s(c − n)` rescaled per packed token to the conditional norm.
    fn combine_guidance(&self, cond: &Tensor, uncond: &Tensor, scale: f64) -> Tensor {
        let size = cond.size();
        let (h, w) = (size[2], size[3]);
        let out = rescaled_guidance(&self.pack(cond), &self.pack(uncond), scale, &[-1]);
        self.unpack(&out, h, w)
    }

    /// Over the 64 channels of each packed 2 × 2 patch, as the true CFG above.
    fn norm_rescaled_guidance(&self, cond: &Tensor, uncond: &Tensor, scale: f64) -> Tensor {
        self.combine_guidance(cond, uncond, scale)
    }
}

impl TrainableDenoiser for QwenImageTransformer {
    weights_and_frozen_copy!();

    /// Joint attention through Ulysses: text and image tokens are both split over the ranks.
    fn sequence_parallel(&self, group: SequenceParallel) -> Result<(), ModelError> {
        self.weights.sequence_parallel("Qwen-Image", self.config.num_attention_heads, group)
    }

    fn example_inputs(&self, shape: ExampleShape) -> ExampleInputs {
        let ExampleShape { batch, height, width, text_len, .. } = shape;
        let c = &self.config;
        let device = self.weights.base.device();
        let opts = (self.img_in.weight.kind(), device);
        let mut text = TextConditioning::new(
            Tensor::randn([batch, text_len, c.joint_attention_dim], opts),
            None,
        );
        text.mask = Some(Tensor::ones([batch, text_len], (Kind::Int64, device)));
        ExampleInputs {
            latents: Tensor::randn([batch, c.latent_channels(), height, width], opts),
            timestep: Tensor::full([batch], 500.0, (Kind::Float, device)),
            text,
            tokens: batch * (height / c.patch_size) * (width / c.patch_size),
        }
    }

    /// diffusers' forward: packed `hidden_states`, `timestep` as σ, `img_shapes` as an (n, 3)
    /// tensor of (frames, rows, columns) shared by every row.
    fn forward_named(&self, inputs: &HashMap<String, Tensor>) -> Result<Tensor, ModelError> {
        let get = |name: &str| {
            inputs.get(name).ok_or_else(|| ModelError::Input(format!("no input `{name}`")))
        };
        let grids = Vec::<i64>::try_from(get("img_shapes")?.reshape([-1]))?;
        let shapes: Vec<ImageShape> = grids.chunks(3).map(|g| (g[0], g[1], g[2])).collect();
        self.forward(
            get("hidden_states")?,
            get("encoder_hidden_states")?,
            inputs.get("encoder_hidden_states_mask"),
            get("timestep")?,
            &shapes,
        )
    }

    fn describe(&self) -> String {
        format!(
            "Qwen-Image transformer {} layers × {} dim",
            self.config.num_layers,
            self.config.inner_dim()
        )
    }
}
