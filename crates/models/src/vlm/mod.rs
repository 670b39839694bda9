//! Vision-language chat models run in-process as judges: `Qwen2_5_VLForConditionalGeneration`
//! and `Qwen3VLForConditionalGeneration` with their tokenizer, image processor, chat template
//! and language-model head (tied to the token embeddings where the config says so). A batch of
//! (picture, question) pairs is laid out as transformers' processor lays it out (left padding),
//! and answered greedily with a key-value cache ([`generate`]).

pub mod chat;
pub mod generate;
pub mod preference;

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::text_encoders::qwen2_5_vl::Qwen25VlTextEncoder;
use crate::text_encoders::qwen2_5_vl_positions::multimodal_positions;
use crate::text_encoders::qwen2_5_vl_vision::Qwen25VlVision;
use crate::text_encoders::qwen2_vl_processor::Qwen2VlImageProcessor;
use crate::text_encoders::qwen3_vl::Qwen3VlEncoder;
use crate::text_encoders::qwen_decoder::{Deepstack, KvCache, Mrope, QwenDecoder};
use crate::tokenizer::TextTokenizer;
use crate::weights::{checkpoint_files, load_weights, LoadOptions};
use crate::{read_config, ModelError};
pub use chat::ChatTemplate;

/// The text that stands for one picture in a rendered template; the processor repeats its
/// `<|image_pad|>` once per merged image token.
const IMAGE_PAD: &str = "<|image_pad|>";

/// The two towers of a checkpoint.
enum Towers {
    Qwen25 { text: Qwen25VlTextEncoder, vision: Qwen25VlVision, section: Vec<i64> },
    Qwen3(Qwen3VlEncoder),
}

/// The fields of `config.json` a judge reads besides the towers'.
#[derive(Deserialize)]
struct ConfigFile {
    model_type: String,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    text_config: Option<TextTie>,
    #[serde(default)]
    eos_token_id: Option<Ids>,
}

#[derive(Deserialize)]
struct TextTie {
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    eos_token_id: Option<Ids>,
}

/// One token id or several (`eos_token_id` takes either).
#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum Ids {
    One(i64),
    Many(Vec<i64>),
}

impl Ids {
    fn to_vec(&self) -> Vec<i64> {
        match self {
            Ids::One(id) => vec![*id],
            Ids::Many(ids) => ids.clone(),
        }
    }
}

#[derive(Deserialize, Default)]
struct GenerationConfig {
    #[serde(default)]
    eos_token_id: Option<Ids>,
}

/// A vision-language model with what it needs to read pictures and questions and to answer.
pub struct VisionLanguageModel {
    towers: Towers,
    /// `lm_head.weight` (vocab, hidden); `None` when tied to the token embeddings.
    lm_head: Option<Tensor>,
    _head_store: VarStore,
    pub tokenizer: TextTokenizer,
    pub processor: Qwen2VlImageProcessor,
    pub template: ChatTemplate,
    /// Tokens that end an answer (`generation_config.json`, else the config).
    pub eos_token_ids: Vec<i64>,
    /// The token padding rows on the left.
    pub pad_token_id: i64,
    /// The checkpoint folder.
    pub dir: PathBuf,
}

/// A batch of conversations as the processor lays them out: left-padded token ids and mask
/// (B, L), the pictures' patches and their `(t, h, w)` grids in row order.
pub struct Prompts {
    pub input_ids: Tensor,
    pub attention_mask: Tensor,
    pub pixel_values: Tensor,
    pub grids: Vec<(i64, i64, i64)>,
}

