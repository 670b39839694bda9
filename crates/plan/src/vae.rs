//! VAEs from their `config.json`: parameter counts as diffusers 0.42.1 builds `AutoencoderKL`
//! (`autoencoders/autoencoder_kl.py`, `vae.py`) and the causal video VAEs `AutoencoderKLWan` /
//! `AutoencoderKLQwenImage` (`autoencoder_kl_wan.py`, `autoencoder_kl_qwenimage.py`), LTX-2's
//! `AutoencoderKLLTX2Video` (`autoencoder_kl_ltx2.py`), and the latent geometry the trajectory formula needs.

use crate::json::Json;
use crate::PlanError;

/// A VAE: parameters and latent geometry.
#[derive(Debug, Clone)]
pub struct Vae {
    pub params: u64,
    /// Elements of its buffers (FLUX.2's batch-norm statistics).
    pub buffers: u64,
    /// Latent channels.
    pub channels: u64,
    /// Pixels per latent pixel, per side.
    pub spatial: u64,
    /// Frames per latent frame (video VAEs; 1 for images).
    pub temporal: u64,
}

pub fn vae(cfg: &Json, class: &str) -> Result<Vae, PlanError> {
    match class {
        "AutoencoderKL" => kl(cfg),
        // FLUX.2's: an AutoencoderKL whose batch norm over 2×2 patches has buffers only (running
        // mean and variance, the batch count).
        "AutoencoderKLFlux2" => {
            let v = kl(cfg)?;
            Ok(Vae { buffers: 2 * 4 * v.channels + 1, ..v })
        }
        "AutoencoderKLWan" | "AutoencoderKLQwenImage" => wan(cfg, 3),
        // Qwen-Image 2.1's: Wan2.2's residual layout with 2-D convolutions (1×1 time convs).
        "AutoencoderKLQwenImage21" => wan(cfg, 2),
        "AutoencoderKLLTX2Video" => ltx2_video(cfg),
        other => Err(cfg.bad(
            "_class_name",
            format!(
                "`{other}` is not a VAE the planner knows; known: AutoencoderKL, \
                 AutoencoderKLFlux2, AutoencoderKLQwenImage, AutoencoderKLQwenImage21, \
                 AutoencoderKLWan, AutoencoderKLLTX2Video"
            ),
        )),
    }
}

/// A k×k (2-D) or k×k×k (3-D, `dims` = 3) convolution with bias.
fn conv(cin: u64, cout: u64, k: u64, dims: u32) -> u64 {
    cin * cout * k.pow(dims) + cout
}

fn kl(cfg: &Json) -> Result<Vae, PlanError> {
    let ch = cfg.ints("block_out_channels", Some(&[64]))?;
    let n = cfg.int("layers_per_block", Some(1))?;
    let (cin, cout) = (cfg.int("in_channels", Some(3))?, cfg.int("out_channels", Some(3))?);
    let z = cfg.int("latent_channels", Some(4))?;
    let attention = cfg.boolean("mid_block_add_attention", true)?;
    let last = *ch.last().ok_or_else(|| cfg.bad("block_out_channels", "empty"))?;
    // GroupNorms carry a weight and a bias.
    let resnet = |a: u64, b: u64| {
        2 * a
            + conv(a, b, 3, 2)
            + 2 * b
            + conv(b, b, 3, 2)
            + if a != b { conv(a, b, 1, 2) } else { 0 }
    };
    let mid =
        2 * resnet(last, last) + if attention { 2 * last + 4 * (last * last + last) } else { 0 };
    let mut encoder = conv(cin, ch[0], 3, 2) + mid + 2 * last + conv(last, 2 * z, 3, 2);
    let mut prev = ch[0];
    for (i, &c) in ch.iter().enumerate() {
        encoder += resnet(prev, c) + (n - 1) * resnet(c, c);
        if i + 1 < ch.len() {
            encoder += conv(c, c, 3, 2);
        }
        prev = c;
    }
    let mut decoder = conv(z, last, 3, 2) + mid + 2 * ch[0] + conv(ch[0], cout, 3, 2);
    let mut prev = last;
    for (i, &c) in ch.iter().rev().enumerate() {
        decoder += resnet(prev, c) + n * resnet(c, c);
        if i + 1 < ch.len() {
            decoder += conv(c, c, 3, 2);
        }
        prev = c;
    }
    let quant = if cfg.boolean("use_quant_conv", true)? { conv(2 * z, 2 * z, 1, 2) } else { 0 };
    let post = if cfg.boolean("use_post_quant_conv", true)? { conv(z, z, 1, 2) } else { 0 };
    let spatial = 1 << (ch.len() - 1);
    let params = encoder + decoder + quant + post;
    Ok(Vae { params, buffers: 0, channels: z, spatial, temporal: 1 })
}

