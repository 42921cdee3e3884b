//! Qwen2.5-VL's vision tower against transformers' `Qwen2_5_VisionTransformerPretrainedModel`
//! on tiny random weights in Hugging Face's names under `visual.` (5-D patch kernel), and
//! the image preparation against `Qwen2VLImageProcessor` (fixtures from
//! tests/fixtures/models/make_qwen_vision.py; the weights are regenerated here).

mod common;

use common::{det_values, max_abs_err, reference};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::io::TypeRules;
use sdflow_core::models::llm::vision::{vision_layout, windows, VisionConfig, VisionInput, VisionTower};
use sdflow_core::models::load::load_weights;
use std::collections::BTreeMap;

const SCALE: f64 = 0.1;

fn floats(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

/// The fixture's image: (3x² + xy + 5y + 17c) mod 256, as 0..1 values.
fn image(w: usize, h: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            for c in 0..3 {
                v.push(((3 * x * x + x * y + 5 * y + 17 * c) % 256) as f32 / 255.0);
            }
        }
    }
    v
}

#[test]
fn patches_match_the_processor() {
    let r = reference("qwen_vision_tiny_ref.json");
    let [w, h]: [usize; 2] = serde_json::from_value(r["size"].clone()).unwrap();
    let input = VisionInput::from_image(&image(w, h), w, h).unwrap();
    assert_eq!((input.rows, input.cols), (h / 14, w / 14));
    let first = floats(&r["first_patches"]);
    assert!(max_abs_err(&input.patches[..first.len()], &first) <= 1e-5);
    let sums: Vec<f64> = serde_json::from_value(r["patch_sums"].clone()).unwrap();
    for (k, (patch, want)) in input.patches.chunks_exact(1176).zip(&sums).enumerate() {
        let got: f64 = patch.iter().map(|&v| v as f64).sum();
        assert!((got - want).abs() <= 1e-2, "patch {k}: sum {got} against {want}");
    }
    assert!(VisionInput::from_image(&image(250, 168), 250, 168).is_err(), "sides must be multiples of 28");
}

#[test]
fn windows_follow_transformers() {
    // 18×12 patches: 9×6 merge blocks in windows of 4×4 — 3 windows across, 2 down.
    let (order, sizes) = windows(12, 18);
    assert_eq!(sizes, vec![16, 16, 4, 8, 8, 2]);
    assert_eq!(&order[..5], &[0, 1, 2, 3, 9]);
    assert_eq!(order.len(), 54);
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(sorted, (0..54).collect::<Vec<_>>());
}

