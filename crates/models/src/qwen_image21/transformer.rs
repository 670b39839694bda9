//! `QwenImage21Transformer2DModel`: the encoder's sequence (condition-image latents dropped into
//! the slots it reserved for them) and the target's latent tokens as one block-causal stream,
//! every block modulated by one shared projection of the timestep embedding.

use std::collections::HashMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::block::{Context, QwenImage21TransformerBlock};
use super::config::QwenImage21TransformerConfig;
use super::layout::{JointLayout, TOKENS_PER_SLOT};
use crate::denoiser::{
    weights_and_frozen_copy, Denoiser, ExampleInputs, ExampleShape, TrainableDenoiser,
};
use crate::lora::LoraConfig;
use crate::model_weights::{ModelWeights, WeightsBuilder};
use crate::nn::{layer_norm, Linear, Mlp, Scope, TIMESTEP_CHANNELS};
use crate::qwen_image::{ImageShape, CONDITION_LATENTS, CONDITION_SHAPES};
use crate::{ModelError, TextConditioning, Unpadding};

/// `QwenImage21TemporalTimesteps` multiplies σ by this before the sinusoid.
const TIME_FACTOR: f64 = 1000.0;
/// Extra of a conditioning with condition images: the encoder positions (B, P ≤ L) that are
/// image slots (nonzero; positions past P are text), every row the same. Their latents and grids are [`CONDITION_LATENTS`] and
/// [`CONDITION_SHAPES`].
pub const IMAGE_SLOTS: &str = "image_slots";

/// `QwenImage21ZeroCenterRMSNorm`: RMS norm in f32 scaled by `weight + 1`.
pub struct ZeroCenterRmsNorm {
    pub weight: Tensor,
    pub eps: f64,
}

impl ZeroCenterRmsNorm {
    fn new(scope: &Scope<'_>, dim: i64, eps: f64) -> Self {
        Self { weight: scope.var("weight", &[dim]), eps }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let h = x.to_kind(Kind::Float);
        let rrms = (h.square().mean_dim(-1, true, Kind::Float) + self.eps).rsqrt();
        (h * rrms * (self.weight.to_kind(Kind::Float) + 1.0)).to_kind(x.kind())
    }
}

/// The Qwen-Image 2.1 denoiser, predicting the flow-matching velocity.
pub struct QwenImage21Transformer {
    pub config: QwenImage21TransformerConfig,
    /// `time_text_embed.timestep_embedder` (no biases).
    pub timestep_embedder: Mlp,
    /// `txt_in`: zero-centred RMS norm, `in_layer`, GELU (tanh), `out_layer`.
    pub text_norm: ZeroCenterRmsNorm,
    pub text_in: Linear,
    pub text_out: Linear,
    pub img_in: Linear,
    /// `modulation.1`: SiLU(temb) → (scale 1, gate 1, scale 2, gate 2), shared by every block.
    pub modulation: Linear,
    pub transformer_blocks: Vec<QwenImage21TransformerBlock>,
    /// `norm_out.linear`: the final norm's scale (no shift).
    pub norm_out: Linear,
    pub proj_out: Linear,
    pub weights: ModelWeights,
}

