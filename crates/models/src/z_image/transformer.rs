//! `ZImageTransformer2DModel` for text-to-image: 2×2 patch tokens and caption tokens are refined
//! apart (noise refiner with adaLN, context refiner without), then run as one stream
//! `[image; caption]` through the main blocks; each part is padded to a multiple of
//! [`SEQ_MULTI_OF`] tokens with a learned pad token.

use std::collections::HashMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::block::{BlockDims, ZImageBlock};
use super::config::{ZImageTransformerConfig, PIPELINE_PATCH};
use super::rope::rotations;
use crate::denoiser::{
    weights_and_frozen_copy, Denoiser, ExampleInputs, ExampleShape, TrainableDenoiser,
};
use crate::lora::LoraConfig;
use crate::model_weights::{ModelWeights, WeightsBuilder};
use crate::nn::{layer_norm, timestep_features, Linear, RmsNorm, Scope, TIMESTEP_CHANNELS};
use crate::sequence::{Role, SequenceParallel, Stream};
use crate::{ModelError, TextConditioning, Unpadding};

/// Image and caption token runs are padded to a multiple of this.
pub const SEQ_MULTI_OF: i64 = 32;
/// Hidden width of the timestep embedder's MLP.
const TIMESTEP_MID: i64 = 1024;

/// What sequence parallelism splits: image then caption tokens (the unified stream's order; the
/// captions' padding masked), with their rotary positions.
const SEQUENCE: [Stream; 4] = [
    Stream { name: "image", dim: 1, role: Role::Keys },
    Stream { name: "text", dim: 1, role: Role::MaskedKeys },
    Stream { name: "image_rot", dim: 1, role: Role::Follows },
    Stream { name: "text_rot", dim: 1, role: Role::Follows },
];

/// `all_final_layer.{p}-{f}`: LayerNorm scaled by `1 + adaLN_modulation.1(silu(t))`, projection.
pub struct FinalLayer {
    pub linear: Linear,
    pub adaln_modulation: Linear,
}

impl FinalLayer {
    fn new(scope: &Scope<'_>, dim: i64, adaln_dim: i64, out: i64) -> Self {
        Self {
            linear: (scope / "linear").linear(dim, out, true),
            adaln_modulation: (&(scope / "adaLN_modulation") / 1).linear(adaln_dim, dim, true),
        }
    }

    fn forward(&self, x: &Tensor, adaln: &Tensor) -> Tensor {
        let scale = self.adaln_modulation.forward(&adaln.silu()).unsqueeze(1) + 1.0;
        self.linear.forward(&(layer_norm(x, 1e-6) * scale))
    }
}

/// The Z-Image denoiser (diffusers predicts `x₀ − noise` at `t = 1 − σ`; [`Denoiser::velocity`]
/// converts to flowtune's timestep and velocity).
pub struct ZImageTransformer {
    pub config: ZImageTransformerConfig,
    /// `t_embedder.mlp.0` and `.2`.
    pub t_embedder: (Linear, Linear),
    /// `cap_embedder.0` (RMS norm) and `.1` (projection).
    pub cap_embedder: (RmsNorm, Linear),
    /// `all_x_embedder.{p}-{f}` of the pipeline's patch pair (2, 1).
    pub x_embedder: Linear,
    pub final_layer: FinalLayer,
    pub x_pad_token: Tensor,
    pub cap_pad_token: Tensor,
    pub noise_refiner: Vec<ZImageBlock>,
    pub context_refiner: Vec<ZImageBlock>,
    pub layers: Vec<ZImageBlock>,
    pub weights: ModelWeights,
}

/// `n` rounded up to a multiple of [`SEQ_MULTI_OF`].
fn padded(n: i64) -> i64 {
    n + (-n).rem_euclid(SEQ_MULTI_OF)
}

