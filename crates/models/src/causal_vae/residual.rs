//! Wan2.2's residual down and up blocks (`is_residual`): the level's residual blocks and
//! resampler plus a parameter-free shortcut that folds space and time into channels and averages
//! them (`AvgDown3D`) or repeats channels and unfolds them (`DupUp3D`).

use tch::Tensor;

use super::blocks::{Resample, ResidualBlock};
use super::layers::FrameCache;
use crate::nn::Scope;

/// `AvgDown3D`: (B, C, T, H, W) → (B, out, T/ft, H/fs, W/fs); time is zero-padded in front to a
/// multiple of `ft`, each output channel averages `C·ft·fs² / out` folded values.
struct AvgDown {
    output: i64,
    factor_t: i64,
    factor_s: i64,
}

impl AvgDown {
    fn forward(&self, x: &Tensor) -> Tensor {
        let (ft, fs) = (self.factor_t, self.factor_s);
        let pad = (ft - x.size()[2] % ft) % ft;
        let x = x.constant_pad_nd([0, 0, 0, 0, pad, 0]);
        let (b, c, t, h, w) = x.size5().expect("5-d activations");
        let folded = x
            .reshape([b, c, t / ft, ft, h / fs, fs, w / fs, fs])
            .permute([0, 1, 3, 5, 7, 2, 4, 6])
            .reshape([b, self.output, -1, t / ft, h / fs, w / fs]);
        folded.mean_dim(2, false, x.kind())
    }
}

/// `DupUp3D`: (B, C, T, H, W) → (B, out, T·ft, H·fs, W·fs), each channel repeated
/// `out·ft·fs² / C` times and unfolded; on the first chunk the first `ft − 1` frames are dropped.
struct DupUp {
    output: i64,
    factor_t: i64,
    factor_s: i64,
    repeats: i64,
}

impl DupUp {
    fn forward(&self, x: &Tensor, first_chunk: bool) -> Tensor {
        let (ft, fs) = (self.factor_t, self.factor_s);
        let x = x.repeat_interleave_self_int(self.repeats, 1, None);
        let (b, _, t, h, w) = x.size5().expect("5-d activations");
        let x = x
            .reshape([b, self.output, ft, fs, fs, t, h, w])
            .permute([0, 1, 5, 2, 6, 3, 7, 4])
            .reshape([b, self.output, t * ft, h * fs, w * fs]);
        if first_chunk {
            x.narrow(2, ft - 1, t * ft - (ft - 1))
        } else {
            x
        }
    }
}

/// `WanResidualDownBlock`: `resnets`, the optional `downsampler`, plus the averaged shortcut of
/// the block's input.
pub(super) struct ResidualDownBlock {
    resnets: Vec<ResidualBlock>,
    downsampler: Option<Resample>,
    shortcut: AvgDown,
}

impl ResidualDownBlock {
    /// `down`: whether the level downsamples, and if so whether also in time.
    pub fn new(
        s: &Scope<'_>,
        input: i64,
        output: i64,
        num_res_blocks: usize,
        down: Option<bool>,
        time: bool,
    ) -> Self {
        let resnets = (0..num_res_blocks)
            .map(|j| {
                let from = if j == 0 { input } else { output };
                ResidualBlock::new(&(&(s / "resnets") / j), from, output, time)
            })
            .collect();
        Self {
            resnets,
            downsampler: down
                .map(|temporal| Resample::down(&(s / "downsampler"), output, temporal, time)),
            shortcut: AvgDown {
                output,
                factor_t: if down == Some(true) { 2 } else { 1 },
                factor_s: if down.is_some() { 2 } else { 1 },
            },
        }
    }

    /// One chunk of frames.
    pub fn forward(&self, x: &Tensor, cache: &mut FrameCache) -> Tensor {
        let mut h = x.shallow_clone();
        for r in &self.resnets {
            h = r.forward(&h, cache);
        }
        if let Some(down) = &self.downsampler {
            h = down.forward(&h, cache);
        }
        h + self.shortcut.forward(x)
    }
}

/// `WanResidualUpBlock`: `num_res_blocks + 1` residual blocks, the optional `upsampler` (which
/// keeps the width), plus the repeated shortcut of the block's input when it upsamples.
pub(super) struct ResidualUpBlock {
    resnets: Vec<ResidualBlock>,
    upsampler: Option<Resample>,
    shortcut: Option<DupUp>,
}

impl ResidualUpBlock {
    /// `up`: whether the level upsamples, and if so whether also in time.
    pub fn new(
        s: &Scope<'_>,
        input: i64,
        output: i64,
        num_res_blocks: usize,
        up: Option<bool>,
        time: bool,
    ) -> Self {
        let resnets = (0..=num_res_blocks)
            .map(|j| {
                let from = if j == 0 { input } else { output };
                ResidualBlock::new(&(&(s / "resnets") / j), from, output, time)
            })
            .collect();
        Self {
            resnets,
            upsampler: up
                .map(|temporal| Resample::up(&(s / "upsampler"), output, output, temporal, time)),
            shortcut: up.map(|temporal| {
                let factor_t = if temporal { 2 } else { 1 };
                DupUp { output, factor_t, factor_s: 2, repeats: output * factor_t * 4 / input }
            }),
        }
    }

    /// One chunk of latent frames.
    pub fn forward(&self, x: &Tensor, cache: &mut FrameCache) -> Tensor {
        let first_chunk = cache.first_chunk();
        let mut h = x.shallow_clone();
        for r in &self.resnets {
            h = r.forward(&h, cache);
        }
        if let Some(up) = &self.upsampler {
            h = up.forward(&h, cache);
        }
        match &self.shortcut {
            Some(shortcut) => h + shortcut.forward(x, first_chunk),
            None => h,
        }
    }
}
