//! The joint text/image sequence of Qwen-Image 2.1: the encoder's sequence with each image slot
//! expanded to the 2×2 latent tokens it stands for (condition images where the encoder reserved
//! them, the target's slots appended), its 3-axis rotary positions and its block-causal mask.

use tch::{Device, Kind, Tensor};

use crate::qwen_image::rope::angles;
use crate::qwen_image::ImageShape;

/// Latent tokens per encoder image slot (a 2×2 group).
pub const TOKENS_PER_SLOT: i64 = 4;
/// The rotary base of every axis.
const ROPE_THETA: f64 = 10_000.0;

/// Where every token of the joint sequence comes from, computed on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct JointLayout {
    /// Per joint position: its index in `[text states (L); image tokens (N)]`.
    pub gather: Vec<i64>,
    /// Per joint position: its image block (conditions in order, then the target), −1 for text.
    pub blocks: Vec<i64>,
    /// Per joint position: (frame, row, column) rotary positions.
    pub positions: [Vec<i64>; 3],
    /// Per text position of the joint sequence, in order: its index in the encoder's sequence.
    pub text_sources: Vec<i64>,
    /// Tokens before the target's (text and condition images).
    pub prefix: i64,
}

impl JointLayout {
    /// `slots`: diffusers' `img_mask` row (the `L` encoder positions, then one slot per 2×2 target
    /// tokens), `shapes`: (frames, rows, columns) of the condition images, then the target.
    pub fn new(slots: &[bool], shapes: &[ImageShape], text_len: i64) -> Result<Self, String> {
        let (&target, conditions) = shapes.split_last().ok_or("img_shapes is empty")?;
        let tokens = |s: &ImageShape| s.0 * s.1 * s.2;
        if let Some(s) = shapes.iter().find(|s| s.0 != 1 || s.1 <= 0 || s.2 <= 0) {
            return Err(format!("img_shapes entry {s:?}: expected one frame of rows × columns"));
        }
        let target_slots = tokens(&target) / TOKENS_PER_SLOT;
        let l = text_len as usize;
        if tokens(&target) % TOKENS_PER_SLOT != 0
            || slots.len() != l + target_slots as usize
            || slots[l..].iter().any(|s| !s)
        {
            return Err(format!(
                "img_mask has {} positions: expected the {text_len} encoder positions, then \
                 {target_slots} target slots (one per 2×2 of the {}×{} target tokens)",
                slots.len(),
                target.1,
                target.2
            ));
        }
        let condition_tokens: i64 = conditions.iter().map(tokens).sum();
        let slotted = slots[..l].iter().filter(|s| **s).count() as i64;
        if slotted * TOKENS_PER_SLOT != condition_tokens {
            return Err(format!(
                "img_mask has {slotted} condition-image slots in the text, the condition images \
                 of img_shapes {conditions:?} need {condition_tokens} / {TOKENS_PER_SLOT}"
            ));
        }
        let (mut gather, mut is_image, mut text_sources) = (vec![], vec![], vec![]);
        let mut image_index = text_len;
        for (i, &slot) in slots.iter().enumerate() {
            if slot {
                gather.extend(image_index..image_index + TOKENS_PER_SLOT);
                is_image.extend([true; TOKENS_PER_SLOT as usize]);
                image_index += TOKENS_PER_SLOT;
            } else {
                gather.push(i as i64);
                is_image.push(false);
                text_sources.push(i as i64);
            }
        }
        let mut blocks = vec![-1; gather.len()];
        let [mut frame, mut row, mut col] = [vec![], vec![], vec![]];
        let (mut cursor, mut position) = (0usize, 0i64);
        for (block, shape) in shapes.iter().enumerate() {
            let (h, w) = (shape.1, shape.2);
            let start =
                (cursor..is_image.len()).find(|&i| is_image[i]).ok_or("img_mask ran out")?;
            let end = start + (h * w) as usize;
            if end > is_image.len() || is_image[start..end].iter().any(|s| !s) {
                return Err(format!("image {block} ({h}×{w} tokens) does not fit its slots"));
            }
            // Text advances one position on every axis; an image sits on one frame with its
            // rows and columns centred on zero, and moves the text on by its longer side.
            for p in position..position + (start - cursor) as i64 {
                frame.push(p);
                row.push(p);
                col.push(p);
            }
            position += (start - cursor) as i64;
            for r in -(h - h / 2)..h / 2 {
                for c in -(w - w / 2)..w / 2 {
                    frame.push(position);
                    row.push(r);
                    col.push(c);
                }
            }
            blocks[start..end].fill(block as i64);
            position += h.max(w);
            cursor = end;
        }
        Ok(Self {
            prefix: (gather.len() as i64) - tokens(&target),
            gather,
            blocks,
            positions: [frame, row, col],
            text_sources,
        })
    }

    /// Tokens of the joint sequence.
    pub fn len(&self) -> i64 {
        self.gather.len() as i64
    }

    /// Whether the sequence is empty (never, for a valid layout).
    pub fn is_empty(&self) -> bool {
        self.gather.is_empty()
    }

    /// Rotary angles (S, head_dim / 2) of every joint position.
    pub fn rotary_angles(&self, axes: &[i64; 3], device: Device) -> Tensor {
        let [f, r, c] = self.positions.each_ref().map(|p| Tensor::from_slice(p).to_device(device));
        angles(axes, ROPE_THETA, [&f, &r, &c])
    }

    /// The prefix's block-causal structure (P, P): a query sees every earlier key and its own
    /// image block; text is causal.
    pub fn prefix_mask(&self, device: Device) -> Tensor {
        let p = self.prefix;
        let blocks = Tensor::from_slice(&self.blocks[..p as usize]).to_device(device);
        let index = Tensor::arange(p, (Kind::Int64, device));
        let causal = index.unsqueeze(1).ge_tensor(&index.unsqueeze(0));
        let same = blocks.unsqueeze(1).eq_tensor(&blocks.unsqueeze(0)) * blocks.ge(0).unsqueeze(1);
        causal.logical_or(&same)
    }

    /// Valid keys (B, S) of the joint sequence from the encoder's mask (B, L): padded text
    /// positions are dropped, image tokens always stay.
    pub fn key_valid(&self, mask: &Tensor) -> Tensor {
        let device = mask.device();
        let b = mask.size()[0];
        let text =
            mask.ne(0).index_select(1, &Tensor::from_slice(&self.text_sources).to_device(device));
        let positions: Vec<i64> =
            (0..self.len()).filter(|&i| self.blocks[i as usize] < 0).collect();
        Tensor::ones([b, self.len()], (Kind::Bool, device)).index_copy(
            1,
            &Tensor::from_slice(&positions).to_device(device),
            &text,
        )
    }
}
