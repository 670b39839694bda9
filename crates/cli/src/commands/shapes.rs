//! `flowtune shapes …`: the shapes-world task — prompt files, ground-truth pictures, and scoring
//! a folder of generated images (as `flowtune sample` writes them) per category.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use clap::{Args, Subcommand};
use flowtune_report::{captioned_grid, Caption};
use flowtune_shapes::{
    detect, evaluate, render, sample_tasks, score, Category, Color, ColorCounts, Task,
};

use crate::Failure;

#[derive(Subcommand)]
pub enum ShapesCommand {
    /// Write `count` prompts (categories in turn) as JSONL in the reference layout.
    Prompts(PromptsArgs),
    /// Draw the ground truth of a prompt file as a captioned grid PNG.
    Render(RenderArgs),
    /// Write preference pairs for offline DPO: each prompt's ground truth (chosen) against a
    /// picture of another task of its category that fails the prompt (rejected).
    Pairs(PairsArgs),
    /// Score a `flowtune sample` folder (`prompts.jsonl` + PNGs): accuracy per category.
    Score(ScoreArgs),
}

#[derive(Args)]
pub struct PromptsArgs {
    /// Output `.jsonl` file.
    out: PathBuf,
    #[arg(long, default_value_t = 600)]
    count: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The rows' `data_source`: validation logs `val-core/<source>/…` per source, so a second
    /// prompt set validated beside the first needs a name of its own.
    #[arg(long, default_value = "shapes")]
    source: String,
}

#[derive(Args)]
pub struct RenderArgs {
    /// A prompt file (`.jsonl` or `.txt`).
    prompts: PathBuf,
    /// Output PNG.
    out: PathBuf,
    #[arg(long, default_value_t = 32)]
    resolution: u32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// At most this many tiles.
    #[arg(long, default_value_t = 36)]
    limit: usize,
}

#[derive(Args)]
pub struct PairsArgs {
    /// Output folder: `pairs.jsonl` and `images/`.
    out: PathBuf,
    #[arg(long, default_value_t = 64)]
    count: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 32)]
    resolution: u32,
}

#[derive(Args)]
pub struct ScoreArgs {
    /// A folder written by `flowtune sample`.
    dir: PathBuf,
    /// Also write the first 36 images as a grid captioned with prompt and verdict.
    #[arg(long)]
    grid: Option<PathBuf>,
    /// Also report pass@k per category: the chance that one of k samples of a prompt passes
    /// (unbiased over each prompt's samples; the folder holds several samples of each prompt).
    #[arg(long)]
    k: Option<usize>,
}

pub fn run(command: ShapesCommand) -> Result<(), Failure> {
    match command {
        ShapesCommand::Prompts(a) => {
            let tasks = sample_tasks(a.seed, a.count);
            flowtune_shapes::write_prompts_jsonl(&a.out, &tasks, &a.source)
                .with_context(|| a.out.display().to_string())
                .map_err(Failure::input)?;
            println!("wrote {} prompts to {}", tasks.len(), a.out.display());
            Ok(())
        }
        ShapesCommand::Pairs(a) => write_pairs(&a).map_err(Failure::Runtime),
        ShapesCommand::Render(a) => {
            let tasks = read_tasks(&a.prompts)?;
            let shown = &tasks[..tasks.len().min(a.limit)];
            let images: Vec<_> = shown
                .iter()
                .enumerate()
                .map(|(i, t)| render(t, a.seed + i as u64, a.resolution))
                .collect();
            let captions: Vec<Caption> =
                shown.iter().map(|t| Caption { text: t.prompt.clone(), verdict: None }).collect();
            let columns = (shown.len() as f64).sqrt().ceil() as u32;
            captioned_grid(&images, &captions, 128, columns, 4)
                .save(&a.out)
                .with_context(|| a.out.display().to_string())
                .map_err(Failure::Runtime)?;
            println!("wrote {}", a.out.display());
            Ok(())
        }
        ShapesCommand::Score(a) => score_folder(&a),
    }
}

/// The tasks of a prompt file, each prompt parsed.
fn read_tasks(path: &Path) -> Result<Vec<Task>, Failure> {
    let dataset = flowtune_data::PromptDataset::load(path).map_err(Failure::input)?;
    dataset.records.iter().map(|r| Task::parse(&r.prompt).map_err(Failure::input)).collect()
}

