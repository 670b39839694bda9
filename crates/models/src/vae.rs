//! `AutoencoderKL` in the SD3 layout: encoder and decoder of ResNet blocks with a single-head
//! attention mid block, optional 1×1 quant convs around the latent (FLUX.2's); latents are
//! `(z − shift_factor)·scaling_factor`.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::nn::{attention, Conv2d, GroupNorm, Linear, Scope};
use crate::weights::{checkpoint_files, load_weights, LoadOptions};
use crate::{read_config, ModelError};

/// Mirror of `vae/config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VaeConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    pub in_channels: i64,
    pub out_channels: i64,
    pub latent_channels: i64,
    pub block_out_channels: Vec<i64>,
    pub down_block_types: Vec<String>,
    pub up_block_types: Vec<String>,
    pub layers_per_block: usize,
    pub norm_num_groups: i64,
    pub act_fn: String,
    pub sample_size: i64,
    pub scaling_factor: f64,
    pub shift_factor: Option<f64>,
    pub use_quant_conv: bool,
    pub use_post_quant_conv: bool,
    pub mid_block_add_attention: bool,
    pub force_upcast: bool,
}

impl Default for VaeConfig {
    fn default() -> Self {
        Self {
            class_name: Some("AutoencoderKL".into()),
            in_channels: 3,
            out_channels: 3,
            latent_channels: 16,
            block_out_channels: vec![128, 256, 512, 512],
            down_block_types: vec!["DownEncoderBlock2D".into(); 4],
            up_block_types: vec!["UpDecoderBlock2D".into(); 4],
            layers_per_block: 2,
            norm_num_groups: 32,
            act_fn: "silu".into(),
            sample_size: 1024,
            scaling_factor: 1.5305,
            shift_factor: Some(0.0609),
            use_quant_conv: false,
            use_post_quant_conv: false,
            mid_block_add_attention: true,
            force_upcast: true,
        }
    }
}

impl VaeConfig {
    fn validate(&self) -> Result<(), String> {
        if self.act_fn != "silu" {
            return Err(format!("act_fn `{}` is not supported; expected silu", self.act_fn));
        }
        let n = self.block_out_channels.len();
        if n == 0 || self.down_block_types.len() != n || self.up_block_types.len() != n {
            return Err("block_out_channels, down_block_types and up_block_types must have one entry per level".into());
        }
        Ok(())
    }
}

const EPS: f64 = 1e-6;

struct ResnetBlock {
    norm1: GroupNorm,
    conv1: Conv2d,
    norm2: GroupNorm,
    conv2: Conv2d,
    conv_shortcut: Option<Conv2d>,
}

