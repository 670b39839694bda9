//! Ulysses sequence parallelism over Gloo on loopback, 2 and 4 ranks, each against the same
//! computation in one process (run by every rank itself): attention, forward and backward,
//! bit-identical where the tokens divide by the ranks; a tiny Wan (text-to-video and
//! image-to-video) and a tiny Qwen-Image (masked text) in f64, token counts that do and do not
//! divide: velocity within 1e-12, parameter gradients (summed over the ranks) within 1e-12 for
//! Qwen-Image and 1e-5 for Wan (whose blocks compute in f32), relative to the largest value.
//! A tiny LTX-2 (2.0 and 2.3 layouts) splits both its video and its audio tokens (1e-5, as Wan).
#[path = "../../dist/tests/collectives/launch.rs"]
mod launch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flowtune_dist::{Backend, DistEnv, ProcessGroup, ReduceOp};
use flowtune_models::flux::{write_tiny_flux, FluxTransformer, TinyFluxSpec, GUIDANCE};
use flowtune_models::flux2::{write_tiny_flux2, Flux2Transformer, TinyFlux2Spec};
use flowtune_models::ltx2::transformer::{
    write_random_transformer, Ltx2Transformer, Ltx2TransformerConfig, AUDIO_EMBEDS, FPS,
    VIDEO_SHAPE,
};
use flowtune_models::nn::attention;
use flowtune_models::qwen_image::{write_tiny_qwen_image, QwenImageTransformer, TinyQwenImageSpec};
use flowtune_models::sd3::{write_tiny_sd3, Sd3Transformer, TinySd3Spec, WeightInit};
use flowtune_models::sequence::{SequenceGroup, SequenceParallel};
use flowtune_models::wan::{write_tiny_wan, TinyWanSpec, WanTransformer};
use flowtune_models::z_image::{write_tiny_z_image, TinyZImageSpec, ZImageTransformer};
use flowtune_models::{ModelError, TextConditioning, TrainableDenoiser, HELD_LATENTS};
use flowtune_sampling::SampleRng;
use launch::{expect_success, free_port, Proc, SCENARIO};
use tch::{Device, Kind, Tensor};

/// Not a test of its own: the entry point of the ranks the other tests spawn (a no-op otherwise).
#[test]
fn worker_process() {
    if let Ok(scenario) = std::env::var(SCENARIO) {
        let env = DistEnv::detect().unwrap().expect("launcher variables are set");
        let pg = Arc::new(ProcessGroup::new(&env, Backend::Gloo, Duration::from_secs(60)).unwrap());
        match scenario.as_str() {
            "attention" => attention_matches(&pg),
            "wan" => wan_matches(&pg),
            "qwen_image" => qwen_image_matches(&pg),
            "sd3" => sd3_matches(&pg),
            "flux" => flux_matches(&pg),
            "z_image" => z_image_matches(&pg),
            "flux2" => flux2_matches(&pg),
            "ltx2" => ltx2_matches(&pg),
            other => panic!("unknown scenario {other}"),
        }
        pg.barrier().unwrap();
    }
}

#[test]
fn ulysses_attention_equals_one_process() {
    launch_all("attention");
}

#[test]
fn tiny_wan_forward_and_backward_equal_one_process() {
    launch_all("wan");
}

#[test]
fn tiny_qwen_image_forward_and_backward_equal_one_process() {
    launch_all("qwen_image");
}

#[test]
fn tiny_sd3_forward_and_backward_equal_one_process() {
    launch_all("sd3");
}

#[test]
fn tiny_flux_forward_and_backward_equal_one_process() {
    launch_all("flux");
}

#[test]
fn tiny_z_image_forward_and_backward_equal_one_process() {
    launch_all("z_image");
}

#[test]
fn tiny_flux2_forward_and_backward_equal_one_process() {
    launch_all("flux2");
}

#[test]
fn tiny_ltx2_forward_and_backward_equal_one_process() {
    launch_all("ltx2");
}

