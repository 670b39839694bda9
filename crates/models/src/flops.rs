//! The floating-point work of the matrix products a model runs, counted as they run (for
//! `perf/tflops` and `perf/mfu`). A [`crate::nn::Linear`] adds `2·in·out` per row (and its LoRA
//! pair `2·r·(in + out)`), an [`crate::nn::attention`] `4·Sq·Sk·d` per head (`QKᵀ` and the
//! weighted sum of values). A product whose output is part of the autograd graph counts three
//! times: its backward costs about twice its forward (the `6·N` per token of the usual training
//! count; `2·N` for a forward alone). Convolutions, norms and element-wise work are not counted.
//! Recomputed blocks (gradient checkpointing) count again, as hardware work.

use std::cell::Cell;

use tch::Tensor;

thread_local! {
    static FLOPS: Cell<f64> = const { Cell::new(0.0) };
}

/// The work counted on this thread so far.
pub fn counted() -> f64 {
    FLOPS.with(Cell::get)
}

/// Adds `forward` FLOPs that produced `output` (×3 when it is in the autograd graph).
pub(crate) fn add(forward: f64, output: &Tensor) {
    let factor = if output.requires_grad() { 3.0 } else { 1.0 };
    FLOPS.with(|f| f.set(f.get() + factor * forward));
}

/// Rows of `x` as a linear layer with `width` inputs sees them.
pub(crate) fn rows(x: &Tensor, width: i64) -> f64 {
    x.numel() as f64 / width.max(1) as f64
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use super::counted;
    use crate::nn::{attention, Linear};

    #[test]
    fn products_count_their_multiply_adds_and_backward_triples_them() {
        let opts = (Kind::Float, Device::Cpu);
        let layer =
            Linear { weight: Tensor::randn([6, 4], opts), bias: None, lora: None, fuse: None };
        let x = Tensor::randn([2, 3, 4], opts);
        let before = counted();
        let y = tch::no_grad(|| layer.forward(&x));
        assert_eq!(counted() - before, 2.0 * 6.0 * 4.0 * 6.0, "6 rows × 2·4·6");
        let before = counted();
        let _ = layer.forward(&x.set_requires_grad(true));
        assert_eq!(counted() - before, 3.0 * 2.0 * 6.0 * 4.0 * 6.0);
        // (B, H, S, d) = (2, 3, 5, 4) against 7 keys.
        let q = Tensor::randn([2, 3, 5, 4], opts);
        let kv = Tensor::randn([2, 3, 7, 4], opts);
        let before = counted();
        let _ = tch::no_grad(|| attention(&q, &kv, &kv, None, false, None));
        assert_eq!(counted() - before, 4.0 * 2.0 * 3.0 * 5.0 * 7.0 * 4.0);
        assert_eq!(y.size(), [2, 3, 6]);
    }

    #[test]
    fn the_largest_attention_says_its_kernel_once() {
        use crate::nn::{attention_backend_name, take_attention_backend};
        let _ = take_attention_backend();
        let x = |n: i64| Tensor::randn([1, 2, n, 8], (Kind::Float, Device::Cpu));
        let _ = tch::no_grad(|| attention(&x(4), &x(4), &x(4), None, false, None));
        let _ = tch::no_grad(|| attention(&x(16), &x(16), &x(16), None, false, None));
        let code = take_attention_backend().expect("an attention ran");
        assert!((0..=4).contains(&code), "{code}");
        assert_ne!(attention_backend_name(code), "unknown");
        assert_eq!(take_attention_backend(), None);
    }
}