impl QwenImage21Transformer {
    /// Builds the module tree for `config` on `device`, with adapters when `lora` is given.
    pub fn new(
        config: &QwenImage21TransformerConfig,
        device: Device,
        kind: Kind,
        lora: Option<&LoraConfig>,
    ) -> Result<Self, ModelError> {
        config.validate().map_err(ModelError::Input)?;
        let weights = WeightsBuilder::new(device, kind, lora);
        let root = weights.root();
        let c = config;
        let (dim, heads, head_dim) = (c.inner_dim(), c.num_attention_heads, c.attention_head_dim);
        let embed = &(&root / "time_text_embed") / "timestep_embedder";
        let txt = &root / "txt_in";
        let blocks = &root / "transformer_blocks";
        Ok(Self {
            timestep_embedder: Mlp {
                linear_1: (&embed / "linear_1").linear(TIMESTEP_CHANNELS, dim, false),
                linear_2: (&embed / "linear_2").linear(dim, dim, false),
            },
            text_norm: ZeroCenterRmsNorm::new(&(&txt / "text_norm"), c.context_in_dim, c.eps),
            text_in: (&txt / "in_layer").linear(c.context_in_dim, dim, false),
            text_out: (&txt / "out_layer").linear(dim, dim, false),
            img_in: (&root / "img_in").linear(c.in_channels, dim, false),
            modulation: (&(&root / "modulation") / 1).linear(dim, 4 * dim, false),
            transformer_blocks: (0..c.num_layers)
                .map(|i| {
                    QwenImage21TransformerBlock::new(
                        &(&blocks / i),
                        dim,
                        heads,
                        head_dim,
                        dim * c.mlp_ratio,
                        c.eps,
                    )
                })
                .collect(),
            norm_out: (&(&root / "norm_out") / "linear").linear(dim, dim, false),
            proj_out: (&root / "proj_out").linear(dim, c.out_channels(), false),
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
            |c: &QwenImage21TransformerConfig| Self::new(c, device, kind, lora),
            |m| &mut m.weights,
        )
    }

    /// The sinusoid of `1000·σ` (`[cos, sin]`) through the embedder.
    fn time_embedding(&self, timestep: &Tensor, kind: Kind) -> Tensor {
        let half = TIMESTEP_CHANNELS / 2;
        let device = timestep.device();
        let freqs =
            (Tensor::arange(half, (Kind::Float, device)) * -(10_000f64).ln() / half as f64).exp();
        let args = (timestep.to_kind(Kind::Float) * TIME_FACTOR).unsqueeze(1) * freqs.unsqueeze(0);
        let features = Tensor::cat(&[args.cos(), args.sin()], -1);
        self.timestep_embedder.forward(&features.to_kind(kind))
    }

    /// diffusers' forward: image tokens (B, N, in_channels) (condition images, then the
    /// target), the encoder's states (B, L, context_in_dim) with their optional mask (B, L)
    /// (nonzero = token), `timestep` (B,) as σ, the images' grids and `img_mask` (B, L + T/4)
    /// (nonzero at image slots; row 0 is read, as diffusers does). Returns the joint sequence's
    /// prediction (B, S, out_channels); the target's tokens are the last T.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: &Tensor,
        encoder_hidden_states_mask: Option<&Tensor>,
        timestep: &Tensor,
        img_shapes: &[ImageShape],
        img_mask: &Tensor,
    ) -> Result<Tensor, ModelError> {
        let layout = self.check_inputs(
            hidden_states,
            encoder_hidden_states,
            encoder_hidden_states_mask,
            timestep,
            img_shapes,
            img_mask,
        )?;
        let kind = hidden_states.kind();
        let device = hidden_states.device();
        let b = hidden_states.size()[0];
        let image = self.img_in.forward(hidden_states);
        let text =
            self.text_in.forward(&self.text_norm.forward(encoder_hidden_states)).gelu("tanh");
        let text = self.text_out.forward(&text);
        let gather = Tensor::from_slice(&layout.gather).to_device(device);
        let mut joint = Tensor::cat(&[text, image], 1).index_select(1, &gather);
        let mut t = timestep.to_kind(kind);
        if self.config.causal_condition {
            t = Tensor::cat(&[t, Tensor::zeros([1], (kind, device))], 0);
        }
        let temb = self.time_embedding(&t, kind);
        let modulation = self.modulation.forward(&temb.silu());
        let key_valid = encoder_hidden_states_mask.map(|m| layout.key_valid(m));
        let prefix_mask = layout.prefix_mask(device).view([1, 1, layout.prefix, layout.prefix]);
        let p = layout.prefix;
        let ctx = Context {
            angles: layout.rotary_angles(&self.config.axes_dims_rope, device),
            prefix: p,
            prefix_mask: match &key_valid {
                Some(valid) => prefix_mask.logical_and(&valid.narrow(1, 0, p).view([b, 1, 1, p])),
                None => prefix_mask,
            },
            target_mask: key_valid.map(|v| v.view([b, 1, 1, -1])),
            causal_condition: self.config.causal_condition,
        };
        for (i, block) in self.transformer_blocks.iter().enumerate() {
            let ctx = ctx.shallow_clone();
            let out = self.weights.run_block(
                "transformer_blocks",
                i,
                &[joint, modulation.shallow_clone()],
                move |t| vec![block.forward(&t[0], &t[1], &ctx)],
            )?;
            [joint] = <[Tensor; 1]>::try_from(out).expect("a block returns 1 stream");
        }
        let scale = ctx.select(&self.norm_out.forward(&temb.silu()), layout.len());
        Ok(self.proj_out.forward(&(layer_norm(&joint, self.config.eps) * (scale + 1.0))))
    }

    fn check_inputs(
        &self,
        x: &Tensor,
        text: &Tensor,
        mask: Option<&Tensor>,
        t: &Tensor,
        img_shapes: &[ImageShape],
        img_mask: &Tensor,
    ) -> Result<JointLayout, ModelError> {
        let c = &self.config;
        let bad = |what: &str, found: Vec<i64>, expected: String| {
            Err(ModelError::Input(format!("{what} has shape {found:?}, expected {expected}")))
        };
        let xs = x.size();
        if xs.len() != 3 || xs[2] != c.in_channels {
            return bad("hidden_states", xs, format!("[B, N, {}] (latent tokens)", c.in_channels));
        }
        let b = xs[0];
        let ts = text.size();
        if ts.len() != 3 || ts[0] != b || ts[2] != c.context_in_dim {
            return bad("encoder_hidden_states", ts, format!("[{b}, L, {}]", c.context_in_dim));
        }
        if let Some(m) = mask {
            if m.size() != [b, ts[1]] {
                return bad("encoder_hidden_states_mask", m.size(), format!("[{b}, {}]", ts[1]));
            }
        }
        if t.size() != [b] {
            return bad("timestep", t.size(), format!("[{b}]"));
        }
        let ms = img_mask.size();
        if ms.len() != 2 || ms[0] != b {
            return bad("img_mask", ms, format!("[{b}, L + target tokens / 4]"));
        }
        let slots = Vec::<bool>::try_from(img_mask.get(0).ne(0))?;
        let layout = JointLayout::new(&slots, img_shapes, ts[1]).map_err(ModelError::Input)?;
        let tokens: i64 = img_shapes.iter().map(|s| s.0 * s.1 * s.2).sum();
        if xs[1] != tokens {
            return bad(
                "hidden_states",
                xs,
                format!("{tokens} tokens (img_shapes {img_shapes:?})"),
            );
        }
        Ok(layout)
    }
}

