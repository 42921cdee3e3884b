//! A1111 prompt weighting and the 77-token chunks a CLIP text encoder consumes.
//!
//! [`parse_prompt_attention`] is A1111's `modules/prompt_parser.py` function of that
//! name, rule for rule: `(x)` multiplies by 1.1, `[x]` divides by 1.1, `(x:1.3)`
//! multiplies by 1.3, nesting multiplies, `\(` `\)` `\[` `\]` `\\` are literal,
//! unclosed brackets apply to the end of the prompt, a closer without its opener is
//! plain text, and a standalone upper-case `BREAK` becomes a `("BREAK", -1.0)` marker.
//! Runs of equal weight are merged. Weights are computed in `f64` in A1111's order of
//! operations, so they match Python's bit for bit.
//!
//! [`tokenize_weighted`] is A1111's `tokenize_line`: every parsed piece is tokenized on
//! its own, tokens are laid into windows of 75, each window becomes
//! `BOS + tokens + EOS + padding` (77 tokens; padding is the tokenizer's pad id, so
//! SD2's zeros follow the EOS as in A1111's SD2 path) with per-token weights, and
//! `BREAK` closes the current window early. Two choices differ from A1111:
//! - a window that overflows is cut at exactly 75 tokens, as sd.cpp does, rather than
//!   moved back to the last comma within 20 tokens; set
//!   [`ChunkOptions::comma_padding_backtrack`] to 20 for A1111's behaviour;
//! - `BREAK` inside brackets still breaks (A1111 scales the marker's weight and then
//!   encodes the word "break" with that negative weight).

use std::sync::{Arc, OnceLock};

use regex::Regex;

use super::clean::py_isspace;
use super::embeddings::{Embedding, EmbeddingLibrary};
use super::tokenizer::ClipTokenizer;
use super::TextError;

/// Tokens per chunk, BOS and EOS included.
pub const CHUNK_LEN: usize = 77;
/// Prompt tokens per chunk.
pub const CHUNK_CONTENT: usize = CHUNK_LEN - 2;

/// Id written at the positions an embedding's vectors will replace. A1111 uses 0 too;
/// any real id keeps the embedding-table lookup in range, and 0 (unlike ids past the
/// vocabulary, sd.cpp's choice) keeps `argmax(ids)` finding the EOS position, which is
/// how CLIP locates its pooled output.
pub const EMBEDDING_PLACEHOLDER: u32 = 0;

const ROUND_MULTIPLIER: f64 = 1.1;

/// One `(text, weight)` pair of [`parse_prompt_attention`]'s result.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptPiece {
    pub text: String,
    pub weight: f64,
}

impl PromptPiece {
    /// A1111 marks `BREAK` as the text `"BREAK"` with weight -1. Brackets around it
    /// scale that weight like any other (A1111 then tokenizes the word "break" with a
    /// negative weight, which no one means); any negative-weight `BREAK` piece counts
    /// as a break here.
    pub fn is_break(&self) -> bool {
        self.text == "BREAK" && self.weight < 0.0
    }
}

fn attention_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"\\\(|\\\)|\\\[|\\\]|\\\\|\\|\(|\[|:([+-]?[.\d]+)\)|\)|\]|[^\\()\[\]:]+|:")
            .expect("valid regex")
    })
}

