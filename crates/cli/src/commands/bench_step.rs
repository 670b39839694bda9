//! `flowtune bench step RECIPE [KEY=VALUE…]`: whole training steps of a recipe — rollout with its
//! CFG and SDE window, rewards, old log-probs, the update — timed by phase, with images and tokens
//! per second, the model FLOP utilisation of rollout and update, and peak memory beside
//! `flowtune plan`'s figure for the same recipe. With `--random-weights` no weight file is read:
//! every component is built from the pipeline's configs with seeded random values on the device,
//! and the text encoders are replaced by stand-in prompt embeddings (`--text-tokens` long).
//! Nothing is written but the report: no checkpoints, no exported weights.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use clap::Args;
use flowtune_config::Recipe;
use flowtune_models::RandomWeights;
use flowtune_objectives::Metrics;
use flowtune_plan::{plan, Pipeline, GIB};
use flowtune_trainer::{status_bytes, train_with, TrainOptions};
use serde_json::{json, Value};
use tch::Device;

use crate::device::DeviceArg;
use crate::Failure;

#[derive(Args)]
pub struct StepArgs {
    /// A YAML recipe.
    recipe: PathBuf,
    /// Overrides like `rollout.n=16`.
    overrides: Vec<String>,
    /// Build every component from the pipeline's `config.json` files with seeded random weights
    /// on the device (a folder of configs is enough); prompts become stand-in embeddings.
    #[arg(long)]
    random_weights: bool,
    /// Seed of the random weights and stand-in embeddings.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Text tokens of every stand-in prompt embedding (negative prompts too).
    #[arg(long, default_value_t = 32)]
    text_tokens: i64,
    /// Transformer blocks: every block count of the denoiser configs (real width, fewer blocks);
    /// with `--random-weights`.
    #[arg(long)]
    layers: Option<u64>,
    /// Condition pictures every prompt names, as `WIDTHxHEIGHT` (comma-separated): image
    /// editing and FLUX.2 references, sized by the pipeline as a user's pictures would be.
    #[arg(long, value_delimiter = ',', value_parser = picture_size)]
    pictures: Vec<(u32, u32)>,
    /// Steps run before the measured one.
    #[arg(long, default_value_t = 1)]
    warmup: u64,
    /// The reward scored (a recipe `reward.functions` entry name); cheap by default: mean
    /// brightness.
    #[arg(long, default_value = "brightness")]
    reward: String,
    /// Activation constants measured by `scripts/measure_activation_constants.py --json` for the
    /// plan's figure (as `flowtune plan --constants`).
    #[arg(long)]
    constants: Option<PathBuf>,
    /// Writes the report as JSON here too.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also runs the step ROUNDS times with `reward.overlap` on and ROUNDS times off, alternating
    /// which goes first, and reports how much of the scoring the overlap hides.
    #[arg(long, default_value_t = 0)]
    overlap_ab: u32,
}

/// `WIDTHxHEIGHT` as two positive sides.
fn picture_size(text: &str) -> Result<(u32, u32), String> {
    let sides =
        text.split_once(['x', '×']).and_then(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)));
    sides
        .filter(|&(w, h)| w > 0 && h > 0)
        .ok_or_else(|| format!("{text}: expected WIDTHxHEIGHT, e.g. 1024x768"))
}

/// The prompt file of `count` prompt groups, every row naming the `pictures` (written beside it
/// as opaque PNGs with some structure); plain lines without pictures.
fn prompt_file(dir: &Path, count: u64, pictures: &[(u32, u32)]) -> anyhow::Result<PathBuf> {
    let prompt = |i| format!("a sign that says \"step {i}\"");
    if pictures.is_empty() {
        let path = dir.join("prompts.txt");
        std::fs::write(&path, (0..count).map(|i| prompt(i) + "\n").collect::<String>())?;
        return Ok(path);
    }
    let mut names = vec![];
    for (i, &(w, h)) in pictures.iter().enumerate() {
        let name = format!("picture{i}.png");
        let pixel = |x: u32, y: u32| image::Rgb([(x * 3 + y) as u8, (y * 5) as u8, (x ^ y) as u8]);
        image::RgbImage::from_fn(w, h, pixel).save(dir.join(&name))?;
        names.push(name);
    }
    let rows = (0..count).map(|i| serde_json::json!({"prompt": prompt(i), "images": names}));
    let path = dir.join("prompts.jsonl");
    std::fs::write(&path, rows.map(|r| r.to_string() + "\n").collect::<String>())?;
    Ok(path)
}

/// The block counts `--layers` sets in a denoiser's config.
const BLOCK_KEYS: [&str; 3] = ["num_layers", "num_single_layers", "n_layers"];