/// Wan's causal 3-D VAE (Wan2.1 and Qwen-Image; Wan2.2's residual variant with
/// `is_residual`), RMS norms with a gain only; with `dims` 2 every convolution is 2-D and the
/// time convolutions 1×1 (Qwen-Image 2.1).
fn wan(cfg: &Json, dims: u32) -> Result<Vae, PlanError> {
    let kt = if dims == 3 { 3 } else { 1 };
    let base = cfg.int("base_dim", Some(96))?;
    let dec_base = cfg.int("decoder_base_dim", Some(base))?;
    let z = cfg.int("z_dim", Some(16))?;
    let mult = cfg.ints("dim_mult", Some(&[1, 2, 4, 4]))?;
    let n = cfg.int("num_res_blocks", Some(2))?;
    let down = cfg.bools("temperal_downsample", &[false, true, true])?;
    let residual = cfg.boolean("is_residual", false)?;
    let (cin, cout) = (cfg.int("in_channels", Some(3))?, cfg.int("out_channels", Some(3))?);
    if !cfg.ints("attn_scales", Some(&[]))?.is_empty() {
        return Err(cfg.bad("attn_scales", "attention inside the stages is not planned"));
    }
    let stage = |i: usize| down.get(i).copied().unwrap_or(false);
    let resnet = |a: u64, b: u64| {
        a + conv(a, b, 3, dims)
            + b
            + conv(b, b, 3, dims)
            + if a != b { conv(a, b, 1, dims) } else { 0 }
    };
    let mid = |c: u64| 2 * resnet(c, c) + c + conv(c, 3 * c, 1, 2) + conv(c, c, 1, 2);
    let widths: Vec<u64> =
        std::iter::once(1).chain(mult.iter().copied()).map(|m| base * m).collect();
    let last = *widths.last().expect("one entry at least");
    let mut encoder = conv(cin, widths[0], 3, dims) + mid(last) + last + conv(last, 2 * z, 3, dims);
    for i in 0..mult.len() {
        let (a, b) = (widths[i], widths[i + 1]);
        encoder += resnet(a, b) + (n - 1) * resnet(b, b);
        if i + 1 < mult.len() {
            encoder += conv(b, b, 3, 2) + if stage(i) { b * b * kt + b } else { 0 };
        }
    }
    let top = *mult.last().expect("dim_mult is not empty");
    let ddims: Vec<u64> =
        std::iter::once(top).chain(mult.iter().rev().copied()).map(|m| dec_base * m).collect();
    let mut decoder = conv(z, ddims[0], 3, dims) + mid(ddims[0]);
    for i in 0..mult.len() {
        let b = ddims[i + 1];
        // Wan2.1's upsamplers halve the width; the next stage starts from that half.
        let a = if i > 0 && !residual { ddims[i] / 2 } else { ddims[i] };
        decoder += resnet(a, b) + n * resnet(b, b);
        if i + 1 < mult.len() {
            let out = if residual { b } else { b / 2 };
            decoder += conv(b, out, 3, 2);
            if stage(mult.len() - 2 - i) {
                decoder += b * 2 * b * kt + 2 * b;
            }
        }
    }
    let last_dec = *ddims.last().expect("one entry at least");
    decoder += last_dec + conv(last_dec, cout, 3, dims);
    let quant = conv(2 * z, 2 * z, 1, dims) + conv(z, z, 1, dims);
    let spatial = cfg.int("scale_factor_spatial", Some(1 << (mult.len() - 1)))?;
    let temporal = cfg.int("scale_factor_temporal", Some(4))?;
    Ok(Vae { params: encoder + decoder + quant, buffers: 0, channels: z, spatial, temporal })
}

