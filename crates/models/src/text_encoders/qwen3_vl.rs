//! `Qwen3VLForConditionalGeneration` as Qwen-Image 2.1 runs it: the language model
//! ([`Qwen3TextEncoder::load_vl`]) and the vision tower ([`Qwen3VlVision`]). With pictures, their
//! merged embeddings replace the `image_token_id` tokens' embeddings, the deepstack features are
//! added to those tokens' states after the first layers, and the rotary positions are 3-D
//! (transformers' `get_rope_index`: [`multimodal_positions`]) with `mrope_section` interleaved
//! over the frequencies (Qwen3-VL always interleaves; `mrope_interleaved` is not read).

use std::path::Path;

use serde::Deserialize;
use tch::{Device, Kind, Tensor};

use super::qwen2_5_vl_positions::multimodal_positions;
use super::qwen3::Qwen3TextEncoder;
use super::qwen3_vl_vision::{Qwen3VlVision, VisionFeatures};
use super::qwen_decoder::{Deepstack, Mrope};
use crate::{read_config, ModelError};

/// transformers' `mrope_section` when the config gives none.
const DEFAULT_MROPE_SECTION: [i64; 3] = [24, 20, 20];

#[derive(Deserialize, Default)]
struct RopeFields {
    mrope_section: Option<Vec<i64>>,
}

#[derive(Deserialize, Default)]
struct TextFields {
    rope_parameters: Option<RopeFields>,
    rope_scaling: Option<RopeFields>,
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    text_config: TextFields,
    #[serde(default = "default_image_token")]
    image_token_id: i64,
}

fn default_image_token() -> i64 {
    151655
}

/// The language model and vision tower of a Qwen3-VL checkpoint.
pub struct Qwen3VlEncoder {
    pub text: Qwen3TextEncoder,
    pub vision: Qwen3VlVision,
    /// The `<|image_pad|>` token whose embeddings the pictures replace.
    pub image_token_id: i64,
    /// Rotary frequencies per position row (temporal, height, width), interleaved.
    pub mrope_section: Vec<i64>,
}

impl Qwen3VlEncoder {
    /// Loads both towers of a `Qwen3VLForConditionalGeneration` directory, frozen.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let config: ConfigFile = read_config(&path)?;
        let rope = config.text_config.rope_parameters.or(config.text_config.rope_scaling);
        let section =
            rope.and_then(|r| r.mrope_section).unwrap_or_else(|| DEFAULT_MROPE_SECTION.to_vec());
        let text = Qwen3TextEncoder::load_vl(dir, device, kind)?;
        let half = text.head_dim() / 2;
        if section.len() != 3
            || section.iter().any(|&n| n < 0)
            || section.iter().sum::<i64>() != half
        {
            return Err(ModelError::Format {
                path: path.display().to_string(),
                message: format!(
                    "text_config mrope_section {section:?}: expected three sizes summing to \
                     head_dim / 2 = {half}"
                ),
            });
        }
        let vision = Qwen3VlVision::load(dir, device, kind)?;
        if vision.config.out_hidden_size != text.hidden_size() {
            return Err(ModelError::Format {
                path: path.display().to_string(),
                message: format!(
                    "vision_config.out_hidden_size {} differs from the language model's \
                     hidden_size {}",
                    vision.config.out_hidden_size,
                    text.hidden_size()
                ),
            });
        }
        Ok(Self { text, vision, image_token_id: config.image_token_id, mrope_section: section })
    }

    /// The last layer's states (B, L, hidden) before the final norm of `input_ids` (B, L) under
    /// `attention_mask` (B, L) (either padding side) whose runs of image tokens hold, in order,
    /// the pictures of patch grids `grids` with the tower's `features` of them.
    pub fn last_layer_with_pictures(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        features: &VisionFeatures,
        grids: &[(i64, i64, i64)],
    ) -> Result<Tensor, ModelError> {
        let (b, l) = input_ids.size2()?;
        if attention_mask.size() != [b, l] {
            return Err(ModelError::Input(format!(
                "Qwen3-VL attention_mask must have the shape of input_ids {:?}, got {:?}",
                [b, l],
                attention_mask.size()
            )));
        }
        let merge = self.vision.config.spatial_merge_size;
        let positions =
            multimodal_positions(input_ids, attention_mask, self.image_token_id, grids, merge)?;
        let slots = input_ids.eq(self.image_token_id);
        let count = slots.sum(Kind::Int64).int64_value(&[]);
        let hidden = self.text.hidden_size();
        if features.embeds.size() != [count, hidden] {
            return Err(ModelError::Input(format!(
                "Qwen3-VL image embeddings must be ({count}, {hidden}) for the {count} image \
                 tokens, got {:?}",
                features.embeds.size()
            )));
        }
        let decoder = self.text.decoder();
        let x = decoder.embed(input_ids);
        let x = x.masked_scatter(&slots.unsqueeze(-1), &features.embeds.to_kind(x.kind()));
        let deepstack = Deepstack { slots: &slots, features: &features.deepstack };
        let depth = self.text.num_layers();
        let mut states = decoder.run_states_with(
            x,
            attention_mask,
            &positions,
            Mrope::Interleaved(&self.mrope_section),
            &[depth],
            Some(&deepstack),
        )?;
        Ok(states.pop().expect("one state"))
    }
}
