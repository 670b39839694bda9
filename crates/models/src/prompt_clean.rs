//! Prompt cleaning as diffusers' Wan pipelines do it before tokenizing: ftfy's `fix_text` (the
//! default fixes that prompts meet), HTML entities decoded twice, runs of whitespace to one space,
//! the ends trimmed.
//!
//! ftfy's fixes, in its order and repeated until nothing changes: HTML entities (only where the
//! text has no `<`), terminal colour codes removed, mojibake (UTF-8 read as Windows-1252) decoded,
//! stray C1 controls read as Windows-1252, Latin ligatures and full-width characters spelled out,
//! curly quotes straightened, line breaks made `\n`, control characters removed, NFC. The
//! mojibake fix is the whole-text form: it applies when the text re-encodes to Windows-1252 and
//! those bytes are UTF-8; ftfy's per-segment heuristics for mixed texts are not reproduced.

use html_escape::decode_html_entities;
use unicode_normalization::UnicodeNormalization;

/// `prompt` as WanPipeline's `prompt_clean` leaves it.
pub fn clean_prompt(prompt: &str) -> String {
    let fixed = fix_text(prompt);
    let once = decode_html_entities(&fixed);
    let twice = decode_html_entities(&once);
    twice.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// ftfy's default `fix_text`, steps repeated until the text stops changing.
fn fix_text(text: &str) -> String {
    let mut text = text.to_string();
    for _ in 0..8 {
        let next = fix_once(&text);
        if next == text {
            break;
        }
        text = next;
    }
    text
}

fn fix_once(text: &str) -> String {
    let text =
        if text.contains('<') { text.to_string() } else { decode_html_entities(text).into_owned() };
    let text = remove_terminal_escapes(&text);
    let text = decode_mojibake(&text).unwrap_or(text);
    let text: String = text.chars().map(c1_as_windows_1252).collect();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            // Latin ligatures and full-width (or half-width) forms: their compatibility spelling.
            'ﬀ'..='ﬆ' | 'Ĳ' | 'ĳ' | 'ŉ' | 'Ǆ'..='ǌ' | 'Ǳ'..='ǳ' | '\u{ff01}'..='\u{ffef}' => {
                out.extend(std::iter::once(c).nfkc())
            }
            '\u{3000}' => out.push(' '),
            '\u{2018}'..='\u{201b}' | '\u{02bc}' => out.push('\''),
            '\u{201c}'..='\u{201f}' => out.push('"'),
            c if is_removed_control(c) => {}
            c => out.push(c),
        }
    }
    let out = out.replace("\r\n", "\n").replace(['\r', '\u{2028}', '\u{2029}', '\u{85}'], "\n");
    out.nfc().collect()
}

/// Drops ANSI terminal escapes: ESC `[`, digits and semicolons, one letter.
fn remove_terminal_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("\u{1b}[") {
        out.push_str(&rest[..at]);
        let tail = &rest[at + 2..];
        let params = tail.find(|c: char| !(c.is_ascii_digit() || c == ';')).unwrap_or(tail.len());
        match tail[params..].chars().next() {
            Some(c) if c.is_ascii_alphabetic() => rest = &tail[params + 1..],
            _ => {
                out.push_str("\u{1b}[");
                rest = tail;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Windows-1252's characters for bytes 0x80–0x9F (`None`: bytes it leaves undefined).
const WINDOWS_1252_HIGH: [Option<char>; 32] = [
    Some('€'),
    None,
    Some('‚'),
    Some('ƒ'),
    Some('„'),
    Some('…'),
    Some('†'),
    Some('‡'),
    Some('ˆ'),
    Some('‰'),
    Some('Š'),
    Some('‹'),
    Some('Œ'),
    None,
    Some('Ž'),
    None,
    None,
    Some('‘'),
    Some('’'),
    Some('“'),
    Some('”'),
    Some('•'),
    Some('–'),
    Some('—'),
    Some('˜'),
    Some('™'),
    Some('š'),
    Some('›'),
    Some('œ'),
    None,
    Some('ž'),
    Some('Ÿ'),
];

/// The byte of `c` in Windows-1252, undefined bytes standing for the C1 control of that number
/// (ftfy's "sloppy" codec).
fn windows_1252_byte(c: char) -> Option<u8> {
    if let Some(i) = WINDOWS_1252_HIGH.iter().position(|&h| h == Some(c)) {
        return Some(0x80 + i as u8);
    }
    let code = c as u32;
    let c1 = (0x80..0xa0).contains(&code);
    let defined_here = !c1 || WINDOWS_1252_HIGH[code as usize - 0x80].is_none();
    (code < 0x100 && defined_here).then_some(code as u8)
}

/// The text UTF-8 decoded from its Windows-1252 bytes, when it is mojibake of that kind.
fn decode_mojibake(text: &str) -> Option<String> {
    if text.is_ascii() {
        return None;
    }
    let bytes = text.chars().map(windows_1252_byte).collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok().filter(|fixed| fixed != text)
}

/// A C1 control character (U+0080–U+009F) read as the Windows-1252 byte of that number.
fn c1_as_windows_1252(c: char) -> char {
    match c as u32 {
        code @ 0x80..=0x9f => WINDOWS_1252_HIGH[code as usize - 0x80].unwrap_or(c),
        _ => c,
    }
}

/// Control and format characters ftfy removes (tab, line feed, form feed and carriage return
/// stay).
fn is_removed_control(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{b}' | '\u{e}'..='\u{1f}' | '\u{7f}' | '\u{206a}'..='\u{206f}'
        | '\u{feff}' | '\u{fff9}'..='\u{fffc}' | '\u{1d173}'..='\u{1d17a}'
        | '\u{e0000}'..='\u{e007f}')
}
