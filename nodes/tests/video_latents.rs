//! Wan's video latent nodes: EmptyHunyuanLatentVideo's shape (ComfyUI's
//! `[B, 16, (length − 1)/4 + 1, H/8, W/8]`, frames inside the channels here) and
//! TrimVideoLatent cutting leading frames off each channel; and the video writers
//! (SaveAnimatedWEBP, SaveVideoSdCpp) on their own.

use sdflow_executor::{InputData, IoType, Value};
use sdflow_nodes::values::Latent;
use serde_json::json;

mod common;
use common::env;

#[test]
fn empty_video_latent_has_the_latent_frames() {
    let env = env(1);
    let c = |v: serde_json::Value| InputData::Const(v);
    for (length, frames) in [(1, 1), (4, 1), (5, 2), (25, 7), (33, 9)] {
        let out = env.run("EmptyHunyuanLatentVideo", vec![("width", c(json!(64))), ("height", c(json!(32))), ("length", c(json!(length))), ("batch_size", c(json!(2)))]).unwrap();
        let l = out.values[0].downcast_ref::<Latent>().unwrap();
        assert_eq!((l.shape, l.frames), ([8, 4, 16 * frames, 2], frames as usize), "length {length}");
        assert!(l.samples.iter().all(|&v| v == 0.0));
    }
    assert!(env.run("EmptyHunyuanLatentVideo", vec![("width", c(json!(64))), ("height", c(json!(32))), ("length", c(json!(0))), ("batch_size", c(json!(1)))]).is_err());
}

#[test]
fn trim_drops_leading_frames_of_every_channel() {
    let env = env(1);
    // 2 samples × 3 channels × 4 frames of 2×1 planes, each value its (sample, channel,
    // frame, pixel) index.
    let (n, ch, t, plane) = (2usize, 3usize, 4usize, 2usize);
    let samples: Vec<f32> = (0..n * ch * t * plane).map(|i| i as f32).collect();
    let mut l = Latent::new(samples.clone(), [2, 1, (ch * t) as i64, n as i64]);
    l.frames = t;
    let input = || InputData::Value(Value::new(IoType::LATENT, l.clone()));
    let out = env.run("TrimVideoLatent", vec![("samples", input()), ("trim_amount", InputData::Const(json!(1)))]).unwrap();
    let got = out.values[0].downcast_ref::<Latent>().unwrap();
    assert_eq!((got.shape, got.frames), ([2, 1, (ch * 3) as i64, 2], 3));
    let want: Vec<f32> = (0..n * ch).flat_map(|k| (1..t).flat_map(move |f| (0..plane).map(move |p| ((k * t + f) * plane + p) as f32))).collect();
    assert_eq!(got.samples, want);
    // Nothing trimmed: the latent as it was; everything trimmed: an error.
    let same = env.run("TrimVideoLatent", vec![("samples", input()), ("trim_amount", InputData::Const(json!(0)))]).unwrap();
    assert_eq!(same.values[0].downcast_ref::<Latent>().unwrap().samples, samples);
    assert!(env.run("TrimVideoLatent", vec![("samples", input()), ("trim_amount", InputData::Const(json!(4)))]).is_err());
}