/// LTX-2's video VAE: causal 3×3×3 convolutions, parameter-free RMS norms, pixel-shuffle down-
/// and upsamplers whose convolutions give `out / stride volume` (down) or `in · volume / factor`
/// (up) channels; a LayerNorm and 1×1×1 shortcut where a residual block changes width; the
/// decoder's noise scales and timestep conditioning when configured.
fn ltx2_video(cfg: &Json) -> Result<Vae, PlanError> {
    let conv3 = |a: u64, b: u64| conv(a, b, 3, 3);
    let ch = cfg.ints("block_out_channels", Some(&[128, 256, 512, 512]))?;
    let dec_ch = cfg.ints("decoder_block_out_channels", Some(&ch))?;
    let layers = cfg.ints("layers_per_block", Some(&[4, 3, 3, 3, 4]))?;
    let dec_layers = cfg.ints("decoder_layers_per_block", Some(&[4, 3, 3, 3, 4]))?;
    let (cin, cout) = (cfg.int("in_channels", Some(3))?, cfg.int("out_channels", Some(3))?);
    let z = cfg.int("latent_channels", Some(128))?;
    let p = cfg.int("patch_size", Some(4))?;
    let (n, m) = (ch.len(), dec_ch.len());
    if layers.len() != n + 1 || dec_layers.len() != m + 1 {
        return Err(cfg.bad("layers_per_block", "needs one entry per block and the mid block"));
    }
    let scaling = cfg.flags("spatio_temporal_scaling", n, true)?;
    let down = cfg.strings("downsample_type", &["conv"; 4])?;
    let tc = cfg.boolean("timestep_conditioning", false)?;
    let noise = cfg.flags("decoder_inject_noise", m + 1, false)?;
    let dec_scaling = cfg.flags("decoder_spatio_temporal_scaling", m, true)?;
    let up = cfg.strings("upsample_type", &["spatiotemporal"; 4])?;
    let factors = cfg.ints("upsample_factor", Some(&vec![1; m]))?;
    if down.len() < n || up.len() < m || factors.len() < m {
        return Err(cfg.bad("upsample_type", "needs one entry per block"));
    }
    let volume = |kind: &str| match kind {
        "spatial" => Ok(4),
        "temporal" => Ok(2),
        "spatiotemporal" => Ok(8),
        other => Err(cfg.bad("upsample_type", format!("`{other}` is not known"))),
    };
    let resnet = |a: u64, b: u64, noise: bool, tc: bool| {
        conv3(a, b)
            + conv3(b, b)
            + if a != b { 2 * a + conv(a, b, 1, 3) } else { 0 }
            + if noise { 2 * a } else { 0 }
            + if tc { 4 * a } else { 0 }
    };
    // A timestep MLP 256 → w → w.
    let time_mlp = |w: u64| 256 * w + w + w * w + w;
    // The encoder starts at the latent width, each block widening in its downsampler.
    let mut encoder = conv3(cin * p * p, z);
    let mut width = z;
    for i in 0..n {
        encoder += layers[i] * resnet(width, width, false, false);
        if scaling[i] {
            encoder += match down[i].as_str() {
                "conv" => conv3(width, width),
                kind => conv3(width, ch[i] / volume(kind)?),
            };
        }
        width = ch[i];
    }
    encoder += layers[n] * resnet(width, width, false, false) + conv3(width, z + 1);
    // The decoder runs the reversed lists (the upsample types as given).
    let rev = |v: &[u64]| v.iter().rev().copied().collect::<Vec<u64>>();
    let (dec_ch, dec_layers, factors) = (rev(&dec_ch), rev(&dec_layers), rev(&factors));
    let noise: Vec<bool> = noise.into_iter().rev().collect();
    let dec_scaling: Vec<bool> = dec_scaling.into_iter().rev().collect();
    let mut out = dec_ch[0];
    let mut decoder = conv3(z, out) + dec_layers[0] * resnet(out, out, noise[0], tc);
    if tc {
        decoder += time_mlp(4 * out);
    }
    for i in 0..m {
        let (a, b) = (out / factors[i], dec_ch[i] / factors[i]);
        if tc {
            decoder += time_mlp(4 * a);
        }
        if a != b {
            decoder += resnet(a, b, noise[i + 1], tc);
        }
        if dec_scaling[i] {
            decoder += conv3(b * factors[i], b * volume(&up[i])?);
        }
        decoder += dec_layers[i + 1] * resnet(b, b, noise[i + 1], tc);
        out = b;
    }
    decoder += conv3(out, cout * p * p);
    if tc {
        decoder += 1 + time_mlp(2 * out) + 2 * out;
    }
    // Unset ratios: every scaling block halves each axis (diffusers' defaults).
    let halvings = scaling.iter().filter(|&&s| s).count();
    let spatial = cfg.int("spatial_compression_ratio", Some(p << halvings))?;
    let pt = cfg.int("patch_size_t", Some(1))?;
    let temporal = cfg.int("temporal_compression_ratio", Some(pt << halvings))?;
    // The latents' mean and standard deviation are saved buffers.
    let (params, buffers) = (encoder + decoder, 2 * z);
    Ok(Vae { params, buffers, channels: z, spatial, temporal })
}
