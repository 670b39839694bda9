//! `WanTransformer3DModel` for text-to-video (Wan2.1 T2V, Wan2.2 T2V and TI2V): 3-D patch tokens,
//! a timestep and text embedder, the blocks, an adaLN output norm and the projection back to
//! patches. The timestep is per sample (B,) or, as Wan2.2-TI2V's pipeline passes it with
//! `expand_timesteps`, per token (B, S).

use std::collections::HashMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::block::WanBlock;
use super::config::WanTransformerConfig;
use super::rope::rotations;
use crate::denoiser::{
    weights_and_frozen_copy, Denoiser, ExampleInputs, ExampleShape, TrainableDenoiser,
};
use crate::lora::LoraConfig;
use crate::model_weights::{ModelWeights, WeightsBuilder};
use crate::nn::{gelu_tanh, layer_norm, timestep_features, Linear, Mlp, Scope};
use crate::sequence::{Role, SequenceParallel, Stream};
use crate::{generated_frames, hold_frames, ModelError, TextConditioning};

/// What sequence parallelism splits: the video tokens (self-attention's keys; cross-attention
/// stays local) with their rotary cos and sin.
const SEQUENCE: [Stream; 3] = [
    Stream { name: "video", dim: 1, role: Role::Keys },
    Stream { name: "cos", dim: 0, role: Role::Follows },
    Stream { name: "sin", dim: 0, role: Role::Follows },
];

/// Per-token timesteps' embeddings and modulations (B, S, …), split with the video tokens.
const PER_TOKEN: Stream = Stream { name: "per-token timesteps", dim: 1, role: Role::Follows };

/// `condition_embedder`: sinusoidal timestep features → `time_embedder` (SiLU MLP) →
/// `time_proj` (six modulations per block); `text_embedder` (GELU-tanh MLP) on the text states.
pub struct ConditionEmbedder {
    pub time_embedder: Mlp,
    pub time_proj: Linear,
    /// `text_embedder.linear_1` and `.linear_2`.
    pub text_embedder: (Linear, Linear),
}

impl ConditionEmbedder {
    fn new(s: &Scope<'_>, c: &WanTransformerConfig) -> Self {
        let dim = c.inner_dim();
        let text = s / "text_embedder";
        Self {
            time_embedder: Mlp::new(&(s / "time_embedder"), c.freq_dim, dim),
            time_proj: (s / "time_proj").linear(dim, 6 * dim, true),
            text_embedder: (
                (&text / "linear_1").linear(c.text_dim, dim, true),
                (&text / "linear_2").linear(dim, dim, true),
            ),
        }
    }
}

/// The Wan denoiser: predicts the flow-matching velocity (noise − data) at the pipeline's
/// timestep `1000·σ`, as flowtune's [`Denoiser`] does.
pub struct WanTransformer {
    pub config: WanTransformerConfig,
    /// `patch_embedding`: Conv3d weight (D, C, pt, ph, pw) and bias.
    pub patch_embedding: (Tensor, Tensor),
    pub condition_embedder: ConditionEmbedder,
    pub blocks: Vec<WanBlock>,
    pub proj_out: Linear,
    /// (1, 2, D): shift and scale of the output norm, added to the timestep embedding.
    pub scale_shift_table: Tensor,
    pub weights: ModelWeights,
}

