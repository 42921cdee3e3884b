//! Circular padding (seamless tiling, sd-cli's `--circular`, `--circularx`, `--circulary`)
//! against PyTorch: a lone convolution with `padding_mode="circular"`, and the tiny SD1 UNet
//! and KL VAE of the parity tests with every convolution made circular (fixtures from
//! tests/fixtures/models/make_circular.py); the circular networks' shift equivariance on
//! the torus, the VAE's wrapped tiles, and FLUX's wrapped rotary positions.

mod common;

use common::{det_weights, keys, max_abs_err, reference};
use sdflow_core::ggml::{Backend, Circular, Context, GraphRun};
use sdflow_core::models::dit::rope;
use sdflow_core::models::nn::conv2d;
use sdflow_core::models::sd::unet::{Heads, Unet, UnetConfig};
use sdflow_core::models::vae::tiling::{layout_wrapped, run_tiled, Direction, VaeTiling};
use sdflow_core::models::vae::{Vae, VaeConfig, VaeOp};

fn floats(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

const X: Circular = Circular { x: true, y: false };
const Y: Circular = Circular { x: false, y: true };

/// `v` ([C][H][W] planes, `n` of them stacked) rolled by `dx` columns and `dy` rows,
/// wrapping (torch's `roll` over the last two dims).
fn roll(v: &[f32], w: usize, h: usize, dx: usize, dy: usize) -> Vec<f32> {
    let mut out = vec![0f32; v.len()];
    for (p, plane) in v.chunks_exact(w * h).enumerate() {
        for y in 0..h {
            for x in 0..w {
                out[p * w * h + ((y + dy) % h) * w + (x + dx) % w] = plane[y * w + x];
            }
        }
    }
    out
}

#[test]
fn pad_circular_wraps_each_axis() {
    let backend = Backend::cpu(1).unwrap();
    let (w, h) = (5usize, 3usize);
    let data: Vec<f32> = (0..w * h * 2).map(|i| i as f32).collect();
    let ctx = Context::new(64, 64).unwrap();
    let mut run = GraphRun::new(&ctx);
    let x = run.input_f32(&[w as i64, h as i64, 2, 1], data.clone()).unwrap();
    let p = ctx.pad_circular(x, [(2, 1), (1, 3), (0, 0), (0, 0)]).unwrap();
    assert_eq!(p.ne(), [8, 7, 2, 1]);
    let got = run.compute(&backend, &[p], 64).unwrap().remove(0);
    let want: Vec<f32> = (0..2)
        .flat_map(|c| (0..7).flat_map(move |y| (0..8).map(move |x| (c, y, x))))
        .map(|(c, y, x)| data[c * w * h + ((y + h - 1) % h) * w + (x + w - 2) % w])
        .collect();
    assert_eq!(got, want);
    let ctx = Context::new(64, 64).unwrap();
    let x = ctx.new_tensor(sdflow_core::ggml::GType::F32, &[5, 3, 2, 1]).unwrap();
    assert!(ctx.pad_circular(x, [(6, 0), (0, 0), (0, 0), (0, 0)]).is_err(), "more than the side");
}

#[test]
fn circular_conv_matches_torch() {
    let backend = Backend::cpu(2).unwrap();
    let r = &reference("circular_ref.json")["conv"];
    let w = det_weights(&r["keys"], 0.3, &backend);
    let x = floats(&r["x"]);
    let conv = |c: Circular, stride: i32| -> Vec<f32> {
        let ctx = Context::new(256, 256).unwrap();
        ctx.set_circular(c);
        let mut run = GraphRun::new(&ctx);
        let xt = run.input_f32(&[9, 6, 5, 2], x.clone()).unwrap();
        let y = conv2d(&ctx, &w, "conv", xt, stride, 1).unwrap();
        run.compute(&backend, &[y], 256).unwrap().remove(0)
    };
    for (c, stride, key) in [(Circular::BOTH, 1, "both_s1"), (Circular::BOTH, 2, "both_s2"), (X, 1, "x_s1"), (Y, 1, "y_s1")] {
        let err = max_abs_err(&conv(c, stride), &floats(&r[key]));
        assert!(err <= 1e-4, "{key}: max abs error {err}");
    }
    // Zero padding is something else.
    assert!(max_abs_err(&conv(Circular::NONE, 1), &floats(&r["both_s1"])) > 1e-2);
}

fn tiny_unet(backend: &Backend) -> (sdflow_core::models::Weights, UnetConfig) {
    let w = det_weights(&keys("unet_sd1_tiny_keys.json"), 0.14, backend);
    let mut cfg = UnetConfig::infer(&w, "model.diffusion_model").unwrap();
    cfg.heads = Heads::Count(4);
    (w, cfg)
}

#[test]
fn circular_unet_matches_torch_and_commutes_with_rolls() {
    let backend = Backend::cpu(2).unwrap();
    let (w, cfg) = tiny_unet(&backend);
    let unet = Unet::new(&w, "model.diffusion_model", cfg).unwrap();
    let r = &reference("circular_ref.json")["unet"];
    let dc = r["context_dim"].as_i64().unwrap();
    let forward = |c: Circular, x: Vec<f32>| -> Vec<f32> {
        let ctx = Context::new(16384, 16384).unwrap();
        ctx.set_circular(c);
        let mut run = GraphRun::new(&ctx);
        let xt = run.input_f32(&[12, 8, 4, 1], x).unwrap();
        let t = run.input_f32(&[1], floats(&r["t"])).unwrap();
        let ct = run.input_f32(&[dc, 7, 1], floats(&r["context"])).unwrap();
        let out = unet.forward(&ctx, xt, t, ct).unwrap();
        run.compute(&backend, &[out], 16384).unwrap().remove(0)
    };
    let x = floats(&r["x"]);
    let plain = forward(Circular::NONE, x.clone());
    assert!(max_abs_err(&plain, &floats(&r["out_plain"])) <= 1e-3);
    let both = forward(Circular::BOTH, x.clone());
    let err = max_abs_err(&both, &floats(&r["out_both"]));
    assert!(err <= 1e-3, "both axes: max abs error {err}");
    let err = max_abs_err(&forward(X, x.clone()), &floats(&r["out_x"]));
    assert!(err <= 1e-3, "x only: max abs error {err}");
    assert!(max_abs_err(&both, &plain) > 0.1, "circular padding changes the output");
    // On the torus the UNet commutes with shifts by its total downscale (4 here): a
    // seamless latent stays seamless.
    let rolled = forward(Circular::BOTH, roll(&x, 12, 8, 4, 4));
    let err = max_abs_err(&rolled, &roll(&both, 12, 8, 4, 4));
    assert!(err <= 1e-4, "rolled input: max abs error {err}");
}

fn tiny_vae(backend: &Backend) -> sdflow_core::models::Weights {
    det_weights(&keys("vae_tiny_keys.json"), 0.14, backend)
}

#[test]
fn circular_vae_matches_torch_whole_and_in_tiles() {
    let backend = Backend::cpu(2).unwrap();
    let w = tiny_vae(&backend);
    let cfg = VaeConfig::infer(&w, "first_stage_model").unwrap();
    let mut vae = Vae::new(&w, "first_stage_model", cfg).unwrap();
    let r = &reference("circular_ref.json")["vae"];
    let latent = floats(&r["latent"]);
    let whole = VaeTiling { retry_on_alloc_failure: false, ..VaeTiling::default() };
    let mut decode = |c: Circular, z: &[f32], tiling: &VaeTiling| -> Vec<f32> {
        vae.circular = c;
        vae.run(&backend, VaeOp::Decode, z, 6, 8, tiling).unwrap().0
    };
    let plain = decode(Circular::NONE, &latent, &whole);
    assert!(max_abs_err(&plain, &floats(&r["dec_plain"])) <= 1e-3);
    let both = decode(Circular::BOTH, &latent, &whole);
    for (c, key) in [(Circular::BOTH, "dec_both"), (X, "dec_x"), (Y, "dec_y")] {
        let err = max_abs_err(&decode(c, &latent, &whole), &floats(&r[key]));
        assert!(err <= 1e-3, "{key}: max abs error {err}");
    }
    assert!(max_abs_err(&both, &plain) > 0.1, "the circular decode differs");
    // Rolling the latent by one pixel rolls the image by the VAE's factor (4).
    let rolled = decode(Circular::BOTH, &roll(&latent, 6, 8, 1, 3), &whole);
    let err = max_abs_err(&rolled, &roll(&both, 24, 32, 4, 12));
    assert!(err <= 1e-4, "rolled latent: max abs error {err}");

    // Tiles that span the latent: the convolutions wrap, as whole.
    let spanning = VaeTiling { enabled: true, tile_size: (8, 8), ..VaeTiling::default() };
    let err = max_abs_err(&decode(Circular::BOTH, &latent, &spanning), &both);
    assert!(err <= 1e-4, "one spanning tile: max abs error {err}");
    // Smaller tiles wrap around the latent instead (sd.cpp's circular tiling: tiles of 4
    // every 2 latent pixels, the last ones running past the edge): every tile has
    // neighbours on both sides, so a shift by the tile step shifts the image.
    let small = VaeTiling { enabled: true, tile_size: (4, 4), ..VaeTiling::default() };
    let tiled = decode(Circular::BOTH, &latent, &small);
    assert!(max_abs_err(&tiled, &both) > 1e-4, "tiles see less than the whole latent");
    let err = max_abs_err(&decode(Circular::BOTH, &roll(&latent, 6, 8, 2, 2), &small), &roll(&tiled, 24, 32, 8, 8));
    assert!(err <= 1e-4, "rolled latent, wrapped tiles: max abs error {err}");
    assert!(max_abs_err(&decode(Circular::NONE, &latent, &small), &tiled) > 1e-3);

    // Encoding: sd.cpp's circular encoder also wraps the downsamplers' one-pixel pad.
    vae.circular = Circular::BOTH;
    let ctx = Context::new(8192, 8192).unwrap();
    ctx.set_circular(Circular::BOTH);
    let mut run = GraphRun::new(&ctx);
    let x = run.input_f32(&[24, 32, 3, 1], floats(&r["image"])).unwrap();
    let m = vae.encode_moments(&ctx, x).unwrap();
    let got = run.compute(&backend, &[m], 8192).unwrap().remove(0);
    let err = max_abs_err(&got, &floats(&r["moments_both"]));
    assert!(err <= 1e-3, "circular encode: max abs error {err}");
}

#[test]
fn wrapped_tiles_blend_to_one() {
    // sd.cpp's circular layout: ⌊40/20⌋ = 2 tiles of 32, 20 apart, 12 overlapping on each
    // side through the edge.
    let l = layout_wrapped(40, 40, 32, 32, 0.5, (true, false));
    assert_eq!((l.tile_w, l.overlap_x), (32, 12));
    let xs: Vec<usize> = l.tiles.iter().filter(|t| t.y == 0).map(|t| t.x).collect();
    assert_eq!(xs, vec![0, 20]);
    assert_eq!((l.wrap_x, l.wrap_y, l.tiles.len()), (true, false, 4), "y is laid out as usual: 2 rows of tiles");
    for (w, h, t, wrap) in [(40, 40, 32, (true, true)), (40, 24, 32, (true, false)), (64, 48, 16, (true, true)), (30, 45, 15, (false, true))] {
        let l = layout_wrapped(w, h, t, t, 0.5, wrap);
        let ones = vec![1f32; w * h];
        for scale in [1, 2] {
            let out = run_tiled(&ones, w, h, 1, 1, scale, Direction::Upscale, &l, |tile, tw, th| {
                Ok::<_, ()>((0..tw * th * scale * scale).map(|i| tile[(i / (scale * tw) / scale) * tw + (i % (scale * tw)) / scale]).collect())
            })
            .unwrap();
            let worst = out.iter().map(|v| (v - 1.0).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-5, "{w}x{h} tile {t} wrap {wrap:?} x{scale}: weights off by {worst}");
        }
    }
}

#[test]
fn wrapped_rotary_positions_are_periodic() {
    let axes = [4, 8, 8];
    let theta = 10_000.0;
    // Columns 0..6 of one row, wrapping at 6 columns (and 3 rows).
    let ids: Vec<Vec<f32>> = (0..8).map(|c| vec![0.0, 1.0, c as f32]).collect();
    let wraps = vec![vec![0, 3, 6]; ids.len()];
    let (cos, sin) = rope::cos_sin(&ids, &wraps, &axes, theta).unwrap();
    let half = 10;
    let tok = |v: &[f32], i: usize| v[i * half..(i + 1) * half].to_vec();
    assert!(max_abs_err(&tok(&cos, 6), &tok(&cos, 0)) < 1e-5 && max_abs_err(&tok(&sin, 7), &tok(&sin, 1)) < 1e-5, "column 6 is column 0 again");
    // sd.cpp's `Rope::rope` with axis_wrap_dims, in f32: frequencies rounded to whole
    // turns per period.
    for (k, &dim) in axes.iter().enumerate() {
        let first: usize = axes[..k].iter().sum::<usize>() / 2;
        for j in 0..dim / 2 {
            let scale = (2 * j) as f32 / dim as f32;
            let omega = 1.0 / 10_000f32.powf(scale);
            let period = wraps[0][k];
            for (i, id) in ids.iter().enumerate() {
                let angle = if period > 0 {
                    let tau = std::f32::consts::TAU;
                    id[k] * tau * (omega * period as f32 / tau).round() / period as f32
                } else {
                    id[k] * omega
                };
                let (c, s) = (cos[i * half + first + j], sin[i * half + first + j]);
                assert!((c - angle.cos()).abs() < 1e-4 && (s - angle.sin()).abs() < 1e-4, "axis {k} pair {j} token {i}");
            }
        }
    }
    // Unwrapped positions are not periodic.
    let (plain, _) = rope::cos_sin(&ids, &[], &axes, theta).unwrap();
    assert!(max_abs_err(&tok(&plain, 6), &tok(&plain, 0)) > 1e-2);
    assert!(rope::cos_sin(&ids, &wraps[..3], &axes, theta).is_err(), "one wrap row per token");
}

#[test]
fn circular_flux_wraps_its_positions() {
    use sdflow_core::models::conditioning::Conditioning;
    use sdflow_core::models::flux::{Flux, FluxConfig, FluxDenoiser, FluxItem};

    let r = reference("flux_tiny_ref.json");
    let backend = Backend::cpu(2).unwrap();
    let w = det_weights(&r["dev"]["keys"], 0.2, &backend);
    let mut cfg = FluxConfig::infer(&w, "").unwrap();
    cfg.axes = serde_json::from_value(r["axes"].clone()).unwrap();
    let [_, c, h, wd]: [usize; 4] = serde_json::from_value(r["latent_shape"].clone()).unwrap();
    let lt = r["txt_len"].as_u64().unwrap() as i64;
    let txt = floats(&r["txt"]);
    let y = floats(&r["y"]);
    let mut cond = Conditioning::new(txt[..txt.len() / 2].to_vec(), 32, lt).unwrap();
    cond.pooled = Some(y[..y.len() / 2].to_vec());
    let x: Vec<f32> = (0..c * h * wd).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
    let shape = [wd as i64, h as i64, c as i64, 1];
    let mut den = FluxDenoiser::new(Flux::new(&w, "", cfg).unwrap());
    let mut at = |circular: Circular| {
        den.circular = circular;
        den.denoise_batch(&backend, shape, 0.7, &[FluxItem { x: &x, cond: &cond, concat: None }]).unwrap().remove(0)
    };
    let (plain, both, xonly) = (at(Circular::NONE), at(Circular::BOTH), at(X));
    assert!(max_abs_err(&plain, &both) > 1e-3 && max_abs_err(&xonly, &both) > 1e-3 && max_abs_err(&xonly, &plain) > 1e-3);
    assert_eq!(at(Circular::NONE), plain, "off again is the plain model");
}
