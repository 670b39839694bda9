//! FLUX.1's rotary embedding (`FluxPosEmbed`): every token has a 3-axis position id, text tokens
//! `[0, 0, 0]` and the packed image token at row `r`, column `c` `[0, r, c]`; each axis rotates its
//! own slice of a head's channels in interleaved pairs.

use tch::{Device, Kind, Tensor};

/// FLUX.1's rotary base of every axis.
pub const THETA: f64 = 10_000.0;

/// Cosine and sine tables (S, head_dim / 2) in f32, text tokens first.
pub struct RotaryTables {
    pub cos: Tensor,
    pub sin: Tensor,
}

impl RotaryTables {
    /// The same tables, sharing storage.
    pub fn shallow_clone(&self) -> Self {
        Self { cos: self.cos.shallow_clone(), sin: self.sin.shallow_clone() }
    }
}

/// Position ids (L + rows·cols, 3) of `text_len` text tokens and a `rows × cols` token grid.
pub fn position_ids(text_len: i64, rows: i64, cols: i64, device: Device) -> Tensor {
    let opts = (Kind::Float, device);
    let row = Tensor::arange(rows, opts).view([rows, 1]).expand([rows, cols], false);
    let col = Tensor::arange(cols, opts).view([1, cols]).expand([rows, cols], false);
    let image = Tensor::stack(&[row.zeros_like(), row, col], 2).reshape([rows * cols, 3]);
    Tensor::cat(&[Tensor::zeros([text_len, 3], opts), image], 0)
}

/// The tables for position ids (S, axes): angles `position · θ^(−2i/d)` per axis in f64, as
/// diffusers computes them, cosines and sines cast to f32 (FLUX.2 has four axes and θ 2000).
pub fn rotary_tables(axes: &[i64], theta: f64, ids: &Tensor) -> RotaryTables {
    let parts: Vec<Tensor> = axes
        .iter()
        .enumerate()
        .map(|(axis, &dim)| {
            let opts = (Kind::Double, ids.device());
            let exponents = Tensor::arange_start_step(0, dim, 2, opts) / dim as f64;
            let inv = Tensor::from(theta).to_device(ids.device()).pow(&exponents).reciprocal();
            let pos = ids.select(1, axis as i64).to_kind(Kind::Float).to_kind(Kind::Double);
            pos.unsqueeze(1) * inv.unsqueeze(0)
        })
        .collect();
    let angles = Tensor::cat(&parts, 1);
    RotaryTables { cos: angles.cos().to_kind(Kind::Float), sin: angles.sin().to_kind(Kind::Float) }
}

/// Rotates (B, S, H, D) queries or keys: each consecutive channel pair `(a, b)` becomes
/// `(a·cos − b·sin, a·sin + b·cos)`, in f32, returned in the input's dtype.
pub fn apply_rotary(x: &Tensor, tables: &RotaryTables) -> Tensor {
    let size = x.size();
    let pairs = x.to_kind(Kind::Float).reshape([size[0], size[1], size[2], -1, 2]);
    let (a, b) = (pairs.select(4, 0), pairs.select(4, 1));
    let (cos, sin) = (tables.cos.unsqueeze(1), tables.sin.unsqueeze(1));
    let out_a = &a * &cos - &b * &sin;
    let out_b = a * sin + b * cos;
    Tensor::stack(&[out_a, out_b], 4).reshape(size).to_kind(x.kind())
}