impl ZImageTransformer {
    /// Builds the module tree for `config` on `device`, with adapters when `lora` is given. Every
    /// patch pair of the config gets its embedder and final layer (they are checkpoint keys);
    /// the forward runs (2, 1).
    pub fn new(
        config: &ZImageTransformerConfig,
        device: Device,
        kind: Kind,
        lora: Option<&LoraConfig>,
    ) -> Result<Self, ModelError> {
        config.validate().map_err(ModelError::Input)?;
        let weights = WeightsBuilder::new(device, kind, lora);
        let root = weights.root();
        let c = config;
        let dims = BlockDims {
            dim: c.dim,
            heads: c.n_heads,
            ffn_dim: c.ffn_dim(),
            adaln_dim: c.adaln_dim(),
            norm_eps: c.norm_eps,
            qk_norm: c.qk_norm,
        };
        let stack = |name: &str, n: usize, modulation: bool| -> Vec<ZImageBlock> {
            (0..n).map(|i| ZImageBlock::new(&(&(&root / name) / i), &dims, modulation)).collect()
        };
        let (mut x_embedder, mut final_layer) = (None, None);
        for (p, f) in c.patch_pairs() {
            let key = format!("{p}-{f}");
            let channels = f * p * p * c.in_channels;
            let embedder = (&(&root / "all_x_embedder") / &key).linear(channels, c.dim, true);
            let last = FinalLayer::new(
                &(&(&root / "all_final_layer") / &key),
                c.dim,
                c.adaln_dim(),
                channels,
            );
            if (p, f) == PIPELINE_PATCH && x_embedder.is_none() {
                (x_embedder, final_layer) = (Some(embedder), Some(last));
            }
        }
        let t_mlp = &(&root / "t_embedder") / "mlp";
        let cap = &root / "cap_embedder";
        Ok(Self {
            t_embedder: (
                (&t_mlp / 0).linear(TIMESTEP_CHANNELS, TIMESTEP_MID, true),
                (&t_mlp / 2).linear(TIMESTEP_MID, c.adaln_dim(), true),
            ),
            cap_embedder: (
                RmsNorm::new(&(&cap / 0), c.cap_feat_dim, c.norm_eps),
                (&cap / 1).linear(c.cap_feat_dim, c.dim, true),
            ),
            x_embedder: x_embedder.expect("validate() checked the (2, 1) pair"),
            final_layer: final_layer.expect("validate() checked the (2, 1) pair"),
            x_pad_token: root.var("x_pad_token", &[1, c.dim]),
            cap_pad_token: root.var("cap_pad_token", &[1, c.dim]),
            noise_refiner: stack("noise_refiner", c.n_refiner_layers, true),
            context_refiner: stack("context_refiner", c.n_refiner_layers, false),
            layers: stack("layers", c.n_layers, true),
            config: config.clone(),
            weights: weights.finish(&["noise_refiner", "context_refiner", "layers"])?,
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
            |c: &ZImageTransformerConfig| Self::new(c, device, kind, lora),
            |m| &mut m.weights,
        )
    }

    /// diffusers' forward for one frame per sample: latents `x` (B, C, H, W), `t` (B,) as the
    /// pipeline passes it (`(1000 − timestep) / 1000`), and each row's caption states
    /// (L_i, cap_feat_dim) (its valid tokens only). Returns the prediction (B, C, H, W).
    pub fn forward(
        &self,
        x: &Tensor,
        t: &Tensor,
        captions: &[Tensor],
    ) -> Result<Tensor, ModelError> {
        let (b, h, w) = self.check_inputs(x, t, captions)?;
        let c = &self.config;
        let (p, dim, device) = (PIPELINE_PATCH.0, c.dim, x.device());
        let kind = self.x_embedder.weight.kind();
        let (rows, cols) = (h / p, w / p);
        let n = rows * cols;
        let image_len = padded(n);

        let features =
            timestep_features(&(t.to_kind(Kind::Float) * c.t_scale), TIMESTEP_CHANNELS, 1.0);
        let adaln =
            self.t_embedder.1.forward(&self.t_embedder.0.forward(&features.to_kind(kind)).silu());

        let patches =
            x.to_kind(kind).view([b, c.in_channels, rows, p, cols, p]).permute([0, 2, 4, 3, 5, 1]);
        let image = self.x_embedder.forward(&patches.reshape([b, n, -1]));
        let pads = self.x_pad_token.to_kind(kind).expand([b, image_len - n, dim], false);
        let image = Tensor::cat(&[image, pads], 1);

        let caption_lens: Vec<i64> = captions.iter().map(|t| padded(t.size()[0])).collect();
        let longest = *caption_lens.iter().max().expect("at least one row");
        self.check_positions(longest, rows, cols)?;
        let text = self.embed_captions(captions, &caption_lens, longest);

        let (image_rot, text_rot) = self.positions(&caption_lens, longest, rows, cols, device);
        let text_keys = (caption_lens.iter().any(|&l| l != longest)).then(|| {
            let lens = Tensor::from_slice(&caption_lens).to_device(device).view([b, 1]);
            Tensor::arange(longest, (Kind::Int64, device)).view([1, longest]).lt_tensor(&lens)
        });
        // This rank's image and caption tokens from here to the output (all without a group).
        let streams = [image, text, image_rot, text_rot];
        let (split, [mut image, mut text, image_rot, text_rot]) =
            self.weights.split_sequence(&SEQUENCE, streams, text_keys.as_ref());
        let (image_keys, caption_keys) = (split.keys_of("image"), split.keys_of("text"));
        for (i, block) in self.noise_refiner.iter().enumerate() {
            let (keys, rot) = (image_keys.clone(), image_rot.shallow_clone());
            let out = self.weights.run_block(
                "noise_refiner",
                i,
                &[image, adaln.shallow_clone()],
                move |t| vec![block.forward(&t[0], &rot, Some(&t[1]), &keys)],
            )?;
            [image] = <[Tensor; 1]>::try_from(out).expect("a block returns 1 stream");
        }
        for (i, block) in self.context_refiner.iter().enumerate() {
            let (keys, rot) = (caption_keys.clone(), text_rot.shallow_clone());
            let out = self.weights.run_block("context_refiner", i, &[text], move |t| {
                vec![block.forward(&t[0], &rot, None, &keys)]
            })?;
            [text] = <[Tensor; 1]>::try_from(out).expect("a block returns 1 stream");
        }

        let mut unified = Tensor::cat(&[image, text], 1);
        let rot = Tensor::cat(&[image_rot, text_rot], 1);
        let keys = split.keys();
        for (i, block) in self.layers.iter().enumerate() {
            let (keys, rot) = (keys.clone(), rot.shallow_clone());
            let out = self.weights.run_block(
                "layers",
                i,
                &[unified, adaln.shallow_clone()],
                move |t| vec![block.forward(&t[0], &rot, Some(&t[1]), &keys)],
            )?;
            [unified] = <[Tensor; 1]>::try_from(out).expect("a block returns 1 stream");
        }
        let image = unified.narrow(1, 0, split.output_tokens("image", n));
        let out = split.gather(self.final_layer.forward(&image, &adaln), n)?;
        Ok(out.view([b, rows, cols, p, p, c.in_channels]).permute([0, 5, 1, 3, 2, 4]).reshape([
            b,
            c.in_channels,
            h,
            w,
        ]))
    }

    /// Caption states (B, longest, D): row `i`'s embedded tokens, then the learned pad token up to
    /// its padded length `caption_lens[i]`, then zeros (masked).
    fn embed_captions(&self, captions: &[Tensor], caption_lens: &[i64], longest: i64) -> Tensor {
        let kind = self.x_embedder.weight.kind();
        let dim = self.config.dim;
        let rows: Vec<Tensor> = captions
            .iter()
            .zip(caption_lens)
            .map(|(cap, &len)| {
                let (norm, proj) = &self.cap_embedder;
                let states = proj.forward(&norm.forward(&cap.to_kind(kind)));
                let pads =
                    self.cap_pad_token.to_kind(kind).expand([len - cap.size()[0], dim], false);
                let empty = Tensor::zeros([longest - len, dim], (kind, cap.device()));
                Tensor::cat(&[states, pads, empty], 0)
            })
            .collect();
        Tensor::stack(&rows, 0)
    }

    /// Rotations of the image tokens (B, S_img, d/2) and the caption tokens (B, S_cap, d/2):
    /// caption token `j` sits at (1 + j, 0, 0); row `i`'s image tokens at (P_i + 1, y, x) after
    /// its padded caption length P_i, their pad tokens at the origin.
    fn positions(
        &self,
        caption_lens: &[i64],
        longest: i64,
        rows: i64,
        cols: i64,
        device: Device,
    ) -> (Tensor, Tensor) {
        let c = &self.config;
        let (b, n) = (caption_lens.len() as i64, rows * cols);
        let image_len = padded(n);
        let int = (Kind::Int64, device);
        let ys = Tensor::arange(rows, int).view([rows, 1]).expand([rows, cols], false).reshape([n]);
        let xs = Tensor::arange(cols, int).view([1, cols]).expand([rows, cols], false).reshape([n]);
        let image_pos: Vec<Tensor> = caption_lens
            .iter()
            .map(|&len| {
                let frame = Tensor::full([n], len + 1, int);
                let grid = Tensor::stack(&[frame, ys.shallow_clone(), xs.shallow_clone()], 1);
                Tensor::cat(&[grid, Tensor::zeros([image_len - n, 3], int)], 0)
            })
            .collect();
        let index = Tensor::arange_start(1, longest + 1, int);
        let text_pos =
            Tensor::stack(&[index.shallow_clone(), index.zeros_like(), index.zeros_like()], 1)
                .unsqueeze(0)
                .expand([b, longest, 3], false);
        (
            rotations(&c.axes_dims, c.rope_theta, &Tensor::stack(&image_pos, 0)),
            rotations(&c.axes_dims, c.rope_theta, &text_pos),
        )
    }

    /// diffusers' rotary tables cover `axes_lens` positions per axis.
    fn check_positions(&self, longest: i64, rows: i64, cols: i64) -> Result<(), ModelError> {
        let lens = &self.config.axes_lens;
        let needed = [longest + 2, rows, cols];
        if needed.iter().zip(lens).any(|(n, l)| n > l) {
            return Err(ModelError::Input(format!(
                "Z-Image positions need axes_lens ≥ {needed:?} (caption of {longest} padded tokens, \
                 {rows}×{cols} image tokens), the config has {lens:?}"
            )));
        }
        Ok(())
    }

    fn check_inputs(
        &self,
        x: &Tensor,
        t: &Tensor,
        captions: &[Tensor],
    ) -> Result<(i64, i64, i64), ModelError> {
        let c = &self.config;
        let size = x.size();
        let p = PIPELINE_PATCH.0;
        if size.len() != 4 || size[1] != c.in_channels || size[2] % p != 0 || size[3] % p != 0 {
            return Err(ModelError::Input(format!(
                "Z-Image latents have shape {size:?}, expected [B, {}, H, W] with H and W \
                 multiples of {p}",
                c.in_channels
            )));
        }
        let b = size[0];
        if t.size() != [b] {
            return Err(ModelError::Input(format!(
                "timestep has shape {:?}, expected [{b}]",
                t.size()
            )));
        }
        if captions.len() as i64 != b {
            return Err(ModelError::Input(format!("{} captions for {b} latents", captions.len())));
        }
        if let Some(bad) = captions
            .iter()
            .find(|t| t.dim() != 2 || t.size()[1] != c.cap_feat_dim || t.size()[0] == 0)
        {
            return Err(ModelError::Input(format!(
                "a caption has shape {:?}, expected [L ≥ 1, {}]",
                bad.size(),
                c.cap_feat_dim
            )));
        }
        Ok((b, size[2], size[3]))
    }
}

/// Each row's valid tokens: `embeds` (B, L, D) where `mask` (B, L) is nonzero (all when absent).
pub fn valid_tokens(embeds: &Tensor, mask: Option<&Tensor>) -> Vec<Tensor> {
    (0..embeds.size()[0])
        .map(|i| {
            let row = embeds.get(i);
            match mask {
                Some(m) => row.index_select(0, &m.get(i).ne(0).nonzero().squeeze_dim(1)),
                None => row,
            }
        })
        .collect()
}

impl Denoiser for ZImageTransformer {
    /// flowtune's timestep `t` (0‥1000, noise at 1000) is diffusers' `(1000 − t) / 1000`, and the
    /// velocity is the negated prediction.
    fn velocity(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &TextConditioning,
    ) -> Result<Tensor, ModelError> {
        let t = (-timestep.to_kind(Kind::Float) + 1000.0) / 1000.0;
        let captions = valid_tokens(&text.embeds, text.mask.as_ref());
        Ok(-self.forward(latents, &t, &captions)?.to_kind(latents.kind()))
    }