/// Copies the JSON configs of pipeline `from` (index, component configs, scheduler) to `to`,
/// with every denoiser block count set to `layers`.
fn copy_configs(from: &Path, to: &Path, layers: Option<u64>) -> anyhow::Result<()> {
    let index = from.join("model_index.json");
    let text = std::fs::read_to_string(&index).with_context(|| index.display().to_string())?;
    std::fs::create_dir_all(to)?;
    std::fs::write(to.join("model_index.json"), text)?;
    for entry in std::fs::read_dir(from)? {
        let dir = entry?.path();
        let Some(name) = dir.file_name().and_then(|n| n.to_str()).map(String::from) else {
            continue;
        };
        if !dir.is_dir() {
            continue;
        }
        for file in ["config.json", "scheduler_config.json"] {
            let path = dir.join(file);
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let mut config: Value =
                serde_json::from_str(&text).with_context(|| path.display().to_string())?;
            if let (Some(n), true) = (layers, name.starts_with("transformer")) {
                for key in BLOCK_KEYS {
                    if let Some(v) = config.get_mut(key) {
                        *v = json!(n);
                    }
                }
            }
            std::fs::create_dir_all(to.join(&name))?;
            std::fs::write(to.join(&name).join(file), serde_json::to_string_pretty(&config)?)?;
        }
    }
    if !to.join("scheduler").join("scheduler_config.json").exists() {
        return Err(anyhow!(
            "{}: no scheduler/scheduler_config.json; random weights still need the scheduler's config",
            from.display()
        ));
    }
    Ok(())
}

/// A metric of the measured step, if logged.
fn get(m: &Metrics, key: &str) -> Option<f64> {
    m.get(key).copied()
}