impl Denoiser for QwenImage21Transformer {
    /// Latents (B, C, H, W) become one token per cell after the condition images' tokens
    /// (extras [`CONDITION_LATENTS`], [`CONDITION_SHAPES`], [`IMAGE_SLOTS`]); the target's slots
    /// are appended to the encoder's and only the target's velocity is kept.
    fn velocity(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &TextConditioning,
    ) -> Result<Tensor, ModelError> {
        let size = latents.size();
        let channels = self.config.in_channels;
        if size.len() != 4 || size[1] != channels || size[2] % 2 != 0 || size[3] % 2 != 0 {
            return Err(ModelError::Input(format!(
                "latents have shape {size:?}, expected [B, {channels}, H, W] with H and W even \
                 (one encoder slot per 2×2 tokens)"
            )));
        }
        let (b, h, w) = (size[0], size[2], size[3]);
        let kind = self.img_in.weight.kind();
        let device = latents.device();
        let mut tokens = latents.to_kind(kind).flatten(2, 3).transpose(1, 2);
        let l = text.embeds.size()[1];
        let target_slots = Tensor::ones([b, h * w / TOKENS_PER_SLOT], (Kind::Bool, device));
        let (slots, mut shapes) = match text.extras.get(CONDITION_LATENTS) {
            Some(condition) => {
                let (Some(grids), Some(slots)) =
                    (text.extras.get(CONDITION_SHAPES), text.extras.get(IMAGE_SLOTS))
                else {
                    return Err(ModelError::Input(format!(
                        "{CONDITION_LATENTS} without {CONDITION_SHAPES} and {IMAGE_SLOTS}"
                    )));
                };
                let p = slots.size()[1];
                if p > l {
                    return Err(ModelError::Input(format!(
                        "{IMAGE_SLOTS} spans {p} encoder positions, the prompt states only {l}"
                    )));
                }
                tokens = Tensor::cat(&[condition.to_kind(kind), tokens], 1);
                let grids = Vec::<i64>::try_from(grids.get(0).reshape([-1]))?;
                // Slots up to the last one: the positions after it are text.
                let slots = slots.to_kind(Kind::Int64).constant_pad_nd([0, l - p]).ne(0);
                (slots, grids.chunks(3).map(|g| (g[0], g[1], g[2])).collect())
            }
            None => (Tensor::zeros([b, l], (Kind::Bool, device)), vec![]),
        };
        shapes.push((1, h, w));
        let out = self.forward(
            &tokens,
            &text.embeds.to_kind(kind),
            text.mask.as_ref(),
            &(timestep / 1000.0),
            &shapes,
            &Tensor::cat(&[slots, target_slots], 1),
        )?;
        let n = out.size()[1];
        Ok(out.narrow(1, n - h * w, h * w).transpose(1, 2).reshape([b, channels, h, w]))
    }

    /// The two CFG branches have their own text lengths: two forwards, as diffusers does.
    fn batched_cfg(&self) -> bool {
        false
    }

    /// The image tokens' rotary positions follow the padded text, so trimming would move them:
    /// only a mask every row fills is dropped.
    fn unpadding(&self) -> Unpadding {
        self.weights.unpadding(Unpadding::FullRows)
    }
}

impl TrainableDenoiser for QwenImage21Transformer {
    weights_and_frozen_copy!();

    fn example_inputs(&self, shape: ExampleShape) -> ExampleInputs {
        let ExampleShape { batch, height, width, text_len, .. } = shape;
        let c = &self.config;
        let device = self.weights.base.device();
        let opts = (self.img_in.weight.kind(), device);
        let text =
            TextConditioning::new(Tensor::randn([batch, text_len, c.context_in_dim], opts), None);
        ExampleInputs {
            latents: Tensor::randn([batch, c.in_channels, height, width], opts),
            timestep: Tensor::full([batch], 500.0, (Kind::Float, device)),
            text,
            tokens: batch * height * width,
        }
    }

    /// diffusers' forward on its argument names: `hidden_states` tokens, `timestep` as σ,
    /// `img_shapes` as an (n, 3) tensor shared by every row, `img_mask`, and the optional
    /// `encoder_hidden_states_mask`.
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
            get("img_mask")?,
        )
    }

    fn describe(&self) -> String {
        format!(
            "Qwen-Image 2.1 transformer {} blocks × {} dim",
            self.config.num_layers,
            self.config.inner_dim()
        )
    }
}