impl WanTransformer {
    /// Builds the module tree for `config` on `device`, with adapters when `lora` is given.
    pub fn new(
        config: &WanTransformerConfig,
        device: Device,
        kind: Kind,
        lora: Option<&LoraConfig>,
    ) -> Result<Self, ModelError> {
        config.validate().map_err(ModelError::Input)?;
        let weights = WeightsBuilder::new(device, kind, lora);
        let root = weights.root();
        let c = config;
        let dim = c.inner_dim();
        let [pt, ph, pw] = c.patch();
        let patch = &root / "patch_embedding";
        let list = &root / "blocks";
        Ok(Self {
            patch_embedding: (
                patch.var("weight", &[dim, c.in_channels, pt, ph, pw]),
                patch.var("bias", &[dim]),
            ),
            condition_embedder: ConditionEmbedder::new(&(&root / "condition_embedder"), c),
            blocks: (0..c.num_layers)
                .map(|i| {
                    WanBlock::new(
                        &(&list / i),
                        dim,
                        c.ffn_dim,
                        c.num_attention_heads,
                        c.cross_attn_norm,
                        c.eps,
                    )
                })
                .collect(),
            proj_out: (&root / "proj_out").linear(dim, c.out_dim() * pt * ph * pw, true),
            scale_shift_table: root.var("scale_shift_table", &[1, 2, dim]),
            config: config.clone(),
            weights: weights.finish(&["blocks"])?,
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
            |c: &WanTransformerConfig| Self::new(c, device, kind, lora),
            |m| &mut m.weights,
        )
    }

    /// diffusers' forward: latents (B, C, F, H, W), `timestep` (B,) or per token (B, S) with
    /// S = (F/pt)·(H/ph)·(W/pw), text states (B, L, text_dim). Returns (B, C_out, F, H, W).
    pub fn forward(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &Tensor,
    ) -> Result<Tensor, ModelError> {
        let grid = self.check_inputs(latents, timestep, text)?;
        let c = &self.config;
        let (weight, bias) = &self.patch_embedding;
        let kind = weight.kind();
        let b = latents.size()[0];
        let [pt, ph, pw] = c.patch();
        let [f, h, w] = grid;
        let (cos, sin) = rotations(c.rope_dims(), grid, latents.device());
        let x = latents.to_kind(kind).conv3d(weight, Some(bias), [pt, ph, pw], [0; 3], [1; 3], 1);
        let x = x.flatten(2, -1).transpose(1, 2).contiguous();
        // This rank's tokens from here to the output projection (all without a group).
        let tokens = x.size()[1];
        let (split, [mut x, cos, sin]) =
            self.weights.split_sequence(&SEQUENCE, [x, cos, sin], None);
        let keys = split.keys();

        // Per-sample timesteps become one row of modulations shared by every token.
        let per_token = timestep.dim() == 2;
        let t = if per_token { timestep.shallow_clone() } else { timestep.unsqueeze(1) };
        let rows = t.size()[1];
        let e = &self.condition_embedder;
        let features = timestep_features(&t.reshape([-1]), c.freq_dim, 1.0).to_kind(kind);
        let mut temb = e.time_embedder.forward(&features).view([b, rows, -1]);
        let mut modulation =
            e.time_proj.forward(&temb.silu()).view([b, rows, 6, -1]).to_kind(Kind::Float);
        if per_token {
            (temb, modulation) =
                (split.split(&PER_TOKEN, &temb), split.split(&PER_TOKEN, &modulation));
        }
        let (l1, l2) = &e.text_embedder;
        let text = l2.forward(&gelu_tanh(&l1.forward(&text.to_kind(kind))));

        for (i, block) in self.blocks.iter().enumerate() {
            let (cos, sin, keys) = (cos.shallow_clone(), sin.shallow_clone(), keys.clone());
            let inputs = [x, modulation.shallow_clone(), text.shallow_clone()];
            let out = self.weights.run_block("blocks", i, &inputs, move |t| {
                vec![block.forward(&t[0], &t[1], &t[2], (&cos, &sin), &keys)]
            })?;
            [x] = <[Tensor; 1]>::try_from(out).expect("a block returns 1 stream");
        }
        let table = self.scale_shift_table.to_kind(Kind::Float).unsqueeze(0);
        let out = (table + temb.to_kind(Kind::Float).unsqueeze(2)).chunk(2, 2);
        let (shift, scale) = (out[0].squeeze_dim(2), out[1].squeeze_dim(2));
        let normed =
            (layer_norm(&x.to_kind(Kind::Float), c.eps) * (scale + 1.0) + shift).to_kind(kind);
        let patches = split.gather(self.proj_out.forward(&normed), tokens)?;
        Ok(patches
            .reshape([b, f, h, w, pt, ph, pw, -1])
            .permute([0, 7, 1, 4, 2, 5, 3, 6])
            .reshape([b, -1, f * pt, h * ph, w * pw]))
    }

    /// The token grid (frames, rows, columns) of valid inputs.
    fn check_inputs(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &Tensor,
    ) -> Result<[i64; 3], ModelError> {
        let c = &self.config;
        let size = latents.size();
        let [pt, ph, pw] = c.patch();
        if size.len() != 5
            || size[1] != c.in_channels
            || size[2] % pt != 0
            || size[3] % ph != 0
            || size[4] % pw != 0
        {
            return Err(ModelError::Input(format!(
                "Wan latents have shape {size:?}, expected [B, {}, F, H, W] with F, H, W \
                 multiples of the patch size {:?}",
                c.in_channels, c.patch_size
            )));
        }
        let b = size[0];
        let grid = [size[2] / pt, size[3] / ph, size[4] / pw];
        if let Some(&big) = grid.iter().find(|&&n| n > c.rope_max_seq_len) {
            return Err(ModelError::Input(format!(
                "a token grid of {grid:?} needs rope_max_seq_len ≥ {big}, the config has {}",
                c.rope_max_seq_len
            )));
        }
        let tokens = grid.iter().product::<i64>();
        let ts = timestep.size();
        if ts != [b] && ts != [b, tokens] {
            return Err(ModelError::Input(format!(
                "timestep has shape {ts:?}, expected [{b}] or per token [{b}, {tokens}]"
            )));
        }
        let ts = text.size();
        if ts.len() != 3 || ts[0] != b || ts[2] != c.text_dim {
            return Err(ModelError::Input(format!(
                "text states have shape {ts:?}, expected [{b}, L, {}]",
                c.text_dim
            )));
        }
        Ok(grid)
    }
}

impl Denoiser for WanTransformer {
    /// The Wan pipelines pass the scheduler's timestep (`1000·σ`) and read a velocity: the
    /// forward itself. The text embeds are the pipeline's zero-padded prompt states (no mask).
    /// With held latents (Wan2.2-TI2V image-to-video), those frames are set to the condition and
    /// their tokens get timestep 0, as WanImageToVideoPipeline's `expand_timesteps` does; their
    /// velocity is 0 (they are not sampled).
    fn velocity(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &TextConditioning,
    ) -> Result<Tensor, ModelError> {
        let Some(held) = text.held_latents() else {
            return Ok(self.forward(latents, timestep, &text.embeds)?.to_kind(latents.kind()));
        };
        let x = hold_frames(latents, held);
        let per_token = self.held_timesteps(&x, held, timestep)?;
        let v = self.forward(&x, &per_token, &text.embeds)?.to_kind(latents.kind());
        Ok(v * generated_frames(latents, held))
    }
}

impl WanTransformer {
    /// Per-token timesteps (B, S) of `timestep` (B,) with the tokens of the `held` leading frames
    /// at 0.
    fn held_timesteps(
        &self,
        latents: &Tensor,
        held: &Tensor,
        timestep: &Tensor,
    ) -> Result<Tensor, ModelError> {
        let [pt, ph, pw] = self.config.patch();
        let size = latents.size();
        let fh = held.size()[2];
        if size.len() != 5 || held.size()[..2] != size[..2] || held.size()[3..] != size[3..] {
            return Err(ModelError::Input(format!(
                "held latents {:?} do not fit latents {size:?}: expected [B, C, Fh, H, W]",
                held.size()
            )));
        }
        if timestep.dim() != 1 || fh % pt != 0 || fh >= size[2] {
            return Err(ModelError::Input(format!(
                "held frames need per-sample timesteps and fewer than {} whole frame patches \
                 (got timestep {:?}, {fh} held frames, temporal patch {pt})",
                size[2],
                timestep.size()
            )));
        }
        let per_frame = (size[3] / ph) * (size[4] / pw);
        let (held_tokens, tokens) = (fh / pt * per_frame, size[2] / pt * per_frame);
        let mask = Tensor::ones([tokens], (Kind::Float, timestep.device()));
        let _ = mask.narrow(0, 0, held_tokens).fill_(0.0);
        Ok(timestep.to_kind(Kind::Float).unsqueeze(1) * mask.unsqueeze(0))
    }
}

impl TrainableDenoiser for WanTransformer {
    weights_and_frozen_copy!();