fn launch_all(scenario: &str) {
    for world in [2, 4] {
        let port = free_port();
        let ranks = (0..world).map(|r| Proc::rank(scenario, r, world, port)).collect();
        expect_success(ranks, Duration::from_secs(300));
    }
}

struct Group(Arc<ProcessGroup>);

impl SequenceGroup for Group {
    fn rank(&self) -> usize {
        self.0.rank()
    }

    fn size(&self) -> usize {
        self.0.size()
    }

    fn exchange(&self, x: &Tensor, scatter: i64, gather: i64) -> Result<Tensor, ModelError> {
        self.0.exchange(x, scatter, gather).map_err(|e| ModelError::Collective(e.to_string()))
    }

    fn all_gather(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let mut shape = x.size();
        shape[0] *= self.0.size() as i64;
        let mut out = Tensor::zeros(&shape, (x.kind(), x.device()));
        self.0.all_gather_into(&mut out, x).map_err(|e| ModelError::Collective(e.to_string()))?;
        Ok(out)
    }
}

/// `t` summed over the ranks.
fn summed(pg: &ProcessGroup, t: &Tensor) -> Tensor {
    let mut t = t.contiguous();
    pg.all_reduce_(&mut t, ReduceOp::Sum).unwrap();
    t
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

fn leaf(t: &Tensor) -> Tensor {
    t.detach().copy().set_requires_grad(true)
}

fn attention_matches(pg: &Arc<ProcessGroup>) {
    let sp = SequenceParallel(Arc::new(Group(pg.clone())));
    let n = pg.size() as i64;
    for kind in [Kind::Double, Kind::Float] {
        for len in [3 * n, 3 * n - 1] {
            tch::manual_seed(0);
            let qkv: Vec<Tensor> =
                (0..3).map(|_| Tensor::randn([2, len, 2 * n, 8], (kind, Device::Cpu))).collect();
            let w = Tensor::randn([2, len, 2 * n, 8], (kind, Device::Cpu));
            let one: Vec<Tensor> = qkv.iter().map(leaf).collect();
            let t = |x: &Tensor| x.transpose(1, 2);
            let full = attention(&t(&one[0]), &t(&one[1]), &t(&one[2]), None, false, None);
            let full = full.transpose(1, 2);
            (&full * &w).sum(kind).backward();

            let mine: Vec<Tensor> = qkv.iter().map(leaf).collect();
            let local: Vec<Tensor> = mine.iter().map(|x| sp.split(x, 1)).collect();
            let mask = sp.key_mask(&[(len, None)], Device::Cpu);
            let out = sp.attention(&local[0], &local[1], &local[2], mask.as_ref()).unwrap();
            let out = sp.gather(&out, len).unwrap();
            (&out * &w).sum(kind).backward();
            let grads: Vec<Tensor> = mine.iter().map(|x| summed(pg, &x.grad())).collect();
            let what = format!("{kind:?}, {len} tokens over {n} ranks");
            if len % n == 0 {
                assert!(out.equal(&full), "attention, {what}: {}", max_diff(&out, &full));
                for (g, x) in grads.iter().zip(&one) {
                    assert!(g.equal(&x.grad()), "gradient, {what}: {}", max_diff(g, &x.grad()));
                }
            } else {
                // Padded keys are masked: another kernel path, equal to rounding.
                let tol = if kind == Kind::Double { 1e-12 } else { 1e-5 };
                let d = max_diff(&out, &full);
                let dg =
                    grads.iter().zip(&one).map(|(g, x)| max_diff(g, &x.grad())).fold(0.0, f64::max);
                println!("attention, {what}: output {d:.3e}, gradients {dg:.3e}");
                assert!(d <= tol && dg <= tol, "{what}: output {d:e}, gradients {dg:e}");
            }
        }
    }
}

/// A tiny Wan (4 heads) in f64, loaded twice: one runs on whole samples, one split over the ranks.
fn wan_matches(pg: &Arc<ProcessGroup>) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_wan(dir.path(), &TinyWanSpec { heads: 4, ..Default::default() }).unwrap();
    let load =
        || WanTransformer::load(&dir.path().join("transformer"), Device::Cpu, Kind::Double, None);
    let (one, split) = (load().unwrap(), load().unwrap());
    split.sequence_parallel(SequenceParallel(Arc::new(Group(pg.clone())))).unwrap();
    // Blocks recomputed in backward rerun their exchanges (and keep what they need alive).
    split.set_gradient_checkpointing(true);
    let c = one.config.clone();
    // (frames, rows, columns) of latents: 3·2·3 = 18 tokens and 3·1·5 = 15 (patch 1×2×2).
    for grid in [[3, 4, 6], [3, 2, 10]] {
        for held in [false, true] {
            tch::manual_seed(1);
            let latents = Tensor::randn([2, c.in_channels, grid[0], grid[1], grid[2]], F64);
            let mut text = TextConditioning::new(Tensor::randn([2, 5, c.text_dim], F64), None);
            if held {
                text.extras.insert(HELD_LATENTS.into(), latents.narrow(2, 0, 1).randn_like());
            }
            let what = format!(
                "Wan, {} tokens, {}",
                grid[0] * grid[1] * grid[2] / 4,
                if held { "image-to-video" } else { "text-to-video" },
            );
            // Wan's modulations, residual stream and norms run in f32 whatever the weights'
            // dtype (as diffusers' do): gradients summed over other token splits differ at f32's
            // rounding; everything else is f64.
            compare(pg, (&what, 1e-5), &one, &split, &latents, &text);
        }
    }
}

