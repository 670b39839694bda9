//! Random weights from configs alone (`PipelineOptions::random`), for every built-in family on its
//! tiny pipeline: the same variables (names, shapes, dtypes) as the files give, bit-identical for
//! one seed and different for another, stand-in prompt embeddings the denoiser runs on; and the
//! resident memory of a ~255 MiB denoiser built without its weight file.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use flowtune_models::flux::FluxPipeline;
use flowtune_models::flux2::Flux2Pipeline;
use flowtune_models::ltx2::Ltx2Pipeline;
use flowtune_models::qwen_image::QwenImagePipeline;
use flowtune_models::qwen_image21::QwenImage21Pipeline;
use flowtune_models::sd3::Sd3Pipeline;
use flowtune_models::wan::WanPipeline;
use flowtune_models::z_image::ZImagePipeline;
use flowtune_models::{
    families, load_pipeline, with_random_weights, FlowPipeline, PipelineOptions, RandomWeights,
};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

/// Resident memory is measured by one test: the others wait (cargo runs a file's tests in threads).
static SERIAL: Mutex<()> = Mutex::new(());

const TEXT_TOKENS: i64 = 5;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn random(seed: u64) -> Option<RandomWeights> {
    Some(RandomWeights { seed, text_tokens: TEXT_TOKENS })
}

/// Variables by name.
type Vars = BTreeMap<String, Tensor>;

fn vars(store: &VarStore) -> Vars {
    store.variables().into_iter().collect()
}

/// Names with their shapes and dtypes.
fn layout(vars: &Vars) -> Vec<(String, Vec<i64>, Kind)> {
    vars.iter().map(|(n, t)| (n.clone(), t.size(), t.kind())).collect()
}

fn identical(a: &Vars, b: &Vars) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|((n, x), (m, y))| n == m && x.equal(y))
}

/// The VAE's variables of the family's pipeline at `dir` (through its own type: the trait object
/// does not expose the VAE), loaded as [`load_pipeline`] does.
fn vae_vars(family: &str, dir: &Path, options: &PipelineOptions) -> Vars {
    let load = || match family {
        "sd3" => vars(&Sd3Pipeline::load(dir, options).expect("sd3").vae.expect("a VAE").store),
        "flux" => vars(&FluxPipeline::load(dir, options).expect("flux").vae.store),
        "flux2" => vars(&Flux2Pipeline::load(dir, options).expect("flux2").vae.autoencoder.store),
        "z_image" => vars(&ZImagePipeline::load(dir, options).expect("z_image").vae.store),
        "qwen_image" => vars(&QwenImagePipeline::load(dir, options).expect("qwen_image").vae.store),
        "qwen_image21" => {
            vars(&QwenImage21Pipeline::load(dir, options).expect("qwen_image21").vae.store)
        }
        "wan" => vars(&WanPipeline::load(dir, options).expect("wan").vae.store),
        "ltx2" => vars(&Ltx2Pipeline::load(dir, options).expect("ltx2").vae.store),
        other => panic!("no VAE accessor for family `{other}`"),
    };
    match options.random {
        Some(r) => with_random_weights(r.seed, load),
        None => load(),
    }
}

