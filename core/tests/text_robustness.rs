//! Arbitrary input never panics and always yields well-formed chunks.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sdflow_core::text::{
    parse_prompt_attention, tokenize_weighted, ChunkOptions, ClipTokenizer, CHUNK_LEN,
};

/// Characters weighted toward the ones the parsers treat specially.
fn random_prompt(rng: &mut StdRng) -> String {
    const SPECIAL: &[&str] = &[
        "(",
        ")",
        "[",
        "]",
        "\\",
        ":",
        ":1.5)",
        ":-2)",
        ":.)",
        " BREAK ",
        "BREAK",
        ",",
        " ",
        "\n",
        "&amp;",
        "&#",
        "&#x",
        ";",
        "&",
        "<",
        "'s",
        "ﬁ",
        "Ａ",
        "\u{301}",
        "\u{1b}[",
        "\u{85}",
        "\u{feff}",
        "İ",
        "Σ",
        "🔥",
        "👩‍👩‍👧",
        "東京",
        "<|endoftext|>",
        "cat",
        "\r\n",
    ];
    let len = rng.random_range(0..120);
    let mut s = String::new();
    for _ in 0..len {
        if rng.random_bool(0.6) {
            s.push_str(SPECIAL[rng.random_range(0..SPECIAL.len())]);
        } else if let Some(c) = char::from_u32(rng.random_range(0..0x3_0000)) {
            s.push(c);
        }
    }
    s
}

#[test]
fn random_prompts_tokenize_into_well_formed_chunks() {
    let tok = ClipTokenizer::default();
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..1500 {
        let prompt = random_prompt(&mut rng);
        let parsed = parse_prompt_attention(&prompt);
        assert!(!parsed.is_empty());
        for backtrack in [0, 20] {
            let options = ChunkOptions {
                comma_padding_backtrack: backtrack,
                ..ChunkOptions::default()
            };
            let got = tokenize_weighted(&prompt, &tok, None, &options).unwrap();
            assert!(!got.chunks.is_empty());
            for c in &got.chunks {
                assert_eq!(c.tokens.len(), CHUNK_LEN, "{prompt:?}");
                assert_eq!(c.weights.len(), CHUNK_LEN, "{prompt:?}");
                assert_eq!(c.tokens[0], tok.bos());
                assert!(c.tokens.contains(&tok.eos()));
                assert!(c.weights.iter().all(|w| w.is_finite()), "{prompt:?}");
            }
            let content: usize = got
                .chunks
                .iter()
                .map(|c| {
                    c.tokens[1..]
                        .iter()
                        .position(|&t| t == tok.eos())
                        .unwrap_or(0)
                })
                .sum();
            assert!(content <= got.token_count, "{prompt:?}");
            // Decoding the content tokens back never fails (no placeholder without an embedding).
            for c in &got.chunks {
                tok.decode(&c.tokens).unwrap();
            }
        }
    }
}
