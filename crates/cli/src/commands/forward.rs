//! `flowtune debug forward` and `flowtune debug make-lora`: run one component on fixture-style
//! tensors (`input.*` → `output.*`), and write a random LoRA, for people porting models.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, Context};
use flowtune_models::lora::{self, LoraConfig};
use flowtune_models::qwen_image::AutoencoderKlQwenImage;
use flowtune_models::text_encoders::qwen2_5_vl::Qwen25VlTextEncoder;
use flowtune_models::text_encoders::qwen3::Qwen3TextEncoder;
use flowtune_models::text_encoders::{clip::ClipTextModel, t5::T5Encoder};
use flowtune_models::vae::AutoencoderKl;
use flowtune_models::wan::{AutoencoderKlWan, WanTransformer};
use flowtune_models::TrainableDenoiser;
use flowtune_sampling::SampleRng;
use tch::{Device, Kind, Tensor};

use crate::Failure;

/// Wan's denoiser, run here until the Wan family is registered.
const WAN_TRANSFORMER: &str = "WanTransformer3DModel";

/// The class a component directory holds: diffusers' `_class_name` or transformers' `architectures[0]`.
fn class_of(dir: &Path) -> Result<String, Failure> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))
        .map_err(Failure::BadInput)?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| path.display().to_string())
        .map_err(Failure::BadInput)?;
    v.get("_class_name")
        .and_then(|c| c.as_str())
        .or_else(|| v.get("architectures").and_then(|a| a.get(0)).and_then(|c| c.as_str()))
        .map(str::to_string)
        .ok_or_else(|| {
            Failure::input(anyhow!("{}: neither `_class_name` nor `architectures`", path.display()))
        })
}

fn input<'a>(
    inputs: &'a HashMap<String, Tensor>,
    name: &str,
    file: &Path,
) -> Result<&'a Tensor, Failure> {
    inputs
        .get(name)
        .ok_or_else(|| Failure::input(anyhow!("{}: no tensor `{name}`", file.display())))
}

/// The denoiser in `component` (as `kind`), of a registered family or Wan's.
fn load_denoiser(
    component: &Path,
    device: Device,
    kind: Kind,
    lora: Option<&LoraConfig>,
) -> Result<Box<dyn TrainableDenoiser>, Failure> {
    if class_of(component)? == WAN_TRANSFORMER {
        let model = WanTransformer::load(component, device, kind, lora);
        return Ok(Box::new(model.map_err(Failure::input)?));
    }
    flowtune_models::load_denoiser(component, device, kind, lora).map_err(Failure::input)
}

/// How `debug forward` runs: an optional LoRA file (with its alpha), the device, a denoiser's
/// dtype, and the relative error tolerated against the inputs file's own outputs.
pub struct Run<'a> {
    pub lora: Option<(&'a Path, Option<f64>)>,
    pub device: Device,
    pub kind: Kind,
    pub check: Option<f64>,
}

/// `inputs` for a denoiser of `kind`: floating tensors of two or more dimensions (latents, text
/// states, pooled vectors) in that kind; timesteps, masks, shapes and position ids as given.
fn as_kind(inputs: &HashMap<String, Tensor>, kind: Kind) -> HashMap<String, Tensor> {
    let cast = |n: &str, t: &Tensor| t.is_floating_point() && t.dim() >= 2 && !n.ends_with("_ids");
    inputs
        .iter()
        .map(|(n, t)| (n.clone(), if cast(n, t) { t.to_kind(kind) } else { t.shallow_clone() }))
        .collect()
}

/// Fails when an output is further than `tolerance` (relative norm) from the expected tensor of
/// the same name in `expected`; prints each error.
fn check(
    outputs: &[(String, Tensor)],
    expected: &HashMap<String, Tensor>,
    file: &Path,
    tolerance: f64,
) -> Result<(), Failure> {
    for (name, out) in outputs {
        let want = expected.get(name).ok_or_else(|| {
            Failure::input(anyhow!("{}: no `{name}` to check against", file.display()))
        })?;
        let want = want.to_device(Device::Cpu).to_kind(Kind::Double);
        let got = out.to_kind(Kind::Double);
        let error = (&got - &want).norm().double_value(&[]) / want.norm().double_value(&[]);
        let ok = error <= tolerance;
        println!(
            "{name}: relative error {error:.3e} (tolerance {tolerance:.1e}) {}",
            if ok { "ok" } else { "FAILED" }
        );
        if !ok {
            return Err(Failure::Runtime(anyhow!(
                "{name}: relative error {error:.3e} over the tolerance {tolerance:.1e} against {}",
                file.display()
            )));
        }
    }
    Ok(())
}

