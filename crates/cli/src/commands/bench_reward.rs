//! `flowtune bench reward`: how many images per second a reward scores, on made-up pictures of
//! signs with quoted text (so OCR-style rewards have a ground truth).

use std::path::PathBuf;

use clap::Args;
use flowtune_rewards::{score_batch, OnError, RgbImage, Sample};
use tch::Device;

use crate::Failure;

#[derive(Args)]
pub struct RewardArgs {
    /// A registered reward name (`flowtune list`), with its default settings.
    #[arg(long, conflicts_with = "reward_config", required_unless_present = "reward_config")]
    name: Option<String>,
    /// A YAML file holding a recipe's `reward:` section, for rewards with settings.
    #[arg(long)]
    reward_config: Option<PathBuf>,
    /// Images per scoring call.
    #[arg(long, default_value_t = 16)]
    count: usize,
    /// Image height and width in pixels.
    #[arg(long, default_value_t = 512)]
    resolution: u32,
    /// Timed calls (after one warm-up).
    #[arg(long, default_value_t = 3)]
    iters: usize,
    /// A native `vlm_judge` only: time transformers' `generate` on the same judge, pictures and
    /// batches in the same run (`$PYTHON`, default python3, runs `--anchor`), and print the ratio.
    #[arg(long)]
    transformers: bool,
    /// The transformers anchor script.
    #[arg(long, default_value = "scripts/bench_vlm_judge_transformers.py")]
    anchor: PathBuf,
    /// Also write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// A textured picture, different for every `index`.
fn picture(index: usize, side: u32) -> RgbImage {
    let k = index as u32 + 1;
    RgbImage::from_fn(side, side, |x, y| {
        image::Rgb([
            ((x * k) % 251) as u8,
            ((y * 3 + x * k) % 253) as u8,
            ((x ^ y) * k % 241) as u8,
        ])
    })
}

pub fn run(a: RewardArgs) -> Result<(), Failure> {
    let config = super::score::reward_section(a.name.as_deref(), a.reward_config.as_deref())?;
    let scorers = flowtune_rewards::build(&config).map_err(Failure::input)?;
    let count = a.count.max(1);
    let images: Vec<RgbImage> = (0..count).map(|i| picture(i, a.resolution)).collect();
    let texts: Vec<String> = (0..count).map(|i| format!("flowtune {i}")).collect();
    let prompts: Vec<String> = texts.iter().map(|t| format!("a sign that says \"{t}\"")).collect();
    let null = serde_json::Value::Null;
    let samples: Vec<Sample<'_>> = (0..count)
        .map(|i| Sample {
            image: &images[i],
            frames: 1,
            audio: None,
            prompt: &prompts[i],
            ground_truth: Some(&texts[i]),
            data_source: "bench",
            extra_info: &null,
        })
        .collect();
    let mut answer_tokens = vec![];
    let seconds = super::bench_common::time(a.iters.max(1), Device::Cpu, || {
        let scored = score_batch(&scorers, &samples, OnError::Fail)
            .map_err(|e| Failure::Runtime(e.into()))?;
        answer_tokens = scored
            .details
            .iter()
            .filter_map(|d| d.extras.get("vlm_judge/answer_tokens").map(|&n| n as i64))
            .collect();
        Ok(())
    })?;
    let names: Vec<&str> = scorers.iter().map(|(s, _)| s.name()).collect();
    println!(
        "reward {}: {count} images of {}² per call, {:.1} ms per call, {:.2} images/s",
        names.join(" + "),
        a.resolution,
        seconds * 1e3,
        count as f64 / seconds
    );
    let mut figures = serde_json::json!({
        "reward": names.join(" + "),
        "count": count,
        "resolution": a.resolution,
        "seconds": seconds,
        "images_per_s": count as f64 / seconds,
    });
    if a.transformers {
        let anchor = transformers_anchor(&a, &config, count)?;
        if anchor.answer_tokens != answer_tokens {
            return Err(Failure::Runtime(anyhow::anyhow!(
                "flowtune and transformers answered with different token counts ({answer_tokens:?} \
                 vs {:?}): the timings would not compare the same work",
                anchor.answer_tokens
            )));
        }
        println!(
            "transformers generate: {:.1} ms per call, {:.2} images/s; flowtune / transformers: {:.2}× \
             ({} answer tokens, the same in both)",
            anchor.seconds * 1e3,
            count as f64 / anchor.seconds,
            anchor.seconds / seconds,
            answer_tokens.iter().sum::<i64>()
        );
        figures["transformers_seconds"] = anchor.seconds.into();
        figures["speedup"] = (anchor.seconds / seconds).into();
        figures["answer_tokens"] = answer_tokens.iter().sum::<i64>().into();
    }
    if let Some(path) = &a.json {
        let text =
            serde_json::to_string_pretty(&figures).map_err(|e| Failure::Runtime(e.into()))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| Failure::Runtime(anyhow::anyhow!("writing {}: {e}", path.display())))?;
    }
    Ok(())
}

/// What the transformers anchor measured.
struct Anchor {
    seconds: f64,
    answer_tokens: Vec<i64>,
}

/// Runs the anchor script on the one native `vlm_judge` of `config`.
fn transformers_anchor(
    a: &RewardArgs,
    config: &flowtune_rewards::RewardConfig,
    count: usize,
) -> Result<Anchor, Failure> {
    let judges: Vec<_> = config
        .functions
        .iter()
        .filter_map(|f| f.vlm.as_ref())
        .filter(|v| v.backend == flowtune_rewards::JudgeBackend::Native)
        .collect();
    let [vlm] = judges[..] else {
        return Err(Failure::input(anyhow::anyhow!(
            "--transformers compares one vlm_judge with backend: native; the reward section has {}",
            judges.len()
        )));
    };
    let model =
        flowtune_models::hub::resolve(std::path::Path::new(&vlm.model)).map_err(Failure::input)?;
    let device = vlm
        .device
        .clone()
        .unwrap_or_else(|| if tch::Cuda::is_available() { "cuda" } else { "cpu" }.to_string());
    let dtype = vlm
        .dtype
        .clone()
        .unwrap_or_else(|| if device == "cpu" { "float32" } else { "bfloat16" }.to_string());
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(&python)
        .arg(&a.anchor)
        .args(["--model", &model.display().to_string()])
        .args(["--settings", &serde_json::to_string(vlm).expect("settings serialize")])
        .args(["--count", &count.to_string(), "--resolution", &a.resolution.to_string()])
        .args(["--iters", &a.iters.max(1).to_string(), "--device", &device, "--dtype", &dtype])
        .output()
        .map_err(|e| {
            Failure::input(anyhow::anyhow!("running {python} {}: {e}", a.anchor.display()))
        })?;
    let said = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "the transformers anchor {} failed: {}",
            a.anchor.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rfind(|l| !l.trim().is_empty())
                .unwrap_or_default()
        )));
    }
    let line = said.lines().last().unwrap_or_default();
    let bad = || Failure::Runtime(anyhow::anyhow!("the transformers anchor printed {line:?}"));
    let value: serde_json::Value = serde_json::from_str(line).map_err(|_| bad())?;
    let seconds = value["seconds"].as_f64().ok_or_else(bad)?;
    let tokens = value["answer_tokens"].as_array().ok_or_else(bad)?;
    let answer_tokens =
        tokens.iter().map(|t| t.as_i64().ok_or_else(bad)).collect::<Result<_, _>>()?;
    Ok(Anchor { seconds, answer_tokens })
}
