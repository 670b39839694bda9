//! The matrix-product count behind `perf/tflops` and `perf/mfu` ([`flowtune_models::flops`])
//! against a hand count of one transformer block, written out from the architecture: a
//! Qwen-Image dual-stream block, a FLUX.1 double-stream block and a FLUX.1 single-stream block.
//! Each block is isolated by differencing two models that differ by that one block (same config,
//! weights and inputs otherwise), so embedders and final layers cancel. Forwards run under
//! `no_grad` (each product counts once); the Qwen-Image block is also counted as in training, with
//! LoRA on its reference targets and grad on: every product whose output is in the autograd graph
//! counts three times, with its adapter's `2·r·(in + out)` per row. Sums of integers, compared
//! exactly.

use flowtune_models::flops::counted;
use flowtune_models::flux::{FluxTransformer, FluxTransformerConfig};
use flowtune_models::lora::QWEN_IMAGE_TARGETS;
use flowtune_models::qwen_image::{QwenImageTransformer, QwenImageTransformerConfig};
use flowtune_models::{LoraConfig, ModelWeights};
use tch::{Device, Kind, Tensor};

/// Batch, heads × head dim (stream width `D`), image tokens (a 2 × 3 grid), text tokens.
const B: i64 = 2;
const H: i64 = 2;
const HEAD_DIM: i64 = 16;
const D: i64 = H * HEAD_DIM;
const S: i64 = 6;
const L: i64 = 5;
/// Channels of a packed latent token and of the text encoder's states.
const IN: i64 = 16;
const TEXT: i64 = 24;
/// LoRA rank of the training count.
const RANK: i64 = 4;
const OPTS: (Kind, Device) = (Kind::Float, Device::Cpu);

/// `2·rows·in·out`: a linear layer's multiply-adds.
fn linear(rows: i64, input: i64, output: i64) -> f64 {
    (2 * rows * input * output) as f64
}

/// `4·B·H·Sq·Sk·d`: `QKᵀ` and the weighted sum of values.
fn attention(sq: i64, sk: i64) -> f64 {
    (4 * B * H * sq * sk * HEAD_DIM) as f64
}

/// Random base weights (a built model's are uninitialised).
fn randomize(weights: &ModelWeights) {
    tch::no_grad(|| {
        for v in weights.base.variables().values() {
            v.shallow_clone().copy_(&(v.randn_like() * 0.02));
        }
    });
}

/// FLOPs counted on this thread while `run` runs, under `no_grad` unless `grad`.
fn count<T>(grad: bool, run: impl FnOnce() -> T) -> f64 {
    let before = counted();
    if grad {
        run();
    } else {
        tch::no_grad(run);
    }
    counted() - before
}