/// The video writers: an animated WebP and sd-cli's AVI land in the output folder under
/// ComfyUI's numbered names with `animated` in the ui, one frame is not animated, and bad
/// inputs are refused by name.
#[test]
fn video_writers_name_their_files_and_refuse_bad_inputs() {
    use sdflow_nodes::values::Image;
    let env = env(1);
    let c = |v: serde_json::Value| InputData::Const(v);
    let frames = |n: usize| InputData::Value(Value::new(IoType::IMAGE, Image { data: (0..n * 16 * 16 * 3).map(|i| (i % 7) as f32 / 7.0).collect(), n, height: 16, width: 16, channels: 3 }));
    let webp = |n: usize, fps: f64| env.run("SaveAnimatedWEBP", vec![("images", frames(n)), ("filename_prefix", c(json!("clips/fox"))), ("fps", c(json!(fps))), ("lossless", c(json!(true))), ("quality", c(json!(80))), ("method", c(json!("default")))]);
    let ui = webp(3, 6.0).unwrap().ui.unwrap();
    assert_eq!(ui["images"][0], json!({"filename": "fox_00001_.webp", "subfolder": "clips", "type": "output"}));
    assert_eq!(ui["animated"], json!([true]));
    assert!(env.dir.path().join("out/clips/fox_00001_.webp").exists());
    let ui = webp(1, 6.0).unwrap().ui.unwrap();
    assert_eq!((ui["images"][0]["filename"].as_str(), ui.get("animated")), (Some("fox_00002_.webp"), None));
    assert!(webp(2, 0.0).unwrap_err().to_string().contains("fps"));
    let avi = |format: &str, fps: i64| env.run("SaveVideoSdCpp", vec![("images", frames(5)), ("filename_prefix", c(json!("out"))), ("format", c(json!(format))), ("fps", c(json!(fps)))]);
    let ui = avi("avi", 16).unwrap().ui.unwrap();
    let bytes = std::fs::read(env.dir.path().join("out").join(ui["images"][0]["filename"].as_str().unwrap())).unwrap();
    assert_eq!((&bytes[0..4], &bytes[8..12]), (&b"RIFF"[..], &b"AVI "[..]));
    assert_eq!(bytes.windows(4).filter(|w| *w == b"00dc").count(), 2 * 5, "five frames, each in the stream and the index");
    assert!(avi("gif", 16).unwrap_err().to_string().contains("gif"));
    assert!(avi("avi", 0).unwrap_err().to_string().contains("fps"));
}

