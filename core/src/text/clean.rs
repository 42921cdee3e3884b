//! CLIP's text clean-up, `whitespace_clean(basic_clean(text)).lower()`, where
//! `basic_clean` is `ftfy.fix_text` followed by `html.unescape` applied twice.
//!
//! The ftfy part covers every fixer of `ftfy.fix_text`'s default configuration except
//! `fix_encoding` (mojibake detection: re-decoding text such as `"sÃ³"` as `"só"`). That
//! fixer is a heuristic built on character-frequency tables and never fires on
//! correctly encoded text, which is what a prompt typed into a UI is; text that really
//! is mojibake tokenizes as the mojibake. `max_decode_length` segmenting (one segment
//! per million characters without a line break) is not reproduced either; prompts are
//! far shorter. Everything else (HTML entities, C1 controls, Latin ligatures, full-width
//! forms, curly quotes, line breaks, terminal escapes, control characters, NFC) follows
//! ftfy 6.3 table for table; the tables are generated from Python, see
//! `core/tests/fixtures/text/gen_clean_tables.py`.

use std::sync::OnceLock;

use regex::{Captures, Regex};
use unicode_normalization::{is_nfc, UnicodeNormalization};

use super::clean_tables::{
    C1_AS_CP1252, CONTROL_CHARS, FTFY_ENTITIES, HTML5_ENTITIES, INVALID_CHARREFS,
    INVALID_CODEPOINTS, LIGATURES, WIDTH_MAP,
};

/// The full clean-up CLIP applies before splitting text into words.
pub fn clip_clean(text: &str) -> String {
    let text = fix_text(text);
    let text = html_unescape(&html_unescape(&text));
    whitespace_clean(&text).to_lowercase()
}

/// Python's `str.isspace`: Unicode `White_Space` plus the information separators
/// U+001C..U+001F, which Python counts as whitespace (bidi class B/S) and Rust does not.
pub(crate) fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `" ".join(text.split())`, which also strips both ends.
fn whitespace_clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text.split(py_isspace).filter(|w| !w.is_empty()) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

/// `ftfy.fix_text` with its default configuration (less `fix_encoding`, see module docs).
pub fn fix_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    // ftfy turns HTML unescaping off for the rest of the text at the first line that
    // contains '<' (it looks like markup), and never back on.
    let mut unescape = true;
    for segment in text.split_inclusive('\n') {
        if segment.contains('<') {
            unescape = false;
        }
        out.push_str(&fix_segment(segment, unescape));
    }
    out
}

fn fix_segment(segment: &str, unescape: bool) -> String {
    let mut text = segment.to_owned();
    // ftfy repeats its fixers until the text stops changing; each pass can expose work
    // for another (an entity that decodes to a curly quote, say).
    loop {
        let before = text.clone();
        if unescape {
            text = ftfy_unescape_html(&text);
        }
        text = fix_c1_controls(&text);
        text = translate(&text, |c| lookup_char(&LIGATURES, c));
        text = translate(&text, |c| lookup_char(&WIDTH_MAP, c));
        text = uncurl_quotes(&text);
        text = fix_line_breaks(&text);
        text = remove_terminal_escapes(&text);
        text.retain(|c| CONTROL_CHARS.binary_search(&c).is_err());
        if !is_nfc(&text) {
            text = text.nfc().collect();
        }
        if text == before {
            return text;
        }
    }
}

fn lookup_char(table: &'static [(char, &'static str)], c: char) -> Option<&'static str> {
    table
        .binary_search_by_key(&c, |&(k, _)| k)
        .ok()
        .map(|i| table[i].1)
}

fn lookup_str(table: &'static [(&'static str, &'static str)], key: &str) -> Option<&'static str> {
    table
        .binary_search_by(|&(k, _)| k.cmp(key))
        .ok()
        .map(|i| table[i].1)
}

/// `str.translate` with a mapping from single characters to strings.
fn translate(text: &str, map: impl Fn(char) -> Option<&'static str>) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match map(c) {
            Some(s) => out.push_str(s),
            None => out.push(c),
        }
    }
    out
}

fn fix_c1_controls(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\u{80}'..='\u{9f}' => C1_AS_CP1252[c as usize - 0x80],
            _ => c,
        })
        .collect()
}

fn uncurl_quotes(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\u{201c}'..='\u{201f}' => '"',
            '\u{2bc}' | '\u{2018}'..='\u{201b}' => '\'',
            _ => c,
        })
        .collect()
}

