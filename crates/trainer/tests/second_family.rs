//! A second model family that only this test registers: a tiny MLP denoiser over 5-D (video-shaped)
//! latents `(B, C, F, H, W)` with a parameter-free text encoder. It goes through the unchanged
//! trainer — registry, its own sigma schedule (dynamic shift), two-forward "true CFG", rollout
//! engine, Flow-GRPO step, LoRA checkpoints, resume — which is what adding a family has to cost:
//! model code plus one registry line.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{lora_moved, root, scratch, tensors};
use flowtune_config::Recipe;
use flowtune_models::denoiser::copy_frozen;
use flowtune_models::lora::LoraConfig;
use flowtune_models::nn::Linear;
use flowtune_models::pipeline::PipelineDir;
use flowtune_models::{
    rescaled_guidance, Denoiser, ExampleInputs, ExampleShape, Family, FlowPipeline, ModelError,
    ModelWeights, PipelineOptions, TextConditioning, TrainableDenoiser, WeightsBuilder,
};
use flowtune_rollout::Engine;
use flowtune_sampling::{GridRequest, Pipeline, SampleRng, SchedulerConfig, SigmaGrid};
use flowtune_trainer::train;
use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

/// Width of the made-up text features.
const TEXT: i64 = 8;

/// `transformer/config.json` of the test family.
#[derive(Clone, Serialize, Deserialize)]
struct MlpConfig {
    #[serde(rename = "_class_name")]
    class_name: String,
    channels: i64,
    frames: i64,
    hidden: i64,
    seed: u64,
}

/// `v = net.2(silu(net.0([x, text, t])))`, applied at every (frame, pixel).
struct MlpDenoiser {
    config: MlpConfig,
    net0: Linear,
    net2: Linear,
    weights: ModelWeights,
}

impl MlpDenoiser {
    fn new(config: &MlpConfig, device: Device, lora: Option<&LoraConfig>) -> Self {
        let weights = WeightsBuilder::new(device, Kind::Float, lora);
        let net = &weights.root() / "net";
        let (c, h) = (config.channels, config.hidden);
        let net0 = (&net / 0).linear(c + TEXT + 1, h, true);
        let net2 = (&net / 2).linear(h, c, true);
        // No transformer blocks: nothing to shard.
        let weights = weights.finish(&[]).expect("adapters");
        // Base weights from the config's seed, in name order.
        let mut rng = SampleRng::new(config.seed);
        let mut vars: Vec<(String, Tensor)> = weights.base.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        tch::no_grad(|| {
            for (_, v) in &vars {
                v.shallow_clone().copy_(&(rng.normal(&v.size(), device) * 0.3));
            }
        });
        Self { config: config.clone(), net0, net2, weights }
    }
}

impl Denoiser for MlpDenoiser {
    fn velocity(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &TextConditioning,
    ) -> Result<Tensor, ModelError> {
        let s = latents.size();
        if s.len() != 5 || s[1] != self.config.channels {
            return Err(ModelError::Input(format!("latents {s:?}: expected (B, C, F, H, W)")));
        }
        let pooled = text.pooled.as_ref().ok_or_else(|| ModelError::Input("no pooled".into()))?;
        let x = latents.permute([0, 2, 3, 4, 1]);
        let rows =
            |t: &Tensor| t.view([s[0], 1, 1, 1, -1]).expand([s[0], s[2], s[3], s[4], -1], false);
        let inputs = Tensor::cat(&[x, rows(pooled), rows(&(timestep / 1000.0))], -1);
        let v = self.net2.forward(&self.net0.forward(&inputs).silu());
        Ok(v.permute([0, 4, 1, 2, 3]))
    }

    /// Two forwards and "true CFG" rescaled over channels: the other flavour of guidance.
    fn batched_cfg(&self) -> bool {
        false
    }

    fn combine_guidance(&self, cond: &Tensor, uncond: &Tensor, scale: f64) -> Tensor {
        rescaled_guidance(cond, uncond, scale, &[1])
    }
}

impl TrainableDenoiser for MlpDenoiser {
    fn weights(&self) -> &ModelWeights {
        &self.weights
    }
    fn weights_mut(&mut self) -> &mut ModelWeights {
        &mut self.weights
    }
    fn frozen_copy(&self) -> Result<Box<dyn TrainableDenoiser>, ModelError> {
        let mut copy = Self::new(&self.config, self.weights.base.device(), None);
        copy_frozen(&self.weights.base, &mut copy.weights.base, |_| true)?;
        Ok(Box::new(copy))
    }
    fn example_inputs(&self, shape: ExampleShape) -> ExampleInputs {
        let ExampleShape { batch, height, width, .. } = shape;
        let c = &self.config;
        ExampleInputs {
            latents: Tensor::randn(
                [batch, c.channels, c.frames, height, width],
                tch::kind::FLOAT_CPU,
            ),
            timestep: Tensor::full([batch], 500.0, tch::kind::FLOAT_CPU),
            text: TextConditioning::new(
                Tensor::randn([batch, 1, TEXT], tch::kind::FLOAT_CPU),
                Some(Tensor::randn([batch, TEXT], tch::kind::FLOAT_CPU)),
            ),
            tokens: batch * c.frames * height * width,
        }
    }
    fn describe(&self) -> String {
        format!("MLP denoiser, hidden {}", self.config.hidden)
    }
}

