//! Tokenizers from a pipeline's `tokenizer*/tokenizer.json` (Hugging Face `tokenizers`), with the
//! pad token and length limit of `tokenizer_config.json`, padded and truncated as transformers'
//! fast tokenizers do with `padding="max_length", truncation=True`. A Qwen2 folder without
//! `tokenizer.json` is built from `vocab.json` + `merges.txt` ([`qwen2`]).

pub mod qwen2;

use std::collections::BTreeMap;
use std::path::Path;

use tch::Tensor;
use tokenizers::{PaddingDirection, PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use crate::ModelError;

/// A loaded tokenizer, its pad token and side.
pub struct TextTokenizer {
    inner: Tokenizer,
    pad_id: u32,
    pad_token: String,
    /// Pads on the left (`padding_side: "left"`, or a Llama tokenizer class, as transformers).
    pad_left: bool,
    /// `model_max_length` of `tokenizer_config.json` (77 for CLIP), if it gives one.
    pub model_max_length: Option<usize>,
}

#[derive(serde::Deserialize, Default)]
struct TokenizerConfig {
    pad_token: Option<serde_json::Value>,
    bos_token: Option<serde_json::Value>,
    eos_token: Option<serde_json::Value>,
    unk_token: Option<serde_json::Value>,
    model_max_length: Option<f64>,
    tokenizer_class: Option<String>,
    padding_side: Option<String>,
    added_tokens_decoder: Option<BTreeMap<String, AddedTokenEntry>>,
}

/// One entry of `added_tokens_decoder`.
#[derive(serde::Deserialize)]
struct AddedTokenEntry {
    content: String,
    #[serde(default)]
    special: bool,
    #[serde(default)]
    normalized: bool,
    #[serde(default)]
    lstrip: bool,
    #[serde(default)]
    rstrip: bool,
    #[serde(default)]
    single_word: bool,
}

/// Adds the `added_tokens_decoder` tokens in id order, checking each lands on its id.
fn add_decoder_tokens(
    inner: &mut Tokenizer,
    entries: &BTreeMap<String, AddedTokenEntry>,
    config_file: &Path,
) -> Result<(), ModelError> {
    let bad =
        |message: String| ModelError::Format { path: config_file.display().to_string(), message };
    let mut by_id = entries
        .iter()
        .map(|(id, e)| {
            Ok((id.parse::<u32>().map_err(|_| bad(format!("added token id {id:?}")))?, e))
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    by_id.sort_by_key(|(id, _)| *id);
    for (id, entry) in by_id {
        let token = tokenizers::AddedToken::from(entry.content.clone(), entry.special)
            .normalized(entry.normalized)
            .lstrip(entry.lstrip)
            .rstrip(entry.rstrip)
            .single_word(entry.single_word);
        if entry.special {
            inner.add_special_tokens(&[token]);
        } else {
            inner.add_tokens(&[token]);
        }
        let found = inner.token_to_id(&entry.content);
        if found != Some(id) {
            return Err(bad(format!(
                "added token {:?} has id {id}, the vocabulary gives it {found:?}",
                entry.content
            )));
        }
    }
    Ok(())
}

/// transformers writes special tokens as a string or as {"content": …}.
fn token_text(value: &Option<serde_json::Value>) -> Option<String> {
    match value {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(v) => v.get("content").and_then(|c| c.as_str()).map(str::to_string),
        None => None,
    }
}

impl TextTokenizer {
    /// Loads `dir/tokenizer.json` and, when present, `dir/tokenizer_config.json`; a folder of a
    /// Qwen2 tokenizer (`tokenizer_class` `Qwen2Tokenizer[Fast]`) without `tokenizer.json` is
    /// built from its `vocab.json`, `merges.txt` and `added_tokens_decoder`.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let file = dir.join("tokenizer.json");
        let config_file = dir.join("tokenizer_config.json");
        let config: TokenizerConfig = if config_file.exists() {
            crate::read_config(&config_file)?
        } else {
            TokenizerConfig::default()
        };
        let mut inner = if file.exists() {
            Tokenizer::from_file(&file).map_err(|e| ModelError::Format {
                path: file.display().to_string(),
                message: e.to_string(),
            })?
        } else if qwen2::is_qwen2(config.tokenizer_class.as_deref()) {
            let mut tok = qwen2::from_vocab_merges(dir)?;
            if let Some(entries) = &config.added_tokens_decoder {
                add_decoder_tokens(&mut tok, entries, &config_file)?;
            }
            tok
        } else {
            return Err(ModelError::Io {
                path: file.display().to_string(),
                message: "no tokenizer.json (and not a Qwen2 tokenizer folder with vocab.json \
                          and merges.txt)"
                    .into(),
            });
        };
        // As transformers does, the config's special tokens are matched whole in the text (SD3's
        // CLIP-G pads with "!", so a "!" in a prompt is that token).
        let specials: Vec<tokenizers::AddedToken> =
            [&config.bos_token, &config.eos_token, &config.unk_token, &config.pad_token]
                .into_iter()
                .filter_map(token_text)
                .filter(|t| inner.token_to_id(t).is_some())
                .map(|t| tokenizers::AddedToken::from(t, true))
                .collect();
        inner.add_special_tokens(&specials);
        let pad_token = token_text(&config.pad_token)
            .or_else(|| inner.get_padding().map(|p| p.pad_token.clone()))
            .ok_or_else(|| ModelError::Format {
                path: config_file.display().to_string(),
                message: "no pad_token".into(),
            })?;
        let pad_id = inner.token_to_id(&pad_token).ok_or_else(|| ModelError::Format {
            path: file.display().to_string(),
            message: format!("pad token {pad_token:?} is not in the vocabulary"),
        })?;
        // Configs without a limit carry a huge sentinel.
        let model_max_length = config.model_max_length.filter(|&m| m < 1e9).map(|m| m as usize);
        // transformers' Llama tokenizers pad on the left unless the config says otherwise.
        let class_side = config.tokenizer_class.as_deref().filter(|c| c.starts_with("Llama"));
        let pad_left = match config.padding_side.as_deref() {
            Some("left") => true,
            Some("right") => false,
            Some(other) => {
                return Err(ModelError::Format {
                    path: config_file.display().to_string(),
                    message: format!("padding_side {other:?}: expected \"left\" or \"right\""),
                })
            }
            None => class_side.is_some(),
        };
        Ok(Self { inner, pad_id, pad_token, pad_left, model_max_length })
    }

    /// A tokenizer built in code, padded with `pad_token` (which must be in its vocabulary).
    pub fn from_tokenizer(
        inner: Tokenizer,
        pad_token: &str,
        model_max_length: Option<usize>,
    ) -> Self {
        let pad_id = inner.token_to_id(pad_token).unwrap_or(0);
        Self { inner, pad_id, pad_token: pad_token.to_string(), pad_left: false, model_max_length }
    }

    /// Token ids and attention mask (B, L) of `texts`, truncated to `max_length` and right-padded
    /// to the longest row (transformers' `padding=True, truncation=True, max_length=…`).
    pub fn encode_longest(
        &self,
        texts: &[&str],
        max_length: usize,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let mut tok = self.inner.clone();
        tok.with_truncation(Some(TruncationParams { max_length, ..Default::default() }))
            .map_err(|e| ModelError::Input(format!("tokenizer truncation: {e}")))?;
        tok.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            direction: self.direction(),
            pad_id: self.pad_id,
            pad_token: self.pad_token.clone(),
            ..Default::default()
        }));
        let encodings = tok
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| ModelError::Input(format!("tokenizing prompts: {e}")))?;
        let length = encodings.first().map_or(0, |e| e.len()) as i64;
        let ids: Vec<i64> =
            encodings.iter().flat_map(|e| e.get_ids().iter().map(|&i| i as i64)).collect();
        let mask: Vec<i64> = encodings
            .iter()
            .flat_map(|e| e.get_attention_mask().iter().map(|&m| m as i64))
            .collect();
        let shape = [texts.len() as i64, length];
        Ok((Tensor::from_slice(&ids).view(shape), Tensor::from_slice(&mask).view(shape)))
    }

    fn direction(&self) -> PaddingDirection {
        if self.pad_left {
            PaddingDirection::Left
        } else {
            PaddingDirection::Right
        }
    }

    /// Token ids of one text, without padding or truncation.
    pub fn ids(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let encoding = self
            .inner
            .encode(text, true)
            .map_err(|e| ModelError::Input(format!("tokenizing {text:?}: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`, without special tokens when `skip_special` (transformers' `decode`
    /// without clean-up of tokenization spaces).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, ModelError> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| ModelError::Input(format!("decoding {} token ids: {e}", ids.len())))
    }

    /// The id of the padding token.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// The id of `token` (a special or ordinary token of the vocabulary), if it has one.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Token ids (B, `length`) of `texts`, truncated and padded to exactly `length`.
    pub fn encode(&self, texts: &[&str], length: usize) -> Result<Tensor, ModelError> {
        Ok(self.encode_with_mask(texts, length)?.0)
    }

    /// Token ids and attention mask (B, `length`) of `texts`, truncated and padded to exactly
    /// `length` (transformers' `padding="max_length", truncation=True`).
    pub fn encode_with_mask(
        &self,
        texts: &[&str],
        length: usize,
    ) -> Result<(Tensor, Tensor), ModelError> {
        self.encode_fixed(texts, length, true)
    }

    /// [`Self::encode_with_mask`] of texts a chat template rendered with their special tokens
    /// (the beginning-of-text one included), which the tokenizer must not add again.
    pub fn encode_rendered_with_mask(
        &self,
        texts: &[&str],
        length: usize,
    ) -> Result<(Tensor, Tensor), ModelError> {
        self.encode_fixed(texts, length, false)
    }

    fn encode_fixed(
        &self,
        texts: &[&str],
        length: usize,
        add_special_tokens: bool,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let mut tok = self.inner.clone();
        tok.with_truncation(Some(TruncationParams { max_length: length, ..Default::default() }))
            .map_err(|e| ModelError::Input(format!("tokenizer truncation: {e}")))?;
        tok.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::Fixed(length),
            direction: self.direction(),
            pad_id: self.pad_id,
            pad_token: self.pad_token.clone(),
            ..Default::default()
        }));
        let encodings = tok
            .encode_batch(texts.to_vec(), add_special_tokens)
            .map_err(|e| ModelError::Input(format!("tokenizing prompts: {e}")))?;
        let flat = |f: fn(&tokenizers::Encoding) -> &[u32]| -> Vec<i64> {
            encodings.iter().flat_map(|e| f(e).iter().map(|&i| i as i64)).collect()
        };
        let shape = [texts.len() as i64, length as i64];
        let ids = Tensor::from_slice(&flat(|e| e.get_ids())).view(shape);
        let mask = Tensor::from_slice(&flat(|e| e.get_attention_mask())).view(shape);
        Ok((ids, mask))
    }
}