pub fn run(a: StepArgs, device: &DeviceArg) -> Result<(), Failure> {
    let device = device.resolve()?;
    if a.layers.is_some() && !a.random_weights {
        return Err(Failure::input(anyhow!("--layers needs --random-weights")));
    }
    if a.text_tokens < 1 {
        return Err(Failure::input(anyhow!("--text-tokens must be at least 1")));
    }
    let first = Recipe::load(&a.recipe, &a.overrides).map_err(Failure::input)?;
    let work = tempfile::tempdir().map_err(|e| Failure::Runtime(e.into()))?;
    let model_dir = flowtune_models::hub::resolve(&first.model.path).map_err(Failure::input)?;
    let model_dir = if a.random_weights {
        let to = work.path().join("pipeline");
        copy_configs(&model_dir, &to, a.layers).map_err(Failure::input)?;
        to
    } else {
        model_dir
    };
    // One prompt group per prompt, each step drawing fresh ones.
    let steps = a.warmup + 1;
    let prompts = first.data.prompts_per_step as u64 * steps;
    let prompt_file = prompt_file(work.path(), prompts, &a.pictures).map_err(Failure::Runtime)?;
    let out = work.path().join("run");
    let mut overrides = vec![format!("reward.functions=[{{name: {}}}]", a.reward)];
    overrides.extend(a.overrides.iter().cloned());
    overrides.extend([
        format!("model.path={}", model_dir.display()),
        format!("data.train_files=[{}]", prompt_file.display()),
        "data.val_files=[]".into(),
        format!("trainer.total_steps={steps}"),
        "trainer.val_freq=0".into(),
        "trainer.val_before_train=false".into(),
        "trainer.save_freq=0".into(),
        "trainer.image_freq=0".into(),
        "trainer.resume=none".into(),
        format!("trainer.output_dir={}", out.display()),
    ]);
    let mut recipe = Recipe::load(&a.recipe, &overrides).map_err(Failure::input)?;
    let random =
        a.random_weights.then_some(RandomWeights { seed: a.seed, text_tokens: a.text_tokens });

    // The plan of the same recipe, first: it reads configs only.
    let mut pipe = Pipeline::read(&model_dir).map_err(Failure::input)?;
    if let Some(path) = &a.constants {
        pipe.use_constants(&super::plan::read_constants(path).map_err(Failure::input)?);
    }
    let gpus = std::env::var("WORLD_SIZE").ok().and_then(|w| w.parse().ok()).unwrap_or(1);
    super::auto_sizes::fit_to_device(&mut recipe, device, gpus)?;
    let gpu = match device {
        Device::Cuda(i) => flowtune_cuda::device_info(i),
        _ => None,
    };
    let gpu_gib = gpu.as_ref().map_or(80.0, |g| g.total_memory_bytes as f64 / GIB);
    let mut setup = super::plan::setup(&recipe, &pipe, gpus, gpu_gib).map_err(Failure::input)?;
    if random.is_some() {
        // Stand-in embeddings: no text encoder is built, every prompt has --text-tokens tokens.
        pipe.text_encoders.clear();
        setup.text_tokens = a.text_tokens as u64;
    }
    let planned = plan(&pipe, &setup);

    let rss_before = status_bytes("VmRSS:").unwrap_or(0) as f64 / GIB;
    let options = TrainOptions { random_weights: random, write: false };
    let started = std::time::Instant::now();
    let summary = train_with(&recipe, device, options).map_err(Failure::training)?;
    // Building the pipeline (with random weights: allocating and filling it on the device), the
    // optimizer and the engine: the run's time outside its steps.
    let steps_seconds: f64 = summary.metrics.iter().filter_map(|m| get(m, "timing_s/step")).sum();
    let setup_seconds = started.elapsed().as_secs_f64() - steps_seconds;
    let m = summary.metrics.last().cloned().unwrap_or_default();
    let per_gpu = get(&m, "perf/throughput").unwrap_or(f64::NAN);
    let (plan_device, plan_host) =
        (planned.device_bytes as f64 / GIB, planned.host_bytes as f64 / GIB);
    // What the plan predicts is held: the device's share on a GPU, everything on the CPU.
    let (measured, predicted) = match device {
        Device::Cuda(_) => (get(&m, "perf/max_memory_allocated_gb"), plan_device),
        _ => (get(&m, "perf/max_memory_rss_gb").map(|p| p - rss_before), plan_device + plan_host),
    };
    let phases = ["step", "gen", "reward", "old_log_prob", "ref", "adv", "update_actor"];
    let seconds: serde_json::Map<String, Value> = phases
        .iter()
        .filter_map(|p| get(&m, &format!("timing_s/{p}")).map(|s| (p.to_string(), json!(s))))
        .collect();
    let report = json!({
        "recipe": a.recipe,
        "overrides": a.overrides,
        "device": crate::device::name(device),
        "gpu": gpu.as_ref().map(|g| g.name.clone()),
        "random_weights": a.random_weights,
        "layers": a.layers,
        "text_tokens": random.map(|r| r.text_tokens),
        "reward": a.reward,
        // Issue 53's throughput items, as this step ran them.
        "throughput_items": {
            "unpadded_attention": recipe.model.unpadded_attention,
            "fused_projections": recipe.model.fused_projections,
        },
        "shape": {
            "samples_per_rank": setup.samples(),
            "resolution": recipe.model.resolution,
            "rollout_steps": recipe.rollout.steps,
            "cfg": setup.cfg,
            "window_steps": setup.window_steps,
            "micro_batch": setup.micro_batch,
            // Policy-gradient forward + backward passes of one micro-batch each.
            "micro_steps": setup.window_steps * setup.samples().div_ceil(setup.micro_batch.max(1)),
        },
        "seconds": seconds,
        "setup_seconds": setup_seconds,
        "images_per_s_per_gpu": per_gpu,
        "tokens_per_sample": planned.tokens,
        "tokens_per_s": per_gpu * planned.tokens as f64,
        "tflops": {"step": get(&m, "perf/tflops"), "rollout": get(&m, "perf/tflops/rollout"),
                   "update": get(&m, "perf/tflops/actor")},
        "mfu": {"step": get(&m, "perf/mfu"), "rollout": get(&m, "perf/mfu/rollout"),
                "update": get(&m, "perf/mfu/actor")},
        "memory_gib": {
            "peak_allocated": get(&m, "perf/max_memory_allocated_gb"),
            "peak_reserved": get(&m, "perf/max_memory_reserved_gb"),
            "peak_rss": get(&m, "perf/max_memory_rss_gb"),
            "rss_before_loading": rss_before,
            "measured": measured,
            "plan_device": plan_device,
            "plan_host": plan_host,
            "planned": predicted,
            "measured_over_plan": measured.map(|x| x / predicted),
        },
        "metrics": m,
    });
    let mut report = report;
    if a.overlap_ab > 0 {
        let ab = super::bench_overlap::overlap_ab(&recipe, device, options, a.overlap_ab)?;
        let f = |k: &str| ab[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "reward overlap: rollout phase {:.2} s overlapped vs {:.2} s serial (sampling {:.2} s, scoring {:.2} s: max {:.2}, sum {:.2}); {:.0} % of the scoring hidden; step {:.2} s vs {:.2} s",
            ab["overlapped"]["rollout_s"].as_f64().unwrap_or(f64::NAN),
            ab["serial"]["rollout_s"].as_f64().unwrap_or(f64::NAN),
            f("sampling_s"),
            f("scoring_s"),
            f("max_s"),
            f("sum_s"),
            100.0 * f("hidden_fraction"),
            ab["overlapped"]["step_s"].as_f64().unwrap_or(f64::NAN),
            ab["serial"]["step_s"].as_f64().unwrap_or(f64::NAN),
        );
        report["reward_overlap"] = ab;
    }
    let pct = |x: Option<f64>| x.map_or("–".into(), |x| format!("{:.1} %", 100.0 * x));
    let s = |p: &str| get(&m, &format!("timing_s/{p}")).unwrap_or(f64::NAN);
    println!(
        "bench step: set up in {:.1} s; {:.2} images/s/GPU, step {:.1} s (rollout {:.1}, reward {:.1}, old log-prob {:.1}, update {:.1}), MFU rollout {} update {}, memory {:.2} GiB vs plan {:.2} GiB",
        setup_seconds,
        per_gpu,
        s("step"),
        s("gen"),
        s("reward"),
        s("old_log_prob"),
        s("update_actor"),
        pct(get(&m, "perf/mfu/rollout")),
        pct(get(&m, "perf/mfu/actor")),
        measured.unwrap_or(f64::NAN),
        predicted
    );
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&report).expect("JSON") + "\n";
        std::fs::write(path, text)
            .with_context(|| path.display().to_string())
            .map_err(Failure::Runtime)?;
    }
    Ok(())
}