/// The linear layers of one Qwen-Image block (`qwen_image/block.rs`) as
/// (module, rows, in, out); attention's inner width `heads·head_dim` is `D`.
fn qwen_block_linears() -> [(&'static str, i64, i64, i64); 14] {
    [
        // AdaLN: SiLU(temb) → (shift, scale, gate) × (attention, MLP), one row per sample.
        ("img_mod.1", B, D, 6 * D),
        ("txt_mod.1", B, D, 6 * D),
        // Image-stream projections.
        ("attn.to_q", B * S, D, D),
        ("attn.to_k", B * S, D, D),
        ("attn.to_v", B * S, D, D),
        ("attn.to_out.0", B * S, D, D),
        // Text-stream projections.
        ("attn.add_q_proj", B * L, D, D),
        ("attn.add_k_proj", B * L, D, D),
        ("attn.add_v_proj", B * L, D, D),
        ("attn.to_add_out", B * L, D, D),
        // GELU(tanh) feed-forwards, hidden width 4·D.
        ("img_mlp.net.0.proj", B * S, D, 4 * D),
        ("img_mlp.net.2", B * S, 4 * D, D),
        ("txt_mlp.net.0.proj", B * L, D, 4 * D),
        ("txt_mlp.net.2", B * L, 4 * D, D),
    ]
}

/// A Qwen-Image transformer with `layers` blocks, run once on fixed inputs: the FLOPs counted.
fn qwen_count(layers: usize, lora: Option<&LoraConfig>) -> f64 {
    let config = QwenImageTransformerConfig {
        num_layers: layers,
        num_attention_heads: H,
        attention_head_dim: HEAD_DIM,
        axes_dims_rope: [4, 6, 6],
        in_channels: IN,
        out_channels: Some(IN / 4),
        joint_attention_dim: TEXT,
        ..Default::default()
    };
    let model = QwenImageTransformer::new(&config, Device::Cpu, Kind::Float, lora).unwrap();
    randomize(&model.weights);
    tch::manual_seed(0);
    let (x, text) = (Tensor::randn([B, S, IN], OPTS), Tensor::randn([B, L, TEXT], OPTS));
    let t = Tensor::full([B], 0.5, OPTS);
    count(lora.is_some(), || model.forward(&x, &text, None, &t, &[(1, 2, 3)]).unwrap())
}

#[test]
fn qwen_image_block_counts_its_products_once_in_inference() {
    let hand: f64 = qwen_block_linears().iter().map(|&(_, r, i, o)| linear(r, i, o)).sum::<f64>()
        // Joint attention over [text; image] keys and queries.
        + attention(L + S, L + S);
    let counted = qwen_count(2, None) - qwen_count(1, None);
    println!("Qwen-Image block, inference: hand {hand}, counted {counted}");
    assert_eq!(counted, hand);
}

#[test]
fn qwen_image_block_with_lora_counts_training_work() {
    let lora = LoraConfig {
        rank: RANK,
        alpha: RANK as f64,
        target_modules: QWEN_IMAGE_TARGETS.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let hand: f64 = qwen_block_linears()
        .iter()
        .map(|&(module, r, i, o)| {
            if lora.targets(module) {
                // An adapted layer's output is in the graph: ×3 for its base and LoRA products.
                3.0 * (linear(r, i, o) + (2 * r * RANK * (i + o)) as f64)
            } else {
                // The modulation layers: frozen, fed by the frozen timestep embedder, so their
                // output is not in the graph and counts once.
                linear(r, i, o)
            }
        })
        .sum::<f64>()
        // Queries and keys come from adapted projections.
        + 3.0 * attention(L + S, L + S);
    let counted = qwen_count(2, Some(&lora)) - qwen_count(1, Some(&lora));
    println!("Qwen-Image block, LoRA r={RANK} training: hand {hand}, counted {counted}");
    assert_eq!(counted, hand);
}

/// A FLUX.1 transformer with `double` and `single` blocks under `no_grad`: the FLOPs counted.
fn flux_count(double: usize, single: usize) -> f64 {
    let config = FluxTransformerConfig {
        num_layers: double,
        num_single_layers: single,
        num_attention_heads: H,
        attention_head_dim: HEAD_DIM,
        axes_dims_rope: [4, 6, 6],
        in_channels: IN,
        joint_attention_dim: TEXT,
        pooled_projection_dim: 12,
        ..Default::default()
    };
    let model = FluxTransformer::new(&config, Device::Cpu, Kind::Float, None).unwrap();
    randomize(&model.weights);
    tch::manual_seed(0);
    let (x, text) = (Tensor::randn([B, S, IN], OPTS), Tensor::randn([B, L, TEXT], OPTS));
    let (pooled, t) = (Tensor::randn([B, 12], OPTS), Tensor::full([B], 0.5, OPTS));
    let img_ids = Tensor::zeros([S, 3], OPTS);
    let txt_ids = Tensor::zeros([L, 3], OPTS);
    count(false, || model.forward(&x, &text, &pooled, &t, &img_ids, &txt_ids, None).unwrap())
}

#[test]
fn flux_double_stream_block_counts_its_products() {
    let hand = linear(B, D, 6 * D) // norm1.linear: SiLU(temb) → 6 chunks, one row per sample
        + linear(B, D, 6 * D) // norm1_context.linear
        + 3.0 * linear(B * S, D, D) // attn.to_q, to_k, to_v (image)
        + 3.0 * linear(B * L, D, D) // attn.add_q_proj, add_k_proj, add_v_proj (text)
        + attention(L + S, L + S) // joint attention over [text; image]
        + linear(B * S, D, D) // attn.to_out.0
        + linear(B * L, D, D) // attn.to_add_out
        + linear(B * S, D, 4 * D) + linear(B * S, 4 * D, D) // ff.net.0.proj, ff.net.2
        + linear(B * L, D, 4 * D) + linear(B * L, 4 * D, D); // ff_context.net.0.proj, .net.2
    let counted = flux_count(2, 0) - flux_count(1, 0);
    println!("FLUX.1 double-stream block: hand {hand}, counted {counted}");
    assert_eq!(counted, hand);
}

#[test]
fn flux_single_stream_block_counts_its_products() {
    let n = L + S; // the joint [text; image] tokens
    let hand = linear(B, D, 3 * D) // norm.linear: (shift, scale, gate), one row per sample
        + 3.0 * linear(B * n, D, D) // attn.to_q, to_k, to_v
        + attention(n, n)
        + linear(B * n, D, 4 * D) // proj_mlp
        + linear(B * n, D + 4 * D, D); // proj_out of [attention; MLP]
    let counted = flux_count(1, 1) - flux_count(1, 0);
    println!("FLUX.1 single-stream block: hand {hand}, counted {counted}");
    assert_eq!(counted, hand);
}