fn load(dir: &Path, options: &PipelineOptions) -> Box<dyn FlowPipeline> {
    load_pipeline(dir, options).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

#[test]
fn every_family_builds_its_files_layout_from_configs_alone() {
    let _serial = serial();
    for family in families() {
        let name = family.name;
        let dir = flowtune_fixtures::scratch(&format!("random-{name}"));
        (family.write_tiny)(&dir, 1).expect("write tiny");
        for kind in [Kind::Float, Kind::BFloat16] {
            let mut options = PipelineOptions::new(Device::Cpu);
            options.dtypes.transformer = kind;
            let files = load(&dir, &options);
            let random_options = PipelineOptions { random: random(7), ..options.clone() };
            let seeded = load(&dir, &random_options);
            let (from_files, from_seed) =
                (vars(files.denoiser().store()), vars(seeded.denoiser().store()));
            assert!(!from_files.is_empty(), "{name}: a denoiser without variables");
            assert_eq!(layout(&from_seed), layout(&from_files), "{name} {kind:?}: denoiser layout");
            let (vae_files, vae_seed) =
                (vae_vars(name, &dir, &options), vae_vars(name, &dir, &random_options));
            assert!(!vae_files.is_empty(), "{name}: a VAE without variables");
            assert_eq!(layout(&vae_seed), layout(&vae_files), "{name} {kind:?}: VAE layout");

            // One seed, one set of weights; another seed, others.
            let again = load(&dir, &random_options);
            assert!(identical(&vars(again.denoiser().store()), &from_seed), "{name}: seed 7 twice");
            assert!(
                identical(&vae_vars(name, &dir, &random_options), &vae_seed),
                "{name}: VAE of seed 7 twice"
            );
            let other = load(&dir, &PipelineOptions { random: random(8), ..options.clone() });
            let other = vars(other.denoiser().store());
            let differ = from_seed.iter().filter(|(n, t)| !t.equal(&other[*n])).count();
            // Norm scales (1) and biases (0) are the same whatever the seed; matrices are not.
            assert!(differ * 4 >= from_seed.len(), "{name}: seeds 7 and 8 differ in {differ}");
            let zero = from_seed
                .values()
                .filter(|t| t.is_floating_point())
                .all(|t| t.abs().max().double_value(&[]) == 0.0);
            assert!(!zero, "{name}: all weights zero");
        }
    }
}

/// Removes every weight file and every text encoder, tokenizer and processor folder: what random
/// weights must not read.
fn strip_to_configs(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if ["text_encoder", "tokenizer", "processor"].iter().any(|p| name.starts_with(p)) {
            std::fs::remove_dir_all(&path).unwrap();
        } else if path.is_dir() {
            for file in std::fs::read_dir(&path).unwrap() {
                let file = file.unwrap().path();
                if file.extension().is_some_and(|e| e == "safetensors") {
                    std::fs::remove_file(file).unwrap();
                }
            }
        }
    }
}

/// Random weights from the configs alone, no text encoder: stand-in embeddings of `text_tokens`
/// per prompt, one per distinct prompt, on which the denoiser gives finite velocities.
#[test]
fn stand_in_prompts_condition_every_denoiser() {
    let _serial = serial();
    for family in families() {
        let name = family.name;
        let dir = flowtune_fixtures::scratch(&format!("random-text-{name}"));
        (family.write_tiny)(&dir, 1).expect("write tiny");
        strip_to_configs(&dir);
        let options = PipelineOptions { random: random(7), ..PipelineOptions::new(Device::Cpu) };
        let pipe = load(&dir, &options);
        // Sized first, as the rollout engine does: LTX-2's prompts carry the sample size.
        let shape = pipe.latent_shape(64, 64).expect("latent shape");
        let text = tch::no_grad(|| pipe.encode_prompts(&["a", "b", "a"])).expect("encode");
        let embeds = &text.embeds;
        assert_eq!(embeds.size()[..2], [3, TEXT_TOKENS], "{name}: rows × text_tokens");
        assert!(embeds.get(0).equal(&embeds.get(2)), "{name}: one prompt, one embedding");
        assert!(!embeds.get(0).equal(&embeds.get(1)), "{name}: two prompts, one embedding");

        let latents = Tensor::randn([&[3i64][..], &shape].concat(), (Kind::Float, Device::Cpu));
        let t = Tensor::from_slice(&[900.0f32, 500.0, 100.0]);
        let v = tch::no_grad(|| pipe.denoiser().velocity(&latents, &t, &text)).expect("velocity");
        assert_eq!(v.size(), latents.size(), "{name}: velocity shape");
        let finite = v.to_kind(Kind::Float).isfinite().all().int64_value(&[]) == 1;
        assert!(finite, "{name}: a non-finite velocity");
    }
}

/// A `/proc/self/status` field (`VmRSS:`) in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with(field)).expect("the field");
    let kib: u64 = line[field.len()..].trim().trim_end_matches("kB").trim().parse().expect("kB");
    kib * 1024
}