/// CreateVideo + SaveVideo: the frames as an MP4 of H.264 (ComfyUI's `_NNNNN_.mp4` name,
/// `animated` in the ui), read back with the `mp4` crate's reader and OpenH264's decoder:
/// every frame there, at fps·1000 ticks a frame, close to what went in; odd sizes and other
/// formats are refused by name.
#[test]
fn save_video_writes_an_h264_mp4_of_its_frames() {
    use sdflow_nodes::values::Image;
    let env = env(1);
    let c = |v: serde_json::Value| InputData::Const(v);
    // Smooth frames that move: H.264 keeps them close.
    let (w, h, n) = (48usize, 32usize, 4usize);
    let data: Vec<f32> = (0..n).flat_map(|f| (0..h).flat_map(move |y| (0..w).flat_map(move |x| [x as f32 / w as f32, y as f32 / h as f32, ((x + 3 * f) % 48) as f32 / 48.0]))).collect();
    let image = |w: usize, h: usize, data: Vec<f32>| InputData::Value(Value::new(IoType::IMAGE, Image { data, n, height: h, width: w, channels: 3 }));
    let video = env.run("CreateVideo", vec![("images", image(w, h, data.clone())), ("fps", c(json!(12.5)))]).unwrap().values.remove(0);
    let save = |video: Value, format: &str| env.run("SaveVideo", vec![("video", InputData::Value(video)), ("filename_prefix", c(json!("video/fox"))), ("format", c(json!(format))), ("codec", c(json!("auto")))]);
    let ui = save(video.clone(), "auto").unwrap().ui.unwrap();
    assert_eq!(ui["images"][0], json!({"filename": "fox_00001_.mp4", "subfolder": "video", "type": "output"}));
    assert_eq!(ui["animated"], json!([true]));
    let bytes = std::fs::read(env.dir.path().join("out/video/fox_00001_.mp4")).unwrap();
    let size = bytes.len() as u64;
    let mut reader = mp4::Mp4Reader::read_header(std::io::Cursor::new(bytes), size).unwrap();
    let (&id, track) = reader.tracks().iter().next().unwrap();
    assert_eq!((track.width(), track.height(), track.timescale(), track.sample_count()), (w as u16, h as u16, 12_500, n as u32));
    let mut annex_b = Vec::new();
    for nal in [track.sequence_parameter_set().unwrap().to_vec(), track.picture_parameter_set().unwrap().to_vec()] {
        annex_b.extend_from_slice(&[0, 0, 0, 1]);
        annex_b.extend_from_slice(&nal);
    }
    let mut decoder = openh264::decoder::Decoder::new().unwrap();
    let mut decoded = Vec::new();
    for i in 1..=n as u32 {
        let sample = reader.read_sample(id, i).unwrap().unwrap();
        assert_eq!((sample.start_time, sample.is_sync || i > 1), ((i as u64 - 1) * 1000, true));
        // Length-prefixed NAL units back to Annex-B for the decoder.
        let mut at = 0;
        let b = &sample.bytes;
        while at + 4 <= b.len() {
            let len = u32::from_be_bytes(b[at..at + 4].try_into().unwrap()) as usize;
            annex_b.extend_from_slice(&[0, 0, 0, 1]);
            annex_b.extend_from_slice(&b[at + 4..at + 4 + len]);
            at += 4 + len;
        }
        if let Some(yuv) = decoder.decode(&annex_b).unwrap() {
            let mut rgb = vec![0u8; w * h * 3];
            yuv.write_rgb8(&mut rgb);
            decoded.push(rgb);
        }
        annex_b.clear();
    }
    assert_eq!(decoded.len(), n);
    for (f, rgb) in decoded.iter().enumerate() {
        let want = &data[f * w * h * 3..(f + 1) * w * h * 3];
        let err = rgb.iter().zip(want).map(|(&a, &b)| (a as f32 - b * 255.0).abs()).sum::<f32>() / want.len() as f32;
        assert!(err < 8.0, "frame {f}: {err} off on average");
    }
    // Odd sizes (H.264's 4:2:0) and formats other than auto/mp4 are refused by name.
    let odd = env.run("CreateVideo", vec![("images", image(w - 1, h, vec![0.5; n * (w - 1) * h * 3])), ("fps", c(json!(8.0)))]).unwrap().values.remove(0);
    assert!(save(odd, "mp4").unwrap_err().to_string().contains("even"));
    assert!(save(video, "webm").unwrap_err().to_string().contains("format"));
    assert!(env.run("CreateVideo", vec![("images", image(w, h, data)), ("fps", c(json!(0.5)))]).unwrap_err().to_string().contains("fps"));
}

