//! A1111 prompt weighting against A1111's own `parse_prompt_attention`
//! (fixtures/text/prompt_attention.json, made by fixtures/text/gen_text_fixtures.py).

use sdflow_core::text::{parse_prompt_attention, PromptPiece};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt: String,
    parsed: Vec<Piece>,
}

#[derive(Deserialize)]
struct Piece {
    text: String,
    weight_bits: u64,
}

#[test]
fn matches_a1111_parse_prompt_attention() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/text/prompt_attention.json"
    );
    let fixture: Fixture = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture"))
        .expect("fixture JSON");
    assert!(fixture.cases.len() >= 20);
    let mut failures = Vec::new();
    for case in &fixture.cases {
        let want: Vec<PromptPiece> = case
            .parsed
            .iter()
            .map(|p| PromptPiece {
                text: p.text.clone(),
                weight: f64::from_bits(p.weight_bits),
            })
            .collect();
        let got = parse_prompt_attention(&case.prompt);
        // Bit equality: A1111's weights come out of the same f64 operations in the same order.
        let same = got.len() == want.len()
            && got
                .iter()
                .zip(&want)
                .all(|(g, w)| g.text == w.text && g.weight.to_bits() == w.weight.to_bits());
        if !same {
            failures.push(format!(
                "prompt {:?}\n  want {:?}\n  got  {:?}",
                case.prompt, want, got
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn break_markers() {
    let parsed = parse_prompt_attention("a BREAK b");
    assert!(parsed[1].is_break());
    assert!(!parsed[0].is_break());
    // Inside brackets A1111 scales the marker's weight; it is still a break here.
    let parsed = parse_prompt_attention("(a BREAK b)");
    assert_eq!(parsed[1].text, "BREAK");
    assert!(parsed[1].is_break());
    // A literal "BREAK" of positive weight is just text.
    assert!(!PromptPiece {
        text: "BREAK".into(),
        weight: 1.0
    }
    .is_break());
}

#[test]
fn non_numeric_weights_stay_text_instead_of_failing() {
    // A1111 raises ValueError on these; here the `:…` is text and `)` closes.
    let parsed = parse_prompt_attention("(x:1.2.3)");
    assert_eq!(
        parsed,
        [PromptPiece {
            text: "x:1.2.3".into(),
            weight: 1.1
        }]
    );
    let parsed = parse_prompt_attention("(y:.)z");
    assert_eq!(
        parsed[0],
        PromptPiece {
            text: "y:.".into(),
            weight: 1.1
        }
    );
    assert_eq!(
        parsed[1],
        PromptPiece {
            text: "z".into(),
            weight: 1.0
        }
    );
    // Without an open bracket the whole thing is text, as in A1111.
    let parsed = parse_prompt_attention("x:1.2.3)");
    assert_eq!(
        parsed,
        [PromptPiece {
            text: "x:1.2.3)".into(),
            weight: 1.0
        }]
    );
}
