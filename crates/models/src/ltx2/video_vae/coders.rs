//! The encoder and decoder of LTX-2's video VAE and their down, mid and up blocks, built from
//! the [`Layout`] a config describes.

use tch::{Kind, Tensor};

use super::config::{Down, DownPlan, Layout, Padding, UpPlan};
use super::layers::{rms_channels, CausalConv3d, Downsampler, Resnet, TimeEmbedder, Upsampler};
use crate::nn::Scope;

enum Downsample {
    Conv(CausalConv3d),
    Fold(Downsampler),
}

/// `LTX2VideoDownBlock3D`: resnets at the input width, then the downsampler (`downsamplers.0`).
struct DownBlock {
    resnets: Vec<Resnet>,
    down: Option<Downsample>,
}

impl DownBlock {
    fn new(s: &Scope<'_>, plan: &DownPlan, eps: f64, padding: Padding) -> Self {
        let r = s / "resnets";
        let resnets = (0..plan.layers)
            .map(|j| Resnet::new(&(&r / j), plan.input, plan.input, eps, false, padding))
            .collect();
        let d = &(s / "downsamplers") / 0;
        let down = match plan.down {
            Down::None => None,
            Down::Conv => {
                Some(Downsample::Conv(CausalConv3d::new(&d, plan.input, plan.input, 2, padding)))
            }
            Down::Fold(stride) => {
                let n = stride.iter().product::<i64>();
                Some(Downsample::Fold(Downsampler {
                    conv: CausalConv3d::new(
                        &(&d / "conv"),
                        plan.input,
                        plan.output / n,
                        1,
                        padding,
                    ),
                    stride,
                    output: plan.output,
                }))
            }
        };
        Self { resnets, down }
    }

    fn forward(&self, x: &Tensor, causal: bool) -> Tensor {
        let mut h = x.shallow_clone();
        for r in &self.resnets {
            h = r.forward(&h, None, causal);
        }
        match &self.down {
            None => h,
            Some(Downsample::Conv(conv)) => conv.forward(&h, causal),
            Some(Downsample::Fold(d)) => d.forward(&h, causal),
        }
    }
}

/// `LTX2VideoMidBlock3d` (and the resnets of an up block): resnets at one width, conditioned on
/// the timestep embedded by `time_embedder` when present.
struct MidBlock {
    time_embedder: Option<TimeEmbedder>,
    resnets: Vec<Resnet>,
}

impl MidBlock {
    /// Resnets at `width`; conditioned ones read a timestep embedded to 4 × `embed` channels.
    fn new(
        s: &Scope<'_>,
        (width, embed): (i64, i64),
        layers: usize,
        eps: f64,
        timestep: bool,
        padding: Padding,
    ) -> Self {
        let r = s / "resnets";
        Self {
            time_embedder: timestep.then(|| TimeEmbedder::new(&(s / "time_embedder"), 4 * embed)),
            resnets: (0..layers)
                .map(|j| Resnet::new(&(&r / j), width, width, eps, timestep, padding))
                .collect(),
        }
    }

    fn embed(&self, timestep: Option<&Tensor>, kind: Kind) -> Option<Tensor> {
        self.time_embedder.as_ref().map(|e| e.forward(timestep.expect("checked by decode"), kind))
    }

    fn resnets(&self, x: Tensor, temb: Option<&Tensor>, causal: bool) -> Tensor {
        self.resnets.iter().fold(x, |h, r| r.forward(&h, temb, causal))
    }

    fn forward(&self, x: &Tensor, timestep: Option<&Tensor>, causal: bool) -> Tensor {
        let temb = self.embed(timestep, x.kind());
        self.resnets(x.shallow_clone(), temb.as_ref(), causal)
    }
}

/// `LTX2VideoUpBlock3d`: an optional channel-changing `conv_in` resnet, the upsampler
/// (`upsamplers.0`), then resnets (with `time_embedder`).
struct UpBlock {
    conv_in: Option<Resnet>,
    upsampler: Option<Upsampler>,
    body: MidBlock,
}

