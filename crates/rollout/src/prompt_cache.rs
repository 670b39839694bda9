//! Prompt embeddings computed once per distinct prompt and kept on the CPU, at most
//! [`PromptCache::BUDGET_BYTES`] of them (the least recently used go first): a step's negative
//! prompt, and a dataset's prompts from their second use on, skip the text encoder, which under
//! `model.offload` runs on the CPU. A prompt is always encoded on its own, so a cached embedding is
//! the one the encoder would give again, bit for bit.

use std::collections::HashMap;
use std::sync::Mutex;

use flowtune_models::{ModelError, TextConditioning};
use tch::Device;

/// The cache; one per rollout engine.
#[derive(Default)]
pub struct PromptCache {
    inner: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    /// Prompt → (embedding on the CPU, its bytes, when it was last used).
    map: HashMap<String, (TextConditioning, usize, u64)>,
    bytes: usize,
    clock: u64,
}

/// Bytes held by the tensors of `text`.
fn bytes(text: &TextConditioning) -> usize {
    let size = |t: &tch::Tensor| t.numel() * t.kind().elt_size_in_bytes();
    let optional = [&text.pooled, &text.mask].into_iter().flatten().map(size).sum::<usize>();
    size(&text.embeds) + optional + text.extras.values().map(size).sum::<usize>()
}

impl PromptCache {
    /// Host memory the cached embeddings may take.
    pub const BUDGET_BYTES: usize = 2 << 30;

    /// The embedding of `prompt` on `device`: cached, or made by `encode` and cached.
    pub fn get_or_encode(
        &self,
        prompt: &str,
        device: Device,
        encode: impl FnOnce() -> Result<TextConditioning, ModelError>,
    ) -> Result<TextConditioning, ModelError> {
        let mut e = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        e.clock += 1;
        let now = e.clock;
        if let Some((text, _, used)) = e.map.get_mut(prompt) {
            *used = now;
            return Ok(text.map_rows(|t| t.to_device(device)));
        }
        let text = encode()?;
        let host = text.map_rows(|t| t.to_device(Device::Cpu));
        let size = bytes(&host);
        while e.bytes + size > Self::BUDGET_BYTES && !e.map.is_empty() {
            let oldest = e.map.iter().min_by_key(|(_, v)| v.2).map(|(k, _)| k.clone());
            if let Some((_, freed, _)) = oldest.and_then(|k| e.map.remove(&k)) {
                e.bytes -= freed;
            }
        }
        if size <= Self::BUDGET_BYTES {
            e.bytes += size;
            e.map.insert(prompt.to_string(), (host, size, now));
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    fn text(value: f64) -> TextConditioning {
        TextConditioning::new(Tensor::full([1, 3, 4], value, (Kind::Float, Device::Cpu)), None)
    }

    #[test]
    fn a_prompt_is_encoded_once_and_given_back_unchanged() {
        let cache = PromptCache::default();
        let mut calls = 0;
        for _ in 0..3 {
            let got = cache
                .get_or_encode("a cat", Device::Cpu, || {
                    calls += 1;
                    Ok(text(2.5))
                })
                .unwrap();
            assert!(got.embeds.equal(&text(2.5).embeds));
        }
        assert_eq!(calls, 1);
        let other = cache.get_or_encode("a dog", Device::Cpu, || Ok(text(1.0))).unwrap();
        assert!(other.embeds.equal(&text(1.0).embeds));
        assert_eq!(cache.inner.lock().unwrap().bytes, 2 * 12 * 4);
    }

    #[test]
    fn a_failed_encoding_is_not_cached() {
        let cache = PromptCache::default();
        let err = cache.get_or_encode("x", Device::Cpu, || Err(ModelError::Input("no".into())));
        assert!(err.is_err());
        assert!(cache.get_or_encode("x", Device::Cpu, || Ok(text(3.0))).is_ok());
    }
}
