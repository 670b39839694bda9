//! The causal 3-D convolution, the RMS norm, the frame cache and the (B, C, T, H, W) ↔ (B·T, C,
//! H, W) reshapes of the Wan-style VAEs.

use tch::{Kind, Tensor};

use crate::nn::Scope;

/// Frames of its input each causal convolution remembers for the next chunk (diffusers' CACHE_T).
const HISTORY: i64 = 2;

/// A 3-D convolution that is causal in time: the `2·padding_t` frames before the input are the
/// history passed in (the end of the previous chunk), zeros where there is none. Without `time`
/// (Qwen-Image 2.1's image VAE) it is a 2-D convolution of each frame, its weight stored
/// (out, in, kh, kw).
pub(crate) struct CausalConv3d {
    weight: Tensor,
    time: bool,
    bias: Tensor,
    stride: [i64; 3],
    padding: [i64; 3],
}

impl CausalConv3d {
    /// `weight` (out, in, kt, kh, kw) (without `time`: (out, in, kh, kw)) and `bias` below `s`.
    pub fn new(
        s: &Scope<'_>,
        input: i64,
        output: i64,
        kernel: [i64; 3],
        stride: [i64; 3],
        time: bool,
    ) -> Self {
        let padding = kernel.map(|k| (k - 1) / 2);
        Self::with_padding(s, input, output, kernel, stride, padding, time)
    }

    /// As [`Self::new`] with explicit padding (time, height, width).
    pub fn with_padding(
        s: &Scope<'_>,
        input: i64,
        output: i64,
        kernel: [i64; 3],
        stride: [i64; 3],
        padding: [i64; 3],
        time: bool,
    ) -> Self {
        let [kt, kh, kw] = kernel;
        let shape: &[i64] =
            if time { &[output, input, kt, kh, kw] } else { &[output, input, kh, kw] };
        Self {
            weight: s.var("weight", shape),
            bias: s.var("bias", &[output]),
            stride,
            padding,
            time,
        }
    }

    /// The weights' dtype.
    pub fn kind(&self) -> Kind {
        self.weight.kind()
    }

    /// `x` (B, C, T, H, W) after `history` (B, C, ≤ 2·padding_t, H, W).
    pub fn forward(&self, x: &Tensor, history: Option<&Tensor>) -> Tensor {
        let [_, sh, sw] = self.stride;
        let [_, ph, pw] = self.padding;
        if !self.time {
            let b = x.size()[0];
            let y = frames_to_batch(x).conv2d(
                &self.weight,
                Some(&self.bias),
                [sh, sw],
                [ph, pw],
                [1, 1],
                1,
            );
            return batch_to_frames(&y, b);
        }
        let mut front = 2 * self.padding[0];
        let x = match history {
            Some(h) if front > 0 => {
                front -= h.size()[2];
                Tensor::cat(&[h, x], 2)
            }
            _ => x.shallow_clone(),
        };
        let kt = self.weight.size()[2];
        if x.size()[2] == 1 && front == kt - 1 {
            // One frame behind zeros: only the kernel's last time slice meets data.
            let weight = self.weight.select(2, kt - 1);
            let y =
                x.squeeze_dim(2).conv2d(&weight, Some(&self.bias), [sh, sw], [ph, pw], [1, 1], 1);
            return y.unsqueeze(2);
        }
        x.constant_pad_nd([0, 0, 0, 0, front, 0]).conv3d(
            &self.weight,
            Some(&self.bias),
            self.stride,
            [0, ph, pw],
            [1, 1, 1],
            1,
        )
    }
}

/// `WanRMS_norm` / `QwenImageRMS_norm`: x / ‖x‖₂ over channels (dim 1) · √C · `gamma`, statistics in f32 for half
/// precision inputs.
pub(crate) struct RmsNorm {
    gamma: Tensor,
    scale: f64,
}

impl RmsNorm {
    /// `gamma` of shape (C, 1, 1, 1) for 5-D inputs, (C, 1, 1) for 4-D (`images`) ones.
    pub fn new(s: &Scope<'_>, channels: i64, images: bool) -> Self {
        let shape: &[i64] = if images { &[channels, 1, 1] } else { &[channels, 1, 1, 1] };
        Self { gamma: s.var("gamma", shape), scale: (channels as f64).sqrt() }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        let upcast = matches!(x.kind(), Kind::Half | Kind::BFloat16);
        let xf = if upcast { x.to_kind(Kind::Float) } else { x.shallow_clone() };
        let norm = xf.norm_scalaropt_dim(2.0, [1], true).clamp_min(1e-12);
        (xf / norm).to_kind(x.kind()) * self.scale * &self.gamma
    }
}

/// What each causal convolution saw of the previous chunks, slot by slot in call order (the
/// encoder and decoder visit their convolutions in the same order for every chunk).
pub(crate) struct FrameCache {
    slots: Vec<Option<Tensor>>,
    next: usize,
    chunk: usize,
    /// False on the last chunk: nothing after it needs the history.
    keep: bool,
}

impl FrameCache {
    pub fn new() -> Self {
        Self { slots: vec![], next: 0, chunk: 0, keep: true }
    }

    /// Starts the next chunk of frames; `last` drops the history as it goes.
    pub fn start_chunk(&mut self, last: bool) {
        if self.next > 0 {
            self.chunk += 1;
        }
        self.next = 0;
        self.keep = !last;
    }

    /// Whether this is the first chunk (the temporal resamplers pass it through).
    pub fn first_chunk(&self) -> bool {
        self.chunk == 0
    }

    /// The next slot's history, taken out.
    pub fn take(&mut self) -> (usize, Option<Tensor>) {
        if self.next == self.slots.len() {
            self.slots.push(None);
        }
        self.next += 1;
        (self.next - 1, self.slots[self.next - 1].take())
    }

    /// Stores the last `frames` frames of `history ++ x` in `slot` (unless this is the last chunk).
    pub fn put(&mut self, slot: usize, history: Option<&Tensor>, x: &Tensor, frames: i64) {
        if !self.keep {
            return;
        }
        let t = x.size()[2];
        let seen = match history {
            Some(h) if t < frames => Tensor::cat(&[h, x], 2),
            _ => x.shallow_clone(),
        };
        let total = seen.size()[2];
        let n = total.min(frames);
        self.slots[slot] = Some(seen.narrow(2, total - n, n).contiguous());
    }

    /// `conv` over `x` after this slot's history, remembering the end of `x` for the next chunk.
    pub fn conv(&mut self, conv: &CausalConv3d, x: &Tensor) -> Tensor {
        let (slot, history) = self.take();
        let y = conv.forward(x, history.as_ref());
        self.put(slot, history.as_ref(), x, HISTORY);
        y
    }
}

/// (B, C, T, H, W) → (B·T, C, H, W).
pub(super) fn frames_to_batch(x: &Tensor) -> Tensor {
    let (b, c, t, h, w) = x.size5().expect("5-d (B, C, T, H, W) activations");
    x.permute([0, 2, 1, 3, 4]).reshape([b * t, c, h, w])
}

/// (B·T, C, H, W) → (B, C, T, H, W).
pub(super) fn batch_to_frames(x: &Tensor, b: i64) -> Tensor {
    let (bt, c, h, w) = x.size4().expect("4-d activations");
    x.reshape([b, bt / b, c, h, w]).permute([0, 2, 1, 3, 4])
}