/// Builders of small tokenizers with the exact structure of the real ones, for tiny pipelines.
pub mod tiny {
    use std::collections::HashMap;
    use std::path::Path;

    use tokenizers::decoders::metaspace::Metaspace as MetaspaceDecoder;
    use tokenizers::models::unigram::Unigram;
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::normalizers::Lowercase;
    use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
    use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
    use tokenizers::pre_tokenizers::whitespace::{Whitespace, WhitespaceSplit};
    use tokenizers::processors::template::TemplateProcessing;
    use tokenizers::Tokenizer;

    use crate::ModelError;

    fn build_err(e: impl std::fmt::Display) -> ModelError {
        ModelError::Input(format!("building a tokenizer: {e}"))
    }

    /// A CLIP-style word-level tokenizer: lower-cased words split at whitespace and punctuation,
    /// `<|startoftext|> … <|endoftext|>` around them; ids are `<unk>`, the words in order, then
    /// the start and end tokens (the end token has the largest id, as CLIP's pooling expects).
    pub fn clip_words(words: &[String]) -> Result<(Tokenizer, usize), ModelError> {
        let mut vocab: HashMap<String, u32> = HashMap::new();
        for w in std::iter::once("<unk>").chain(words.iter().map(String::as_str)) {
            let n = vocab.len() as u32;
            vocab.entry(w.to_lowercase()).or_insert(n);
        }
        let (bos, eos) = (vocab.len() as u32, vocab.len() as u32 + 1);
        vocab.insert("<|startoftext|>".into(), bos);
        vocab.insert("<|endoftext|>".into(), eos);
        let size = vocab.len();
        let model = WordLevel::builder()
            .vocab(vocab.into_iter().collect())
            .unk_token("<unk>".into())
            .build()
            .map_err(build_err)?;
        let mut tok = Tokenizer::new(model);
        tok.with_normalizer(Some(Lowercase));
        tok.with_pre_tokenizer(Some(Whitespace {}));
        tok.with_post_processor(Some(
            TemplateProcessing::builder()
                .try_single("<|startoftext|> $A <|endoftext|>")
                .map_err(build_err)?
                .special_tokens(vec![("<|startoftext|>", bos), ("<|endoftext|>", eos)])
                .build()
                .map_err(build_err)?,
        ));
        Ok((tok, size))
    }

