//! LTX-2's audio decoders from their `config.json`: the mel-spectrogram VAE
//! `AutoencoderKLLTX2Audio` (diffusers 0.42.1 `autoencoders/autoencoder_kl_ltx2_audio.py`) and
//! the vocoders `LTX2Vocoder` / `LTX2VocoderWithBWE` (`pipelines/ltx2/vocoder.py`).

use crate::json::Json;
use crate::PlanError;

/// Parameters of the audio component whose config is `cfg`, by its class.
pub fn audio(cfg: &Json, class: &str) -> Result<u64, PlanError> {
    match class {
        "AutoencoderKLLTX2Audio" => vae(cfg),
        "LTX2Vocoder" => vocoder(cfg, ""),
        // The 16 kHz vocoder, then a bandwidth-extension generator of the same kind.
        "LTX2VocoderWithBWE" => Ok(vocoder(cfg, "")? + vocoder(cfg, "bwe_")?),
        other => Err(cfg.bad(
            "_class_name",
            format!(
                "`{other}` is not an audio component the planner knows; known: \
                 AutoencoderKLLTX2Audio, LTX2Vocoder, LTX2VocoderWithBWE"
            ),
        )),
    }
}

/// A k×k 2-D convolution with bias.
fn conv2(a: u64, b: u64, k: u64) -> u64 {
    a * b * k * k + b
}

/// The audio VAE: an LDM-style encoder and decoder of 3×3 convolutions (causal ones pad
/// differently, same weights), pixel norms without parameters or 32-group GroupNorms, optional
/// attention (1×1 q/k/v/out convolutions) in the mid blocks.
fn vae(cfg: &Json) -> Result<u64, PlanError> {
    let base = cfg.int("base_channels", Some(128))?;
    let mult = cfg.ints("ch_mult", Some(&[1, 2, 4]))?;
    let n = cfg.int("num_res_blocks", Some(2))?;
    let (cin, cout) = (cfg.int("in_channels", Some(2))?, cfg.int("output_channels", Some(2))?);
    let z = cfg.int("latent_channels", Some(8))?;
    let z_out = if cfg.boolean("double_z", true)? { 2 * z } else { z };
    let group = match cfg.string("norm_type").unwrap_or("group") {
        "group" => true,
        "pixel" => false,
        other => return Err(cfg.bad("norm_type", format!("`{other}` is not known"))),
    };
    if cfg.get("attn_resolutions").and_then(|v| v.as_array()).is_some_and(|a| !a.is_empty()) {
        return Err(cfg.bad("attn_resolutions", "attention inside the stages is not planned"));
    }
    let norm = |c: u64| if group { 2 * c } else { 0 };
    let resnet = |a: u64, b: u64| {
        norm(a)
            + conv2(a, b, 3)
            + norm(b)
            + conv2(b, b, 3)
            + if a != b { conv2(a, b, 1) } else { 0 }
    };
    let attention = cfg.boolean("mid_block_add_attention", true)?;
    let mid = |c: u64| 2 * resnet(c, c) + if attention { norm(c) + 4 * conv2(c, c, 1) } else { 0 };
    let widths: Vec<u64> = mult.iter().map(|m| base * m).collect();
    let top = *widths.last().ok_or_else(|| cfg.bad("ch_mult", "empty"))?;
    let mut encoder = conv2(cin, base, 3);
    let mut width = base;
    for (i, &w) in widths.iter().enumerate() {
        encoder += resnet(width, w) + (n - 1) * resnet(w, w);
        if i + 1 < widths.len() {
            encoder += conv2(w, w, 3);
        }
        width = w;
    }
    encoder += mid(top) + norm(top) + conv2(top, z_out, 3);
    let mut decoder = conv2(z, top, 3) + mid(top);
    let mut width = top;
    for (i, &w) in widths.iter().enumerate().rev() {
        decoder += resnet(width, w) + n * resnet(w, w);
        if i > 0 {
            decoder += conv2(w, w, 3);
        }
        width = w;
    }
    decoder += norm(width) + conv2(width, cout, 3);
    Ok(encoder + decoder)
}

/// A HiFi-GAN style vocoder (keys under `prefix`): a k7 input convolution, transposed-convolution
/// upsamplers halving the width, per upsampler one residual block per kernel size (two
/// convolutions per dilation, each after a SnakeBeta (α, β per channel), Snake (α) or a
/// parameter-free LeakyReLU), a final activation and a bias-optional k7 output convolution.
fn vocoder(cfg: &Json, prefix: &str) -> Result<u64, PlanError> {
    let key = |k: &str| format!("{prefix}{k}");
    let cin = cfg.int(&key("in_channels"), Some(128))?;
    let mut width = cfg.int(&key("hidden_channels"), Some(1024))?;
    let cout = cfg.int(&key("out_channels"), Some(2))?;
    let factors = cfg.ints(&key("upsample_factors"), Some(&[6, 5, 2, 2, 2]))?;
    let kernels = cfg.ints(&key("upsample_kernel_sizes"), Some(&[16, 15, 8, 4, 4]))?;
    let res_kernels = cfg.ints(&key("resnet_kernel_sizes"), Some(&[3, 7, 11]))?;
    let dilations: Vec<u64> = match cfg.get(&key("resnet_dilations")) {
        Some(v) => v
            .as_array()
            .and_then(|d| d.iter().map(|l| Some(l.as_array()?.len() as u64)).collect())
            .ok_or_else(|| cfg.bad(&key("resnet_dilations"), "expected lists of dilations"))?,
        None => vec![3; res_kernels.len()],
    };
    if factors.len() != kernels.len() || dilations.len() != res_kernels.len() {
        return Err(cfg.bad(&key("upsample_factors"), "lists of different lengths"));
    }
    let act = match cfg.string(&key("act_fn")).unwrap_or("leaky_relu") {
        "snakebeta" => 2,
        "snake" => 1,
        "leaky_relu" => 0,
        other => return Err(cfg.bad(&key("act_fn"), format!("`{other}` is not known"))),
    };
    let bias = cfg.boolean(&key("final_bias"), true)?;
    let conv1 = |a: u64, b: u64, k: u64| a * b * k + b;
    let mut params = conv1(cin, width, 7);
    for &k in &kernels {
        let out = width / 2;
        params += conv1(width, out, k);
        for (&rk, &d) in res_kernels.iter().zip(&dilations) {
            params += 2 * d * (conv1(out, out, rk) + act * out);
        }
        width = out;
    }
    // The output activation is a SnakeBeta for either Snake kind.
    let act_out = if act > 0 { 2 * width } else { 0 };
    Ok(params + act_out + width * cout * 7 + if bias { cout } else { 0 })
}
