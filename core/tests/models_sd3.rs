//! SD3 / SD3.5 MMDiT against diffusers' `SD3Transformer2DModel` on tiny random weights in
//! Stability's single-file names (fixtures from tests/fixtures/models/make_sd3.py; the
//! weights are regenerated here): SD3 and SD3.5 medium (q/k norms, MMDiT-X), skip layers,
//! and four Euler steps of SD3's shifted flow schedule.

mod common;

use common::{det_weights_with, max_abs_err, reference};
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::models::conditioning::Conditioning;
use sdflow_core::models::dit::{patchify, unpatchify_hwc};
use sdflow_core::models::sd3::{Sd3, Sd3Config, Sd3Denoiser, Sd3Inputs, Sd3Item};
use sdflow_core::models::Weights;

const SCALE: f64 = 0.2;

fn fixture() -> serde_json::Value {
    reference("sd3_tiny_ref.json")
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

fn shape() -> [usize; 4] {
    serde_json::from_value(fixture()["latent_shape"].clone()).unwrap()
}

fn tiny(variant: &str) -> Weights {
    let r = fixture();
    let backend = common::backend(2);
    det_weights_with(
        &r[variant]["keys"],
        SCALE,
        &backend,
        &[("pos_embed", floats(&r[variant]["pos_embed"]))],
    )
}

/// The velocity on the fixture's inputs as a latent [B, C, H, W].
fn velocity(w: &Weights, skip: &[usize]) -> sdflow_core::models::Result<Vec<f32>> {
    let r = fixture();
    let [b, c, h, wd] = shape();
    let model = Sd3::new(w, "", Sd3Config::infer(w, "")?)?;
    let p = model.config.patch as usize;
    let backend = common::backend(2);
    let ctx = Context::new(16384, 16384).unwrap();
    let mut g = GraphRun::new(&ctx);
    let (rows, cols) = (h / p, wd / p);
    let img = g.input_f32(
        &[(c * p * p) as i64, (rows * cols) as i64, b as i64],
        patchify(&floats(&r["latent"]), [b, c, h, wd], p)?,
    )?;
    let lt = r["txt_len"].as_u64().unwrap() as usize;
    let txt_vals = floats(&r["txt"]);
    let txt = g.input_f32(
        &[(txt_vals.len() / (b * lt)) as i64, lt as i64, b as i64],
        txt_vals,
    )?;
    let y_vals = floats(&r["y"]);
    let y = g.input_f32(&[(y_vals.len() / b) as i64, b as i64], y_vals)?;
    let timesteps = floats(&r["sigma"]);
    let inputs = Sd3Inputs {
        img,
        rows: rows as i64,
        cols: cols as i64,
        txt,
        timesteps: &timesteps,
        y,
        skip,
    };
    let out = model.forward(&ctx, &mut g, &inputs)?;
    assert_eq!(
        out.ne(),
        [(c * p * p) as i64, (rows * cols) as i64, b as i64, 1]
    );
    let v = g.compute(&backend, &[out], 16384)?.remove(0);
    unpatchify_hwc(&v, [b, c, h, wd], p)
}

#[test]
fn sd3_matches_diffusers() {
    let w = tiny("sd3");
    let cfg = Sd3Config::infer(&w, "").unwrap();
    assert_eq!(
        (
            cfg.in_channels,
            cfg.out_channels,
            cfg.patch,
            cfg.hidden,
            cfg.heads,
            cfg.mlp_hidden,
            cfg.context,
            cfg.pooled,
            cfg.depth,
            cfg.pos_embed_max
        ),
        (16, 16, 2, 24, 3, 96, 40, 48, 3, 12)
    );
    assert!(!cfg.qk_norm && cfg.self_attn_blocks.is_empty());
    let err = max_abs_err(
        &velocity(&w, &[]).unwrap(),
        &floats(&fixture()["sd3"]["velocity"]),
    );
    assert!(err <= 1e-3, "max abs error {err}");
}

#[test]
fn sd35_medium_matches_diffusers() {
    let w = tiny("sd35m");
    let cfg = Sd3Config::infer(&w, "").unwrap();
    assert!(cfg.qk_norm);
    assert_eq!(cfg.self_attn_blocks, [0, 1]);
    let err = max_abs_err(
        &velocity(&w, &[]).unwrap(),
        &floats(&fixture()["sd35m"]["velocity"]),
    );
    assert!(err <= 1e-3, "max abs error {err}");
}

#[test]
fn skipped_layers_match_diffusers() {
    for variant in ["sd3", "sd35m"] {
        let w = tiny(variant);
        let got = velocity(&w, &[1]).unwrap();
        let want = floats(&fixture()[variant]["skip_1"]);
        let err = max_abs_err(&got, &want);
        assert!(err <= 1e-3, "{variant}: max abs error {err}");
        assert!(
            max_abs_err(&got, &floats(&fixture()[variant]["velocity"])) > 1e-2,
            "skipping changes the output"
        );
    }
    // A block the model does not have leaves nothing out, as in ComfyUI and sd.cpp.
    let w = tiny("sd3");
    assert_eq!(velocity(&w, &[3, 9]).unwrap(), velocity(&w, &[]).unwrap());
}

#[test]
fn four_euler_steps_match_diffusers() {
    use sdflow_core::sampling::{sample, CpuRng, Denoised, SampleOpts, Sampler};

    let r = fixture();
    let s = &r["sampling"];
    let [_, c, h, wd] = shape();
    let w = tiny("sd35m");
    let backend = common::backend(2);
    let mut den = Sd3Denoiser::new(Sd3::new(&w, "", Sd3Config::infer(&w, "").unwrap()).unwrap());
    let lt = r["txt_len"].as_u64().unwrap() as i64;
    let txt = floats(&r["txt"]);
    let y = floats(&r["y"]);
    let mut cond = Conditioning::new(txt[..txt.len() / 2].to_vec(), 40, lt).unwrap();
    cond.pooled = Some(y[..y.len() / 2].to_vec());
    let latent_shape = [wd as i64, h as i64, c as i64, 1];
    let mut model = |x: &[f32], sigma: f32| -> Result<Denoised, sdflow_core::models::ModelError> {
        Ok(den
            .denoise_batch(
                &backend,
                latent_shape,
                sigma,
                &[Sd3Item { x, cond: &cond }],
                &[],
            )?
            .remove(0)
            .into())
    };
    let sigmas = floats(&s["sigmas"]);
    let mut rng = CpuRng::new(0);
    let opts = SampleOpts {
        flow: true,
        ..SampleOpts::default()
    };
    let out = sample(
        Sampler::Euler,
        &mut model,
        floats(&s["noise"]),
        &sigmas,
        &mut rng,
        &opts,
        None,
    )
    .unwrap();
    let err = max_abs_err(&out, &floats(&s["final"]));
    assert!(err <= 1e-3, "4 steps: max abs error {err}");
}

#[test]
fn denoiser_batches_items_and_names_bad_inputs() {
    let w = tiny("sd3");
    let backend = common::backend(2);
    let mut den = Sd3Denoiser::new(Sd3::new(&w, "", Sd3Config::infer(&w, "").unwrap()).unwrap());
    let [_, c, h, wd] = shape();
    let x: Vec<f32> = (0..c * h * wd)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let shape = [wd as i64, h as i64, c as i64, 1];
    let mk = |tokens: i64, seed: i64| {
        let mut k = Conditioning::new(
            (0..tokens * 40)
                .map(|i| (((i + seed) * 13 % 29) as f32) / 29.0 - 0.5)
                .collect(),
            40,
            tokens,
        )
        .unwrap();
        k.pooled = Some((0..48).map(|i| ((i + seed) % 7) as f32 / 7.0).collect());
        k
    };
    let (a, b, long) = (mk(5, 0), mk(5, 3), mk(8, 1));
    let alone: Vec<Vec<f32>> = [&a, &b, &long]
        .iter()
        .map(|k| {
            den.denoise_batch(&backend, shape, 0.5, &[Sd3Item { x: &x, cond: k }], &[])
                .unwrap()
                .remove(0)
        })
        .collect();
    let together = den
        .denoise_batch(
            &backend,
            shape,
            0.5,
            &[
                Sd3Item { x: &x, cond: &a },
                Sd3Item { x: &x, cond: &long },
                Sd3Item { x: &x, cond: &b },
            ],
            &[],
        )
        .unwrap();
    for (got, want) in together.iter().zip([&alone[0], &alone[2], &alone[1]]) {
        assert!(max_abs_err(got, want) < 1e-4);
    }
    assert!(max_abs_err(&alone[0], &alone[1]) > 1e-3);

    let wide = Conditioning::new(vec![0.0; 64], 64, 1).unwrap();
    let e = den
        .denoise_batch(&backend, shape, 0.5, &[Sd3Item { x: &x, cond: &wide }], &[])
        .err()
        .expect("width");
    assert!(e.to_string().contains("reads 40"), "{e}");
    // An odd size is padded by wrapping around and cropped back, as ComfyUI's MMDiT does.
    let (w1, h1) = (wd - 1, h - 1);
    let odd: Vec<f32> = (0..c * h1 * w1).map(|i| ((i * 53 % 97) as f32 / 48.0) - 1.0).collect();
    let got = den.denoise_batch(&backend, [w1 as i64, h1 as i64, c as i64, 1], 0.5, &[Sd3Item { x: &odd, cond: &a }], &[]).unwrap().remove(0);
    let (padded, h2, w2) = sdflow_core::models::dit::pad_to_patches(&odd, [c, h1, w1], 2);
    let full = den.denoise_batch(&backend, [w2 as i64, h2 as i64, c as i64, 1], 0.5, &[Sd3Item { x: &padded, cond: &a }], &[]).unwrap().remove(0);
    assert!(max_abs_err(&got, &sdflow_core::models::dit::crop(&full, [c, h2, w2], h1, w1)) < 1e-5);
    let e = den
        .denoise_batch(
            &backend,
            [wd as i64, h as i64 / 2, 4 * c as i64, 1],
            0.5,
            &[Sd3Item { x: &x, cond: &a }],
            &[],
        )
        .err()
        .expect("channels");
    assert!(e.to_string().contains("latent channels"), "{e}");
    // Larger than the position table.
    let big = vec![0.0; c * 26 * 26];
    let e = den
        .denoise_batch(
            &backend,
            [26, 26, c as i64, 1],
            0.5,
            &[Sd3Item { x: &big, cond: &a }],
            &[],
        )
        .err()
        .expect("too large");
    assert!(e.to_string().contains("positions reach 12"), "{e}");
}

#[test]
fn missing_and_misshapen_weights_are_named() {
    let r = fixture();
    let backend = common::backend(2);
    let mut keys: serde_json::Map<String, serde_json::Value> =
        serde_json::from_value(r["sd3"]["keys"].clone()).unwrap();
    keys.remove("joint_blocks.1.context_block.mlp.fc2.bias");
    let w = common::det_weights(&serde_json::Value::Object(keys.clone()), SCALE, &backend);
    let e = Sd3::new(&w, "", Sd3Config::infer(&w, "").unwrap())
        .err()
        .expect("missing");
    assert!(
        e.to_string()
            .contains("joint_blocks.1.context_block.mlp.fc2.bias"),
        "{e}"
    );
    keys.insert("pos_embed".into(), serde_json::json!([1, 140, 24]));
    let w = common::det_weights(&serde_json::Value::Object(keys), SCALE, &backend);
    let e = Sd3Config::infer(&w, "").err().expect("not square");
    assert!(e.to_string().contains("not a square grid"), "{e}");
    let e = Sd3Config::infer(&tiny("sd3"), "model.diffusion_model.")
        .err()
        .expect("prefix");
    assert!(e.to_string().contains("not an SD3 MMDiT"), "{e}");
}

/// A diffusers-named SD3.5 medium (each tensor made from Stability's rows as diffusers'
/// own converter places them: make_dit_diffusers_maps.py) loads as Stability's names,
/// fused and reordered back, and computes what diffusers' `SD3Transformer2DModel` does.
#[test]
fn diffusers_names_load_as_stability() {
    use common::det_values;
    use sdflow_core::dtype::DType;
    use sdflow_core::io::TypeRules;
    use sdflow_core::models::load::load_weights;
    use sdflow_core::models::sd3::diffusers::stability_layout;
    use std::collections::BTreeMap;
    let r = fixture();
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(r["sd35m"]["keys"].clone()).unwrap();
    let values = |name: &str| if name == "pos_embed" { floats(&r["sd35m"]["pos_embed"]) } else { det_values(name, keys[name].iter().product(), SCALE) };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sd3.5_medium_diffusers.safetensors");
    common::write_diffusers_file(&path, "sd3_diffusers_map.json", "model.diffusion_model.", &keys, &values);
    let src = stability_layout(sdflow_core::io::open(&path).unwrap()).unwrap();
    let names: std::collections::BTreeSet<&str> = src.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, keys.keys().map(String::as_str).collect(), "every single-file tensor, nothing else");
    for (name, shape) in &keys {
        let want: Vec<u8> = values(name).iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(&src.read(name).unwrap()[..], &want[..], "{name} is Stability's tensor bit for bit");
        assert_eq!(&src.get(name).unwrap().shape, shape);
    }
    let backend = common::backend(2);
    let w = load_weights(&backend, src.as_ref(), &[""], &TypeRules::new(Some(DType::F32), "").unwrap()).unwrap();
    let err = max_abs_err(&velocity(&w, &[]).unwrap(), &floats(&r["sd35m"]["velocity"]));
    assert!(err <= 1e-3, "max abs error {err}");
}