impl UpBlock {
    fn new(s: &Scope<'_>, plan: &UpPlan, eps: f64, timestep: bool, padding: Padding) -> Self {
        let conv_in = (plan.input != plan.output)
            .then(|| Resnet::new(&(s / "conv_in"), plan.input, plan.output, eps, false, padding));
        let upsampler = plan.up.map(|(stride, factor, residual)| {
            let input = plan.output * factor;
            let n = stride.iter().product::<i64>();
            let u = &(s / "upsamplers") / 0;
            Upsampler {
                conv: CausalConv3d::new(&(&u / "conv"), input, input * n / factor, 1, padding),
                stride,
                factor,
                residual,
            }
        });
        let body = MidBlock::new(s, (plan.output, plan.input), plan.layers, eps, timestep, padding);
        Self { conv_in, upsampler, body }
    }

    fn forward(&self, x: &Tensor, timestep: Option<&Tensor>, causal: bool) -> Tensor {
        let mut h = match &self.conv_in {
            Some(r) => r.forward(x, None, causal),
            None => x.shallow_clone(),
        };
        let temb = self.body.embed(timestep, h.kind());
        if let Some(u) = &self.upsampler {
            h = u.forward(&h, causal);
        }
        self.body.resnets(h, temb.as_ref(), causal)
    }
}

/// `LTX2VideoEncoder3d`: patches folded into channels, `conv_in`, down blocks, `mid_block`,
/// RMS norm, SiLU, `conv_out` to latent_channels + 1 (means and one shared log-variance).
pub(super) struct Encoder {
    patch: i64,
    causal: bool,
    conv_in: CausalConv3d,
    down_blocks: Vec<DownBlock>,
    mid_block: MidBlock,
    conv_out: CausalConv3d,
}

impl Encoder {
    pub fn new(s: &Scope<'_>, c: &super::Ltx2VideoVaeConfig, layout: &Layout) -> Self {
        let (eps, pad) = (c.resnet_norm_eps, layout.encoder_padding);
        let d = s / "down_blocks";
        let width = layout.down.last().map_or(c.latent_channels, |b| b.output);
        let pixels = c.in_channels * c.patch_size * c.patch_size;
        Self {
            patch: c.patch_size,
            causal: c.encoder_causal,
            conv_in: CausalConv3d::new(&(s / "conv_in"), pixels, c.latent_channels, 1, pad),
            down_blocks: layout
                .down
                .iter()
                .enumerate()
                .map(|(i, plan)| DownBlock::new(&(&d / i), plan, eps, pad))
                .collect(),
            mid_block: MidBlock::new(
                &(s / "mid_block"),
                (width, width),
                layout.encoder_mid_layers,
                eps,
                false,
                pad,
            ),
            conv_out: CausalConv3d::new(&(s / "conv_out"), width, c.latent_channels + 1, 1, pad),
        }
    }

    /// Video (B, C, T, H, W) → (B, latent_channels + 1, t, h, w).
    pub fn forward(&self, video: &Tensor) -> Tensor {
        let p = self.patch;
        let (b, c, t, h, w) = video.size5().expect("checked 5-d");
        // Channel order (colour, column offset, row offset), as diffusers folds patches.
        let x = video
            .reshape([b, c, t, h / p, p, w / p, p])
            .permute([0, 1, 6, 4, 2, 3, 5])
            .reshape([b, c * p * p, t, h / p, w / p]);
        let mut x = self.conv_in.forward(&x, self.causal);
        for block in &self.down_blocks {
            x = block.forward(&x, self.causal);
        }
        let x = self.mid_block.forward(&x, None, self.causal);
        self.conv_out.forward(&rms_channels(&x).silu(), self.causal)
    }

