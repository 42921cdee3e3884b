//! ControlNet against diffusers' `ControlNetModel` and `UNet2DConditionModel` with
//! `down_block_additional_residuals` / `mid_block_additional_residual`, on tiny random
//! weights in the LDM key layout (fixtures from tests/fixtures/models/make_controlnet.py).

mod common;

use common::{det_values, det_weights, keys, max_abs_err, reference};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::{Backend, Context, GraphRun};
use sdflow_core::io::{self, TypeRules};
use sdflow_core::models::sd::controlnet::{self, ControlNet, ControlNetConfig, PREFIX};
use sdflow_core::models::load::load_weights;
use sdflow_core::models::sd::unet::{Heads, Unet, UnetConfig, UnetExtras};
use sdflow_core::models::Weights;
use std::collections::BTreeMap;

const UNET: &str = "model.diffusion_model";

fn heads(name: &str) -> Heads {
    // diffusers' attention_head_dim is a head count: 4 for SD1; [2, 4] for the XL-like
    // pair, 16-wide heads.
    if name == "sd1" {
        Heads::Count(4)
    } else {
        Heads::Dim(16)
    }
}

fn unet_keys(name: &str) -> String {
    if name == "sd1" {
        "unet_sd1_tiny_keys.json".into()
    } else {
        "unet_xl_tiny_keys.json".into()
    }
}

struct Outputs {
    out: Vec<f32>,
    skips: Vec<Vec<f32>>,
    middle: Vec<f32>,
}

/// Run ControlNet and UNet on the inputs of one reference case.
fn run(backend: &Backend, name: &str, cw: &Weights, uw: &Weights, case: &serde_json::Value) -> Outputs {
    let mut ccfg = ControlNetConfig::infer(cw, PREFIX).unwrap();
    ccfg.unet.heads = heads(name);
    assert_eq!(ccfg.hint_scale(), 8);
    assert_eq!(ccfg.hint_channels, 3);
    let cnet = ControlNet::new(cw, PREFIX, ccfg).unwrap();
    let mut ucfg = UnetConfig::infer(uw, UNET).unwrap();
    ucfg.heads = heads(name);
    cnet.check_fits(&ucfg).unwrap();
    let unet = Unet::new(uw, UNET, ucfg).unwrap();

    let seed = case["seed"].as_u64().unwrap();
    let s: Vec<i64> = serde_json::from_value(case["shape"].clone()).unwrap();
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    let tokens = case["tokens"].as_i64().unwrap();
    let dc = unet.config.context_dim;
    let y_dim = case["y_dim"].as_i64().unwrap();
    let det = |what: &str, len: i64, scale: f64| det_values(&format!("input.{seed}.{what}"), len as usize, scale);
    let ctx = Context::new(32768, 32768).unwrap();
    let mut g = GraphRun::new(&ctx);
    let x = g.input_f32(&[w, h, c, n], det("x", n * c * h * w, 1.0)).unwrap();
    let t = g.input_f32(&[n], serde_json::from_value(case["t"].clone()).unwrap()).unwrap();
    let context = g.input_f32(&[dc, tokens, n], det("context", n * tokens * dc, 1.0)).unwrap();
    let hint: Vec<f32> = det("hint", n * 3 * 64 * h * w, 0.5).iter().map(|v| v + 0.5).collect();
    let hint = g.input_f32(&[8 * w, 8 * h, 3, n], hint).unwrap();
    let y = (y_dim > 0).then(|| g.input_f32(&[y_dim, n], det("y", n * y_dim, 1.0)).unwrap());
    let strength = case["strength"].as_f64().unwrap() as f32;
    let res = cnet.forward(&ctx, x, hint, t, context, y, strength).unwrap();
    let out = unet.forward_with(&ctx, x, t, context, &UnetExtras { y, control: Some(res.clone()), ..Default::default() }).unwrap();
    let mut wanted = vec![out, res.middle];
    wanted.extend(res.skips.iter().copied());
    let mut got = g.compute(backend, &wanted, 32768).unwrap();
    let out = got.remove(0);
    let middle = got.remove(0);
    Outputs { out, skips: got, middle }
}

