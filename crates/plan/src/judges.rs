//! Reward models that run in the training process (`vlm_judge` with `backend: native`, `hpsv3`):
//! their weights, and the key-value cache of one batch of answers (or of one scoring forward).

use std::path::Path;

use serde_json::Value;

use crate::json::Json;
use crate::{Dtype, PlanError};

/// Text tokens around each picture in a judge's prompt (template, instruction, sample prompt).
pub const PROMPT_TOKENS: u64 = 256;

/// An in-process judge as the planner sees it.
#[derive(Debug, Clone)]
pub struct Judge {
    /// What the plan calls it (`vlm_judge (<class>)`).
    pub name: String,
    pub params: u64,
    /// Values cached per token: keys and values of every layer.
    pub cache_per_token: u64,
    pub dtype: Dtype,
    /// Weights on the host between scorings (`vlm.offload`).
    pub offload: bool,
    /// Pictures answered together (`vlm.batch_size`) and the tokens of each one's sequence.
    pub batch: u64,
    pub tokens: u64,
}

impl Judge {
    /// The judge in folder `dir` (transformers `config.json`) answering `batch` pictures of
    /// `resolution`² pixels at a time with at most `answer_tokens` tokens each; `dtype` when
    /// given, else the checkpoint's. A `preference` model (HPSv3) adds its head.
    pub fn read(
        dir: &Path,
        preference: bool,
        dtype: Option<Dtype>,
        offload: bool,
        batch: u64,
        resolution: u64,
        answer_tokens: u64,
    ) -> Result<Self, PlanError> {
        let cfg = Json::read(&dir.join("config.json"))?;
        let class = cfg
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .ok_or_else(|| cfg.bad("architectures", "missing"))?
            .to_string();
        let mut params = crate::text::judge(&cfg, &class)?;
        if preference {
            let hidden = cfg.nested_or_self("text_config").int("hidden_size", None)?;
            params += crate::text::preference_head(hidden, 2);
        }
        let text = cfg.nested_or_self("text_config");
        let heads = text.int("num_attention_heads", None)?;
        let head_dim = text.int("head_dim", Some(text.int("hidden_size", None)? / heads))?;
        let kv = text.int("num_key_value_heads", Some(heads))? * head_dim;
        let cache_per_token = 2 * text.int("num_hidden_layers", None)? * kv;
        let vision = cfg.nested_or_self("vision_config");
        let side =
            vision.int("patch_size", Some(14))? * vision.int("spatial_merge_size", Some(2))?;
        let picture = resolution.div_ceil(side).pow(2);
        let stored = cfg.string("dtype").or(cfg.string("torch_dtype"));
        let dtype = dtype.unwrap_or(match stored {
            Some("float32") => Dtype::F32,
            Some("float16") => Dtype::F16,
            _ => Dtype::Bf16,
        });
        let reward = if preference { "hpsv3" } else { "vlm_judge" };
        Ok(Self {
            name: format!("{reward} ({class})"),
            params,
            cache_per_token,
            dtype,
            offload,
            batch,
            tokens: picture + PROMPT_TOKENS + answer_tokens,
        })
    }

    /// Bytes of its weights.
    pub fn weight_bytes(&self) -> u64 {
        self.params * self.dtype.bytes()
    }

    /// Bytes of the key-value cache of one batch.
    pub fn cache_bytes(&self) -> u64 {
        self.cache_per_token * self.tokens * self.batch * self.dtype.bytes()
    }
}