impl ResnetBlock {
    fn new(s: &Scope<'_>, groups: i64, input: i64, output: i64) -> Self {
        Self {
            norm1: GroupNorm::new(&(s / "norm1"), groups, input, EPS),
            conv1: (s / "conv1").conv2d(input, output, 3, 1, 1),
            norm2: GroupNorm::new(&(s / "norm2"), groups, output, EPS),
            conv2: (s / "conv2").conv2d(output, output, 3, 1, 1),
            conv_shortcut: (input != output)
                .then(|| (s / "conv_shortcut").conv2d(input, output, 1, 1, 0)),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let h = self.conv1.forward(&self.norm1.forward(x).silu());
        let h = self.conv2.forward(&self.norm2.forward(&h).silu());
        match &self.conv_shortcut {
            Some(c) => c.forward(x) + h,
            None => x + h,
        }
    }
}

/// `UNetMidBlock2D`: resnet, single-head spatial attention with residual, resnet.
struct MidBlock {
    resnet_0: ResnetBlock,
    attention: Option<(GroupNorm, Linear, Linear, Linear, Linear)>,
    resnet_1: ResnetBlock,
}

impl MidBlock {
    fn new(s: &Scope<'_>, groups: i64, ch: i64, attention: bool) -> Self {
        let resnets = s / "resnets";
        let a = &(s / "attentions") / 0;
        Self {
            resnet_0: ResnetBlock::new(&(&resnets / 0), groups, ch, ch),
            attention: attention.then(|| {
                (
                    GroupNorm::new(&(&a / "group_norm"), groups, ch, EPS),
                    (&a / "to_q").linear(ch, ch, true),
                    (&a / "to_k").linear(ch, ch, true),
                    (&a / "to_v").linear(ch, ch, true),
                    (&(&a / "to_out") / 0).linear(ch, ch, true),
                )
            }),
            resnet_1: ResnetBlock::new(&(&resnets / 1), groups, ch, ch),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let x = self.resnet_0.forward(x);
        let x = match &self.attention {
            Some((norm, q, k, v, out)) => {
                let (b, c, h, w) = x.size4().expect("4-d feature map");
                let tokens = norm.forward(&x).view([b, c, h * w]).transpose(1, 2);
                let heads = |t: Tensor| t.unsqueeze(1);
                let (q, k, v) = (
                    heads(q.forward(&tokens)),
                    heads(k.forward(&tokens)),
                    heads(v.forward(&tokens)),
                );
                let attn = attention(&q, &k, &v, None, false, None);
                let out = out.forward(&attn.squeeze_dim(1));
                out.transpose(1, 2).reshape([b, c, h, w]) + &x
            }
            None => x,
        };
        self.resnet_1.forward(&x)
    }
}

struct Level {
    resnets: Vec<ResnetBlock>,
    /// Down: stride-2 conv after (0,1,0,1) padding; up: nearest ×2 then conv.
    resample: Option<Conv2d>,
}

pub struct Encoder {
    conv_in: Conv2d,
    down_blocks: Vec<Level>,
    mid_block: MidBlock,
    conv_norm_out: GroupNorm,
    conv_out: Conv2d,
}

pub struct Decoder {
    conv_in: Conv2d,
    mid_block: MidBlock,
    up_blocks: Vec<Level>,
    conv_norm_out: GroupNorm,
    conv_out: Conv2d,
}

pub struct AutoencoderKl {
    pub config: VaeConfig,
    pub encoder: Encoder,
    pub decoder: Decoder,
    /// 1×1 conv on the posterior moments (`use_quant_conv`).
    quant_conv: Option<Conv2d>,
    /// 1×1 conv on the latent before the decoder (`use_post_quant_conv`).
    post_quant_conv: Option<Conv2d>,
    pub store: VarStore,
}

impl AutoencoderKl {
    pub fn new(config: &VaeConfig, device: Device, kind: Kind) -> Result<Self, ModelError> {
        config.validate().map_err(ModelError::Input)?;
        let store = crate::weights::store(device, kind);
        let root = Scope::root(store.root(), None);
        let (ch, g) = (&config.block_out_channels, config.norm_num_groups);
        let top = *ch.last().expect("validated non-empty");
        let enc = &root / "encoder";
        let down_blocks = (0..ch.len())
            .map(|i| {
                let s = &(&enc / "down_blocks") / i;
                let input = if i == 0 { ch[0] } else { ch[i - 1] };
                Level {
                    resnets: (0..config.layers_per_block)
                        .map(|j| {
                            ResnetBlock::new(
                                &(&(&s / "resnets") / j),
                                g,
                                if j == 0 { input } else { ch[i] },
                                ch[i],
                            )
                        })
                        .collect(),
                    resample: (i + 1 < ch.len()).then(|| {
                        (&(&(&s / "downsamplers") / 0) / "conv").conv2d(ch[i], ch[i], 3, 2, 0)
                    }),
                }
            })
            .collect();
        let encoder = Encoder {
            conv_in: (&enc / "conv_in").conv2d(config.in_channels, ch[0], 3, 1, 1),
            down_blocks,
            mid_block: MidBlock::new(&(&enc / "mid_block"), g, top, config.mid_block_add_attention),
            conv_norm_out: GroupNorm::new(&(&enc / "conv_norm_out"), g, top, EPS),
            conv_out: (&enc / "conv_out").conv2d(top, 2 * config.latent_channels, 3, 1, 1),
        };
        let dec = &root / "decoder";
        let reversed: Vec<i64> = ch.iter().rev().copied().collect();
        let up_blocks = (0..reversed.len())
            .map(|i| {
                let s = &(&dec / "up_blocks") / i;
                let input = if i == 0 { reversed[0] } else { reversed[i - 1] };
                Level {
                    resnets: (0..=config.layers_per_block)
                        .map(|j| {
                            ResnetBlock::new(
                                &(&(&s / "resnets") / j),
                                g,
                                if j == 0 { input } else { reversed[i] },
                                reversed[i],
                            )
                        })
                        .collect(),
                    resample: (i + 1 < reversed.len()).then(|| {
                        (&(&(&s / "upsamplers") / 0) / "conv").conv2d(
                            reversed[i],
                            reversed[i],
                            3,
                            1,
                            1,
                        )
                    }),
                }
            })
            .collect();
        let decoder = Decoder {
            conv_in: (&dec / "conv_in").conv2d(config.latent_channels, top, 3, 1, 1),
            mid_block: MidBlock::new(&(&dec / "mid_block"), g, top, config.mid_block_add_attention),
            up_blocks,
            conv_norm_out: GroupNorm::new(&(&dec / "conv_norm_out"), g, ch[0], EPS),
            conv_out: (&dec / "conv_out").conv2d(ch[0], config.out_channels, 3, 1, 1),
        };
        let latent = config.latent_channels;
        let quant_conv = config
            .use_quant_conv
            .then(|| (&root / "quant_conv").conv2d(2 * latent, 2 * latent, 1, 1, 0));
        let post_quant_conv = config
            .use_post_quant_conv
            .then(|| (&root / "post_quant_conv").conv2d(latent, latent, 1, 1, 0));
        Ok(Self { config: config.clone(), encoder, decoder, quant_conv, post_quant_conv, store })
    }