fn check(name: &str) {
    let backend = common::backend(2);
    let cw = det_weights(&keys(&format!("controlnet_{name}_tiny_keys.json")), 0.14, &backend);
    let uw = det_weights(&keys(&unet_keys(name)), 0.14, &backend);
    let r = &reference("controlnet_tiny_ref.json")[name];
    let f = |v: &serde_json::Value| -> Vec<f32> { serde_json::from_value(v.clone()).unwrap() };

    let full = &r["full"];
    let got = run(&backend, name, &cw, &uw, full);
    let want_skips: Vec<serde_json::Value> = serde_json::from_value(full["skips"].clone()).unwrap();
    assert_eq!(got.skips.len(), want_skips.len(), "one residual per skip");
    let mut worst = max_abs_err(&got.middle, &f(&full["middle"]));
    for (i, (g, w)) in got.skips.iter().zip(&want_skips).enumerate() {
        let e = max_abs_err(g, &f(w));
        assert!(e <= 1e-3, "{name}: skip residual {i}: max abs error {e}");
        worst = worst.max(e);
    }
    let e = max_abs_err(&got.out, &f(&full["out"]));
    // The control must matter, or the comparison proves nothing about it.
    assert!(full["effect"].as_f64().unwrap() > 0.1);
    eprintln!("{name}: residuals max abs error {worst}, UNet output {e}");
    assert!(worst <= 1e-3 && e <= 1e-3, "{name}: residuals {worst}, UNet output {e}");

    let batch = &r["batch"];
    let got = run(&backend, name, &cw, &uw, batch);
    let e = max_abs_err(&got.out, &f(&batch["out"]));
    eprintln!("{name}: batch of 2 at 10x6: UNet output max abs error {e}");
    assert!(e <= 1e-3, "{name}: batch of 2 at 10x6: max abs error {e}");
}

#[test]
fn sd1_controlnet_matches_diffusers() {
    check("sd1");
}

#[test]
fn sdxl_like_controlnet_with_label_emb_matches_diffusers() {
    check("xl");
}