/// A tiny Qwen-Image (4 heads) in f64, as [`wan_matches`]: joint attention over text (masked,
/// rows of different lengths) and image tokens, both split over the ranks.
fn qwen_image_matches(pg: &Arc<ProcessGroup>) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_qwen_image(dir.path(), &TinyQwenImageSpec { heads: 4, ..Default::default() })
        .unwrap();
    let path = dir.path().join("transformer");
    let load = || QwenImageTransformer::load(&path, Device::Cpu, Kind::Double, None);
    let (one, split) = (load().unwrap(), load().unwrap());
    split.sequence_parallel(SequenceParallel(Arc::new(Group(pg.clone())))).unwrap();
    // Blocks recomputed in backward rerun their exchanges (and keep what they need alive).
    split.set_gradient_checkpointing(true);
    let c = one.config.clone();
    // Latent (rows, columns): 4·3 = 12 and 3·3 = 9 image tokens (patch 2); 5 or 8 text tokens.
    for (size, text_len) in [([8, 6], 8), ([6, 6], 5)] {
        tch::manual_seed(2);
        let latents = Tensor::randn([2, c.latent_channels(), size[0], size[1]], F64);
        let mut text =
            TextConditioning::new(Tensor::randn([2, text_len, c.joint_attention_dim], F64), None);
        let mask = Tensor::ones([2, text_len], (Kind::Int64, Device::Cpu));
        let _ = mask.get(1).narrow(0, text_len - 2, 2).fill_(0);
        text.mask = Some(mask);
        let what =
            format!("Qwen-Image, {} image and {text_len} text tokens", size[0] * size[1] / 4);
        compare(pg, (&what, 1e-12), &one, &split, &latents, &text);
    }
}

