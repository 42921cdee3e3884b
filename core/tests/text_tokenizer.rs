//! CLIP tokenizer against OpenCLIP's `SimpleTokenizer` (fixtures/text/tokenizer.json,
//! made by fixtures/text/gen_text_fixtures.py).

use sdflow_core::text::{ClipTokenizer, PadToken, TextError, BOS_TOKEN, EOS_TOKEN};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt: String,
    ids: Vec<u32>,
}

fn fixture() -> Fixture {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/text/tokenizer.json"
    );
    let text = std::fs::read_to_string(path).expect("tokenizer fixture");
    serde_json::from_str(&text).expect("tokenizer fixture JSON")
}

#[test]
fn matches_reference_tokenization() {
    let fixture = fixture();
    assert!(
        fixture.cases.len() >= 30,
        "fixture has {} prompts",
        fixture.cases.len()
    );
    assert!(
        fixture.cases.iter().any(|c| c.ids.len() >= 300),
        "fixture lacks a 300-token prompt"
    );
    let tok = ClipTokenizer::default();
    let mut failures = Vec::new();
    for case in &fixture.cases {
        let got = tok.encode(&case.prompt);
        if got != case.ids {
            failures.push(format!(
                "prompt {:?}\n  want {:?}\n  got  {:?}",
                case.prompt, case.ids, got
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} prompts differ:\n{}",
        failures.len(),
        fixture.cases.len(),
        failures.join("\n")
    );
}

#[test]
fn known_ids_and_special_tokens() {
    let tok = ClipTokenizer::default();
    assert_eq!(tok.encode("a photo of a cat"), [320, 1125, 539, 320, 2368]);
    assert_eq!(tok.encode(","), [267]);
    assert_eq!((tok.bos(), tok.eos(), tok.pad()), (49406, 49407, 49407));
    assert_eq!(ClipTokenizer::new(PadToken::Zero).pad(), 0);
    // OpenAI's special-token spellings are recognised inside text, as in CLIP and
    // transformers' CLIPTokenizer.
    assert_eq!(
        tok.encode("a<|endoftext|>b <|startoftext|>"),
        [320, EOS_TOKEN, 321, BOS_TOKEN]
    );
    // An unfinished marker is ordinary text (ids from the reference tokenizer).
    assert_eq!(tok.encode("<|endoftext|"), [27, 347, 40786, 4160, 347]);
}

#[test]
fn decode_inverts_encode_up_to_cleaning() {
    let tok = ClipTokenizer::default();
    let ids = tok.encode("Hello,   WORLD!! it's  café 東京");
    assert_eq!(
        tok.decode(&ids).unwrap(),
        "hello , world !! it 's café 東京 "
    );
    let with_specials = [BOS_TOKEN, 320, EOS_TOKEN];
    assert_eq!(
        tok.decode(&with_specials).unwrap(),
        "<|startoftext|>a <|endoftext|>"
    );
}

#[test]
fn decode_rejects_ids_outside_the_vocabulary() {
    let tok = ClipTokenizer::default();
    match tok.decode(&[320, 49408, 5]) {
        Err(TextError::UnknownTokenId {
            id: 49408,
            position: 1,
        }) => {}
        other => panic!("expected UnknownTokenId, got {other:?}"),
    }
    assert!(tok.decode(&[u32::MAX]).is_err());
}

#[test]
fn every_vocabulary_id_decodes() {
    let tok = ClipTokenizer::default();
    let all: Vec<u32> = (0..sdflow_core::text::VOCAB_SIZE).collect();
    let text = tok.decode(&all).unwrap();
    assert!(text.starts_with("!\"#"), "{}", &text[..20]);
}