/// Write `tensors` (name, PyTorch shape, values) as an f32 safetensors file and load
/// it the way the ControlNet loader does.
fn load_file(dir: &std::path::Path, file: &str, tensors: &[(String, Vec<usize>, Vec<f32>)], backend: &Backend) -> Result<Weights, String> {
    let path = dir.join(file);
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    io::safetensors::write(&path, tensors.iter().zip(&bytes).map(|((n, s, _), b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    let src = controlnet::standalone_source(io::open(&path).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    load_weights(backend, src.as_ref(), &[&format!("{PREFIX}.")], &TypeRules::none()).map_err(|e| e.to_string())
}

fn ldm_tensors() -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let k: BTreeMap<String, Vec<usize>> = serde_json::from_value(keys("controlnet_sd1_tiny_keys.json")).unwrap();
    k.into_iter().map(|(n, s)| (n.clone(), s.clone(), det_values(&n, s.iter().product(), 0.14))).collect()
}

#[test]
fn diffusers_and_bare_key_layouts_load_to_the_same_controlnet() {
    let backend = common::backend(2);
    let dir = tempfile::tempdir().unwrap();
    let uw = det_weights(&keys("unet_sd1_tiny_keys.json"), 0.14, &backend);
    let case = &reference("controlnet_tiny_ref.json")["sd1"]["full"];
    let reference_out = run(&backend, "sd1", &load_file(dir.path(), "ldm.safetensors", &ldm_tensors(), &backend).unwrap(), &uw, case).out;

    // A full checkpoint with a ControlNet holds other models' tensors too: left out.
    let mut with_unet = ldm_tensors();
    with_unet.push(("model.diffusion_model.out.2.bias".into(), vec![4], vec![0.5; 4]));
    let w = load_file(dir.path(), "full.safetensors", &with_unet, &backend).unwrap();
    assert!(w.names().all(|n| n.starts_with("control_model.")));

    let bare: Vec<_> = ldm_tensors().into_iter().map(|(n, s, v)| (n.strip_prefix("control_model.").unwrap().to_string(), s, v)).collect();
    let w = load_file(dir.path(), "bare.safetensors", &bare, &backend).unwrap();
    assert_eq!(run(&backend, "sd1", &w, &uw, case).out, reference_out, "bare LDM names");

    let shapes: BTreeMap<String, Vec<usize>> = serde_json::from_value(keys("controlnet_sd1_diffusers_keys.json")).unwrap();
    let names: BTreeMap<String, String> = serde_json::from_value(keys("controlnet_sd1_diffusers_names.json")).unwrap();
    let diffusers: Vec<_> = shapes.iter().map(|(n, s)| (n.clone(), s.clone(), det_values(&names[n], s.iter().product(), 0.14))).collect();
    let w = load_file(dir.path(), "diffusers.safetensors", &diffusers, &backend).unwrap();
    assert_eq!(w.names().count(), diffusers.len(), "every diffusers tensor has an LDM name");
    assert_eq!(run(&backend, "sd1", &w, &uw, case).out, reference_out, "diffusers names");
}

#[test]
fn bad_controlnets_fail_with_clear_errors() {
    let backend = common::backend(1);
    let dir = tempfile::tempdir().unwrap();

    // Not a ControlNet at all.
    let unet: Vec<_> = vec![("model.diffusion_model.out.2.bias".to_string(), vec![4], vec![0.0; 4])];
    let e = load_file(dir.path(), "unet.safetensors", &unet, &backend).err().unwrap();
    assert!(e.contains("not a ControlNet"), "{e}");

    // A missing file and a malformed one.
    assert!(io::open(&dir.path().join("missing.safetensors")).is_err());
    std::fs::write(dir.path().join("junk.safetensors"), b"\x10\0\0\0\0\0\0\0{not json}").unwrap();
    assert!(io::open(&dir.path().join("junk.safetensors")).is_err());

    // A zero convolution of the wrong width names the weight.
    let mut t = ldm_tensors();
    let z = t.iter_mut().find(|(n, ..)| n == "control_model.zero_convs.3.0.weight").unwrap();
    z.1 = vec![16, 16, 1, 1];
    z.2.truncate(256);
    let w = load_file(dir.path(), "bad_zero.safetensors", &t, &backend).unwrap();
    let mut cfg = ControlNetConfig::infer(&w, PREFIX).unwrap();
    cfg.unet.heads = Heads::Count(4);
    let e = ControlNet::new(&w, PREFIX, cfg).err().unwrap().to_string();
    assert!(e.contains("zero_convs.3.0.weight"), "{e}");

    // A missing middle-block output names it.
    let t: Vec<_> = ldm_tensors().into_iter().filter(|(n, ..)| !n.starts_with("control_model.middle_block_out.")).collect();
    let w = load_file(dir.path(), "no_mid_out.safetensors", &t, &backend).unwrap();
    let mut cfg = ControlNetConfig::infer(&w, PREFIX).unwrap();
    cfg.unet.heads = Heads::Count(4);
    let e = ControlNet::new(&w, PREFIX, cfg).err().unwrap().to_string();
    assert!(e.contains("middle_block_out.0"), "{e}");

    // An SD1 ControlNet does not fit the XL-like UNet.
    let cw = det_weights(&keys("controlnet_sd1_tiny_keys.json"), 0.14, &backend);
    let mut cfg = ControlNetConfig::infer(&cw, PREFIX).unwrap();
    cfg.unet.heads = Heads::Count(4);
    let cnet = ControlNet::new(&cw, PREFIX, cfg).unwrap();
    let uw = det_weights(&keys("unet_xl_tiny_keys.json"), 0.14, &backend);
    let e = cnet.check_fits(&UnetConfig::infer(&uw, UNET).unwrap()).err().unwrap().to_string();
    assert!(e.contains("skip widths"), "{e}");
}

#[test]
fn the_synthetic_controlnet_fits_the_tiny_checkpoint() {
    let backend = common::backend(1);
    let dir = tempfile::tempdir().unwrap();
    let cfg = sdflow_core::synth::SdConfig::tiny_sd1_f8();
    let cpath = dir.path().join("cn.safetensors");
    sdflow_core::synth::write_controlnet(&cpath, &cfg.unet, 3, 7).unwrap();
    let ckpt = dir.path().join("ckpt.safetensors");
    sdflow_core::synth::write_checkpoint(&ckpt, &cfg, DType::F32, 1, sdflow_core::synth::Format::Safetensors).unwrap();
    let cw = load_weights(&backend, controlnet::standalone_source(io::open(&cpath).unwrap()).unwrap().as_ref(), &[""], &TypeRules::none()).unwrap();
    let uw = load_weights(&backend, io::open(&ckpt).unwrap().as_ref(), &["model.diffusion_model."], &TypeRules::none()).unwrap();
    let ccfg = ControlNetConfig::infer(&cw, PREFIX).unwrap();
    assert_eq!(ccfg.hint_convs.len(), 8);
    let cnet = ControlNet::new(&cw, PREFIX, ccfg).unwrap();
    cnet.check_fits(&UnetConfig::infer(&uw, UNET).unwrap()).unwrap();
}

/// SdDenoiser::denoise_batch with controls: items with different control stacks batch
/// apart and each gets exactly what the UNet gives with the summed residuals of its
/// stack (c_in-scaled latent, sample i on hint image i mod images); an item without
/// controls is the plain prediction.
#[test]
fn the_denoiser_runs_stacked_controls_per_item() {
    use sdflow_core::models::sd::{BatchItem, ControlInput, IpSide, SdDenoiser};
use sdflow_core::models::conditioning::{Conditioning, Prediction};
    use sdflow_core::sampling::schedule::DiscreteSchedule;
    let backend = common::backend(2);
    let uw = det_weights(&keys("unet_sd1_tiny_keys.json"), 0.14, &backend);
    let c1w = det_weights(&keys("controlnet_sd1_tiny_keys.json"), 0.14, &backend);
    // A second ControlNet: the same layout, other values.
    let k2: BTreeMap<String, Vec<usize>> = serde_json::from_value(keys("controlnet_sd1_tiny_keys.json")).unwrap();
    let t2: Vec<_> = k2.into_iter().map(|(n, s)| (n.clone(), s.clone(), det_values(&format!("second.{n}"), s.iter().product(), 0.14))).collect();
    let dir = tempfile::tempdir().unwrap();
    let c2w = load_file(dir.path(), "second.safetensors", &t2, &backend).unwrap();
    fn net(w: &Weights) -> ControlNet<'_> {
        let mut cfg = ControlNetConfig::infer(w, PREFIX).unwrap();
        cfg.unet.heads = Heads::Count(4);
        ControlNet::new(w, PREFIX, cfg).unwrap()
    }
    let (n1, n2) = (net(&c1w), net(&c2w));
    let mut ucfg = UnetConfig::infer(&uw, UNET).unwrap();
    ucfg.heads = Heads::Count(4);
    let mut den = SdDenoiser::new(Unet::new(&uw, UNET, ucfg.clone()).unwrap(), DiscreteSchedule::sd(), Prediction::Epsilon);

    let (w, h, n) = (6i64, 4i64, 2usize);
    let per = (w * h * 4) as usize;
    let x = det_values("batch.x", per * n, 1.0);
    let cond = Conditioning::new(det_values("batch.cond", 48 * 5, 1.0), 48, 5).unwrap();
    let hint1: Vec<f32> = det_values("batch.hint1", (w * h * 64 * 3) as usize, 0.5).iter().map(|v| v + 0.5).collect();
    let hint2: Vec<f32> = det_values("batch.hint2", (w * h * 64 * 3) as usize * 2, 0.5).iter().map(|v| v + 0.5).collect();
    let a = [ControlInput { net: &n1, hint: &hint1, images: 1, strength: 0.8 }];
    let b = [ControlInput { net: &n1, hint: &hint1, images: 1, strength: 0.8 }, ControlInput { net: &n2, hint: &hint2, images: 2, strength: 0.5 }];
    let sigma = 3.0f32;
    let items = [BatchItem { x: &x, cond: &cond, concat: None, ip: IpSide::Cond, control: &a }, BatchItem { x: &x, cond: &cond, concat: None, ip: IpSide::Cond, control: &b }, BatchItem { x: &x, cond: &cond, concat: None, ip: IpSide::Cond, control: &[] }];
    let out = den.denoise_batch(&backend, [w, h, 4, n as i64], sigma, &items).unwrap();

    // The same by hand, one graph per item.
    let unet = Unet::new(&uw, UNET, ucfg).unwrap();
    let c_in = 1.0 / (sigma * sigma + 1.0).sqrt();
    let t = DiscreteSchedule::sd().sigma_to_t(sigma);
    let by_hand = |controls: &[(&ControlNet, Vec<f32>, f32)]| -> Vec<f32> {
        let ctx = Context::new(65536, 65536).unwrap();
        let mut g = GraphRun::new(&ctx);
        let xt = g.input_f32(&[w, h, 4, n as i64], x.iter().map(|v| v * c_in).collect()).unwrap();
        let tt = g.input_f32(&[n as i64], vec![t; n]).unwrap();
        let ct = g.input_f32(&[48, 5, n as i64], [cond.data.clone(), cond.data.clone()].concat()).unwrap();
        let mut sum: Option<sdflow_core::models::sd::unet::ControlResiduals> = None;
        for (net, hint, s) in controls {
            let ht = g.input_f32(&[8 * w, 8 * h, 3, n as i64], hint.clone()).unwrap();
            let r = net.forward(&ctx, xt, ht, tt, ct, None, *s).unwrap();
            sum = Some(match sum {
                None => r,
                Some(p) => sdflow_core::models::sd::unet::ControlResiduals { skips: p.skips.iter().zip(&r.skips).map(|(a, b)| ctx.add(*a, *b).unwrap()).collect(), middle: ctx.add(p.middle, r.middle).unwrap() },
            });
        }
        let eps = unet.forward_with(&ctx, xt, tt, ct, &UnetExtras { control: sum, ..Default::default() }).unwrap();
        let eps = g.compute(&backend, &[eps], 65536).unwrap().remove(0);
        x.iter().zip(&eps).map(|(xv, e)| xv - sigma * e).collect()
    };
    let twice = |v: &[f32]| [v, v].concat();
    let expect = [by_hand(&[(&n1, twice(&hint1), 0.8)]), by_hand(&[(&n1, twice(&hint1), 0.8), (&n2, hint2.clone(), 0.5)]), by_hand(&[])];
    for (k, (got, want)) in out.iter().zip(&expect).enumerate() {
        let e = max_abs_err(got, want);
        assert!(e <= 1e-5, "item {k}: max abs error {e}");
    }
    assert!(max_abs_err(&out[0], &out[2]) > 1e-3 && max_abs_err(&out[0], &out[1]) > 1e-3, "the controls matter");
}

/// The diffusers → LDM encoder renaming inverts the LoRA tables' LDM → diffusers one on
/// every encoder weight of the SD1 UNet, and maps SDXL's add embedding to label_emb.
#[test]
fn diffusers_encoder_names_round_trip() {
    use sdflow_core::lora::keys::{diffusers_to_ldm_encoder, ldm_to_diffusers};
    let k: BTreeMap<String, Vec<usize>> = serde_json::from_value(keys("unet_sd1_tiny_keys.json")).unwrap();
    let names: std::collections::HashSet<&str> = k.keys().map(String::as_str).collect();
    let mut n = 0;
    for name in k.keys() {
        let module = name.strip_prefix("model.diffusion_model.").unwrap().rsplit_once('.').unwrap().0;
        if !["input_blocks.", "middle_block.", "time_embed."].iter().any(|p| module.starts_with(p)) {
            continue;
        }
        let d = ldm_to_diffusers(module, 2, &names).unwrap_or_else(|| panic!("{module}"));
        assert_eq!(diffusers_to_ldm_encoder(&d, 2).as_deref(), Some(module), "{d}");
        n += 1;
    }
    assert!(n > 100, "{n} encoder weights");
    assert_eq!(diffusers_to_ldm_encoder("add_embedding.linear_2", 2).as_deref(), Some("label_emb.0.2"));
    assert_eq!(diffusers_to_ldm_encoder("up_blocks.0.resnets.0.conv1", 2), None, "no decoder in an encoder");
}
