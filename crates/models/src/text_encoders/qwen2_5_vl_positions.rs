//! Qwen2.5-VL's 3-D rotary positions (transformers' `get_rope_index` for images): rows temporal,
//! height and width. Text tokens count up with equal rows; the merged tokens of a `(t, h, w)` patch
//! grid take `start + (t_i, h_i, w_i)` on the `t × h/merge × w/merge` grid, and the text after it
//! continues at `start + max(h, w) / merge`. Padding positions are 0.
//!
//! Videos are not supported: their temporal rows would be scaled by `tokens_per_second` ·
//! `second_per_grid_ts`, which Qwen-Image-Edit's condition pictures never need.

use tch::{Device, Kind, Tensor};

use crate::ModelError;

/// Positions (3, B, L) i64 of text-only rows: 0‥L in every row.
pub fn text_positions(b: i64, l: i64, device: Device) -> Tensor {
    Tensor::arange(l, (Kind::Int64, device)).view([1, 1, l]).expand([3, b, l], false)
}

/// Positions (3, B, L) i64 on the device of `input_ids` (B, L) for rows whose runs of
/// `image_token_id` tokens (among the tokens `attention_mask` keeps) are the merged tokens of the
/// pictures with patch grids `grids`, consumed in order across rows.
pub fn multimodal_positions(
    input_ids: &Tensor,
    attention_mask: &Tensor,
    image_token_id: i64,
    grids: &[(i64, i64, i64)],
    spatial_merge_size: i64,
) -> Result<Tensor, ModelError> {
    let (b, l) = input_ids.size2()?;
    let ids = Vec::<i64>::try_from(input_ids.to_kind(Kind::Int64).reshape([-1]))?;
    let keep = Vec::<i64>::try_from(attention_mask.to_kind(Kind::Int64).reshape([-1]))?;
    let (b, l) = (b as usize, l as usize);
    let mut out = vec![0i64; 3 * b * l];
    let mut grids = grids.iter();
    for row in 0..b {
        let kept: Vec<usize> = (row * l..(row + 1) * l).filter(|&i| keep[i] != 0).collect();
        let (mut next, mut pos) = (0, 0);
        while next < kept.len() {
            if ids[kept[next]] != image_token_id {
                for r in 0..3 {
                    out[r * b * l + kept[next]] = pos;
                }
                (next, pos) = (next + 1, pos + 1);
                continue;
            }
            let &(t, h, w) = grids.next().ok_or_else(|| {
                ModelError::Input(format!(
                    "row {row} has more runs of image tokens ({image_token_id}) than the {} \
                     picture grids given",
                    grids.len()
                ))
            })?;
            let m = spatial_merge_size;
            if t < 1 || h < 1 || w < 1 || h % m != 0 || w % m != 0 {
                return Err(ModelError::Input(format!(
                    "picture grid {:?}: expected positive sizes, h and w multiples of the merge \
                     size {m}",
                    (t, h, w)
                )));
            }
            let (gh, gw) = (h / m, w / m);
            let count = (t * gh * gw) as usize;
            let run = kept[next..].iter().take_while(|&&i| ids[i] == image_token_id).count();
            if run < count {
                return Err(ModelError::Input(format!(
                    "row {row}: a run of {run} image tokens where grid {:?} needs {count}",
                    (t, h, w)
                )));
            }
            for (k, &i) in kept[next..next + count].iter().enumerate() {
                let k = k as i64;
                let cell = [k / (gh * gw), k / gw % gh, k % gw];
                for (r, c) in cell.iter().enumerate() {
                    out[r * b * l + i] = pos + c;
                }
            }
            next += count;
            pos += gh.max(gw);
        }
    }
    if grids.len() != 0 {
        return Err(ModelError::Input(format!(
            "{} picture grids were left without image tokens",
            grids.len()
        )));
    }
    Ok(Tensor::from_slice(&out).view([3, b as i64, l as i64]).to_device(input_ids.device()))
}