/// The test family's pipeline: no VAE (latents are frames of pixels), a byte-statistics text
/// encoder, a flow-matching scheduler with dynamic shifting.
struct TinyVideoPipeline {
    dir: PipelineDir,
    scheduler: SchedulerConfig,
    denoiser: MlpDenoiser,
}

impl FlowPipeline for TinyVideoPipeline {
    fn dir(&self) -> &PipelineDir {
        &self.dir
    }
    fn device(&self) -> Device {
        self.denoiser.weights.base.device()
    }
    fn scheduler(&self) -> &SchedulerConfig {
        &self.scheduler
    }
    fn denoiser(&self) -> &dyn TrainableDenoiser {
        &self.denoiser
    }
    fn denoiser_mut(&mut self) -> &mut dyn TrainableDenoiser {
        &mut self.denoiser
    }
    fn encode_prompts(&self, prompts: &[&str]) -> Result<TextConditioning, ModelError> {
        let features: Vec<f32> = prompts
            .iter()
            .flat_map(|p| {
                (1..=TEXT as u32).map(move |j| {
                    let n = p.len().max(1) as f32;
                    p.bytes().map(|b| ((b as u32 * j) % 17) as f32 / 17.0).sum::<f32>() / n
                })
            })
            .collect();
        let pooled = Tensor::from_slice(&features).view([prompts.len() as i64, TEXT]);
        let pooled = pooled.to_device(self.device());
        Ok(TextConditioning::new(pooled.unsqueeze(1), Some(pooled)))
    }
    fn latent_shape(&self, height: i64, width: i64) -> Result<Vec<i64>, ModelError> {
        let c = &self.denoiser.config;
        Ok(vec![c.channels, c.frames, height, width])
    }
    /// Flux-style explicit sigmas, shifted by the clip's token count.
    fn grid_request(&self, steps: usize, latent_shape: &[i64]) -> GridRequest {
        let tokens = latent_shape[1..].iter().product::<i64>() as u64;
        GridRequest { steps, pipeline: Pipeline::Flux, image_seq_len: Some(tokens), sigmas: None }
    }
    /// Frames side by side: (B, C, F, H, W) → (B, H, F·W, 3).
    fn decode_rgb8(&self, latents: &Tensor) -> Result<Tensor, ModelError> {
        let (b, _, f, h, w) = latents.size5()?;
        let frames = latents.permute([0, 3, 2, 4, 1]).reshape([b, h, f * w, 3]);
        Ok(((frames.clamp(-1.0, 1.0) + 1.0) * 127.5).round().to_kind(Kind::Uint8))
    }
    fn encode_rgb8(&self, images: &Tensor) -> Result<Tensor, ModelError> {
        let (b, h, fw, _) = images.size4()?;
        let f = self.denoiser.config.frames;
        let pixels = images.to_kind(Kind::Float) / 127.5 - 1.0;
        Ok(pixels.reshape([b, h, f, fw / f, 3]).permute([0, 4, 2, 1, 3]))
    }
    fn trained_stores(&self) -> Vec<(&'static str, &'static str, &VarStore)> {
        vec![("transformer", "diffusion_pytorch_model.safetensors", &self.denoiser.weights.base)]
    }
}

fn load(dir: &PipelineDir, options: &PipelineOptions) -> Result<Box<dyn FlowPipeline>, ModelError> {
    let config: MlpConfig =
        flowtune_models::read_config(&dir.root.join("transformer/config.json"))?;
    Ok(Box::new(TinyVideoPipeline {
        dir: dir.clone(),
        scheduler: SchedulerConfig { use_dynamic_shifting: true, ..Default::default() },
        denoiser: MlpDenoiser::new(&config, options.device, options.lora.as_ref()),
    }))
}

fn load_denoiser(
    dir: &Path,
    device: Device,
    _: Kind,
    lora: Option<&LoraConfig>,
) -> Result<Box<dyn TrainableDenoiser>, ModelError> {
    let config: MlpConfig = flowtune_models::read_config(&dir.join("config.json"))?;
    Ok(Box::new(MlpDenoiser::new(&config, device, lora)))
}

fn write_tiny(dir: &Path, seed: u64) -> Result<(), ModelError> {
    let config = MlpConfig {
        class_name: "TinyMlpDenoiser".into(),
        channels: 3,
        frames: 2,
        hidden: 16,
        seed,
    };
    std::fs::create_dir_all(dir.join("transformer")).expect("folder");
    let index = serde_json::json!({
        "_class_name": "TinyVideoPipeline",
        "transformer": ["flowtune_test", "TinyMlpDenoiser"],
    });
    flowtune_models::write_json(&dir.join("model_index.json"), &index)?;
    flowtune_models::write_json(&dir.join("transformer/config.json"), &config)
}