/// A tiny SD3.5-Medium layout (4 heads, an image-only attention in block 0) in f64, as
/// [`qwen_image_matches`]: image then text tokens in the joint sequence, both split.
fn sd3_matches(pg: &Arc<ProcessGroup>) {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySd3Spec { heads: 4, dual_attention_layers: vec![0], ..Default::default() };
    write_tiny_sd3(dir.path(), &spec).unwrap();
    let path = dir.path().join("transformer");
    let load = || Sd3Transformer::load(&path, Device::Cpu, Kind::Double, None);
    let (one, split) = (load().unwrap(), load().unwrap());
    split.sequence_parallel(SequenceParallel(Arc::new(Group(pg.clone())))).unwrap();
    // Blocks recomputed in backward rerun their exchanges (and keep what they need alive).
    split.set_gradient_checkpointing(true);
    let c = one.config.clone();
    // Latent (rows, columns): 4·3 = 12 and 3·3 = 9 image tokens (patch 2); 8 or 5 text tokens.
    for (size, text_len) in [([8, 6], 8), ([6, 6], 5)] {
        tch::manual_seed(3);
        let latents = Tensor::randn([2, c.in_channels, size[0], size[1]], F64);
        let embeds = Tensor::randn([2, text_len, c.joint_attention_dim], F64);
        let text =
            TextConditioning::new(embeds, Some(Tensor::randn([2, c.pooled_projection_dim], F64)));
        let what = format!("SD3, {} image and {text_len} text tokens", size[0] * size[1] / 4);
        compare(pg, (&what, 1e-12), &one, &split, &latents, &text);
    }
}

/// A tiny FLUX.1 (4 heads, double- and single-stream blocks) in f64, as [`sd3_matches`]: text
/// then image tokens, both split, through both kinds of block.
fn flux_matches(pg: &Arc<ProcessGroup>) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_flux(dir.path(), &TinyFluxSpec { heads: 4, ..Default::default() }).unwrap();
    let path = dir.path().join("transformer");
    let load = || FluxTransformer::load(&path, Device::Cpu, Kind::Double, None);
    let (one, split) = (load().unwrap(), load().unwrap());
    split.sequence_parallel(SequenceParallel(Arc::new(Group(pg.clone())))).unwrap();
    // Blocks recomputed in backward rerun their exchanges (and keep what they need alive).
    split.set_gradient_checkpointing(true);
    let c = one.config.clone();
    // Latent (rows, columns): 4·3 = 12 and 3·3 = 9 image tokens (2×2 packing); 8 or 5 text.
    for (size, text_len) in [([8, 6], 8), ([6, 6], 5)] {
        tch::manual_seed(4);
        let latents = Tensor::randn([2, c.in_channels / 4, size[0], size[1]], F64);
        let embeds = Tensor::randn([2, text_len, c.joint_attention_dim], F64);
        let pooled = Tensor::randn([2, c.pooled_projection_dim], F64);
        let mut text = TextConditioning::new(embeds, Some(pooled));
        if c.guidance_embeds {
            text.extras.insert(GUIDANCE.into(), Tensor::from_slice(&[3.5f64, 3.5]));
        }
        let what = format!("FLUX.1, {} image and {text_len} text tokens", size[0] * size[1] / 4);
        compare(pg, (&what, 1e-12), &one, &split, &latents, &text);
    }
}

/// A tiny Z-Image (4 heads) in f64, as [`qwen_image_matches`]: noise and context refiners and the
/// unified stack, captions of different lengths (masked), all split.
fn z_image_matches(pg: &Arc<ProcessGroup>) {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinyZImageSpec { heads: 4, axes_dims: vec![4, 6, 6], ..Default::default() };
    write_tiny_z_image(dir.path(), &spec).unwrap();
    let path = dir.path().join("transformer");
    let load = || ZImageTransformer::load(&path, Device::Cpu, Kind::Double, None);
    let (one, split) = (load().unwrap(), load().unwrap());
    split.sequence_parallel(SequenceParallel(Arc::new(Group(pg.clone())))).unwrap();
    split.set_gradient_checkpointing(true);
    let c = one.config.clone();
    for (size, text_len) in [([8, 6], 8), ([6, 6], 40)] {
        tch::manual_seed(5);
        let latents = Tensor::randn([2, c.in_channels, size[0], size[1]], F64);
        let mut text =
            TextConditioning::new(Tensor::randn([2, text_len, c.cap_feat_dim], F64), None);
        let mask = Tensor::ones([2, text_len], (Kind::Int64, Device::Cpu));
        let _ = mask.get(1).narrow(0, text_len - 3, 3).fill_(0);
        text.mask = Some(mask);
        let what = format!("Z-Image, {} image and {text_len} text tokens", size[0] * size[1] / 4);
        compare(pg, (&what, 1e-12), &one, &split, &latents, &text);
    }
}

