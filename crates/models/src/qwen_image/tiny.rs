//! `flowtune make-tiny qwen_image`: a complete random `QwenImagePipeline` directory in the exact
//! diffusers layout (loadable by diffusers), for tests and examples.

use std::path::Path;

use flowtune_sampling::SampleRng;
use serde_json::json;
use tch::{Device, Kind};

use super::{
    write_tiny_qwen_vae, QwenImageTransformer, QwenImageTransformerConfig, QwenVaeConfig, EDIT_PLUS,
};
use crate::sd3::tiny::{randomize, write_model, write_scheduler, DIFFUSERS_VERSION};
use crate::sd3::WeightInit;
use crate::text_encoders::qwen_tiny::{write_tiny_qwen_text_encoder, TinyQwenTextSpec};
use crate::{write_json, ModelError};

/// Sizes of a tiny Qwen-Image pipeline.
#[derive(Debug, Clone)]
pub struct TinyQwenImageSpec {
    pub seed: u64,
    pub layers: usize,
    pub heads: i64,
    pub head_dim: i64,
    /// Rotary dimensions per axis (frame, row, column); they sum to `head_dim`.
    pub axes_dims_rope: [i64; 3],
    /// The text encoder, whose width is the transformer's `joint_attention_dim`.
    pub text: TinyQwenTextSpec,
    pub vae: QwenVaeConfig,
    /// The Edit models' zero timestep for condition tokens.
    pub zero_cond_t: bool,
    /// A `QwenImageEditPlusPipeline` (with a `processor/` folder) instead of `QwenImagePipeline`.
    pub edit: bool,
    /// The dtype the transformer's weights are written in (a released checkpoint's is bf16).
    pub dtype: Kind,
    /// A real transformer config (e.g. with fewer blocks) used as it is instead of the one the
    /// sizes above build; the text encoder's width is its `joint_attention_dim`.
    pub transformer: Option<QwenImageTransformerConfig>,
}

impl Default for TinyQwenImageSpec {
    fn default() -> Self {
        Self {
            seed: 0,
            layers: 2,
            heads: 2,
            head_dim: 16,
            axes_dims_rope: [4, 6, 6],
            text: TinyQwenTextSpec::default(),
            vae: QwenVaeConfig::tiny(),
            zero_cond_t: false,
            edit: false,
            dtype: Kind::Float,
            transformer: None,
        }
    }
}

/// Writes the pipeline into `dir` (created if missing).
pub fn write_tiny_qwen_image(dir: &Path, spec: &TinyQwenImageSpec) -> Result<(), ModelError> {
    let config = spec.transformer.clone().unwrap_or_else(|| QwenImageTransformerConfig {
        num_layers: spec.layers,
        num_attention_heads: spec.heads,
        attention_head_dim: spec.head_dim,
        axes_dims_rope: spec.axes_dims_rope,
        joint_attention_dim: spec.text.hidden_size,
        in_channels: 4 * spec.vae.z_dim,
        out_channels: Some(spec.vae.z_dim),
        zero_cond_t: spec.zero_cond_t,
        ..Default::default()
    });
    let text = TinyQwenTextSpec { hidden_size: config.joint_attention_dim, ..spec.text.clone() };
    write_tiny_qwen_text_encoder(
        &dir.join("text_encoder"),
        &dir.join("tokenizer"),
        spec.seed,
        &text,
    )?;
    write_tiny_qwen_vae(&dir.join("vae"), spec.seed + 1, &spec.vae)?;

    let transformer = QwenImageTransformer::new(&config, Device::Cpu, spec.dtype, None)?;
    let mut rng = SampleRng::new(spec.seed + 2);
    randomize(&transformer.weights.base, &mut rng, WeightInit::Normal(0.1))?;
    write_model(&dir.join("transformer"), &transformer.weights.base, &config)?;

    // Qwen-Image's own scheduler settings (dynamic shifting, exponential time shift, terminal 0.02).
    write_scheduler(
        dir,
        &json!({
            "_class_name": "FlowMatchEulerDiscreteScheduler",
            "_diffusers_version": DIFFUSERS_VERSION,
            "base_image_seq_len": 256,
            "base_shift": 0.5,
            "invert_sigmas": false,
            "max_image_seq_len": 8192,
            "max_shift": 0.9,
            "num_train_timesteps": 1000,
            "shift": 1.0,
            "shift_terminal": 0.02,
            "stochastic_sampling": false,
            "time_shift_type": "exponential",
            "use_beta_sigmas": false,
            "use_dynamic_shifting": true,
            "use_exponential_sigmas": false,
            "use_karras_sigmas": false
        }),
    )?;
    let mut index = json!({
            "_class_name": "QwenImagePipeline",
            "_diffusers_version": DIFFUSERS_VERSION,
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
            "tokenizer": ["transformers", "Qwen2Tokenizer"],
            "transformer": ["diffusers", "QwenImageTransformer2DModel"],
            "vae": ["diffusers", "AutoencoderKLQwenImage"],
    });
    if spec.edit {
        index["_class_name"] = json!(EDIT_PLUS);
        index["processor"] = json!(["transformers", "Qwen2VLProcessor"]);
        write_processor(&dir.join("processor"), &dir.join("tokenizer"))?;
    }
    write_json(&dir.join("model_index.json"), &index)
}

/// Edit-Plus's `processor/`: Qwen2-VL's image-processor settings (the released pipeline's) and a
/// copy of the tokenizer, as `Qwen2VLProcessor.save_pretrained` lays them out.
fn write_processor(dir: &Path, tokenizer: &Path) -> Result<(), ModelError> {
    let io = |path: &Path, e: std::io::Error| ModelError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    for entry in std::fs::read_dir(tokenizer).map_err(|e| io(tokenizer, e))? {
        let from = entry.map_err(|e| io(tokenizer, e))?.path();
        let to = dir.join(from.file_name().expect("a file in the folder"));
        std::fs::copy(&from, &to).map_err(|e| io(&to, e))?;
    }
    write_json(
        &dir.join("preprocessor_config.json"),
        &json!({
            "image_processor_type": "Qwen2VLImageProcessor",
            "processor_class": "Qwen2VLProcessor",
            "do_resize": true,
            "do_rescale": true,
            "do_normalize": true,
            "do_convert_rgb": true,
            "resample": 3,
            "rescale_factor": 1.0 / 255.0,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711],
            "min_pixels": 3136,
            "max_pixels": 12845056,
            "patch_size": 14,
            "temporal_patch_size": 2,
            "merge_size": 2
        }),
    )
}
