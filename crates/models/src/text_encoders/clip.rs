//! `CLIPTextModel` and `CLIPTextModelWithProjection`: causal pre-LN transformer over token +
//! position embeddings; pooled output at the end-of-text token, projected by the latter.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::clip::encoder::{Encoder, EncoderShape};
use crate::nn::{Embedding, LayerNorm, Linear, Scope};
use crate::{read_config, ModelError};

/// Mirror of the transformers `CLIPTextConfig` fields the model uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClipTextConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub projection_dim: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    pub max_position_embeddings: i64,
    pub hidden_act: String,
    pub layer_norm_eps: f64,
    pub bos_token_id: i64,
    pub eos_token_id: i64,
    pub pad_token_id: i64,
}

impl Default for ClipTextConfig {
    fn default() -> Self {
        Self {
            vocab_size: 49408,
            hidden_size: 512,
            intermediate_size: 2048,
            projection_dim: 512,
            num_hidden_layers: 12,
            num_attention_heads: 8,
            max_position_embeddings: 77,
            hidden_act: "quick_gelu".into(),
            layer_norm_eps: 1e-5,
            bos_token_id: 49406,
            eos_token_id: 49407,
            pad_token_id: 1,
        }
    }
}

/// What the SD3 prompt encoding takes from CLIP.
pub struct ClipOutput {
    /// Final-layer-normed states (B, L, D).
    pub last_hidden_state: Tensor,
    /// Input of the last layer, not normed (B, L, D): `hidden_states[-2]`.
    pub penultimate_hidden_state: Tensor,
    /// Final-layer-normed state at the end-of-text token (B, D): `pooler_output`.
    pub pooler_output: Tensor,
    /// Projected pooled output (B, projection_dim); `None` without a `text_projection`.
    pub text_embeds: Option<Tensor>,
}

/// The text tower under a model's root: `text_model.{embeddings, encoder, final_layer_norm}` and,
/// with a projection, `text_projection` (`CLIPTextModelWithProjection`, `CLIPModel`).
pub struct ClipTextTower {
    pub config: ClipTextConfig,
    token_embedding: Embedding,
    position_embedding: Embedding,
    encoder: Encoder,
    final_layer_norm: LayerNorm,
    text_projection: Option<Linear>,
}

impl ClipTextTower {
    pub fn new(
        root: &Scope<'_>,
        config: &ClipTextConfig,
        projection: bool,
    ) -> Result<Self, ModelError> {
        let text = root / "text_model";
        let d = config.hidden_size;
        let embeddings = &text / "embeddings";
        let shape = EncoderShape {
            hidden_size: d,
            intermediate_size: config.intermediate_size,
            num_hidden_layers: config.num_hidden_layers,
            num_attention_heads: config.num_attention_heads,
            layer_norm_eps: config.layer_norm_eps,
            hidden_act: config.hidden_act.clone(),
        };
        Ok(Self {
            token_embedding: Embedding::new(
                &(&embeddings / "token_embedding"),
                config.vocab_size,
                d,
            ),
            position_embedding: Embedding::new(
                &(&embeddings / "position_embedding"),
                config.max_position_embeddings,
                d,
            ),
            encoder: Encoder::new(&text, &shape)?,
            final_layer_norm: LayerNorm::new(
                &(&text / "final_layer_norm"),
                d,
                config.layer_norm_eps,
            ),
            text_projection: projection
                .then(|| (root / "text_projection").linear(d, config.projection_dim, false)),
            config: config.clone(),
        })
    }