/// A tiny FLUX.2 (4 heads) in f64, as [`flux_matches`].
fn flux2_matches(pg: &Arc<ProcessGroup>) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_flux2(dir.path(), &TinyFlux2Spec { heads: 4, ..Default::default() }).unwrap();
    let path = dir.path().join("transformer");
    let load = || Flux2Transformer::load(&path, Device::Cpu, Kind::Double, None);
    let (one, split) = (load().unwrap(), load().unwrap());
    split.sequence_parallel(SequenceParallel(Arc::new(Group(pg.clone())))).unwrap();
    split.set_gradient_checkpointing(true);
    let c = one.config.clone();
    // Latent (rows, columns): 12 and 9 image tokens (no patching); 8 or 5 text tokens.
    for (size, text_len) in [([4, 3], 8), ([3, 3], 5)] {
        tch::manual_seed(6);
        let latents = Tensor::randn([2, c.in_channels, size[0], size[1]], F64);
        let embeds = Tensor::randn([2, text_len, c.joint_attention_dim], F64);
        let mut text = TextConditioning::new(embeds, None);
        if c.guidance_embeds {
            text.extras.insert(GUIDANCE.into(), Tensor::from_slice(&[3.5f64, 3.5]));
        }
        let what = format!("FLUX.2, {} image and {text_len} text tokens", size[0] * size[1]);
        compare(pg, (&what, 1e-12), &one, &split, &latents, &text);
    }
}

/// A tiny LTX-2 in the 2.0 and the 2.3 layout (4 video and 4 audio heads) in f64, as
/// [`wan_matches`]: video and audio tokens both split (self-attention and the audio↔video
/// attentions through Ulysses), the text local and masked; and head counts that do not divide by
/// the group refused by name.
fn ltx2_matches(pg: &Arc<ProcessGroup>) {
    let group = || SequenceParallel(Arc::new(Group(pg.clone())));
    let tiny = Ltx2TransformerConfig {
        num_attention_heads: 4,
        attention_head_dim: 4,
        audio_num_attention_heads: 4,
        audio_attention_head_dim: 4,
        ..Ltx2TransformerConfig::tiny()
    };
    let ltx23 = tiny.clone().with_ltx23_layout(6, 24);
    for (layout, config) in [("LTX-2.0", tiny.clone()), ("LTX-2.3", ltx23)] {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = SampleRng::new(7);
        write_random_transformer(dir.path(), &config, &mut rng, WeightInit::Normal(0.1), F64.0)
            .unwrap();
        let load = || Ltx2Transformer::load(dir.path(), Device::Cpu, Kind::Double, None);
        let (one, split) = (load().unwrap(), load().unwrap());
        split.sequence_parallel(group()).unwrap();
        split.set_gradient_checkpointing(true);
        let c = &one.config;
        // Latent video (frames, rows, columns) → 9 and 8 video tokens (patch 1); 7 and 6 audio;
        // image-to-video holds the first frame's tokens (per-token video timesteps).
        let cases = [([3, 1, 3], 7, false), ([2, 2, 2], 6, false), ([3, 1, 3], 7, true)];
        for (video, audio, held) in cases {
            tch::manual_seed(7);
            let tokens = video.iter().product::<i64>() + audio;
            let latents = Tensor::randn([2, tokens, c.in_channels], F64);
            let mut text =
                TextConditioning::new(Tensor::randn([2, 5, c.video_text_dim()], F64), None);
            let mask = Tensor::ones([2, 5], (Kind::Int64, Device::Cpu));
            let _ = mask.get(1).narrow(0, 3, 2).fill_(0);
            text.mask = Some(mask);
            let extras = [
                (AUDIO_EMBEDS, Tensor::randn([2, 5, c.audio_text_dim()], F64)),
                (VIDEO_SHAPE, Tensor::from_slice(&video).repeat([2, 1])),
                (FPS, Tensor::from_slice(&[24.0f32, 25.0])),
            ];
            text.extras.extend(extras.into_iter().map(|(k, v)| (k.to_string(), v)));
            if held {
                let first = latents.narrow(1, 0, video[1] * video[2]).randn_like();
                text.extras.insert(HELD_LATENTS.into(), first);
            }
            let what = format!(
                "{layout}, {} video and {audio} audio tokens{}",
                tokens - audio,
                if held { ", image-to-video" } else { "" }
            );
            // The query and key norms' statistics are f32 (as diffusers'): the text keys'
            // gradients, partial sums over each rank's queries, differ at f32's rounding (1e-8);
            // everything else is f64.
            compare(pg, (&what, 1e-5), &one, &split, &latents, &text);
        }
    }

    // 3 video or audio heads (8 wide) do not divide by 2 or 4.
    for key in ["num_attention_heads", "audio_num_attention_heads"] {
        let mut c = tiny.clone();
        if key == "num_attention_heads" {
            (c.num_attention_heads, c.attention_head_dim, c.cross_attention_dim) = (3, 8, 24);
        } else {
            (c.audio_num_attention_heads, c.audio_attention_head_dim) = (3, 8);
            c.audio_cross_attention_dim = 24;
        }
        let model = Ltx2Transformer::new(&c, Device::Cpu, Kind::Double, None).unwrap();
        let err = model.sequence_parallel(group()).unwrap_err().to_string();
        assert!(err.contains(&format!(" {key} 3")), "{err}");
    }
}