/// Runs `component` on `inputs_file` and writes `out`.
pub fn forward(
    component: &Path,
    inputs_file: &Path,
    out: &Path,
    run: &Run<'_>,
) -> Result<(), Failure> {
    let Run { lora: lora_file, device, kind, .. } = *run;
    let inputs: HashMap<String, Tensor> = Tensor::read_safetensors(inputs_file)
        .with_context(|| format!("cannot read {}", inputs_file.display()))
        .map_err(Failure::BadInput)?
        .into_iter()
        .map(|(n, t)| (n, t.to_device(device)))
        .collect();
    let get = |name: &str| input(&inputs, name, inputs_file);
    let class = class_of(component)?;
    let outputs: Vec<(String, Tensor)> = match class.as_str() {
        denoiser
            if denoiser == WAN_TRANSFORMER
                || flowtune_models::families().iter().any(|f| f.denoiser_class == denoiser) =>
        {
            let lora = match lora_file {
                Some((f, alpha)) => {
                    let mut config = lora::read_config(f, "transformer").map_err(Failure::input)?;
                    config.alpha = alpha.unwrap_or(config.alpha);
                    Some(config)
                }
                None => None,
            };
            let mut model = load_denoiser(component, device, kind, lora.as_ref())?;
            if let Some((f, _)) = lora_file {
                model.load_lora(f).map_err(Failure::input)?;
            }
            let named = as_kind(&inputs, kind)
                .iter()
                .filter_map(|(n, t)| n.strip_prefix("input.").map(|k| (k.to_string(), t.shallow_clone())))
                .collect();
            let sample = tch::no_grad(|| model.forward_named(&named))
                .map_err(|e| Failure::input(anyhow!("{}: {e}", inputs_file.display())))?;
            let name = if lora_file.is_some() { "output.sample_with_lora" } else { "output.sample" };
            vec![(name.into(), sample.to_kind(Kind::Float))]
        }
        "AutoencoderKL" => {
            let vae = AutoencoderKl::load(component, device, Kind::Float).map_err(Failure::input)?;
            let latents = get("input.latents")?;
            vec![("output.image".into(), tch::no_grad(|| vae.decode(latents)))]
        }
        "AutoencoderKLQwenImage" => {
            let vae = AutoencoderKlQwenImage::load(component, device, Kind::Float).map_err(Failure::input)?;
            let latents = get("input.latents")?;
            vec![("output.image".into(), tch::no_grad(|| vae.decode(latents)))]
        }
        "AutoencoderKLWan" => {
            let vae = AutoencoderKlWan::load(component, device, Kind::Float).map_err(Failure::input)?;
            let mut outputs = vec![];
            if let Some(latents) = inputs.get("input.latents") {
                outputs.push(("output.video".into(), tch::no_grad(|| vae.decode_video(latents)).map_err(Failure::input)?));
            }
            if let Some(video) = inputs.get("input.video") {
                let (mean, logvar) = tch::no_grad(|| vae.encode_video(video)).map_err(Failure::input)?;
                outputs.extend([("output.latents".into(), mean), ("output.logvar".into(), logvar)]);
            }
            if outputs.is_empty() {
                return Err(Failure::input(anyhow!("{}: neither `input.latents` nor `input.video`", inputs_file.display())));
            }
            outputs
        }
        "UMT5EncoderModel" => {
            let t5 = T5Encoder::load(component, device, Kind::Float).map_err(Failure::input)?;
            let ids = get("input.input_ids")?;
            let mask = inputs.get("input.attention_mask");
            vec![("output.last_hidden_state".into(), tch::no_grad(|| t5.forward_masked(ids, mask).map_err(Failure::input))?)]
        }
        "CLIPTextModel" | "CLIPTextModelWithProjection" => {
            let clip = ClipTextModel::load(component, device, Kind::Float).map_err(Failure::input)?;
            let o = tch::no_grad(|| clip.forward(get("input.input_ids")?).map_err(Failure::input))?;
            let mut outputs = vec![
                ("output.pooler_output".into(), o.pooler_output),
                ("output.last_hidden_state".into(), o.last_hidden_state),
                ("output.penultimate_hidden_state".into(), o.penultimate_hidden_state),
            ];
            outputs.extend(o.text_embeds.map(|t| ("output.text_embeds".into(), t)));
            outputs
        }
        "T5EncoderModel" => {
            let t5 = T5Encoder::load(component, device, Kind::Float).map_err(Failure::input)?;
            vec![("output.last_hidden_state".into(), tch::no_grad(|| t5.forward(get("input.input_ids")?).map_err(Failure::input))?)]
        }
        "Qwen2_5_VLForConditionalGeneration" => {
            let encoder = Qwen25VlTextEncoder::load(component, device, Kind::Float).map_err(Failure::input)?;
            let ids = get("input.input_ids")?;
            let mask = match inputs.get("input.attention_mask") {
                Some(mask) => mask.shallow_clone(),
                None => ids.ones_like(),
            };
            vec![("output.last_hidden_state".into(), tch::no_grad(|| encoder.forward(ids, &mask).map_err(Failure::input))?)]
        }
        "Qwen3Model" | "Qwen3ForCausalLM" => {
            let encoder = Qwen3TextEncoder::load(component, device, Kind::Float).map_err(Failure::input)?;
            let ids = get("input.input_ids")?;
            let mask = match inputs.get("input.attention_mask") {
                Some(mask) => mask.shallow_clone(),
                None => ids.ones_like(),
            };
            vec![("output.hidden_states_m2".into(), tch::no_grad(|| encoder.penultimate(ids, &mask).map_err(Failure::input))?)]
        }
        other => {
            return Err(Failure::input(anyhow!(
                "{}: class `{other}` is not supported; expected a registered denoiser ({}), {WAN_TRANSFORMER}, AutoencoderKL, AutoencoderKLQwenImage, AutoencoderKLWan, CLIPTextModel, CLIPTextModelWithProjection, T5EncoderModel, UMT5EncoderModel, Qwen2_5_VLForConditionalGeneration or Qwen3Model",
                component.display(),
                flowtune_models::families().iter().map(|f| f.denoiser_class).collect::<Vec<_>>().join(", ")
            )))
        }
    };
    let cpu: Vec<(String, Tensor)> =
        outputs.into_iter().map(|(n, t)| (n, t.to_device(Device::Cpu).contiguous())).collect();
    Tensor::write_safetensors(&cpu, out)
        .with_context(|| format!("cannot write {}", out.display()))
        .map_err(Failure::Runtime)?;
    for (n, t) in &cpu {
        println!("{n}: {:?}", t.size());
    }
    match run.check {
        Some(tolerance) => check(&cpu, &inputs, inputs_file, tolerance),
        None => Ok(()),
    }
}

/// Writes random (non-zero) adapters for a denoiser directory of any registered family.
pub fn make_lora(
    component: &Path,
    out: &Path,
    config: &LoraConfig,
    seed: u64,
) -> Result<(), Failure> {
    let model = load_denoiser(component, Device::Cpu, Kind::Float, Some(config))?;
    let store = &model.adapters().expect("built with LoRA").store;
    let mut rng = SampleRng::new(seed);
    let mut vars: Vec<(String, Tensor)> = store.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    tch::no_grad(|| {
        for (_, v) in &vars {
            v.shallow_clone().copy_(&(rng.normal(&v.size(), Device::Cpu) * 0.1));
        }
    });
    model.save_lora(out).map_err(|e| Failure::Runtime(e.into()))?;
    println!(
        "wrote {} ({} adapter tensors, r {}, alpha {})",
        out.display(),
        vars.len(),
        config.rank,
        config.alpha
    );
    Ok(())
}
