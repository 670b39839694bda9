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
            prompt: &prompts[i],
            ground_truth: Some(&texts[i]),
            data_source: "bench",
            extra_info: &null,
        })
        .collect();
    let seconds = super::bench_common::time(a.iters.max(1), Device::Cpu, || {
        score_batch(&scorers, &samples, OnError::Fail)
            .map(drop)
            .map_err(|e| Failure::Runtime(e.into()))
    })?;
    let names: Vec<&str> = scorers.iter().map(|(s, _)| s.name()).collect();
    println!(
        "reward {}: {count} images of {}² per call, {:.1} ms per call, {:.2} images/s",
        names.join(" + "),
        a.resolution,
        seconds * 1e3,
        count as f64 / seconds
    );
    Ok(())
}