    /// Self-attention through Ulysses; cross-attention stays local (the text is on every rank).
    fn sequence_parallel(&self, group: SequenceParallel) -> Result<(), ModelError> {
        self.weights.sequence_parallel("Wan", self.config.num_attention_heads, group)
    }

    /// Latents of `frames` (at least the temporal patch) × `height` × `width` cells.
    fn example_inputs(&self, shape: ExampleShape) -> ExampleInputs {
        let ExampleShape { batch, frames, height, width, text_len } = shape;
        let c = &self.config;
        let device = self.weights.base.device();
        let opts = (self.patch_embedding.0.kind(), device);
        let [pt, ph, pw] = c.patch();
        let frames = frames.max(pt);
        ExampleInputs {
            latents: Tensor::randn([batch, c.in_channels, frames, height, width], opts),
            timestep: Tensor::full([batch], 500.0, (Kind::Float, device)),
            text: TextConditioning::new(Tensor::randn([batch, text_len, c.text_dim], opts), None),
            tokens: batch * (frames / pt) * (height / ph) * (width / pw),
        }
    }

    /// diffusers' forward on its argument names: `hidden_states` (B, C, F, H, W), `timestep`
    /// (B,) or (B, S), `encoder_hidden_states` (B, L, text_dim).
    fn forward_named(&self, inputs: &HashMap<String, Tensor>) -> Result<Tensor, ModelError> {
        let get = |name: &str| {
            inputs.get(name).ok_or_else(|| ModelError::Input(format!("no input `{name}`")))
        };
        self.forward(get("hidden_states")?, get("timestep")?, get("encoder_hidden_states")?)
    }

    fn describe(&self) -> String {
        format!(
            "Wan transformer {} layers × {} dim",
            self.config.num_layers,
            self.config.inner_dim()
        )
    }
}