fn fix_line_breaks(text: &str) -> String {
    text.replace("\r\n", "\n")
        .replace(['\r', '\u{2028}', '\u{2029}', '\u{85}'], "\n")
}

fn remove_terminal_escapes(text: &str) -> String {
    static ANSI: OnceLock<Regex> = OnceLock::new();
    let re = ANSI.get_or_init(|| Regex::new(r"\x1b\[(?:\d|;)*[a-zA-Z]").expect("valid regex"));
    re.replace_all(text, "").into_owned()
}

/// ftfy's own `unescape_html`: only `&name;` forms it is sure about, and numeric
/// references whose decoding consumes the semicolon.
fn ftfy_unescape_html(text: &str) -> String {
    if !text.contains('&') {
        return text.to_owned();
    }
    static ENTITY: OnceLock<Regex> = OnceLock::new();
    let re = ENTITY.get_or_init(|| Regex::new(r"&#?[0-9A-Za-z]{1,24};").expect("valid regex"));
    re.replace_all(text, |caps: &Captures| {
        let m = &caps[0];
        if let Some(v) = lookup_str(&FTFY_ENTITIES, m) {
            v.to_owned()
        } else if m.starts_with("&#") {
            let unescaped = html_unescape(m);
            if unescaped.contains(';') {
                m.to_owned()
            } else {
                unescaped
            }
        } else {
            m.to_owned()
        }
    })
    .into_owned()
}

/// Python's `html.unescape`: named references from the HTML5 table (with the longest
/// known prefix rule for legacy names written without `;`) and numeric references with
/// the HTML5 replacement rules.
pub fn html_unescape(text: &str) -> String {
    if !text.contains('&') {
        return text.to_owned();
    }
    static CHARREF: OnceLock<Regex> = OnceLock::new();
    let re = CHARREF.get_or_init(|| {
        Regex::new(r"&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\x0c <&#;]{1,32};?)")
            .expect("valid regex")
    });
    re.replace_all(text, |caps: &Captures| replace_charref(&caps[1]))
        .into_owned()
}

fn replace_charref(s: &str) -> String {
    if let Some(num) = s.strip_prefix('#') {
        let (digits, radix) = match num.strip_prefix(['x', 'X']) {
            Some(hex) => (hex, 16),
            None => (num, 10),
        };
        let digits = digits.trim_end_matches(';');
        // Python's int() has no overflow; anything past u32 is past U+10FFFF anyway.
        let code = u32::from_str_radix(digits, radix).unwrap_or(u32::MAX);
        if let Ok(i) = INVALID_CHARREFS.binary_search_by_key(&code, |&(k, _)| k) {
            return INVALID_CHARREFS[i].1.to_string();
        }
        if (0xD800..=0xDFFF).contains(&code) || code > 0x10FFFF {
            return '\u{FFFD}'.to_string();
        }
        if INVALID_CODEPOINTS.binary_search(&code).is_ok() {
            return String::new();
        }
        return char::from_u32(code).map_or_else(|| '\u{FFFD}'.to_string(), |c| c.to_string());
    }
    if let Some(v) = lookup_str(&HTML5_ENTITIES, s) {
        return v.to_owned();
    }
    // Longest prefix of at least two characters that names an entity.
    let bounds: Vec<usize> = s.char_indices().map(|(i, _)| i).skip(2).collect();
    for &end in bounds.iter().rev() {
        if let Some(v) = lookup_str(&HTML5_ENTITIES, &s[..end]) {
            return format!("{v}{}", &s[end..]);
        }
    }
    format!("&{s}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_unescape_follows_python() {
        assert_eq!(html_unescape("&amp;lt;"), "&lt;");
        assert_eq!(html_unescape("&notit; &notin; &amp"), "¬it; ∉ &");
        assert_eq!(
            html_unescape("&#x110000; &#128; &#1;x &#0;"),
            "\u{FFFD} € x \u{FFFD}"
        );
        assert_eq!(html_unescape("&zzz; & &;"), "&zzz; & &;");
    }

    #[test]
    fn ftfy_subset() {
        assert_eq!(fix_text("“ﬁne” ＦＵＬＬ\r\n"), "\"fine\" FULL\n");
        assert_eq!(
            fix_text("P&EACUTE;REZ <b>&amp;</b>"),
            "P&EACUTE;REZ <b>&amp;</b>"
        );
        assert_eq!(fix_text("e\u{301}\u{1b}[31mred"), "éred");
    }
}