/// `pairs.jsonl` with chosen (the prompt's own scene, score 1) and rejected (a scene of another
/// task of the same category that the scorer fails for this prompt, score 0) images.
fn write_pairs(a: &PairsArgs) -> anyhow::Result<()> {
    use rand::SeedableRng;
    let images = a.out.join("images");
    std::fs::create_dir_all(&images).with_context(|| images.display().to_string())?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(a.seed ^ 0x9A1E);
    let mut lines = String::new();
    for (i, task) in sample_tasks(a.seed, a.count).iter().enumerate() {
        let seed = a.seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
        let chosen = render(task, seed, a.resolution);
        let rejected = (0..100)
            .map(|_| render(&Task::sample(&mut rng, task.category), seed, a.resolution))
            .find(|image| !score(task, image).correct)
            .ok_or_else(|| anyhow!("no failing scene found for {:?}", task.prompt))?;
        let (c, r) = (format!("images/{i:04}_chosen.png"), format!("images/{i:04}_rejected.png"));
        chosen.save(a.out.join(&c)).with_context(|| c.clone())?;
        rejected.save(a.out.join(&r)).with_context(|| r.clone())?;
        let line = serde_json::json!({
            "prompt": task.prompt, "chosen": c, "rejected": r,
            "chosen_score": 1.0, "rejected_score": 0.0,
        });
        lines.push_str(&format!("{line}\n"));
    }
    let file = a.out.join("pairs.jsonl");
    std::fs::write(&file, lines).with_context(|| file.display().to_string())?;
    println!("wrote {} pairs to {}", a.count, file.display());
    Ok(())
}

/// One prompt's samples in a scored folder.
#[derive(Default)]
struct PromptSamples {
    category: Option<Category>,
    samples: usize,
    passed: usize,
}

/// `flowtune shapes score`: accuracy (and pass@k) per category, and the diversity of the colours
/// drawn where the prompt names none.
fn score_folder(a: &ScoreArgs) -> Result<(), Failure> {
    let index = a.dir.join("prompts.jsonl");
    let text = std::fs::read_to_string(&index)
        .with_context(|| format!("{} (expected a `flowtune sample` folder)", index.display()))
        .map_err(Failure::input)?;
    let mut prompts: BTreeMap<String, PromptSamples> = BTreeMap::new();
    let mut colors = ColorCounts::default();
    let (mut images, mut captions) = (vec![], vec![]);
    for (n, line) in text.lines().enumerate() {
        let entry: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}", index.display(), n + 1))
            .map_err(Failure::input)?;
        let (Some(file), Some(prompt)) = (entry["file"].as_str(), entry["prompt"].as_str()) else {
            return Err(Failure::input(anyhow!(
                "{}:{}: expected file and prompt",
                index.display(),
                n + 1
            )));
        };
        let task = Task::parse(prompt).map_err(Failure::input)?;
        let path = a.dir.join(file);
        let image = image::open(&path)
            .with_context(|| path.display().to_string())
            .map_err(Failure::input)?
            .to_rgb8();
        let detections = detect(&image);
        let correct = evaluate(&task, &detections).correct;
        colors.add(&task, &detections);
        let e = prompts.entry(task.prompt.clone()).or_default();
        e.category = Some(task.category);
        e.samples += 1;
        e.passed += usize::from(correct);
        if images.len() < 36 {
            images.push(image);
            captions.push(Caption { text: task.prompt, verdict: Some(correct) });
        }
    }
    if let Some(out) = &a.grid {
        captioned_grid(&images, &captions, 128, 6, 4)
            .save(out)
            .with_context(|| out.display().to_string())
            .map_err(Failure::Runtime)?;
    }
    let k = a.k.unwrap_or(1).max(1);
    if let Some(p) = prompts.iter().find(|(_, p)| p.samples < k) {
        return Err(Failure::input(anyhow!(
            "--k {k}: the prompt {:?} has only {} samples in {}",
            p.0,
            p.1.samples,
            a.dir.display()
        )));
    }
    let rows: Vec<(&str, Vec<&PromptSamples>)> = Category::ALL
        .iter()
        .map(|c| (c.name(), prompts.values().filter(|p| p.category == Some(*c)).collect()))
        .chain([("overall", prompts.values().collect())])
        .collect();
    for (name, group) in rows.iter().filter(|r| !r.1.is_empty()) {
        let (passed, samples) = group.iter().fold((0, 0), |a, p| (a.0 + p.passed, a.1 + p.samples));
        let accuracy = 100.0 * passed as f64 / samples as f64;
        let mut line = format!("{name:<14} {accuracy:>5.1} %  ({passed}/{samples})");
        if a.k.is_some() {
            let at_k: f64 = group.iter().map(|p| pass_at(k, p.samples, p.passed)).sum::<f64>();
            line += &format!("   pass@{k} {:>5.1} %", 100.0 * at_k / group.len() as f64);
        }
        println!("{line}");
    }
    println!(
        "colour entropy where the prompt names no colour: {:.2} bits (uniform: {:.2})",
        colors.entropy(),
        (Color::ALL.len() as f64).log2()
    );
    Ok(())
}

/// The chance that at least one of `k` of a prompt's `n` samples, `c` of them passing, passes.
fn pass_at(k: usize, n: usize, c: usize) -> f64 {
    // 1 − C(n − c, k) / C(n, k), as a product to stay in range.
    1.0 - (n - c + 1..=n).map(|i| 1.0 - k as f64 / i as f64).product::<f64>()
}