    /// Loads a diffusers `vae/` directory, frozen.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let config: VaeConfig = read_config(&dir.join("config.json"))?;
        let mut model = Self::new(&config, device, kind)?;
        load_weights(
            &mut model.store,
            &checkpoint_files(dir)?,
            LoadOptions { kind: Some(kind), ..Default::default() },
        )?;
        model.store.freeze();
        Ok(model)
    }

    /// Images in [−1, 1] (B, 3, H, W) from diffusion latents: `decode(z/scaling + shift)`.
    pub fn decode(&self, latents: &Tensor) -> Tensor {
        let z = latents / self.config.scaling_factor + self.config.shift_factor.unwrap_or(0.0);
        let z = match &self.post_quant_conv {
            Some(conv) => conv.forward(&z),
            None => z,
        };
        let d = &self.decoder;
        let mut x = d.mid_block.forward(&d.conv_in.forward(&z));
        for level in &d.up_blocks {
            for r in &level.resnets {
                x = r.forward(&x);
            }
            if let Some(conv) = &level.resample {
                let (h, w) = (x.size()[2], x.size()[3]);
                x = conv.forward(&x.upsample_nearest2d([2 * h, 2 * w], 2.0, 2.0));
            }
        }
        d.conv_out.forward(&d.conv_norm_out.forward(&x).silu())
    }

    /// Diffusion latents of images in [−1, 1]: the posterior mean, `(mean − shift)·scaling`, and
    /// the posterior log-variance.
    pub fn encode(&self, images: &Tensor) -> (Tensor, Tensor) {
        let e = &self.encoder;
        let mut x = e.conv_in.forward(images);
        for level in &e.down_blocks {
            for r in &level.resnets {
                x = r.forward(&x);
            }
            if let Some(conv) = &level.resample {
                x = conv.forward(&x.constant_pad_nd([0, 1, 0, 1]));
            }
        }
        let moments = e.conv_out.forward(&e.conv_norm_out.forward(&e.mid_block.forward(&x)).silu());
        let moments = match &self.quant_conv {
            Some(conv) => conv.forward(&moments),
            None => moments,
        };
        let parts = moments.chunk(2, 1);
        let mean =
            (&parts[0] - self.config.shift_factor.unwrap_or(0.0)) * self.config.scaling_factor;
        (mean, parts[1].clamp(-30.0, 20.0))
    }

    /// The dtype of the decoder weights (latents are cast to it).
    pub fn decoder_kind(&self) -> Kind {
        self.decoder.conv_in.weight.kind()
    }

    /// u8 RGB images (B, H, W, 3) of diffusion latents, decoded in the decoder's dtype.
    pub fn decode_rgb8(&self, latents: &Tensor) -> Tensor {
        Self::to_rgb8(&self.decode(&latents.to_kind(self.decoder_kind())))
    }

    /// Clean latents (f32, the posterior mean) of u8 RGB images (B, H, W, 3).
    pub fn encode_rgb8(&self, images: &Tensor) -> Tensor {
        self.encode(&Self::from_rgb8(images).to_kind(self.decoder_kind())).0.to_kind(Kind::Float)
    }

    /// u8 RGB images (B, H, W, 3) as f32 pixels in [−1, 1] (B, 3, H, W): the inverse of
    /// [`Self::to_rgb8`].
    pub fn from_rgb8(images: &Tensor) -> Tensor {
        images.permute([0, 3, 1, 2]).to_kind(Kind::Float) / 127.5 - 1.0
    }

    /// Decoded images as u8 RGB (B, H, W, 3).
    pub fn to_rgb8(images: &Tensor) -> Tensor {
        ((images.to_kind(Kind::Float) + 1.0) * 127.5)
            .round()
            .clamp(0.0, 255.0)
            .to_kind(Kind::Uint8)
            .permute([0, 2, 3, 1])
            .contiguous()
    }
}
