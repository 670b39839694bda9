//! CLIP's tokenizer: byte-level BPE with word-final `</w>`, lower-cased and whitespace-collapsed
//! text split by CLIP's pattern, `<|startoftext|> … <|endoftext|>` around each prompt — built from
//! a model folder's `tokenizer.json`, its `vocab.json` + `merges.txt`, or OpenAI's original merges
//! file (`bpe_simple_vocab_16e6.txt.gz`).

use std::io::Read;
use std::path::Path;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::normalizers::{Lowercase, Replace, Sequence as NormalizerSequence, NFC};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::roberta::RobertaProcessing;
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

use crate::tokenizer::TextTokenizer;
use crate::ModelError;

const SPLIT: &str =
    r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+";
const BOS: &str = "<|startoftext|>";
const EOS: &str = "<|endoftext|>";

fn build_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Input(format!("building the CLIP tokenizer: {e}"))
}

/// The vocabulary CLIP derives from its merges: the 256 byte symbols, each again word-final, each
/// merge's result, then the start and end tokens.
pub fn byte_vocab_and(merges: Merges) -> (Vocab, Merges) {
    let mut symbols: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    symbols.sort_by_key(|c| byte_order(*c));
    let mut words: Vec<String> = symbols.iter().map(char::to_string).collect();
    words.extend(symbols.iter().map(|c| format!("{c}</w>")));
    words.extend(merges.iter().map(|(a, b)| format!("{a}{b}")));
    words.extend([BOS.to_string(), EOS.to_string()]);
    let vocab: Vocab = words.into_iter().enumerate().map(|(i, w)| (w, i as u32)).collect();
    (vocab, merges)
}

/// Where a byte-level symbol sits in GPT-2's `bytes_to_unicode` order: the printable bytes
/// (which stand for themselves) by value, then the others, remapped to 256, 257, … in byte order.
fn byte_order(c: char) -> u32 {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let code = c as u32;
    if code < 256 && printable(code) {
        code
    } else {
        // The remapped symbols are U+0100 onwards; they sort after every printable byte.
        256 + code
    }
}

/// The CLIP pipeline around a BPE vocabulary and its merges.
pub fn clip_bpe(vocab: Vocab, merges: Merges) -> Result<Tokenizer, ModelError> {
    let id = |t: &str| {
        vocab.get(t).copied().ok_or_else(|| build_err(format!("{t} is not in the vocabulary")))
    };
    let (bos, eos) = (id(BOS)?, id(EOS)?);
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .unk_token(EOS.into())
        .end_of_word_suffix("</w>".into())
        .build()
        .map_err(build_err)?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_normalizer(Some(NormalizerSequence::new(vec![
        NFC.into(),
        Replace::new(tokenizers::normalizers::replace::ReplacePattern::Regex(r"\s+".into()), " ")
            .map_err(build_err)?
            .into(),
        Lowercase.into(),
    ])));
    let split =
        Split::new(SplitPattern::Regex(SPLIT.into()), SplitDelimiterBehavior::Removed, true)
            .map_err(build_err)?;
    tok.with_pre_tokenizer(Some(PreSequence::new(vec![
        split.into(),
        ByteLevel::new(false, true, true).into(),
    ])));
    tok.with_decoder(Some(ByteLevelDecoder::default()));
    tok.with_post_processor(Some(
        RobertaProcessing::new((EOS.into(), eos), (BOS.into(), bos))
            .trim_offsets(false)
            .add_prefix_space(false),
    ));
    // As transformers does, the start and end tokens are matched whole in a prompt.
    tok.add_special_tokens(&[
        tokenizers::AddedToken::from(BOS, true),
        tokenizers::AddedToken::from(EOS, true),
    ]);
    Ok(tok)
}

/// A CLIP byte-level BPE tokenizer with no merges, for tiny pipelines: every byte, alone or
/// word-final (`</w>`), then `<|startoftext|>` and `<|endoftext|>`. Returns it and its vocabulary
/// size.
pub fn tiny() -> Result<(Tokenizer, usize), ModelError> {
    let mut chars: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    chars.sort_unstable();
    let words = chars.iter().map(char::to_string).chain(chars.iter().map(|c| format!("{c}</w>")));
    let words = words.chain(["<|startoftext|>".to_string(), "<|endoftext|>".to_string()]);
    let vocab: Vocab = words.enumerate().map(|(i, w)| (w, i as u32)).collect();
    let size = vocab.len();
    Ok((clip_bpe(vocab, vec![])?, size))
}

/// OpenAI's merges file (gzip): the first line is a header, then the 48,894 merges CLIP uses.
pub fn from_merges_file(path: &Path) -> Result<TextTokenizer, ModelError> {
    let io = |e: std::io::Error| ModelError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).map_err(io)?)
        .read_to_string(&mut text)
        .map_err(io)?;
    let count = 49152 - 256 - 2;
    let merges: Merges = text
        .lines()
        .skip(1)
        .take(count)
        .map(|l| l.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())))
        .collect::<Option<_>>()
        .ok_or_else(|| ModelError::Format {
            path: path.display().to_string(),
            message: "a merge line is not two symbols".into(),
        })?;
    if merges.len() != count {
        return Err(ModelError::Format {
            path: path.display().to_string(),
            message: format!("{} merges, CLIP's file has {count}", merges.len()),
        });
    }
    let (vocab, merges) = byte_vocab_and(merges);
    Ok(TextTokenizer::from_tokenizer(clip_bpe(vocab, merges)?, EOS, Some(77)))
}

/// The tokenizer of a CLIP model folder: `tokenizer.json` (with `tokenizer_config.json`), else
/// `vocab.json` + `merges.txt`.
pub fn load(dir: &Path) -> Result<TextTokenizer, ModelError> {
    if dir.join("tokenizer.json").exists() {
        return TextTokenizer::load(dir);
    }
    let (vocab_file, merges_file) = (dir.join("vocab.json"), dir.join("merges.txt"));
    if !(vocab_file.exists() && merges_file.exists()) {
        return Err(ModelError::Format {
            path: dir.display().to_string(),
            message: "no tokenizer.json, nor vocab.json and merges.txt, for the CLIP tokenizer"
                .into(),
        });
    }
    let (vocab, merges) =
        BPE::read_file(&vocab_file.to_string_lossy(), &merges_file.to_string_lossy()).map_err(
            |e| ModelError::Format { path: dir.display().to_string(), message: e.to_string() },
        )?;
    Ok(TextTokenizer::from_tokenizer(clip_bpe(vocab, merges)?, EOS, Some(77)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_symbols_come_in_gpt2_order() {
        let (vocab, _) = byte_vocab_and(vec![]);
        assert_eq!(vocab["!"], 0);
        assert_eq!(vocab["~"], 93);
        assert_eq!(vocab["Ā"], 188, "byte 0 comes after the 188 printable bytes");
        assert_eq!(vocab["!</w>"], 256);
        assert_eq!((vocab[BOS], vocab[EOS]), (512, 513));
    }
}