/// A1111's `parse_prompt_attention`.
///
/// One deliberate difference: where A1111 raises on a weight that is not a number
/// (`(x:1.2.3)`, `(x:.)`), the `:…` is kept as plain text and the `)` closes as usual.
pub fn parse_prompt_attention(prompt: &str) -> Vec<PromptPiece> {
    let mut res: Vec<PromptPiece> = Vec::new();
    let mut round: Vec<usize> = Vec::new();
    let mut square: Vec<usize> = Vec::new();
    let multiply_range = |res: &mut Vec<PromptPiece>, start: usize, m: f64| {
        for p in &mut res[start..] {
            p.weight *= m;
        }
    };

    for caps in attention_regex().captures_iter(prompt) {
        let mut text = caps.get(0).map_or("", |m| m.as_str());
        let weight_text = caps.get(1).map(|m| m.as_str());
        let weight = weight_text.and_then(py_float);
        if weight_text.is_some() && weight.is_none() {
            // Not a number: the `:…` is text, the `)` still closes.
            push_text(&mut res, &text[..text.len() - 1]);
            text = ")";
        }
        if let Some(literal) = text.strip_prefix('\\') {
            res.push(PromptPiece {
                text: literal.to_owned(),
                weight: 1.0,
            });
        } else if text == "(" {
            round.push(res.len());
        } else if text == "[" {
            square.push(res.len());
        } else if let (Some(w), Some(start)) = (weight, round.last().copied()) {
            round.pop();
            multiply_range(&mut res, start, w);
        } else if text == ")" && !round.is_empty() {
            let start = round.pop().unwrap_or_default();
            multiply_range(&mut res, start, ROUND_MULTIPLIER);
        } else if text == "]" && !square.is_empty() {
            let start = square.pop().unwrap_or_default();
            multiply_range(&mut res, start, 1.0 / ROUND_MULTIPLIER);
        } else {
            push_text(&mut res, text);
        }
    }
    for start in round {
        multiply_range(&mut res, start, ROUND_MULTIPLIER);
    }
    for start in square {
        multiply_range(&mut res, start, 1.0 / ROUND_MULTIPLIER);
    }
    if res.is_empty() {
        res.push(PromptPiece {
            text: String::new(),
            weight: 1.0,
        });
    }
    let mut merged: Vec<PromptPiece> = Vec::with_capacity(res.len());
    for piece in res {
        match merged.last_mut() {
            Some(last) if last.weight == piece.weight => last.text.push_str(&piece.text),
            _ => merged.push(piece),
        }
    }
    merged
}

/// Python's `float()` on what the weight pattern `[+-]?[.\d]+` matched. `\d` is any
/// Unicode decimal digit and `float` reads all of them (`(x:١.٥)` is 1.5), so they
/// are mapped to ASCII first. Decimal digits always come in runs of ten, zero first.
fn py_float(text: &str) -> Option<f64> {
    static DIGIT: OnceLock<Regex> = OnceLock::new();
    let digit = DIGIT.get_or_init(|| Regex::new(r"^\p{Nd}$").expect("valid regex"));
    let is_digit = |c: char| {
        let mut buf = [0u8; 4];
        digit.is_match(c.encode_utf8(&mut buf))
    };
    let mut ascii = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            ascii.push(c);
            continue;
        }
        if !is_digit(c) {
            return None;
        }
        let mut run_start = c as u32;
        while let Some(prev) = run_start.checked_sub(1).and_then(char::from_u32) {
            if !is_digit(prev) {
                break;
            }
            run_start -= 1;
        }
        let value = (c as u32 - run_start) % 10;
        ascii.push(char::from_digit(value, 10)?);
    }
    ascii.parse().ok()
}

/// Plain text, split at `BREAK`s.
fn push_text(res: &mut Vec<PromptPiece>, text: &str) {
    for (i, part) in split_break(text).into_iter().enumerate() {
        if i > 0 {
            res.push(PromptPiece {
                text: "BREAK".to_owned(),
                weight: -1.0,
            });
        }
        res.push(PromptPiece {
            text: part.to_owned(),
            weight: 1.0,
        });
    }
}

/// Python's `\w` for `re` string patterns: `str.isalnum()` (letter or number
/// categories; unlike Rust's `is_alphanumeric`, no combining marks) or `_`.
fn py_is_word(c: char) -> bool {
    static WORD: OnceLock<Regex> = OnceLock::new();
    let re = WORD.get_or_init(|| Regex::new(r"^[\p{L}\p{N}_]$").expect("valid regex"));
    let mut buf = [0u8; 4];
    re.is_match(c.encode_utf8(&mut buf))
}

/// `re.split(r"\s*\bBREAK\b\s*", text)`.
fn split_break(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut last_end = 0;
    let mut search = 0;
    while let Some(found) = text[search..].find("BREAK") {
        let start = search + found;
        let end = start + "BREAK".len();
        let before_ok = text[..start]
            .chars()
            .next_back()
            .is_none_or(|c| !py_is_word(c));
        let after_ok = text[end..].chars().next().is_none_or(|c| !py_is_word(c));
        if !(before_ok && after_ok) {
            search = start + 1;
            continue;
        }
        let lead = text[last_end..start]
            .char_indices()
            .rev()
            .take_while(|&(_, c)| py_isspace(c))
            .last()
            .map_or(start, |(i, _)| last_end + i);
        let trail = text[end..]
            .char_indices()
            .find(|&(_, c)| !py_isspace(c))
            .map_or(text.len(), |(i, _)| end + i);
        parts.push(&text[last_end..lead]);
        last_end = trail;
        search = trail;
    }
    parts.push(&text[last_end..]);
    parts
}