/// The test family's registry line.
static FAMILY: Family = Family {
    name: "tiny_video",
    pipeline_classes: &["TinyVideoPipeline"],
    refused_classes: &[],
    denoiser_class: "TinyMlpDenoiser",
    lora_targets: &["net.0", "net.2"],
    components: &[("transformer", "TinyMlpDenoiser")],
    load,
    load_denoiser,
    write_tiny,
    condition_sizes: flowtune_models::condition_sizes::no_tokens,
};

/// The family registered once, and one pipeline of it on disk for every test.
fn pipeline() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        flowtune_models::registry::register(&FAMILY);
        let dir = flowtune_fixtures::shared!("tiny-video-pipeline");
        (flowtune_models::family_named("tiny_video").unwrap().write_tiny)(&dir, 7).unwrap();
        dir
    })
}

fn recipe(out: &Path, steps: u64, resume: &str) -> Recipe {
    let overrides = [
        format!("model.path={}", pipeline().display()),
        "model.resolution=8".into(),
        "model.lora.target_modules=[net.0, net.2]".into(),
        format!("data.train_files=[{}]", root().join("examples/prompts/tiny.txt").display()),
        format!("trainer.output_dir={}", out.display()),
        format!("trainer.total_steps={steps}"),
        "trainer.save_freq=1".into(),
        "trainer.image_freq=2".into(),
        format!("trainer.resume={resume}"),
    ];
    Recipe::load(&root().join("examples/flow_grpo_tiny.yaml"), &overrides).expect("recipe")
}

#[test]
fn the_family_s_schedule_reaches_the_sampler() {
    let out = scratch("video-grid");
    let recipe = recipe(&out, 1, "none");
    let pipe =
        flowtune_models::load_pipeline(&recipe.model.path, &PipelineOptions::new(Device::Cpu))
            .expect("a registered family loads by its class");
    let shape = pipe.latent_shape(8, 8).unwrap();
    assert_eq!(shape, [3, 2, 8, 8], "5-D latents");
    let engine = Engine::new(pipe.as_ref(), &recipe.rollout, shape, 0).unwrap();
    let flux = GridRequest {
        steps: recipe.rollout.steps,
        pipeline: Pipeline::Flux,
        image_seq_len: Some(128),
        sigmas: None,
    };
    let want = SigmaGrid::new(pipe.scheduler(), &flux).unwrap();
    assert_eq!(engine.grid.sigmas, want.sigmas);
    let plain = GridRequest { steps: recipe.rollout.steps, ..Default::default() };
    let unshifted = SigmaGrid::new(&SchedulerConfig::default(), &plain).unwrap();
    assert_ne!(engine.grid.sigmas, unshifted.sigmas, "the dynamic shift applies");
}

#[test]
fn a_registered_video_family_trains_and_resumes_through_the_unchanged_trainer() {
    // Two straight Flow-GRPO steps on 5-D latents.
    let straight = scratch("video-straight");
    let summary = train(&recipe(&straight, 2, "none"), Device::Cpu).expect("train");
    let first = &summary.metrics[0];
    assert!(first.values().all(|v| v.is_finite()), "{first:?}");
    assert!((first["actor/ratio_mean"] - 1.0).abs() <= 1e-6, "on-policy at step 1: {first:?}");
    let lora = tensors(&summary.export);
    assert!(lora_moved(&lora), "the LoRA trained");
    assert!(lora.keys().all(|k| k.starts_with("transformer.net.")), "{:?}", lora.keys());
    // The training grid shows the decoded clips (frames side by side), and plays them.
    assert!(image::open(straight.join("images/train_step_000002.png")).is_ok());
    let gif = std::fs::File::open(straight.join("images/train_step_000002.gif")).expect("a GIF");
    let decoder = image::codecs::gif::GifDecoder::new(std::io::BufReader::new(gif)).unwrap();
    let played = image::AnimationDecoder::into_frames(decoder).collect_frames().unwrap();
    assert_eq!(played.len(), 2, "one grid per frame of the clips");

    // One step, then a resumed second step, gives the same adapters and step-2 metrics.
    let resumed = scratch("video-resumed");
    train(&recipe(&resumed, 1, "none"), Device::Cpu).expect("first step");
    let again = train(&recipe(&resumed, 2, "auto"), Device::Cpu).expect("resumed step");
    assert_eq!(again.steps_run, 1, "resumed from step 1");
    let after = tensors(&again.export);
    for (name, t) in &lora {
        let diff = (t - &after[name]).abs().max().double_value(&[]);
        assert!(diff <= 1e-6 * (1.0 + t.abs().max().double_value(&[])), "{name}: {diff}");
    }
    for key in ["critic/rewards/mean", "actor/loss", "actor/ratio_mean"] {
        let (a, b) = (summary.metrics[1][key], again.metrics[0][key]);
        assert!((a - b).abs() <= 1e-6 * (1.0 + a.abs()), "{key}: {a} vs {b}");
    }
}
