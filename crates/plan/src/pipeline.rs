//! A pipeline directory read from its configs alone: `model_index.json` and each component's
//! `config.json` (no weights).

use std::path::Path;

use serde_json::Value;

use crate::audio::audio;
use crate::denoisers::{denoiser, Denoiser};
use crate::json::Json;
use crate::text::text_encoder;
use crate::vae::{vae, Vae};
use crate::PlanError;

/// A frozen component (text encoder or VAE) and its size.
#[derive(Debug, Clone)]
pub struct Frozen {
    /// Folder name (`text_encoder_2`, `vae`).
    pub name: String,
    pub class: String,
    pub params: u64,
}

/// What the planner knows of a pipeline.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// `model_index.json`'s `_class_name`.
    pub class: String,
    /// No CFG whatever the scale: `model_index.json`'s `is_distilled` (a step-distilled FLUX.2
    /// [klein]), or FLUX.2 [dev]'s `Flux2Pipeline` (guidance-distilled, the value embedded).
    pub distilled: bool,
    /// The denoisers by folder (`transformer`, and Wan2.2-A14B's `transformer_2`).
    pub denoisers: Vec<(String, Denoiser)>,
    /// Text encoders, and what turns their states into the denoiser's (LTX-2's connectors).
    pub text_encoders: Vec<Frozen>,
    pub vae: Option<(Frozen, Vae)>,
    /// Frozen decoders beside the VAE (LTX-2's audio VAE and vocoder), offloaded with it.
    pub decoders: Vec<Frozen>,
}

impl Pipeline {
    /// Reads `dir/model_index.json` and the `config.json` of every component it lists.
    pub fn read(dir: &Path) -> Result<Self, PlanError> {
        let index = Json::read(&dir.join("model_index.json"))?;
        let class = index
            .string("_class_name")
            .ok_or_else(|| index.bad("_class_name", "missing"))?
            .to_string();
        let distilled = index.boolean("is_distilled", false)? || class == "Flux2Pipeline";
        let mut pipeline = Self {
            class,
            distilled,
            denoisers: vec![],
            text_encoders: vec![],
            vae: None,
            decoders: vec![],
        };
        for name in COMPONENTS {
            // Components are `[library, class]` pairs; `[null, null]` marks an absent one.
            let Some(class) = index
                .get(name)
                .and_then(Value::as_array)
                .and_then(|a| a.get(1))
                .and_then(Value::as_str)
            else {
                continue;
            };
            let role = match name {
                "transformer" | "transformer_2" => Role::Denoiser,
                "vae" => Role::Vae,
                "audio_vae" | "vocoder" => Role::Decoder,
                _ => Role::Text,
            };
            let cfg = Json::read(&dir.join(name).join("config.json"))?;
            match role {
                Role::Denoiser => pipeline.denoisers.push((name.to_string(), denoiser(&cfg)?)),
                Role::Text => {
                    let class = cfg.class().unwrap_or_else(|| class.to_string());
                    let params = text_encoder(&cfg, &class)?;
                    pipeline.text_encoders.push(Frozen { name: name.to_string(), class, params });
                }
                Role::Decoder => {
                    let class = cfg.class().unwrap_or_else(|| class.to_string());
                    let params = audio(&cfg, &class)?;
                    pipeline.decoders.push(Frozen { name: name.to_string(), class, params });
                }
                Role::Vae => {
                    let class = cfg.class().unwrap_or_else(|| class.to_string());
                    let v = vae(&cfg, &class)?;
                    let frozen = Frozen { name: name.to_string(), class, params: v.params };
                    pipeline.vae = Some((frozen, v));
                }
            }
        }
        if pipeline.denoisers.is_empty() {
            return Err(index.bad("transformer", "the pipeline lists no transformer component"));
        }
        Ok(pipeline)
    }

    /// Takes measured activation constants (`scripts/measure_activation_constants.py --json`,
    /// e.g. on a GPU) in place of the built-in ones, by block name: `name → (bf16, f32)`.
    pub fn use_constants(&mut self, measured: &std::collections::BTreeMap<String, (f64, f64)>) {
        for (_, den) in &mut self.denoisers {
            for (_, saved, _) in &mut den.blocks {
                if let Some(&(bf16, f32)) = measured.get(saved.name) {
                    (saved.bf16, saved.f32) = (bf16, f32);
                }
            }
        }
    }

    /// The first denoiser (the shapes of all are the same in a two-expert pipeline).
    pub fn denoiser(&self) -> &Denoiser {
        &self.denoisers[0].1
    }
}

/// The component folders the planner reads, in `model_index.json` order.
const COMPONENTS: [&str; 9] = [
    "transformer",
    "transformer_2",
    "text_encoder",
    "text_encoder_2",
    "text_encoder_3",
    "connectors",
    "vae",
    "audio_vae",
    "vocoder",
];

enum Role {
    Denoiser,
    Text,
    Vae,
    Decoder,
}