#[test]
fn tower_matches_transformers() {
    let r = reference("qwen_vision_tiny_ref.json");
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(r["keys"].clone()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen_2.5_vl_7b.safetensors");
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = keys.iter().map(|(k, s)| (k.clone(), s.clone(), det_values(k, s.iter().product(), SCALE).iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    sdflow_core::io::safetensors::write(&path, tensors.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    let src = vision_layout(sdflow_core::io::open(&path).unwrap()).unwrap();
    let backend = common::backend(2);
    let w = load_weights(&backend, src.as_ref(), &[""], &TypeRules::new(Some(DType::F32), "").unwrap()).unwrap();
    let cfg = VisionConfig::infer(&w, "visual.").unwrap();
    assert_eq!((cfg.hidden, cfg.heads, cfg.depth, cfg.intermediate, cfg.out_hidden), (160, 2, 4, 64, 48));
    check_tower(&r, &w, &backend);
}

/// The tower of `w` (under `visual.`) on the fixture's image against its reference output.
fn check_tower(r: &serde_json::Value, w: &sdflow_core::models::Weights, backend: &sdflow_core::ggml::Backend) {
    let mut cfg = VisionConfig::infer(w, "visual.").unwrap();
    cfg.full_attention = serde_json::from_value(r["full_attention"].clone()).unwrap();
    let tower = VisionTower::new(w, "visual.", cfg).unwrap();
    let [iw, ih]: [usize; 2] = serde_json::from_value(r["size"].clone()).unwrap();
    let input = VisionInput::from_image(&image(iw, ih), iw, ih).unwrap();
    let size = tower.graph_size(&input);
    let ctx = Context::new(size, size).unwrap();
    let mut g = GraphRun::new(&ctx);
    let out = tower.forward(&ctx, &mut g, &input).unwrap();
    assert_eq!(out.ne(), [48, 54, 1, 1]);
    let got = g.compute(backend, &[out], size).unwrap().remove(0);
    let err = max_abs_err(&got, &floats(&r["out"]));
    assert!(err <= 1e-3, "max abs error {err}");
}

/// The same tower as llama.cpp's mmproj file holds it (sd-cli's `--llm_vision`): q, k
/// and v apart, one [hidden, 3, 14, 14] kernel per frame, `v.blk.N.*` / `mm.*` names.
#[test]
fn an_mmproj_file_is_the_same_tower() {
    use sdflow_core::models::llm::vision::{find_prefix, is_mmproj};
    let r = reference("qwen_vision_tiny_ref.json");
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(r["keys"].clone()).unwrap();
    let mut data: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for (k, s) in &keys {
        let v = det_values(k, s.iter().product(), SCALE);
        let name = k.strip_prefix("visual.").unwrap();
        if name == "patch_embed.proj.weight" {
            // [o, 3, 2, 14, 14] → two [o, 3, 14, 14], frame by frame.
            let (o, area) = (s[0], 14 * 14);
            for f in 0..2 {
                let mut k = Vec::with_capacity(o * 3 * area);
                for oi in 0..o {
                    for c in 0..3 {
                        let at = ((oi * 3 + c) * 2 + f) * area;
                        k.extend_from_slice(&v[at..at + area]);
                    }
                }
                let n = if f == 0 { "v.patch_embd.weight".to_string() } else { "v.patch_embd.weight.1".to_string() };
                data.push((n, vec![o, 3, 14, 14], k));
            }
            continue;
        }
        if let Some(rest) = name.strip_prefix("blocks.") {
            let (i, part) = rest.split_once('.').unwrap();
            if let Some(kind) = part.strip_prefix("attn.qkv.") {
                let third = s[0] / 3;
                let row = v.len() / s[0];
                for (j, p) in ["attn_q", "attn_k", "attn_v"].iter().enumerate() {
                    let shape = if s.len() == 2 { vec![third, s[1]] } else { vec![third] };
                    data.push((format!("v.blk.{i}.{p}.{kind}"), shape, v[j * third * row..(j + 1) * third * row].to_vec()));
                }
                continue;
            }
            let g = [("attn.proj.", "attn_out."), ("norm1.", "ln1."), ("norm2.", "ln2."), ("mlp.gate_proj.", "ffn_gate."), ("mlp.up_proj.", "ffn_up."), ("mlp.down_proj.", "ffn_down.")]
                .iter()
                .find_map(|(h, g)| part.strip_prefix(h).map(|kind| format!("v.blk.{i}.{g}{kind}")))
                .unwrap();
            data.push((g, s.clone(), v));
            continue;
        }
        let g = match name {
            "merger.ln_q.weight" => "v.post_ln.weight".to_string(),
            n => n.replace("merger.mlp.", "mm."),
        };
        data.push((g, s.clone(), v));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmproj-qwen2.5-vl.gguf");
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = data.into_iter().map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    sdflow_core::io::gguf::write(&path, &[], bytes.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice()))).unwrap();
    let raw = sdflow_core::io::open(&path).unwrap();
    assert!(is_mmproj(raw.tensors().iter().map(|t| t.name.as_str())));
    assert_eq!(find_prefix(raw.tensors().iter().map(|t| t.name.as_str())).as_deref(), Some("visual."));
    let src = vision_layout(raw).unwrap();
    let backend = common::backend(2);
    let w = load_weights(&backend, src.as_ref(), &[""], &TypeRules::new(Some(DType::F32), "").unwrap()).unwrap();
    check_tower(&r, &w, &backend);
}

/// Qwen2.5-VL's language model reading an image: the tower's merged tokens in place of
/// the image pads, multimodal rotary positions; against transformers' `Qwen2_5_VLModel`.
#[test]
fn language_model_reads_the_image_as_transformers_does() {
    use sdflow_core::models::llm::{ImageSpan, LlmConfig, LlmEncoder};
    let r = reference("qwen_vl_tiny_ref.json");
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(r["keys"].clone()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen_vl.safetensors");
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = keys.iter().map(|(k, s)| (k.clone(), s.clone(), det_values(k, s.iter().product(), SCALE).iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    sdflow_core::io::safetensors::write(&path, tensors.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    let backend = common::backend(2);
    let rules = TypeRules::new(Some(DType::F32), "").unwrap();
    let vw = load_weights(&backend, vision_layout(sdflow_core::io::open(&path).unwrap()).unwrap().as_ref(), &[""], &rules).unwrap();
    let lw = load_weights(&backend, sdflow_core::io::open(&path).unwrap().as_ref(), &["language_model."], &rules).unwrap();
    let mut vcfg = VisionConfig::infer(&vw, "visual.").unwrap();
    vcfg.full_attention = vec![1, 3];
    let tower = VisionTower::new(&vw, "visual.", vcfg).unwrap();
    let lm = LlmEncoder::new(&lw, "language_model.", LlmConfig::infer(&lw, "language_model.", Some(32)).unwrap()).unwrap();
    let input = VisionInput::from_image(&image(252, 168), 252, 168).unwrap();
    let tokens: Vec<i32> = serde_json::from_value(r["tokens"].clone()).unwrap();
    let at = r["image_at"].as_u64().unwrap() as usize;
    let [rows, cols]: [usize; 2] = serde_json::from_value(r["grid"].clone()).unwrap();
    let sections: [i32; 3] = serde_json::from_value(r["mrope_section"].clone()).unwrap();
    let size = tower.graph_size(&input) + 4096;
    let ctx = Context::new(size, size).unwrap();
    let mut g = GraphRun::new(&ctx);
    let img = tower.forward(&ctx, &mut g, &input).unwrap();
    let out = lm.forward_with_images(&ctx, &mut g, &tokens, &[ImageSpan { at, tokens: img, rows, cols }], Some(sections), &[lm.config.layers + 1]).unwrap();
    let got = g.compute(&backend, &[out], size).unwrap().remove(0);
    let err = max_abs_err(&got, &floats(&r["out"]));
    assert!(err <= 1e-3, "max abs error {err}");
    // sd.cpp's positions (each token at its index) against transformers given those ids.
    let ctx = Context::new(size, size).unwrap();
    let mut g = GraphRun::new(&ctx);
    let img = tower.forward(&ctx, &mut g, &input).unwrap();
    let out = lm.forward_with_images(&ctx, &mut g, &tokens, &[ImageSpan { at, tokens: img, rows, cols }], None, &[lm.config.layers + 1]).unwrap();
    let plain = g.compute(&backend, &[out], size).unwrap().remove(0);
    let err = max_abs_err(&plain, &floats(&r["out_plain"]));
    assert!(err <= 1e-3, "text positions: max abs error {err}");
    assert!(max_abs_err(&plain, &got) > 1e-2, "the positions matter");
    // An image that does not fit the prompt is named.
    let ctx = Context::new(size, size).unwrap();
    let mut g = GraphRun::new(&ctx);
    let img = tower.forward(&ctx, &mut g, &input).unwrap();
    let e = lm.forward_with_images(&ctx, &mut g, &tokens[..20], &[ImageSpan { at, tokens: img, rows, cols }], Some(sections), &[3]).err().expect("too short");
    assert!(e.to_string().contains("image tokens"), "{e}");
}

/// The image pad is one special token, and ComfyUI's cut of the text-to-image template is
/// the 34 tokens diffusers and sd.cpp drop; the edit templates are cut before the images.
#[test]
fn templates_cut_where_comfyui_cuts() {
    use sdflow_core::models::llm::prompt::{comfy_template_end, Family, IMAGE_PAD, QWEN_IMAGE_EDIT_PLUS_TEMPLATE, QWEN_IMAGE_EDIT_TEMPLATE};
    use sdflow_core::text::llm::LlmTokenizer;
    let tok = LlmTokenizer::qwen().unwrap();
    assert_eq!(tok.encode("<|vision_start|><|image_pad|><|vision_end|>").unwrap(), vec![151652, IMAGE_PAD, 151653]);
    let t2i = Family::QwenImage.layout("a fox", 28);
    let ids = tok.encode(&t2i.text).unwrap();
    assert_eq!(comfy_template_end(&ids), t2i.drop);
    for template in [QWEN_IMAGE_EDIT_TEMPLATE.replace("{}", "make it snow"), QWEN_IMAGE_EDIT_PLUS_TEMPLATE.replace("{}", "Picture 1: <|vision_start|><|image_pad|><|vision_end|>make it snow")] {
        let ids = tok.encode(&template).unwrap();
        let end = comfy_template_end(&ids);
        assert_eq!(tok.piece(ids[end - 1]).as_deref(), Some("Ċ"), "the cut is after `user\\n`");
        assert!(ids[end..].contains(&IMAGE_PAD));
    }
}

/// sd.cpp's edit prompt: the Edit-Plus template with numbered pictures, its 64-token
/// system part dropped (the first picture's tokens at 64 + 6, where sd.cpp splices them),
/// A1111 weights inside the user's text only.
#[test]
fn sd_cpp_edit_layout_drops_the_system_part() {
    use sdflow_core::models::llm::prompt::{qwen_image_edit_layout, IMAGE_PAD};
    use sdflow_core::text::llm::LlmTokenizer;
    let tok = LlmTokenizer::qwen().unwrap();
    let p = qwen_image_edit_layout("make it (snow:1.3)", 2, 28);
    assert_eq!(&p.text[p.attn.clone()], "make it (snow:1.3)");
    let t = tok.tokenize_weighted(&p.text, p.attn.clone(), 0, None).unwrap();
    assert_eq!(t.ids.iter().position(|&i| i == IMAGE_PAD), Some(64 + 6));
    assert_eq!(t.ids.iter().filter(|&&i| i == IMAGE_PAD).count(), 2);
    assert_eq!(tok.piece(t.ids[63]).as_deref(), Some("Ċ"), "the system part ends at `user\\n`");
    assert_eq!((p.drop, p.out_layers.clone()), (64, vec![29]));
    assert!(t.weights.iter().any(|&w| w == 1.3) && t.weights[..70].iter().all(|&w| w == 1.0));
}
