//! Mistral's "tekken" vocabulary (FLUX.2 dev's Mistral-Small-3.2) as a Hugging Face
//! tokenizer.
//!
//! Tekken is tiktoken-style byte-level BPE: ranked byte sequences, a split pattern, and
//! 1,000 special tokens before the first rank (so token id = rank + 1000), the vocabulary
//! cut at the model's size (131,072). The file has no merge list; a merge is any two
//! tokens whose bytes join into a third, ordered by that third's rank — the conversion
//! transformers' `TikTokenConverter` uses, under which Hugging Face's BPE (with
//! `ignore_merges`: a whole pre-token in the vocabulary is taken at once, as tiktoken
//! does) gives tiktoken's ids. The special tokens are sd.cpp's list (mistral_common's):
//! written in a prompt (`[INST]`) they become their ids.

use std::collections::HashMap;
use std::io::Read;

use base64::Engine;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

#[derive(serde::Deserialize)]
struct File {
    config: Config,
    vocab: Vec<Entry>,
}

#[derive(serde::Deserialize)]
struct Config {
    pattern: String,
    default_vocab_size: usize,
    default_num_special_tokens: usize,
}

#[derive(serde::Deserialize)]
struct Entry {
    rank: usize,
    token_bytes: String,
}

/// The special tokens in id order (ids 0..19), the rest being `<SPECIAL_k>`.
const SPECIAL: [&str; 20] = [
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]",
    "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]",
];

/// GPT-2's byte → printable character map, which byte-level BPE vocabularies are written in.
fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        out[b as usize] = if printable {
            char::from_u32(b).expect("a byte is a char")
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("below 512")
        };
    }
    out
}

/// The tokenizer of a gzip'd tekken file.
pub(crate) fn from_gz(gz: &[u8]) -> Result<Tokenizer, String> {
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(gz).read_to_end(&mut json).map_err(|e| format!("unpacking the Mistral vocabulary: {e}"))?;
    from_json(&json)
}

/// The tokenizer of a tekken file's JSON.
pub(crate) fn from_json(json: &[u8]) -> Result<Tokenizer, String> {
    let file: File = serde_json::from_slice(json).map_err(|e| format!("reading the Mistral vocabulary: {e}"))?;
    let specials = file.config.default_num_special_tokens;
    let size = file.config.default_vocab_size.checked_sub(specials).ok_or("the Mistral vocabulary is smaller than its special tokens")?;
    let mut ranked: Vec<Option<Vec<u8>>> = vec![None; size];
    for e in &file.vocab {
        if e.rank < size {
            let bytes = base64::engine::general_purpose::STANDARD.decode(&e.token_bytes).map_err(|err| format!("Mistral vocabulary rank {}: {err}", e.rank))?;
            ranked[e.rank] = Some(bytes);
        }
    }
    let ranked: Vec<Vec<u8>> = ranked.into_iter().enumerate().map(|(r, b)| b.ok_or(format!("the Mistral vocabulary has no rank {r}"))).collect::<Result<_, _>>()?;
    let rank_of: HashMap<&[u8], usize> = ranked.iter().enumerate().map(|(r, b)| (b.as_slice(), r)).collect();
    let chars = byte_chars();
    let show = |b: &[u8]| -> String { b.iter().map(|&x| chars[x as usize]).collect() };
    let mut vocab = tokenizers::models::bpe::Vocab::default();
    let mut merges: Vec<(usize, usize, usize)> = Vec::new();
    for (rank, bytes) in ranked.iter().enumerate() {
        vocab.insert(show(bytes), (rank + specials) as u32);
        let mut local: Vec<(usize, usize, usize)> = (1..bytes.len())
            .filter_map(|i| Some((*rank_of.get(&bytes[..i])?, *rank_of.get(&bytes[i..])?, rank)))
            .collect();
        local.sort();
        merges.extend(local);
    }
    let merges: Vec<(String, String)> = merges.into_iter().map(|(l, r, _)| (show(&ranked[l]), show(&ranked[r]))).collect();
    let names: Vec<String> = (0..specials).map(|i| SPECIAL.get(i).map_or_else(|| format!("<SPECIAL_{i}>"), |s| s.to_string())).collect();
    for (i, n) in names.iter().enumerate() {
        vocab.insert(n.clone(), i as u32);
    }
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).ignore_merges(true).build().map_err(|e| format!("building the Mistral vocabulary: {e}"))?;
    let split = Split::new(SplitPattern::Regex(file.config.pattern.clone()), SplitDelimiterBehavior::Isolated, false).map_err(|e| format!("the Mistral split pattern: {e}"))?;
    let pre = Sequence::new(vec![PreTokenizerWrapper::Split(split), PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false))]);
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(pre));
    tok.with_decoder(Some(ByteLevel::default()));
    tok.add_special_tokens(&names.iter().map(|n| AddedToken::from(n.clone(), true)).collect::<Vec<_>>());
    Ok(tok)
}