/// How a prompt is laid into chunks.
#[derive(Clone, Debug)]
pub struct ChunkOptions {
    /// Parse A1111 attention syntax; off, the whole prompt is one piece of weight 1
    /// (A1111's "Emphasis: None"). `BREAK` only works with parsing on.
    pub parse_weights: bool,
    /// When a window fills up and a comma was among its last this-many tokens, move
    /// the text after that comma into the next window. 0 (the default) cuts at exactly
    /// 75 tokens like sd.cpp; A1111's default is 20.
    pub comma_padding_backtrack: usize,
}

impl Default for ChunkOptions {
    fn default() -> Self {
        Self {
            parse_weights: true,
            comma_padding_backtrack: 0,
        }
    }
}

/// A textual-inversion embedding placed in a chunk: its vectors replace the token
/// embeddings at `position .. position + embedding.num_vectors()` (BOS is position 0).
#[derive(Clone, Debug)]
pub struct EmbeddingSlot {
    pub position: usize,
    pub embedding: Arc<Embedding>,
}

/// One encoder window: `CHUNK_LEN` tokens and their weights.
#[derive(Clone, Debug)]
pub struct Chunk {
    pub tokens: Vec<u32>,
    pub weights: Vec<f32>,
    pub embeddings: Vec<EmbeddingSlot>,
}

/// A prompt laid into chunks.
#[derive(Clone, Debug)]
pub struct TokenizedPrompt {
    /// At least one.
    pub chunks: Vec<Chunk>,
    /// A1111's token counter: 75 for every window closed early or full, plus the
    /// tokens of the last one.
    pub token_count: usize,
    /// No text token and no embedding came out of the prompt (empty, blank, or
    /// only syntax such as `()` or `BREAK`). SDXL pipelines zero such conditioning.
    pub empty: bool,
    /// Names of ComfyUI-style `embedding:NAME` words with no such embedding; they were
    /// left out of the chunks.
    pub missing_embeddings: Vec<String>,
}

impl TokenizedPrompt {
    /// Grown to `n` chunks with empty ones (BOS, EOS, then `pad`), as ComfyUI evens the
    /// chunk counts of two encoders' prompts.
    pub fn padded_to(mut self, n: usize, pad: u32) -> Self {
        while self.chunks.len() < n {
            let mut empty = self.chunks[0].clone();
            empty.tokens.iter_mut().skip(2).for_each(|t| *t = pad);
            empty.tokens[1] = super::EOS_TOKEN;
            empty.weights.iter_mut().for_each(|w| *w = 1.0);
            empty.embeddings.clear();
            self.chunks.push(empty);
        }
        self
    }
}

struct Builder {
    bos: u32,
    eos: u32,
    pad: u32,
    chunks: Vec<Chunk>,
    tokens: Vec<u32>,
    weights: Vec<f32>,
    embeddings: Vec<EmbeddingSlot>,
    token_count: usize,
    last_comma: Option<usize>,
}

impl Builder {
    /// A1111's `next_chunk`.
    fn next_chunk(&mut self, is_last: bool) {
        self.token_count += if is_last {
            self.tokens.len()
        } else {
            CHUNK_CONTENT
        };
        let used = self.tokens.len();
        let mut tokens = Vec::with_capacity(CHUNK_LEN);
        tokens.push(self.bos);
        tokens.append(&mut self.tokens);
        tokens.push(self.eos);
        tokens.resize(CHUNK_LEN, self.pad);
        let mut weights = Vec::with_capacity(CHUNK_LEN);
        weights.push(1.0);
        weights.append(&mut self.weights);
        weights.resize(CHUNK_LEN, 1.0);
        debug_assert!(used <= CHUNK_CONTENT);
        let embeddings = std::mem::take(&mut self.embeddings)
            .into_iter()
            .map(|mut slot| {
                slot.position += 1;
                slot
            })
            .collect();
        self.chunks.push(Chunk {
            tokens,
            weights,
            embeddings,
        });
        self.last_comma = None;
    }