    /// A T5 unigram tokenizer over single characters (`<pad>`=0, `</s>`=1, `<unk>`=2).
    pub fn t5() -> Result<(Tokenizer, usize), ModelError> {
        let mut vocab: Vec<(String, f64)> = vec![
            ("<pad>".into(), 0.0),
            ("</s>".into(), 0.0),
            ("<unk>".into(), 0.0),
            ("▁".into(), -2.0),
        ];
        for c in (b' '..=b'~').map(char::from).filter(|c| !c.is_whitespace()) {
            vocab.push((c.to_string(), -3.0));
            vocab.push((format!("▁{c}"), -2.5));
        }
        let size = vocab.len();
        let unigram = Unigram::from(vocab, Some(2), false).map_err(build_err)?;
        let mut tok = Tokenizer::new(unigram);
        tok.with_pre_tokenizer(Some(PreSequence::new(vec![
            WhitespaceSplit.into(),
            Metaspace::new('▁', PrependScheme::Always, true).into(),
        ])));
        tok.with_decoder(Some(MetaspaceDecoder::new('▁', PrependScheme::Always, true)));
        tok.with_post_processor(Some(
            TemplateProcessing::builder()
                .try_single("$A </s>")
                .map_err(build_err)?
                .try_pair("$A </s> $B </s>")
                .map_err(build_err)?
                .special_tokens(vec![("</s>", 1)])
                .build()
                .map_err(build_err)?,
        ));
        Ok((tok, size))
    }

    /// Writes `tokenizer.json` and a transformers `tokenizer_config.json` into `dir`.
    pub fn write(
        dir: &Path,
        tokenizer: &Tokenizer,
        config: serde_json::Value,
    ) -> Result<(), ModelError> {
        std::fs::create_dir_all(dir).map_err(|e| ModelError::Io {
            path: dir.display().to_string(),
            message: e.to_string(),
        })?;
        let file = dir.join("tokenizer.json");
        tokenizer.save(&file, true).map_err(|e| ModelError::Io {
            path: file.display().to_string(),
            message: e.to_string(),
        })?;
        crate::write_json(&dir.join("tokenizer_config.json"), &config)
    }
}
