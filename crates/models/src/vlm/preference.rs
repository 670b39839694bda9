//! A preference model on a Qwen2-VL backbone (HPSv3's `Qwen2VLRewardModelBT`): the language
//! model's final-normed state at the reward token (`<|Reward|>`, once per conversation) goes
//! through a small head in f32 — Linear(hidden, 1024), ReLU, Linear(1024, 16), ReLU,
//! Linear(16, outputs) (`rm_head.0`, `.3`, `.5`; dropout is inactive) — whose first output is the
//! score (HPSv3: the mean of its Gaussian, the second its log-σ). As the released model runs it,
//! every token (the picture's too) takes sequential 1-D rotary positions, and rows are padded on
//! the right.

use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::ChatTemplate;
use crate::nn::{Linear, Scope};
use crate::text_encoders::qwen2_5_vl::Qwen25VlTextEncoder;
use crate::text_encoders::qwen2_5_vl_positions::text_positions;
use crate::text_encoders::qwen2_vl_processor::Qwen2VlImageProcessor;
use crate::text_encoders::qwen2_vl_vision::Qwen2VlVision;
use crate::tokenizer::TextTokenizer;
use crate::weights::{checkpoint_files, load_weights, LoadOptions};
use crate::ModelError;

/// The token whose state is scored.
pub const REWARD_TOKEN: &str = "<|Reward|>";
const IMAGE_PAD: &str = "<|image_pad|>";

/// A Qwen2-VL preference model with its tokenizer, image processor and chat template.
pub struct PreferenceModel {
    text: Qwen25VlTextEncoder,
    vision: Qwen2VlVision,
    head: [Linear; 3],
    _head_store: tch::nn::VarStore,
    pub tokenizer: TextTokenizer,
    pub processor: Qwen2VlImageProcessor,
    pub template: ChatTemplate,
    reward_token_id: i64,
    pad_token_id: i64,
}

impl PreferenceModel {
    /// Loads a folder of `Qwen2VLRewardModelBT` (a Qwen2-VL `config.json`, safetensors with
    /// `rm_head.*`, a tokenizer that has `<|Reward|>`) with the backbone in `kind` on `device`;
    /// the head stays f32. `outputs` is the head's width (HPSv3: 2).
    pub fn load(dir: &Path, device: Device, kind: Kind, outputs: i64) -> Result<Self, ModelError> {
        let text = Qwen25VlTextEncoder::load(dir, device, kind)?;
        let vision = Qwen2VlVision::load(dir, device, kind)?;
        let hidden = text.config.hidden_size;
        if vision.config.hidden_size != hidden {
            return Err(ModelError::Format {
                path: dir.join("config.json").display().to_string(),
                message: format!(
                    "vision_config.hidden_size {} differs from the language model's {hidden}",
                    vision.config.hidden_size
                ),
            });
        }
        let mut store = crate::weights::store(device, Kind::Float);
        let root = Scope::root(store.root(), None);
        let head = &root / "rm_head";
        let head = [
            (&head / 0).linear(hidden, 1024, true),
            (&head / 3).linear(1024, 16, true),
            (&head / 5).linear(16, outputs, true),
        ];
        let options = LoadOptions {
            kind: Some(Kind::Float),
            ignored_prefixes: &["model.", "visual.", "lm_head."],
            ..Default::default()
        };
        load_weights(&mut store, &checkpoint_files(dir)?, options)?;
        store.freeze();
        let tokenizer = TextTokenizer::load(dir)?;
        let reward_token_id =
            tokenizer.token_id(REWARD_TOKEN).ok_or_else(|| ModelError::Format {
                path: dir.display().to_string(),
                message: format!("the tokenizer has no {REWARD_TOKEN} token to score at"),
            })?;
        Ok(Self {
            pad_token_id: i64::from(tokenizer.pad_id()),
            reward_token_id: i64::from(reward_token_id),
            processor: Qwen2VlImageProcessor::load(dir)?,
            template: ChatTemplate::load(dir)?,
            tokenizer,
            text,
            vision,
            head,
            _head_store: store,
        })
    }

    /// The head's outputs (B, outputs) f32 for one conversation per `(picture, user)`: the
    /// template with its default system prompt around the picture and `user` (which must hold
    /// the reward token once), right-padded.
    pub fn score(&self, rows: &[(&image::RgbImage, &str)]) -> Result<Tensor, ModelError> {
        let _guard = tch::no_grad_guard();
        let device = self.text.store.device();
        let merge = self.processor.merge_size;
        let (mut ids, mut patches, mut grids) = (vec![], vec![], vec![]);
        for (k, (picture, user)) in rows.iter().enumerate() {
            let text = self.template.picture_question(None, user)?;
            let (h, w) = (picture.height() as usize, picture.width() as usize);
            let (values, grid) = self.processor.preprocess(h, w, picture.as_raw(), device)?;
            let tokens = (grid.0 * grid.1 * grid.2 / (merge * merge)) as usize;
            let row: Vec<i64> = self
                .tokenizer
                .ids(&text.replace(IMAGE_PAD, &IMAGE_PAD.repeat(tokens)))?
                .into_iter()
                .map(i64::from)
                .collect();
            let marks = row.iter().filter(|&&t| t == self.reward_token_id).count();
            if marks != 1 {
                return Err(ModelError::Input(format!(
                    "conversation {k} holds {marks} {REWARD_TOKEN} tokens; the prompt must hold one"
                )));
            }
            ids.push(row);
            patches.push(values);
            grids.push(grid);
        }
        let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
        let (mut flat, mut mask) = (vec![], vec![]);
        for row in &ids {
            flat.extend(row);
            flat.extend(std::iter::repeat_n(self.pad_token_id, longest - row.len()));
            mask.extend(std::iter::repeat_n(1i64, row.len()));
            mask.extend(std::iter::repeat_n(0i64, longest - row.len()));
        }
        let (b, l) = (rows.len() as i64, longest as i64);
        let input_ids = Tensor::from_slice(&flat).view([b, l]).to_device(device);
        let mask = Tensor::from_slice(&mask).view([b, l]).to_device(device);
        let embeds = self.vision.forward(&Tensor::cat(&patches, 0), &grids)?;
        let decoder = self.text.decoder();
        let slots = input_ids.eq(self.text.config.image_token_id);
        let x = decoder.embed(&input_ids);
        let x = x.masked_scatter(&slots.unsqueeze(-1), &embeds.to_kind(x.kind()));
        let section = [decoder.shape.head_dim / 2];
        let depth = decoder.shape.num_hidden_layers;
        let states = decoder.run(x, &mask, &text_positions(b, l, device), &section, depth)?;
        let states = decoder.final_norm(&states);
        let at = input_ids.eq(self.reward_token_id).to_kind(Kind::Int64).argmax(1, false);
        let pooled = states
            .gather(1, &at.view([b, 1, 1]).expand([b, 1, states.size()[2]], false), false)
            .squeeze_dim(1)
            .to_kind(Kind::Float);
        let [first, second, last] = &self.head;
        let h = first.forward(&pooled).relu();
        Ok(last.forward(&second.forward(&h).relu()))
    }

    /// Moves every weight to `device`.
    pub fn to_device(&mut self, device: Device) {
        self.text.store.set_device(device);
        self.vision.store.set_device(device);
        self._head_store.set_device(device);
    }
}