    /// Closes the window at `at`, carrying what follows into the next one.
    fn relocate_after(&mut self, at: usize) {
        let moved_tokens = self.tokens.split_off(at);
        let moved_weights = self.weights.split_off(at);
        let (kept, moved): (Vec<_>, Vec<_>) = std::mem::take(&mut self.embeddings)
            .into_iter()
            .partition(|s| s.position < at);
        self.embeddings = kept;
        self.next_chunk(false);
        self.tokens = moved_tokens;
        self.weights = moved_weights;
        self.embeddings = moved
            .into_iter()
            .map(|mut s| {
                s.position -= at;
                s
            })
            .collect();
    }
}

/// What a weighted piece turns into before it is laid into windows.
enum Item {
    Token(u32),
    Embedding(Arc<Embedding>),
}

/// Part of a piece's text: plain text, or the name of a ComfyUI `embedding:NAME` word.
#[derive(Debug, PartialEq)]
enum Segment<'a> {
    Text(&'a str),
    Named(&'a str),
}

const COMFY_EMBEDDING_PREFIX: &str = "embedding:";

/// ComfyUI splits a piece into words at spaces and newlines; a word that starts with
/// `embedding:` names an embedding.
fn split_comfy(text: &str) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    let mut last = 0;
    let mut at_word_start = true;
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        if at_word_start && rest.starts_with(COMFY_EMBEDDING_PREFIX) {
            let end = rest.find([' ', '\n']).map_or(text.len(), |n| i + n);
            if last < i {
                out.push(Segment::Text(&text[last..i]));
            }
            out.push(Segment::Named(&text[i + COMFY_EMBEDDING_PREFIX.len()..end]));
            last = end;
            i = end;
            continue;
        }
        let c = rest.chars().next().unwrap_or(' ');
        at_word_start = c == ' ' || c == '\n';
        i += c.len_utf8();
    }
    if last < text.len() {
        out.push(Segment::Text(&text[last..]));
    }
    out
}

/// Tokens of `text` with A1111 name matching.
fn text_items(
    text: &str,
    tokenizer: &ClipTokenizer,
    embeddings: Option<&EmbeddingLibrary>,
    items: &mut Vec<Item>,
) -> Result<(), TextError> {
    let ids = tokenizer.encode(text);
    let mut position = 0;
    while position < ids.len() {
        let found = match embeddings {
            Some(lib) => lib.find_at(&ids, position)?,
            None => None,
        };
        match found {
            Some((embedding, name_len)) => {
                items.push(Item::Embedding(embedding));
                position += name_len;
            }
            None => {
                items.push(Item::Token(ids[position]));
                position += 1;
            }
        }
    }
    Ok(())
}

fn piece_items(
    text: &str,
    tokenizer: &ClipTokenizer,
    embeddings: Option<&EmbeddingLibrary>,
    missing: &mut Vec<String>,
) -> Result<Vec<Item>, TextError> {
    let mut items = Vec::new();
    let Some(lib) = embeddings else {
        text_items(text, tokenizer, None, &mut items)?;
        return Ok(items);
    };
    for segment in split_comfy(text) {
        match segment {
            Segment::Text(t) => text_items(t, tokenizer, Some(lib), &mut items)?,
            Segment::Named(name) => match lib.resolve_name(name)? {
                Some((embedding, leftover)) => {
                    items.push(Item::Embedding(embedding));
                    text_items(leftover, tokenizer, Some(lib), &mut items)?;
                }
                None => {
                    tracing::warn!(
                        name,
                        "prompt names an embedding that does not exist; ignored"
                    );
                    missing.push(name.to_owned());
                }
            },
        }
    }
    Ok(items)
}