/// SaveWEBM: the frames as a WebM of VP9 at the CRF, read back (the WebM's blocks, libvpx's
/// VP9 decoder): every frame, at 1000/fps ms apart, close to what went in, a lower CRF
/// closer; av1 and bad CRFs are refused by name.
#[test]
fn save_webm_writes_vp9_that_decodes_to_its_frames() {
    use sdflow_nodes::values::Image;
    use sdflow_nodes::video::encode::webm_frames;
    let env = env(1);
    let c = |v: serde_json::Value| InputData::Const(v);
    let (w, h, n) = (48usize, 32usize, 5usize);
    let data: Vec<f32> = (0..n).flat_map(|f| (0..h).flat_map(move |y| (0..w).flat_map(move |x| [x as f32 / w as f32, y as f32 / h as f32, ((x + 3 * f) % 48) as f32 / 48.0]))).collect();
    let save = |crf: f64, codec: &str| {
        env.run(
            "SaveWEBM",
            vec![
                ("images", InputData::Value(Value::new(IoType::IMAGE, Image { data: data.clone(), n, height: h, width: w, channels: 3 }))),
                ("filename_prefix", c(json!("clips/vp9"))),
                ("codec", c(json!(codec))),
                ("fps", c(json!(20.0))),
                ("crf", c(json!(crf))),
            ],
        )
    };
    let mut errors = Vec::new();
    for (k, crf) in [10.0, 50.0].into_iter().enumerate() {
        let ui = save(crf, "vp9").unwrap().ui.unwrap();
        assert_eq!(ui["images"][0]["filename"], json!(format!("vp9_{:05}_.webm", k + 1)));
        assert_eq!(ui["animated"], json!([true]));
        let file = std::fs::read(env.dir.path().join("out/clips").join(ui["images"][0]["filename"].as_str().unwrap())).unwrap();
        let webm = webm_frames(&file).unwrap();
        assert_eq!((webm.doc_type.as_str(), webm.codec.as_str(), webm.blocks.len()), ("webm", "V_VP9", n));
        assert!(webm.blocks[0].1, "the first frame is a keyframe");
        let decoded = decode_vp9(&webm.blocks.iter().map(|b| b.2.clone()).collect::<Vec<_>>(), w, h);
        assert_eq!(decoded.len(), n);
        let mut worst = 0.0f32;
        for (f, (t, _, _)) in webm.blocks.iter().enumerate() {
            assert_eq!(*t, 50 * f as i64, "frame {f}'s time");
            let want = &data[f * w * h * 3..(f + 1) * w * h * 3];
            let err = decoded[f].iter().zip(want).map(|(&a, &b)| (a as f32 - b * 255.0).abs()).sum::<f32>() / want.len() as f32;
            worst = worst.max(err);
        }
        assert!(worst < 10.0, "crf {crf}: frames {worst} off on average");
        errors.push(worst);
    }
    assert!(errors[0] < errors[1], "a lower crf is closer: {errors:?}");
    assert!(save(30.0, "av1").unwrap_err().to_string().contains("av1"));
    assert!(save(70.0, "vp9").unwrap_err().to_string().contains("crf"));
}

/// VP9 frames through libvpx's decoder, each as RGB (BT.601 limited range).
fn decode_vp9(frames: &[Vec<u8>], w: usize, h: usize) -> Vec<Vec<u8>> {
    use vpx_sys::*;
    let mut out = Vec::new();
    // SAFETY: the decoder context is initialised before use and destroyed after; the image
    // pointers libvpx returns stay valid until the next decode call.
    unsafe {
        let mut ctx: vpx_codec_ctx_t = std::mem::zeroed();
        assert_eq!(vpx_codec_dec_init_ver(&mut ctx, vpx_codec_vp9_dx(), std::ptr::null(), 0, VPX_DECODER_ABI_VERSION as i32), vpx_codec_err_t::VPX_CODEC_OK);
        for f in frames {
            assert_eq!(vpx_codec_decode(&mut ctx, f.as_ptr(), f.len() as u32, std::ptr::null_mut(), 0), vpx_codec_err_t::VPX_CODEC_OK);
            let mut iter: vpx_codec_iter_t = std::ptr::null();
            loop {
                let img = vpx_codec_get_frame(&mut ctx, &mut iter);
                if img.is_null() {
                    break;
                }
                let img = &*img;
                assert_eq!((img.d_w as usize, img.d_h as usize), (w, h));
                let plane = |p: usize, x: usize, y: usize| *img.planes[p].add(y * img.stride[p] as usize + x) as f32;
                let mut rgb = Vec::with_capacity(w * h * 3);
                for y in 0..h {
                    for x in 0..w {
                        let (yy, u, v) = (plane(0, x, y) - 16.0, plane(1, x / 2, y / 2) - 128.0, plane(2, x / 2, y / 2) - 128.0);
                        for c in [1.164 * yy + 1.596 * v, 1.164 * yy - 0.392 * u - 0.813 * v, 1.164 * yy + 2.017 * u] {
                            rgb.push(c.round().clamp(0.0, 255.0) as u8);
                        }
                    }
                }
                out.push(rgb);
            }
        }
        vpx_codec_destroy(&mut ctx);
    }
    out
}