    /// Conditional and unconditional captions differ in length: two forwards.
    fn batched_cfg(&self) -> bool {
        false
    }

    /// Padding lies at the end of each row's text and nothing else depends on its length.
    fn unpadding(&self) -> Unpadding {
        self.weights.unpadding(Unpadding::Regroup)
    }

    /// ZImagePipeline's `do_classifier_free_guidance`: any scale above 0.
    fn runs_cfg(&self, scale: f64) -> bool {
        scale > 0.0
    }

    /// ZImagePipeline's CFG, `c + g·(c − u)`: a recipe's `guidance_scale` is diffusers' number.
    fn combine_guidance(&self, cond: &Tensor, uncond: &Tensor, scale: f64) -> Tensor {
        cond + (cond - uncond) * scale
    }
}

impl TrainableDenoiser for ZImageTransformer {
    /// Every attention (noise and context refiners, the unified stack) through Ulysses: image and
    /// caption tokens are both split over the ranks.
    fn sequence_parallel(&self, group: SequenceParallel) -> Result<(), ModelError> {
        self.weights.sequence_parallel("Z-Image", self.config.n_heads, group)
    }

    weights_and_frozen_copy!();

    fn example_inputs(&self, shape: ExampleShape) -> ExampleInputs {
        let ExampleShape { batch, height, width, text_len, .. } = shape;
        let c = &self.config;
        let device = self.weights.base.device();
        let opts = (self.x_embedder.weight.kind(), device);
        ExampleInputs {
            latents: Tensor::randn([batch, c.in_channels, height, width], opts),
            timestep: Tensor::full([batch], 500.0, (Kind::Float, device)),
            text: TextConditioning::new(
                Tensor::randn([batch, text_len, c.cap_feat_dim], opts),
                None,
            ),
            tokens: batch * (height / 2) * (width / 2),
        }
    }

    /// diffusers' forward: `x` (B, C, 1, H, W) (the stacked list), `t` as the pipeline passes
    /// it, `cap_feats` (B, L, D) with an optional `cap_mask` (B, L) selecting each row's tokens.
    /// Returns (B, C, 1, H, W).
    fn forward_named(&self, inputs: &HashMap<String, Tensor>) -> Result<Tensor, ModelError> {
        let get = |name: &str| {
            inputs.get(name).ok_or_else(|| ModelError::Input(format!("no input `{name}`")))
        };
        let x = get("x")?;
        if x.dim() != 5 || x.size()[2] != 1 {
            return Err(ModelError::Input(format!(
                "x has shape {:?}, expected [B, C, 1, H, W] (one frame)",
                x.size()
            )));
        }
        let captions = valid_tokens(get("cap_feats")?, inputs.get("cap_mask"));
        Ok(self.forward(&x.squeeze_dim(2), get("t")?, &captions)?.unsqueeze(2))
    }

    fn describe(&self) -> String {
        format!("Z-Image transformer {} layers × {} dim", self.config.n_layers, self.config.dim)
    }
}