/// Lays `prompt` into chunks; see the module documentation for the rules.
///
/// Embeddings from `embeddings` are found two ways:
/// - A1111's: the tokens of an embedding's name, wherever they appear within one
///   weighted piece (`bad-hands` in `a photo, bad-hands`; case does not matter, the
///   tokenizer lower-cases);
/// - ComfyUI's: a word `embedding:NAME` (at the start of the piece or after a space
///   or newline; `NAME` may carry the file extension or directories, and trailing
///   commas stay text). A name with no such embedding is dropped, as ComfyUI does,
///   and listed in [`TokenizedPrompt::missing_embeddings`].
///
/// An embedding occupies as many positions as it has vectors, never split across two
/// windows. Without a library, both spellings are plain text.
pub fn tokenize_weighted(
    prompt: &str,
    tokenizer: &ClipTokenizer,
    embeddings: Option<&EmbeddingLibrary>,
    options: &ChunkOptions,
) -> Result<TokenizedPrompt, TextError> {
    let pieces = if options.parse_weights {
        parse_prompt_attention(prompt)
    } else {
        vec![PromptPiece {
            text: prompt.to_owned(),
            weight: 1.0,
        }]
    };
    let comma = tokenizer.encode(",").first().copied();
    let mut b = Builder {
        bos: tokenizer.bos(),
        eos: tokenizer.eos(),
        pad: tokenizer.pad(),
        chunks: Vec::new(),
        tokens: Vec::with_capacity(CHUNK_CONTENT),
        weights: Vec::with_capacity(CHUNK_CONTENT),
        embeddings: Vec::new(),
        token_count: 0,
        last_comma: None,
    };
    let mut empty = true;
    let mut missing = Vec::new();

    for piece in &pieces {
        if options.parse_weights && piece.is_break() {
            b.next_chunk(false);
            continue;
        }
        let weight = piece.weight as f32;
        for item in piece_items(&piece.text, tokenizer, embeddings, &mut missing)? {
            empty = false;
            // A1111's order: note a comma, else move the text after a recent comma
            // into a new window when this one is full; then close a full window.
            if matches!(item, Item::Token(t) if Some(t) == comma) {
                b.last_comma = Some(b.tokens.len());
            } else if let Some(last_comma) = b.last_comma.filter(|&c| {
                options.comma_padding_backtrack != 0
                    && b.tokens.len() == CHUNK_CONTENT
                    && b.tokens.len() - c <= options.comma_padding_backtrack
            }) {
                b.relocate_after(last_comma + 1);
            }
            if b.tokens.len() == CHUNK_CONTENT {
                b.next_chunk(false);
            }
            match item {
                Item::Token(token) => {
                    b.tokens.push(token);
                    b.weights.push(weight);
                }
                Item::Embedding(embedding) => {
                    let n = embedding.num_vectors();
                    if n > CHUNK_CONTENT {
                        return Err(TextError::EmbeddingTooLong {
                            name: embedding.name.clone(),
                            vectors: n,
                            max: CHUNK_CONTENT,
                        });
                    }
                    if b.tokens.len() + n > CHUNK_CONTENT {
                        b.next_chunk(false);
                    }
                    b.embeddings.push(EmbeddingSlot {
                        position: b.tokens.len(),
                        embedding,
                    });
                    b.tokens
                        .extend(std::iter::repeat_n(EMBEDDING_PLACEHOLDER, n));
                    b.weights.extend(std::iter::repeat_n(weight, n));
                }
            }
        }
    }
    if !b.tokens.is_empty() || b.chunks.is_empty() {
        b.next_chunk(true);
    }
    Ok(TokenizedPrompt {
        chunks: b.chunks,
        token_count: b.token_count,
        empty,
        missing_embeddings: missing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_break_matches_python_re_split() {
        assert_eq!(split_break("a BREAK b"), ["a", "b"]);
        assert_eq!(split_break("a  BREAK\n BREAK b"), ["a", "", "b"]);
        assert_eq!(
            split_break("BREAKFAST xBREAK BREAK_ break"),
            ["BREAKFAST xBREAK BREAK_ break"]
        );
        assert_eq!(split_break("BREAK,x"), ["", ",x"]);
    }

    #[test]
    fn split_comfy_finds_embedding_words() {
        use Segment::*;
        assert_eq!(
            split_comfy("a embedding:x, b\nembedding:y.pt"),
            [Text("a "), Named("x,"), Text(" b\n"), Named("y.pt")]
        );
        assert_eq!(split_comfy("embedding:"), [Named("")]);
        assert_eq!(
            split_comfy("xembedding:y (embedding:z"),
            [Text("xembedding:y (embedding:z")]
        );
        assert_eq!(split_comfy("a\tembedding:y"), [Text("a\tembedding:y")]);
    }
}