    pub fn kind(&self) -> Kind {
        self.conv_in.kind()
    }
}

/// `LTX2VideoDecoder3d`: `conv_in`, `mid_block`, up blocks, RMS norm (modulated by the
/// timestep through `time_embedder` and `scale_shift_table`), SiLU, `conv_out`, patches unfolded.
pub(super) struct Decoder {
    patch: i64,
    causal: bool,
    conv_in: CausalConv3d,
    mid_block: MidBlock,
    up_blocks: Vec<UpBlock>,
    /// `timestep_scale_multiplier`, `time_embedder` and the (2, C) `scale_shift_table`.
    conditioning: Option<(Tensor, TimeEmbedder, Tensor)>,
    conv_out: CausalConv3d,
}

impl Decoder {
    pub fn new(s: &Scope<'_>, c: &super::Ltx2VideoVaeConfig, layout: &Layout) -> Self {
        let (eps, pad, timestep) =
            (c.resnet_norm_eps, layout.decoder_padding, c.timestep_conditioning);
        let u = s / "up_blocks";
        let width = layout.up.last().map_or(layout.decoder_width, |b| b.output);
        let pixels = c.out_channels * c.patch_size * c.patch_size;
        Self {
            patch: c.patch_size,
            causal: c.decoder_causal,
            conv_in: CausalConv3d::new(
                &(s / "conv_in"),
                c.latent_channels,
                layout.decoder_width,
                1,
                pad,
            ),
            mid_block: MidBlock::new(
                &(s / "mid_block"),
                (layout.decoder_width, layout.decoder_width),
                layout.decoder_mid_layers,
                eps,
                timestep,
                pad,
            ),
            up_blocks: layout
                .up
                .iter()
                .enumerate()
                .map(|(i, plan)| UpBlock::new(&(&u / i), plan, eps, timestep, pad))
                .collect(),
            conditioning: timestep.then(|| {
                (
                    s.var("timestep_scale_multiplier", &[]),
                    TimeEmbedder::new(&(s / "time_embedder"), 2 * width),
                    s.var("scale_shift_table", &[2, width]),
                )
            }),
            conv_out: CausalConv3d::new(&(s / "conv_out"), width, pixels, 1, pad),
        }
    }

    /// Latents (B, latent_channels, F, h, w) and, when conditioned, timesteps (B,) → video
    /// (B, out_channels, 1 + 8(F − 1), 32h, 32w) for the released layout.
    pub fn forward(&self, z: &Tensor, timestep: Option<&Tensor>) -> Tensor {
        let scaled = self.conditioning.as_ref().map(|(multiplier, _, _)| {
            timestep.expect("checked by decode").to_kind(multiplier.kind()) * multiplier
        });
        let timestep = scaled.as_ref();
        let x = self.conv_in.forward(z, self.causal);
        let mut x = self.mid_block.forward(&x, timestep, self.causal);
        for block in &self.up_blocks {
            x = block.forward(&x, timestep, self.causal);
        }
        let mut x = rms_channels(&x);
        if let Some((_, embedder, table)) = &self.conditioning {
            let temb = embedder.forward(timestep.expect("scaled above"), x.kind());
            let c = table.size()[1];
            let m = temb.view([-1, 2, c, 1, 1, 1]) + table.view([1, 2, c, 1, 1, 1]);
            let m = m.unbind(1);
            x = x * (&m[1] + 1.0) + &m[0];
        }
        let x = self.conv_out.forward(&x.silu(), self.causal);
        let p = self.patch;
        let (b, cp, t, h, w) = x.size5().expect("5-d");
        let c = cp / (p * p);
        x.reshape([b, c, p, p, t, h, w]).permute([0, 1, 4, 5, 3, 6, 2]).reshape([
            b,
            c,
            t,
            h * p,
            w * p,
        ])
    }

    pub fn kind(&self) -> Kind {
        self.conv_in.kind()
    }
}
