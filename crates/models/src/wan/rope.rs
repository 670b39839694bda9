//! Wan's 3-axis rotary embedding: the head's channel pairs are split between frame, row and
//! column positions; angles and their cosines and sines are computed in f64 and rounded to f32,
//! as diffusers' `WanRotaryPosEmbed` tables are.

use tch::{Device, Kind, Tensor};

/// Cosines and sines (S, head_dim / 2) of the tokens of a `frames × rows × cols` grid, in
/// row-major (frame, row, column) order. `dims` are the per-axis rotary widths.
pub fn rotations(dims: [i64; 3], grid: [i64; 3], device: Device) -> (Tensor, Tensor) {
    let [f, h, w] = grid;
    let parts: Vec<Tensor> = dims
        .iter()
        .zip(grid)
        .enumerate()
        .map(|(axis, (&dim, len))| {
            let exponents =
                Tensor::arange_start_step(0, dim, 2, (Kind::Double, device)) / dim as f64;
            let frequencies = Tensor::pow_scalar(10_000f64, &exponents).reciprocal();
            let positions = Tensor::arange(len, (Kind::Double, device)).unsqueeze(1);
            let angles = positions * frequencies.unsqueeze(0);
            let mut shape = [1, 1, 1, dim / 2];
            shape[axis] = len;
            angles.view(shape).expand([f, h, w, dim / 2], false)
        })
        .collect();
    let angles = Tensor::cat(&parts, -1).reshape([f * h * w, -1]);
    (angles.cos().to_kind(Kind::Float), angles.sin().to_kind(Kind::Float))
}

/// Rotates queries or keys (B, S, H, d): consecutive channels (2i, 2i + 1) are the pair turned by
/// angle i, computed in f32 (diffusers' tables are f32 and promote half-precision inputs) and
/// returned in the input's dtype.
pub fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let size = x.size();
    let (b, s, heads, d) = (size[0], size[1], size[2], size[3]);
    let pairs = x.to_kind(Kind::Float).reshape([b, s, heads, d / 2, 2]);
    let (re, im) = (pairs.select(-1, 0), pairs.select(-1, 1));
    let (cos, sin) = (cos.view([1, s, 1, d / 2]), sin.view([1, s, 1, d / 2]));
    Tensor::stack(&[&re * &cos - &im * &sin, &re * &sin + &im * &cos], -1)
        .reshape([b, s, heads, d])
        .to_kind(x.kind())
}
