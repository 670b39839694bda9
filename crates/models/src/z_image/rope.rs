//! Z-Image's 3-axis rotary embedding: each axis (caption index / frame, row, column) owns a
//! slice of the head, and a token's rotation is the complex number `e^{iθ}` per frequency,
//! with angles computed in f64 and rounded to f32 as diffusers' `RopeEmbedder` tables are.

use tch::{Kind, Tensor};

/// Complex rotations (B, S, head_dim / 2) of integer positions (B, S, 3).
pub fn rotations(axes_dims: &[i64], theta: f64, positions: &Tensor) -> Tensor {
    let device = positions.device();
    let parts: Vec<Tensor> = axes_dims
        .iter()
        .enumerate()
        .map(|(axis, &dim)| {
            let exponents =
                Tensor::arange_start_step(0, dim, 2, (Kind::Double, device)) / dim as f64;
            let frequencies = Tensor::pow_scalar(theta, &exponents).reciprocal();
            let position = positions.select(-1, axis as i64).to_kind(Kind::Double).unsqueeze(-1);
            let angles = (position * frequencies).to_kind(Kind::Float);
            Tensor::polar(&angles.ones_like(), &angles)
        })
        .collect();
    Tensor::cat(&parts, -1)
}

/// Rotates queries or keys (B, S, H, d) by `rotations` (B, S, d / 2), pairing consecutive
/// channels as (real, imaginary), in f32 (real arithmetic, whose backward is cheap); the result
/// has the input's dtype.
pub fn rotate(x: &Tensor, rotations: &Tensor) -> Tensor {
    let size = x.size();
    let mut pairs = size.clone();
    pairs.pop();
    pairs.extend([-1, 2]);
    let x2 = x.to_kind(Kind::Float).reshape(pairs.as_slice());
    let (re, im) = (x2.select(-1, 0), x2.select(-1, 1));
    let (cos, sin) = (rotations.real().unsqueeze(2), rotations.imag().unsqueeze(2));
    let out = Tensor::stack(&[&re * &cos - &im * &sin, &re * &sin + &im * &cos], -1);
    out.reshape(size.as_slice()).to_kind(x.kind())
}