    /// Encodes token ids (B, L), L ≤ max_position_embeddings.
    pub fn forward(&self, ids: &Tensor) -> Result<ClipOutput, ModelError> {
        let (b, l) = ids.size2().map_err(|_| {
            ModelError::Input(format!("CLIP input_ids must be (B, L), got {:?}", ids.size()))
        })?;
        if l > self.config.max_position_embeddings {
            return Err(ModelError::Input(format!(
                "CLIP takes at most {} tokens, got {l}",
                self.config.max_position_embeddings
            )));
        }
        let positions = Tensor::arange(l, (Kind::Int64, ids.device()));
        let x = self.token_embedding.forward(ids)
            + self.position_embedding.forward(&positions).unsqueeze(0);
        let out = self.encoder.forward(x, true);
        let last = self.final_layer_norm.forward(&out.last);
        // transformers' rule: configs with eos_token_id 2 predate the fix and pool at the largest
        // id (the real end-of-text token has the largest id); others at the first eos token.
        let eos_at = if self.config.eos_token_id == 2 {
            ids.argmax(-1, false)
        } else {
            ids.eq(self.config.eos_token_id).to_kind(Kind::Int).argmax(-1, false)
        };
        let rows = Tensor::arange(b, (Kind::Int64, ids.device()));
        let pooled = last.index(&[Some(rows), Some(eos_at)]);
        Ok(ClipOutput {
            text_embeds: self.text_projection.as_ref().map(|p| p.forward(&pooled)),
            pooler_output: pooled,
            last_hidden_state: last,
            penultimate_hidden_state: out.penultimate,
        })
    }
}

/// The `architectures` of a text-only CLIP component's `config.json`.
pub const CLIP_TEXT_ARCHITECTURES: [&str; 2] = ["CLIPTextModel", "CLIPTextModelWithProjection"];

/// The position-id buffer that checkpoints of transformers before 4.31 carry.
const IGNORED: &[&str] = &["text_model.embeddings.position_ids"];
/// transformers 5 saves `CLIPTextModel` (FLUX.1's text encoder) without the `text_model.` prefix
/// (`CLIPTextModelWithProjection` keeps it); transformers loads either layout, and so does this.
const UNPREFIXED: &[(&str, &str)] = &[
    ("embeddings.", "text_model.embeddings."),
    ("encoder.", "text_model.encoder."),
    ("final_layer_norm.", "text_model.final_layer_norm."),
];

/// `CLIPTextModel` or `CLIPTextModelWithProjection`: the text tower and the store holding its
/// weights.
pub struct ClipTextModel {
    pub config: ClipTextConfig,
    tower: ClipTextTower,
    pub store: VarStore,
}

impl ClipTextModel {
    /// Zeroed weights; `projection` builds `text_projection` (`CLIPTextModelWithProjection`).
    pub fn new(
        config: &ClipTextConfig,
        device: Device,
        kind: Kind,
        projection: bool,
    ) -> Result<Self, ModelError> {
        let store = super::store(device, kind);
        let tower = ClipTextTower::new(&Scope::root(store.root(), None), config, projection)?;
        Ok(Self { config: config.clone(), tower, store })
    }

    /// Loads a transformers directory (`config.json` + safetensors) saved by transformers 4 or 5;
    /// `architectures` in the config says whether it has a projection.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let config: ClipTextConfig = read_config(&path)?;
        let raw: serde_json::Value = read_config(&path)?;
        let architecture = raw["architectures"].get(0).and_then(|a| a.as_str());
        let projection = match architecture {
            Some("CLIPTextModel") => false,
            Some("CLIPTextModelWithProjection") => true,
            _ => {
                return Err(ModelError::Format {
                    path: path.display().to_string(),
                    message: format!(
                        "architectures is {}, expected one of {CLIP_TEXT_ARCHITECTURES:?}",
                        raw["architectures"]
                    ),
                })
            }
        };
        let mut model = Self::new(&config, device, kind, projection)?;
        super::load_frozen(&mut model.store, dir, kind, IGNORED, UNPREFIXED)?;
        Ok(model)
    }

    /// Encodes token ids (B, L), L ≤ max_position_embeddings.
    pub fn forward(&self, ids: &Tensor) -> Result<ClipOutput, ModelError> {
        self.tower.forward(ids)
    }
}