const F64: (Kind, Device) = (Kind::Double, Device::Cpu);

/// The velocity of `latents` and the gradients of Σ velocity·w from `one` (whole samples) and
/// `split` (this rank's tokens, checkpointed blocks; gradients summed over the ranks): velocity
/// within 1e-12 and
/// gradients within `grad_tol`, relative to the largest value.
fn compare(
    pg: &ProcessGroup,
    (what, grad_tol): (&str, f64),
    one: &dyn TrainableDenoiser,
    split: &dyn TrainableDenoiser,
    latents: &Tensor,
    text: &TextConditioning,
) {
    let t = Tensor::from_slice(&[300.0f32, 800.0]);
    let w = latents.randn_like();
    let run = |model: &dyn TrainableDenoiser| -> (Tensor, BTreeMap<String, Tensor>) {
        let params = model.full_parameters();
        for p in params.values() {
            flowtune_recompute::clear_grad(p);
        }
        let v = model.velocity(latents, &t, text).unwrap();
        (&v * &w).sum(Kind::Double).backward();
        // A weight that does not reach the output (the last block's text stream) has none.
        let grad = |p: &Tensor| if p.grad().defined() { p.grad() } else { p.zeros_like() };
        let grads = params.iter().map(|(k, p)| (k.clone(), grad(p))).collect();
        (v.detach(), grads)
    };
    let (v_one, g_one) = run(one);
    let recomputed = flowtune_recompute::recomputed_blocks();
    let (v_split, g_split) = run(split);
    assert!(flowtune_recompute::recomputed_blocks() > recomputed, "{what}: nothing recomputed");
    let dv = max_diff(&v_split, &v_one) / v_one.abs().max().double_value(&[]).max(1.0);
    let mut dg: f64 = 0.0;
    for (name, g) in &g_split {
        let (g, r) = (summed(pg, g), &g_one[name]);
        dg = dg.max(max_diff(&g, r) / r.abs().max().double_value(&[]).max(1.0));
    }
    let what = format!("{what} over {} ranks", pg.size());
    println!("{what}: velocity {dv:.3e}, gradients {dg:.3e} (relative)");
    assert!(dv <= 1e-12 && dg <= grad_tol, "{what}: velocity {dv:e}, gradients {dg:e}");
}