impl VisionLanguageModel {
    /// Loads a transformers folder of either architecture (`model_type` `qwen2_5_vl` or
    /// `qwen3_vl`) as `kind` on `device`, frozen, with its tokenizer, image processor and chat
    /// template.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let config_path = dir.join("config.json");
        let config: ConfigFile = read_config(&config_path)?;
        let towers = match config.model_type.as_str() {
            "qwen2_5_vl" => {
                let text = Qwen25VlTextEncoder::load(dir, device, kind)?;
                let section = text.mrope_section()?;
                let vision = Qwen25VlVision::load(dir, device, kind)?;
                Towers::Qwen25 { text, vision, section }
            }
            "qwen3_vl" => Towers::Qwen3(Qwen3VlEncoder::load(dir, device, kind)?),
            other => {
                return Err(ModelError::Format {
                    path: config_path.display().to_string(),
                    message: format!(
                        "model_type `{other}` is not a supported vision-language judge; expected \
                         qwen2_5_vl (Qwen2.5-VL) or qwen3_vl (Qwen3-VL)"
                    ),
                })
            }
        };
        // transformers 5 ties when either level says so (older saves put it in text_config).
        let text_tie = config.text_config.as_ref().and_then(|t| t.tie_word_embeddings);
        let tied = config.tie_word_embeddings.unwrap_or(false) || text_tie.unwrap_or(false);
        let mut head_store = crate::weights::store(device, kind);
        let lm_head = if tied {
            None
        } else {
            let decoder = decoder_of(&towers);
            let shape = [decoder.shape.vocab_size, decoder.shape.hidden_size];
            let weight = head_store.root().sub("lm_head").zeros_no_train("weight", &shape);
            let options = LoadOptions {
                kind: Some(kind),
                ignored_prefixes: &["model.", "visual."],
                ..Default::default()
            };
            load_weights(&mut head_store, &checkpoint_files(dir)?, options)?;
            head_store.freeze();
            Some(weight)
        };
        let generation: GenerationConfig = match dir.join("generation_config.json") {
            file if file.exists() => read_config(&file)?,
            _ => GenerationConfig::default(),
        };
        let text_eos = config.text_config.as_ref().and_then(|t| t.eos_token_id.clone());
        let eos = generation.eos_token_id.or(config.eos_token_id).or(text_eos);
        let tokenizer = TextTokenizer::load(dir)?;
        let eos_token_ids = match eos {
            Some(ids) => ids.to_vec(),
            None => tokenizer.token_id("<|im_end|>").map(|id| vec![id as i64]).unwrap_or_default(),
        };
        if eos_token_ids.is_empty() {
            return Err(ModelError::Format {
                path: dir.display().to_string(),
                message: "no end-of-answer token: expected eos_token_id in generation_config.json \
                          or config.json, or <|im_end|> in the tokenizer"
                    .into(),
            });
        }
        if tokenizer.token_id(IMAGE_PAD).map(i64::from) != Some(image_token_id(&towers)) {
            return Err(ModelError::Format {
                path: config_path.display().to_string(),
                message: format!(
                    "image_token_id {} is not the tokenizer's {IMAGE_PAD} ({:?})",
                    image_token_id(&towers),
                    tokenizer.token_id(IMAGE_PAD)
                ),
            });
        }
        let pad_token_id = i64::from(tokenizer.pad_id());
        Ok(Self {
            towers,
            lm_head,
            _head_store: head_store,
            processor: Qwen2VlImageProcessor::load(dir)?,
            template: ChatTemplate::load(dir)?,
            tokenizer,
            eos_token_ids,
            pad_token_id,
            dir: dir.to_path_buf(),
        })
    }

    /// The language model's decoder.
    fn decoder(&self) -> &QwenDecoder {
        decoder_of(&self.towers)
    }

    /// Where the weights live.
    pub fn device(&self) -> Device {
        self.decoder().embedding_weight().device()
    }

    /// The weights' kind.
    pub fn kind(&self) -> Kind {
        self.decoder().embedding_weight().kind()
    }

    /// Moves every weight to `device` (a judge sleeps on the host between scorings).
    pub fn to_device(&mut self, device: Device) {
        match &mut self.towers {
            Towers::Qwen25 { text, vision, .. } => {
                text.store.set_device(device);
                vision.store.set_device(device);
            }
            Towers::Qwen3(encoder) => {
                encoder.text.store.set_device(device);
                encoder.vision.store.set_device(device);
            }
        }
        self._head_store.set_device(device);
        if let Some(head) = &mut self.lm_head {
            *head = self._head_store.variables()["lm_head.weight"].shallow_clone();
        }
    }

    /// Parameters of the towers and the head (a tied head counted once).
    pub fn parameter_count(&self) -> i64 {
        let count =
            |store: &VarStore| store.variables().values().map(|t| t.numel() as i64).sum::<i64>();
        let towers = match &self.towers {
            Towers::Qwen25 { text, vision, .. } => count(&text.store) + count(&vision.store),
            Towers::Qwen3(encoder) => count(&encoder.text.store) + count(&encoder.vision.store),
        };
        towers + count(&self._head_store)
    }

    /// Lays out one conversation per `(picture, system, user)`: the template rendered (then
    /// `answer_prefix`, the start of the answer), each picture's `<|image_pad|>` repeated once per
    /// merged token, tokenized, and left-padded.
    pub fn prompts(
        &self,
        rows: &[(&image::RgbImage, Option<&str>, &str)],
        answer_prefix: &str,
    ) -> Result<Prompts, ModelError> {
        let device = self.device();
        let merge = self.processor.merge_size;
        let (mut ids, mut patches, mut grids) = (vec![], vec![], vec![]);
        for (picture, system, user) in rows {
            let text = self.template.picture_question(*system, user)? + answer_prefix;
            if text.matches(IMAGE_PAD).count() != 1 {
                return Err(ModelError::Input(format!(
                    "the chat template wrote {} {IMAGE_PAD} for one picture: {text:?}",
                    text.matches(IMAGE_PAD).count()
                )));
            }
            let (h, w) = (picture.height() as usize, picture.width() as usize);
            let (values, grid) = self.processor.preprocess(h, w, picture.as_raw(), device)?;
            let tokens = grid.0 * grid.1 * grid.2 / (merge * merge);
            let text = text.replace(IMAGE_PAD, &IMAGE_PAD.repeat(tokens as usize));
            ids.push(self.tokenizer.ids(&text)?);
            patches.push(values);
            grids.push(grid);
        }
        let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
        let (mut flat, mut mask) = (vec![], vec![]);
        for row in &ids {
            let pad = longest - row.len();
            flat.extend(std::iter::repeat_n(self.pad_token_id, pad));
            flat.extend(row.iter().map(|&i| i64::from(i)));
            mask.extend(std::iter::repeat_n(0i64, pad));
            mask.extend(std::iter::repeat_n(1i64, row.len()));
        }
        let shape = [rows.len() as i64, longest as i64];
        Ok(Prompts {
            input_ids: Tensor::from_slice(&flat).view(shape).to_device(device),
            attention_mask: Tensor::from_slice(&mask).view(shape).to_device(device),
            pixel_values: Tensor::cat(&patches, 0),
            grids,
        })
    }

    /// The final-normed states (B, L, hidden) of every position of `prompts`, in the weights'
    /// kind, and the cache and next positions (B) to continue from: the prefill of [`generate`]
    /// ([`Self::logits`] turns states into logits).
    pub fn prefill(&self, prompts: &Prompts) -> Result<(Tensor, KvCache, Tensor), ModelError> {
        let _guard = tch::no_grad_guard();
        let ids = &prompts.input_ids;
        let mask = &prompts.attention_mask;
        let decoder = self.decoder();
        let image_token = image_token_id(&self.towers);
        let slots = ids.eq(image_token);
        let mut cache = KvCache::default();
        let (states, positions) = match &self.towers {
            Towers::Qwen25 { vision, section, .. } => {
                let merge = vision.config.spatial_merge_size;
                let positions =
                    multimodal_positions(ids, mask, image_token, &prompts.grids, merge)?;
                let embeds = vision.forward(&prompts.pixel_values, &prompts.grids)?;
                let x = embed_pictures(decoder, ids, &slots, &embeds)?;
                let rope = Mrope::Chunked(section);
                (decoder.run_cached(x, mask, &positions, rope, &mut cache, None)?, positions)
            }
            Towers::Qwen3(encoder) => {
                let merge = encoder.vision.config.spatial_merge_size;
                let positions =
                    multimodal_positions(ids, mask, image_token, &prompts.grids, merge)?;
                let features = encoder.vision.forward(&prompts.pixel_values, &prompts.grids)?;
                let x = embed_pictures(decoder, ids, &slots, &features.embeds)?;
                let deepstack = Deepstack { slots: &slots, features: &features.deepstack };
                let rope = Mrope::Interleaved(&encoder.mrope_section);
                let states =
                    decoder.run_cached(x, mask, &positions, rope, &mut cache, Some(&deepstack))?;
                (states, positions)
            }
        };
        // The next token of a row continues after its largest position (transformers'
        // `rope_deltas`): padding sits at 0.
        let next = positions.amax([0, 2], false) + 1;
        Ok((states, cache, next))
    }

    /// One step of decoding: the logits (B, 1, vocab) of `tokens` (B, 1) at `positions` (B),
    /// after the `cache`d tokens that `keys` (B, cached + 1) keeps.
    pub fn decode_step(
        &self,
        tokens: &Tensor,
        keys: &Tensor,
        positions: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor, ModelError> {
        let _guard = tch::no_grad_guard();
        let decoder = self.decoder();
        let b = tokens.size()[0];
        let positions = positions.view([1, b, 1]).expand([3, b, 1], false);
        let x = decoder.embed(tokens);
        let states = match &self.towers {
            Towers::Qwen25 { section, .. } => {
                decoder.run_cached(x, keys, &positions, Mrope::Chunked(section), cache, None)?
            }
            Towers::Qwen3(encoder) => {
                let rope = Mrope::Interleaved(&encoder.mrope_section);
                decoder.run_cached(x, keys, &positions, rope, cache, None)?
            }
        };
        Ok(self.logits(&states))
    }

    /// The language-model head on final-normed states (…, hidden) → (…, vocab).
    pub fn logits(&self, states: &Tensor) -> Tensor {
        let head = self.lm_head.as_ref().unwrap_or(self.decoder().embedding_weight());
        states.matmul(&head.tr())
    }
}

fn decoder_of(towers: &Towers) -> &QwenDecoder {
    match towers {
        Towers::Qwen25 { text, .. } => text.decoder(),
        Towers::Qwen3(encoder) => encoder.text.decoder(),
    }
}

fn image_token_id(towers: &Towers) -> i64 {
    match towers {
        Towers::Qwen25 { text, .. } => text.config.image_token_id,
        Towers::Qwen3(encoder) => encoder.image_token_id,
    }
}

/// Token embeddings of `ids` with the image tokens (`slots`) replaced by `embeds` in order.
fn embed_pictures(
    decoder: &QwenDecoder,
    ids: &Tensor,
    slots: &Tensor,
    embeds: &Tensor,
) -> Result<Tensor, ModelError> {
    let count = slots.sum(Kind::Int64).int64_value(&[]);
    let hidden = decoder.shape.hidden_size;
    if embeds.size() != [count, hidden] {
        return Err(ModelError::Input(format!(
            "image embeddings ({:?}) do not fill the {count} image tokens of width {hidden}",
            embeds.size()
        )));
    }
    let x = decoder.embed(ids);
    Ok(x.masked_scatter(&slots.unsqueeze(-1), &embeds.to_kind(x.kind())))
}
