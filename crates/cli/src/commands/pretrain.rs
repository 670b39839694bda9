//! `flowtune pretrain shapes --model DIR --out DIR`: flow-matching pre-training of every weight
//! on procedurally drawn shapes scenes (a fresh scene for every example).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use flowtune_sampling::row_seed;
use flowtune_shapes::{fade, render, Category, RgbImage, Task, FADED_STRENGTH};
use flowtune_trainer::pretrain::{pretrain, PretrainConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::device::DeviceArg;
use crate::Failure;

/// Where training images come from.
#[derive(Clone, Copy, ValueEnum)]
pub enum DataSource {
    /// Shapes-world scenes of every category, in turn.
    Shapes,
}

#[derive(Args)]
pub struct PretrainArgs {
    /// The training data.
    data: DataSource,
    /// The pipeline to start from (`flowtune make-tiny shapes`).
    #[arg(long)]
    model: PathBuf,
    /// Where the trained pipeline is written (a complete pipeline directory).
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value_t = 4000)]
    steps: u64,
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    #[arg(long, default_value_t = 200)]
    warmup_steps: u64,
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f64,
    #[arg(long, default_value_t = 1.0)]
    max_grad_norm: f64,
    /// Probability of training on the empty prompt (for classifier-free guidance).
    #[arg(long, default_value_t = 0.1)]
    caption_dropout: f64,
    /// Share of examples whose picture is a near miss of its caption (`Task::slip`: another
    /// colour, count, shape or relation): a model that knows the task but samples it unreliably.
    #[arg(long, default_value_t = 0.0)]
    caption_noise: f64,
    /// Share of examples whose picture is faded (`flowtune_shapes::fade` to `FADED_STRENGTH`): a
    /// lower-quality share of the data, which the model learns to draw as often.
    #[arg(long, default_value_t = 0.0)]
    faded: f64,
    /// EMA decay of the saved weights; 0 saves the live weights.
    #[arg(long, default_value_t = 0.999)]
    ema_decay: f64,
    /// Image height and width in pixels.
    #[arg(long, default_value_t = 32)]
    resolution: i64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Save every this many steps (and at the end).
    #[arg(long, default_value_t = 500)]
    save_every: u64,
}

pub fn run(a: PretrainArgs, device: &DeviceArg) -> Result<(), Failure> {
    let device = device.resolve()?;
    for (flag, share) in [("--caption-noise", a.caption_noise), ("--faded", a.faded)] {
        if !(0.0..=1.0).contains(&share) {
            return Err(Failure::input(anyhow::anyhow!(
                "{flag} {share}: expected a probability in [0, 1]"
            )));
        }
    }
    let config = PretrainConfig {
        model: a.model,
        out: a.out,
        steps: a.steps,
        batch_size: a.batch_size,
        lr: a.lr,
        warmup_steps: a.warmup_steps,
        weight_decay: a.weight_decay,
        max_grad_norm: a.max_grad_norm,
        caption_dropout: a.caption_dropout,
        caption_noise: a.caption_noise,
        faded: a.faded,
        ema_decay: (a.ema_decay > 0.0).then_some(a.ema_decay),
        resolution: a.resolution,
        seed: a.seed,
        save_every: a.save_every.max(1),
    };
    let DataSource::Shapes = a.data;
    let (seed, resolution) = (a.seed, a.resolution as u32);
    let (noise, faded) = (a.caption_noise, a.faded);
    let examples = move |index: u64| shapes_example(seed, index, noise, faded, resolution);
    let summary = pretrain(&config, &examples, device).map_err(Failure::training)?;
    println!(
        "pre-trained {} steps in {:.0} s (final loss {:.4}); pipeline written to {}",
        summary.steps,
        summary.wall_seconds,
        summary.final_loss,
        config.out.display()
    );
    Ok(())
}

/// Training example `index`: a task of category `index` mod 6 and its scene, both from a seed of
/// (`seed`, `index`); with probability `noise` (drawn from a seed of its own) the scene is of a
/// near miss instead, and with probability `faded` (from a third seed) it is faded.
fn shapes_example(
    seed: u64,
    index: u64,
    noise: f64,
    faded: f64,
    resolution: u32,
) -> (String, RgbImage) {
    let example_seed = row_seed(seed, index, 0);
    let mut rng = ChaCha8Rng::seed_from_u64(example_seed);
    let category = Category::ALL[(index % Category::ALL.len() as u64) as usize];
    let task = Task::sample(&mut rng, category);
    let mut noise_rng = ChaCha8Rng::seed_from_u64(row_seed(seed, index, 1));
    let drawn = match noise > 0.0 && noise_rng.random_bool(noise) {
        true => task.slip(&mut noise_rng),
        false => task.clone(),
    };
    let mut image = render(&drawn, example_seed, resolution);
    let mut fade_rng = ChaCha8Rng::seed_from_u64(row_seed(seed, index, 2));
    if faded > 0.0 && fade_rng.random_bool(faded) {
        fade(&mut image, FADED_STRENGTH);
    }
    (task.prompt, image)
}

#[cfg(test)]
mod tests {
    use flowtune_shapes::{detect, score};

    use super::*;

    #[test]
    fn a_faded_share_of_examples_scores_nothing_and_the_rest_are_unchanged() {
        let (n, share) = (600, 0.5);
        let mut faded = 0;
        for index in 0..n {
            let (prompt, plain) = shapes_example(7, index, 0.0, 0.0, 32);
            let (same_prompt, image) = shapes_example(7, index, 0.0, share, 32);
            assert_eq!(prompt, same_prompt);
            let task = Task::parse(&prompt).unwrap();
            assert!(score(&task, &plain).correct, "{prompt}: the plain scene is right");
            if image == plain {
                continue;
            }
            faded += 1;
            assert!(detect(&image).is_empty(), "{prompt}: a faded scene shows no object");
        }
        // Binomial(600, ½): ±3 standard deviations is ±37.
        assert!((faded as i64 - 300).abs() <= 37, "{faded} of {n} faded");
        assert_eq!(shapes_example(7, 3, 0.4, share, 32), shapes_example(7, 3, 0.4, share, 32));
    }
}
