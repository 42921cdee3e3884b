//! Chunking of weighted prompts against A1111's `tokenize_line`
//! (fixtures/text/chunks.json, made by fixtures/text/gen_text_fixtures.py).

use sdflow_core::text::{
    tokenize_weighted, ChunkOptions, ClipTokenizer, PadToken, CHUNK_LEN, EOS_TOKEN,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt: String,
    comma_padding_backtrack: usize,
    token_count: usize,
    chunks: Vec<WantChunk>,
}

#[derive(Deserialize)]
struct WantChunk {
    tokens: Vec<u32>,
    weight_bits: Vec<u64>,
}

fn fixture() -> Fixture {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/text/chunks.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("fixture JSON")
}

#[test]
fn matches_a1111_tokenize_line() {
    let tok = ClipTokenizer::default();
    let mut failures = Vec::new();
    let mut compared = 0;
    // The generator leaves out prompts with a bracketed BREAK, the one documented
    // difference from A1111 (which tokenizes the word "break" with a negative weight
    // there); break_inside_brackets_still_breaks covers it.
    for case in &fixture().cases {
        let options = ChunkOptions {
            comma_padding_backtrack: case.comma_padding_backtrack,
            ..ChunkOptions::default()
        };
        let got = tokenize_weighted(&case.prompt, &tok, None, &options).expect("tokenize");
        compared += 1;
        let tokens: Vec<&Vec<u32>> = got.chunks.iter().map(|c| &c.tokens).collect();
        let want_tokens: Vec<&Vec<u32>> = case.chunks.iter().map(|c| &c.tokens).collect();
        // Chunk weights are f32; A1111's f64 multipliers are compared after the same cast.
        let weights: Vec<Vec<u32>> = got
            .chunks
            .iter()
            .map(|c| c.weights.iter().map(|w| w.to_bits()).collect())
            .collect();
        let want_weights: Vec<Vec<u32>> = case
            .chunks
            .iter()
            .map(|c| {
                c.weight_bits
                    .iter()
                    .map(|&b| (f64::from_bits(b) as f32).to_bits())
                    .collect()
            })
            .collect();
        if tokens != want_tokens || weights != want_weights || got.token_count != case.token_count {
            failures.push(format!(
                "prompt {:?} (backtrack {}): chunks {} want {}, token_count {} want {}, tokens equal {}, weights equal {}",
                case.prompt,
                case.comma_padding_backtrack,
                got.chunks.len(),
                case.chunks.len(),
                got.token_count,
                case.token_count,
                tokens == want_tokens,
                weights == want_weights
            ));
        }
        assert!(got
            .chunks
            .iter()
            .all(|c| c.tokens.len() == CHUNK_LEN && c.weights.len() == CHUNK_LEN));
    }
    assert!(compared >= 60);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn sd2_pads_with_zero_after_the_first_eos() {
    // A1111's SD2 path: chunks as for SD1, then every token after the first EOS is 0.
    let tok = ClipTokenizer::new(PadToken::Zero);
    for case in &fixture().cases {
        let options = ChunkOptions {
            comma_padding_backtrack: case.comma_padding_backtrack,
            ..ChunkOptions::default()
        };
        let got = tokenize_weighted(&case.prompt, &tok, None, &options).expect("tokenize");
        for (g, w) in got.chunks.iter().zip(&case.chunks) {
            let eos = w
                .tokens
                .iter()
                .position(|&t| t == EOS_TOKEN)
                .expect("EOS in chunk");
            let mut want = w.tokens.clone();
            want[eos + 1..].fill(0);
            assert_eq!(g.tokens, want, "prompt {:?}", case.prompt);
        }
    }
}

#[test]
fn break_inside_brackets_still_breaks() {
    let tok = ClipTokenizer::default();
    let got = tokenize_weighted("[a BREAK b]", &tok, None, &ChunkOptions::default()).unwrap();
    assert_eq!(got.chunks.len(), 2);
    let a = tok.encode("a")[0];
    let b = tok.encode("b")[0];
    assert_eq!(&got.chunks[0].tokens[..3], [49406, a, 49407]);
    assert_eq!(&got.chunks[1].tokens[..3], [49406, b, 49407]);
    assert_eq!(got.chunks[0].weights[1], (1.0f64 / 1.1) as f32);
    assert_eq!(got.chunks[1].weights[1], (1.0f64 / 1.1) as f32);
}

#[test]
fn chunk_boundaries_and_weights_per_token() {
    let tok = ClipTokenizer::default();
    let cat = tok.encode("cat")[0];
    let dog = tok.encode("dog")[0];
    // 74 plain tokens then a weighted pair straddling the 75-token boundary.
    let prompt = format!("{} (cat dog:1.5)", vec!["cat"; 74].join(" "));
    let got = tokenize_weighted(&prompt, &tok, None, &ChunkOptions::default()).unwrap();
    assert_eq!(got.chunks.len(), 2);
    assert_eq!(got.token_count, 76);
    let (c0, c1) = (&got.chunks[0], &got.chunks[1]);
    assert_eq!(c0.tokens[0], 49406);
    assert_eq!(c0.tokens[75], cat);
    assert_eq!(c0.weights[75], 1.5);
    assert_eq!(c0.weights[74], 1.0);
    assert_eq!(c0.tokens[76], 49407);
    assert_eq!(&c1.tokens[..3], [49406, dog, 49407]);
    assert_eq!(c1.weights[1], 1.5);
    assert!(c1.tokens[3..].iter().all(|&t| t == 49407));
    assert!(c1.weights[2..].iter().all(|&w| w == 1.0));
    assert!(!got.empty);
}

#[test]
fn empty_prompts() {
    let tok = ClipTokenizer::default();
    for prompt in ["", "   ", "()", "[ ]", "BREAK", "\u{feff}\u{7}"] {
        let got = tokenize_weighted(prompt, &tok, None, &ChunkOptions::default()).unwrap();
        assert!(got.empty, "{prompt:?}");
        assert_eq!(got.chunks.len(), 1, "{prompt:?}");
        assert_eq!(&got.chunks[0].tokens[..2], [49406, 49407]);
    }
    let got = tokenize_weighted("BREAK BREAK", &tok, None, &ChunkOptions::default()).unwrap();
    assert!(got.empty);
    assert_eq!(got.chunks.len(), 2);
    assert!(
        !tokenize_weighted(".", &tok, None, &ChunkOptions::default())
            .unwrap()
            .empty
    );
}

#[test]
fn weighting_can_be_switched_off() {
    let tok = ClipTokenizer::default();
    let options = ChunkOptions {
        parse_weights: false,
        ..ChunkOptions::default()
    };
    let got = tokenize_weighted("(a:1.5) BREAK b", &tok, None, &options).unwrap();
    assert_eq!(got.chunks.len(), 1);
    let want = tok.encode("(a:1.5) BREAK b");
    assert_eq!(&got.chunks[0].tokens[1..=want.len()], want.as_slice());
    assert!(got.chunks[0].weights.iter().all(|&w| w == 1.0));
}
