//! `CLIPTextModelWithProjection`: causal pre-LN transformer over token + position embeddings;
//! pooled output at the end-of-text token, projected.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::nn::{attention, Embedding, LayerNorm, Linear, Scope};
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
    /// Projected pooled output (B, projection_dim).
    pub text_embeds: Tensor,
}

struct EncoderLayer {
    layer_norm1: LayerNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    out_proj: Linear,
    layer_norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

pub struct ClipTextModel {
    pub config: ClipTextConfig,
    token_embedding: Embedding,
    position_embedding: Embedding,
    layers: Vec<EncoderLayer>,
    final_layer_norm: LayerNorm,
    text_projection: Linear,
    pub store: VarStore,
}

impl ClipTextModel {
    pub fn new(config: &ClipTextConfig, device: Device) -> Result<Self, ModelError> {
        match config.hidden_act.as_str() {
            "quick_gelu" | "gelu" => {}
            other => {
                return Err(ModelError::Input(format!(
                    "CLIP hidden_act `{other}` is not supported; expected quick_gelu or gelu"
                )))
            }
        }
        let store = super::store(device);
        let root = Scope::root(store.root(), None);
        let text = &root / "text_model";
        let (d, eps) = (config.hidden_size, config.layer_norm_eps);
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let s = &(&(&text / "encoder") / "layers") / i;
                let attn = &s / "self_attn";
                let mlp = &s / "mlp";
                EncoderLayer {
                    layer_norm1: LayerNorm::new(&(&s / "layer_norm1"), d, eps),
                    q_proj: (&attn / "q_proj").linear(d, d, true),
                    k_proj: (&attn / "k_proj").linear(d, d, true),
                    v_proj: (&attn / "v_proj").linear(d, d, true),
                    out_proj: (&attn / "out_proj").linear(d, d, true),
                    layer_norm2: LayerNorm::new(&(&s / "layer_norm2"), d, eps),
                    fc1: (&mlp / "fc1").linear(d, config.intermediate_size, true),
                    fc2: (&mlp / "fc2").linear(config.intermediate_size, d, true),
                }
            })
            .collect();
        let embeddings = &text / "embeddings";
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
            layers,
            final_layer_norm: LayerNorm::new(&(&text / "final_layer_norm"), d, eps),
            text_projection: (&root / "text_projection").linear(d, config.projection_dim, false),
            config: config.clone(),
            store,
        })
    }

    /// Loads a transformers directory (`config.json` + safetensors).
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let config: ClipTextConfig = read_config(&dir.join("config.json"))?;
        let mut model = Self::new(&config, device)?;
        super::load_frozen(&mut model.store, dir, kind)?;
        Ok(model)
    }

    fn act(&self, x: &Tensor) -> Tensor {
        match self.config.hidden_act.as_str() {
            "quick_gelu" => x * (x * 1.702).sigmoid(),
            _ => x.gelu("none"),
        }
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
        let mut x = self.token_embedding.forward(ids)
            + self.position_embedding.forward(&positions).unsqueeze(0);
        let heads = self.config.num_attention_heads;
        let mut penultimate = x.shallow_clone();
        for (i, layer) in self.layers.iter().enumerate() {
            if i + 1 == self.layers.len() {
                penultimate = x.shallow_clone();
            }
            let h = layer.layer_norm1.forward(&x);
            let split = |t: Tensor| t.view([b, l, heads, -1]).transpose(1, 2);
            let (q, k, v) = (
                split(layer.q_proj.forward(&h)),
                split(layer.k_proj.forward(&h)),
                split(layer.v_proj.forward(&h)),
            );
            let attn = attention(&q, &k, &v, None, true, None);
            x = &x + layer.out_proj.forward(&attn.transpose(1, 2).reshape([b, l, -1]));
            let h = layer.layer_norm2.forward(&x);
            x = &x + layer.fc2.forward(&self.act(&layer.fc1.forward(&h)));
        }
        let last = self.final_layer_norm.forward(&x);
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
            text_embeds: self.text_projection.forward(&pooled),
            last_hidden_state: last,
            penultimate_hidden_state: penultimate,
        })
    }
}