/// A tiny SD3 pipeline whose transformer config is widened to 16 heads of 64 (2 joint blocks of
/// width 1024, ~255 MiB in f32) and whose transformer weight file is gone: random weights build it
/// from the config, and resident memory grows by about its bytes, no more.
#[test]
fn random_weights_take_their_bytes_of_resident_memory() {
    let _serial = serial();
    let dir = flowtune_fixtures::scratch("random-rss");
    (flowtune_models::family_named("sd3").unwrap().write_tiny)(&dir, 1).expect("write tiny");
    let transformer = dir.join("transformer");
    let config_path = transformer.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["num_attention_heads"] = 16.into();
    config["attention_head_dim"] = 64.into();
    config["caption_projection_dim"] = 1024.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    for entry in std::fs::read_dir(&transformer).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            std::fs::remove_file(path).unwrap();
        }
    }

    let options = PipelineOptions { random: random(7), ..PipelineOptions::new(Device::Cpu) };
    let before = status_bytes("VmRSS:");
    let pipe = load(&dir, &options);
    let after = status_bytes("VmRSS:");
    let weights: u64 = pipe
        .denoiser()
        .store()
        .variables()
        .values()
        .map(|t| (t.numel() * t.kind().elt_size_in_bytes()) as u64)
        .sum();
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let grown = after.saturating_sub(before);
    println!("weights {:.1} MiB, resident memory grew {:.1} MiB", mib(weights), mib(grown));
    assert!((200.0..=400.0).contains(&mib(weights)), "{:.1} MiB of weights", mib(weights));
    let slack = 64 << 20;
    let (low, high) = (weights * 3 / 4, weights * 5 / 4 + slack);
    assert!(
        (low.saturating_sub(slack)..=high).contains(&grown),
        "resident memory grew {:.1} MiB for {:.1} MiB of weights",
        mib(grown),
        mib(weights)
    );
    // Nonzero, seeded: the fill touched every page.
    let sum: f64 = pipe
        .denoiser()
        .store()
        .variables()
        .values()
        .map(|t| t.abs().sum(Kind::Double).double_value(&[]))
        .sum();
    assert!(sum > 0.0);
}

/// Stand-in prompts take condition pictures where the denoiser reads them as VAE tokens
/// (Qwen-Image-Edit-Plus, FLUX.2 references): the extras are those of the real pipeline's sizing,
/// every row carries them and the velocity is finite. Qwen-Image 2.1's pictures fill the text
/// encoder's vision slots, which stand-ins lack: refused by name.
#[test]
fn stand_in_prompts_take_condition_pictures_as_vae_tokens() {
    use flowtune_models::flux2::REFERENCE_TOKENS;
    use flowtune_models::qwen_image::CONDITION_LATENTS;
    let _serial = serial();
    let picture = image::RgbaImage::from_fn(96, 64, |x, y| image::Rgba([x as u8, y as u8, 9, 255]));
    let options = PipelineOptions { random: random(3), ..PipelineOptions::new(Device::Cpu) };
    for (fixture, extra) in [
        ("qwen_image_edit_pipeline", CONDITION_LATENTS),
        ("flux2_klein_pipeline", REFERENCE_TOKENS),
    ] {
        let dir = flowtune_fixtures::dir().join(fixture);
        let pipe = load(&dir, &options);
        let shape = pipe.latent_shape(32, 32).expect("latent shape");
        let text = tch::no_grad(|| {
            pipe.encode_prompts_with_pictures(&["a", "b"], std::slice::from_ref(&picture), &shape)
        })
        .expect("encode");
        let sizes = flowtune_models::condition_sizes(&dir, &[vec![(96, 64)]], None).unwrap();
        let cell = if fixture.starts_with("flux2") { 4 } else { 16 };
        let tokens: u32 = sizes[0].encoded.iter().map(|&(w, h)| (w / cell) * (h / cell)).sum();
        assert_eq!(text.extras[extra].size()[..2], [2, tokens as i64], "{fixture}");
        let latents = Tensor::randn([&[2i64][..], &shape].concat(), (Kind::Float, Device::Cpu));
        let t = Tensor::from_slice(&[900.0f32, 100.0]);
        let v = tch::no_grad(|| pipe.denoiser().velocity(&latents, &t, &text)).expect("velocity");
        assert_eq!(v.to_kind(Kind::Float).isfinite().all().int64_value(&[]), 1, "{fixture}");
    }
    let dir = flowtune_fixtures::dir().join("qwen_image21_pipeline");
    let pipe = load(&dir, &options);
    let shape = pipe.latent_shape(32, 32).expect("latent shape");
    let err = pipe.encode_prompts_with_pictures(&["a"], &[picture], &shape).err().expect("refused");
    assert!(err.to_string().contains("need its text encoder"), "{err}");
}
