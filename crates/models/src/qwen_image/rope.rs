//! Qwen-Image's 3-axis rotary embedding (`QwenEmbedRope` with `scale_rope`): image tokens get
//! (frame, row, column) positions with rows and columns centred on zero, text tokens follow on
//! all three axes after the largest image half-size.

use tch::{Device, Kind, Tensor};

/// Rotary angle tables for one forward: `(S, head_dim / 2)` for the image and the text tokens.
pub struct RotaryAngles {
    pub image: Tensor,
    pub text: Tensor,
}

impl RotaryAngles {
    /// The same angles, sharing storage.
    pub fn shallow_clone(&self) -> Self {
        Self { image: self.image.shallow_clone(), text: self.text.shallow_clone() }
    }
}

/// One image on the image stream: frames × rows × columns of tokens (diffusers' `img_shapes`
/// entry).
pub type ImageShape = (i64, i64, i64);

/// Inverse frequencies `θ^(−2i/d)` of one axis (f32, as diffusers' `rope_params`).
fn inverse_frequencies(dim: i64, theta: f64, device: Device) -> Tensor {
    let exponents = Tensor::arange_start_step(0, dim, 2, (Kind::Float, device)) / dim as f64;
    Tensor::from(theta).to_device(device).to_kind(Kind::Float).pow(&exponents).reciprocal()
}

/// Angles `position × inverse frequency` for each axis's positions (each (S,)), concatenated
/// along the frequency dimension.
pub(crate) fn angles(axes: &[i64; 3], theta: f64, positions: [&Tensor; 3]) -> Tensor {
    let parts: Vec<Tensor> = axes
        .iter()
        .zip(positions)
        .map(|(&dim, pos)| {
            let inv = inverse_frequencies(dim, theta, pos.device());
            pos.to_kind(Kind::Float).unsqueeze(1) * inv.unsqueeze(0)
        })
        .collect();
    Tensor::cat(&parts, 1)
}

/// Positions `−(n − n/2) … n/2 − 1` of a centred axis of `n` tokens.
fn centred(n: i64, device: Device) -> Tensor {
    Tensor::arange(n, (Kind::Int64, device)) - (n - n / 2)
}

/// The angle tables for `images` (in stream order, the `i`-th on frame index `i`) and
/// `text_len` text tokens.
pub fn rotary_angles(
    axes: &[i64; 3],
    theta: f64,
    images: &[ImageShape],
    text_len: i64,
    device: Device,
) -> RotaryAngles {
    let mut parts = vec![];
    let mut text_start = 0;
    for (index, &(frames, rows, cols)) in images.iter().enumerate() {
        let grid = |t: Tensor, shape: [i64; 3]| t.view(shape).expand([frames, rows, cols], false);
        let frame =
            Tensor::arange_start(index as i64, index as i64 + frames, (Kind::Int64, device));
        let frame = grid(frame, [frames, 1, 1]).reshape([-1]);
        let row = grid(centred(rows, device), [1, rows, 1]).reshape([-1]);
        let col = grid(centred(cols, device), [1, 1, cols]).reshape([-1]);
        parts.push(angles(axes, theta, [&frame, &row, &col]));
        text_start = text_start.max(rows / 2).max(cols / 2);
    }
    let text = Tensor::arange_start(text_start, text_start + text_len, (Kind::Int64, device));
    RotaryAngles { image: Tensor::cat(&parts, 0), text: angles(axes, theta, [&text, &text, &text]) }
}

/// Rotates (B, S, H, D) queries or keys by angles (S, D/2): each consecutive pair is a complex
/// number multiplied by `e^{iθ}`, in f32, returned in the input's dtype.
pub fn apply_rotary(x: &Tensor, angles: &Tensor) -> Tensor {
    let size = x.size();
    let pairs = x.to_kind(Kind::Float).reshape([size[0], size[1], size[2], -1, 2]);
    let (re, im) = (pairs.select(4, 0), pairs.select(4, 1));
    let (cos, sin) = (angles.cos().unsqueeze(1), angles.sin().unsqueeze(1));
    let out_re = &re * &cos - &im * &sin;
    let out_im = re * sin + im * cos;
    Tensor::stack(&[out_re, out_im], 4).reshape(size).to_kind(x.kind())
}
