//! sdflow's guidance math against a NumPy transcription of ComfyUI's (fixture written by
//! `fixtures/comfy_guidance.py`): areas in pixels and percentages, masks with and
//! without "mask bounds", strengths, same-area counterparts on the other side, CFG.

use sdflow_core::models::conditioning::Conditioning;
use sdflow_nodes::sampling::guidance::{calc_cond_batch, prepare, Mix, ModelItem, Prepared};
use sdflow_nodes::values::{CondArea, CondEntry, CondList, CondMask, Mask};
use serde_json::Value;
use std::sync::Arc;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn mask(v: &Value) -> Arc<Mask> {
    let u = |k: &str| v[k].as_u64().unwrap() as usize;
    Arc::new(Mask { data: floats(&v["data"]), n: u("n"), height: u("height"), width: u("width") })
}

/// The fixture's toy denoiser: its conditioning's first value, half the input, and a
/// ramp over the position inside the region it is given.
fn toy(items: &[ModelItem<'_>], shape: [i64; 4]) -> Result<Vec<Vec<f32>>, ()> {
    let (w, h, c) = (shape[0] as usize, shape[1] as usize, shape[2] as usize);
    Ok(items
        .iter()
        .map(|it| {
            it.x.iter()
                .enumerate()
                .map(|(i, v)| {
                    let (xx, yy, ch) = (i % w, (i / w) % h, (i / (w * h)) % c);
                    v * 0.5 + it.cond.data[0] + (0.01 * xx as f32 + 0.02 * yy as f32) + (0.1 * ch as f64) as f32
                })
                .collect()
        })
        .collect())
}

#[test]
fn one_evaluation_matches_comfyui() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/comfy_guidance.json")).unwrap();
    let f: Value = serde_json::from_str(&text).unwrap();
    let shape: Vec<i64> = f["shape"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    let shape = [shape[0], shape[1], shape[2], shape[3]];
    let x = floats(&f["x"]);
    let e = |v: f32| CondEntry::new(Conditioning::new(vec![v, 0.0], 2, 1).unwrap());
    let cells = |h, w, y, x| Some(CondArea::Cells { height: h, width: w, y, x });
    let positive = CondList(vec![
        e(0.3),
        CondEntry { area: cells(64 / 8, 96 / 8, 32 / 8, 48 / 8), strength: 0.8, ..e(1.5) },
        CondEntry { area: Some(CondArea::Fraction { height: 0.5, width: 0.3, y: 0.25, x: 0.1 }), strength: 1.2, ..e(-0.7) },
        CondEntry { mask: Some(CondMask { mask: mask(&f["mask_a"]), strength: 0.9, area_to_bounds: false }), strength: 0.7, ..e(2.0) },
        CondEntry { mask: Some(CondMask { mask: mask(&f["mask_b"]), strength: 1.0, area_to_bounds: true }), ..e(-1.1) },
    ]);
    let negative = CondList(vec![e(-0.5), CondEntry { area: cells(48 / 8, 48 / 8, 0, 0), ..e(0.9) }]);
    let prepared = prepare(&[&positive, &negative], shape[0] as usize, shape[1] as usize, &mut |_| Ok(None)).unwrap();
    let counts: Vec<u64> = f["entries_after_same_area"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(vec![prepared[0].len() as u64, prepared[1].len() as u64], counts, "same-area counterparts");
    let sides: Vec<Option<&[Prepared]>> = prepared.iter().map(|p| Some(p.as_slice())).collect();
    // A budget of one latent: some regions batch, others run alone; the result must not care.
    for budget in [usize::MAX, 1, (shape[0] * shape[1] * shape[3]) as usize] {
        let mut out = calc_cond_batch(&sides, &x, shape, 0, &|_| true, budget, &mut toy).unwrap();
        let (cond, uncond) = (out[0].take().unwrap(), out[1].take().unwrap());
        let worst = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst(&cond, &floats(&f["cond"])) < 2e-5, "cond: worst {}", worst(&cond, &floats(&f["cond"])));
        assert!(worst(&uncond, &floats(&f["uncond"])) < 2e-5, "uncond: worst {}", worst(&uncond, &floats(&f["uncond"])));
        let mixed = Mix::Cfg { cfg: f["cfg"].as_f64().unwrap() as f32 }.mix(cond, None, Some(uncond)).denoised;
        assert!(worst(&mixed, &floats(&f["mixed"])) < 1e-4, "mixed: worst {}", worst(&mixed, &floats(&f["mixed"])));
    }
}
