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
/// `animated` in the ui), read back with the `mp4` crate's reader and LoadVideo's decoder:
/// every frame there, at fps·1000 ticks a frame, close to what went in; odd sizes and other
/// formats are refused by name.
#[test]
fn save_video_writes_an_h264_mp4_of_its_frames() {
    use sdflow_nodes::values::Image;
    let env = env(1);
    let c = |v: serde_json::Value| InputData::Const(v);
    let (w, h, n) = (48usize, 32usize, 4usize);
    let data = moving_frames(w, h, n);
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
    for i in 1..=n as u32 {
        let sample = reader.read_sample(id, i).unwrap().unwrap();
        assert_eq!((sample.start_time, sample.is_sync || i > 1), ((i as u64 - 1) * 1000, true));
    }
    let read = sdflow_nodes::video::decode::decode_video_file(&std::fs::read(env.dir.path().join("out/video/fox_00001_.mp4")).unwrap()).unwrap();
    assert_eq!((read.width, read.height, read.frames, read.fps), (w, h, n, 12.5));
    let decoded: Vec<&[u8]> = read.rgb.chunks(w * h * 3).collect();
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

/// SaveWEBM: the frames as a WebM of VP9 at the CRF, read back (the WebM's blocks, and
/// LoadVideo's decoder: libvpx's): every frame, at 1000/fps ms apart, close to what went in, a lower CRF
/// closer; bad CRFs and unknown codecs are refused by name.
#[test]
fn save_webm_writes_vp9_that_decodes_to_its_frames() {
    use sdflow_nodes::values::Image;
    use sdflow_nodes::video::encode::webm_frames;
    let env = env(1);
    let c = |v: serde_json::Value| InputData::Const(v);
    let (w, h, n) = (48usize, 32usize, 5usize);
    let data = moving_frames(w, h, n);
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
        let video = sdflow_nodes::video::decode::decode_video_file(&file).unwrap();
        assert_eq!((video.width, video.height, video.frames, video.fps), (w, h, n, 20.0));
        let decoded: Vec<&[u8]> = video.rgb.chunks(w * h * 3).collect();
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
    assert!(save(70.0, "vp9").unwrap_err().to_string().contains("crf"));
    assert!(save(30.0, "h265").unwrap_err().to_string().contains("h265"));
}

/// SaveWEBM's av1: a WebM of 10-bit AV1 (as ComfyUI's SVT-AV1 writes it) that another
/// program's reader — ffmpeg, which .ci/run installs — decodes to every frame, close to
/// what went in, a lower CRF closer; our LoadVideo refuses it by name (it reads VP8/VP9).
#[test]
fn save_webm_writes_av1_that_ffmpeg_decodes() {
    use sdflow_nodes::values::Image;
    use sdflow_nodes::video::encode::webm_frames;
    use std::process::Command;
    let env = env(1);
    let c = |v: serde_json::Value| InputData::Const(v);
    let (w, h, n) = (48usize, 32usize, 5usize);
    let data = moving_frames(w, h, n);
    let save = |crf: f64| {
        env.run(
            "SaveWEBM",
            vec![
                ("images", InputData::Value(Value::new(IoType::IMAGE, Image { data: data.clone(), n, height: h, width: w, channels: 3 }))),
                ("filename_prefix", c(json!("clips/av1"))),
                ("codec", c(json!("av1"))),
                ("fps", c(json!(20.0))),
                ("crf", c(json!(crf))),
            ],
        )
    };
    let mut errors = Vec::new();
    for (k, crf) in [8.0, 56.0].into_iter().enumerate() {
        let ui = save(crf).unwrap().ui.unwrap();
        assert_eq!(ui["images"][0]["filename"], json!(format!("av1_{:05}_.webm", k + 1)));
        let path = env.dir.path().join("out/clips").join(ui["images"][0]["filename"].as_str().unwrap());
        let webm = webm_frames(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!((webm.doc_type.as_str(), webm.codec.as_str(), webm.blocks.len()), ("webm", "V_AV1", n));
        assert!(webm.blocks[0].1, "the first frame is a keyframe");
        for (f, (t, _, _)) in webm.blocks.iter().enumerate() {
            assert_eq!(*t, 50 * f as i64, "frame {f}'s time");
        }
        let probe = Command::new("ffprobe")
            .args(["-v", "error", "-select_streams", "v:0", "-show_entries", "stream=codec_name,pix_fmt,width,height,r_frame_rate", "-of", "csv=p=0"])
            .arg(&path)
            .output()
            .expect("ffprobe (ffmpeg) runs: .ci/run installs it");
        assert!(probe.status.success(), "{}", String::from_utf8_lossy(&probe.stderr));
        assert_eq!(String::from_utf8_lossy(&probe.stdout).trim(), "av1,48,32,yuv420p10le,20/1");
        let out = Command::new("ffmpeg").args(["-v", "error", "-i"]).arg(&path).args(["-f", "rawvideo", "-pix_fmt", "rgb24", "-"]).output().expect("ffmpeg runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.stdout.len(), n * w * h * 3, "every frame decodes");
        let mut worst = 0.0f32;
        for (f, got) in out.stdout.chunks(w * h * 3).enumerate() {
            let want = &data[f * w * h * 3..(f + 1) * w * h * 3];
            let err = got.iter().zip(want).map(|(&a, &b)| (a as f32 - b * 255.0).abs()).sum::<f32>() / want.len() as f32;
            worst = worst.max(err);
        }
        assert!(worst < 10.0, "crf {crf}: frames {worst} off on average");
        errors.push(worst);
        let input = env.dir.path().join("input");
        std::fs::create_dir_all(&input).unwrap();
        std::fs::copy(&path, input.join("av1.webm")).unwrap();
        let e = env.run("LoadVideo", vec![("file", c(json!("av1.webm")))]).unwrap_err().to_string();
        assert!(e.contains("V_AV1"), "{e}");
    }
    assert!(errors[0] < errors[1], "a lower crf is closer: {errors:?}");
    assert!(save(64.0).unwrap_err().to_string().contains("crf"));
}

/// LoadVideo and GetVideoComponents: SaveVideo's MP4 and SaveWEBM's WebM from the input
/// folder back to frames, their rate and no sound; files that are not videos are refused by
/// name.
#[test]
fn load_video_reads_what_the_writers_wrote() {
    use sdflow_nodes::values::Image;
    use sdflow_nodes::video::Audio;
    let env = env(1);
    let c = |v: serde_json::Value| InputData::Const(v);
    let (w, h, n) = (32usize, 32usize, 3usize);
    let data: Vec<f32> = (0..n * w * h * 3).map(|i| ((i / 3) % w) as f32 / w as f32).collect();
    let images = || InputData::Value(Value::new(IoType::IMAGE, Image { data: data.clone(), n, height: h, width: w, channels: 3 }));
    let video = env.run("CreateVideo", vec![("images", images()), ("fps", c(json!(16.0)))]).unwrap().values.remove(0);
    env.run("SaveVideo", vec![("video", InputData::Value(video)), ("filename_prefix", c(json!("clip"))), ("format", c(json!("mp4"))), ("codec", c(json!("h264")))]).unwrap();
    env.run("SaveWEBM", vec![("images", images()), ("filename_prefix", c(json!("vp9"))), ("codec", c(json!("vp9"))), ("fps", c(json!(8.0))), ("crf", c(json!(20.0)))]).unwrap();
    let input = env.dir.path().join("input");
    std::fs::create_dir_all(&input).unwrap();
    for (from, to) in [("clip_00001_.mp4", "a.mp4"), ("vp9_00001_.webm", "b.webm")] {
        std::fs::copy(env.dir.path().join("out").join(from), input.join(to)).unwrap();
    }
    std::fs::write(input.join("c.mp4"), b"not a video at all").unwrap();
    for (file, fps) in [("a.mp4", 16.0), ("b.webm", 8.0)] {
        let v = env.run("LoadVideo", vec![("file", c(json!(file)))]).unwrap().values.remove(0);
        let parts = env.run("GetVideoComponents", vec![("video", InputData::Value(v))]).unwrap().values;
        let frames = parts[0].downcast_ref::<Image>().unwrap();
        assert_eq!((frames.n, frames.width, frames.height), (n, w, h), "{file}");
        assert!(parts[1].downcast_ref::<Audio>().unwrap().waveform.is_empty());
        assert_eq!((*parts[2].downcast_ref::<f64>().unwrap(), *parts[3].downcast_ref::<i64>().unwrap()), (fps, 8), "{file}");
        let err = frames.data.iter().zip(&data).map(|(a, b)| (a - b).abs()).sum::<f32>() / data.len() as f32;
        assert!(err < 0.05, "{file}: frames {err} off on average");
    }
    let e = env.run("LoadVideo", vec![("file", c(json!("c.mp4")))]).unwrap_err().to_string();
    assert!(e.contains("c.mp4") && e.contains("not an MP4 or WebM"), "{e}");
}

/// `n` smooth RGB frames `w`×`h` whose blue ramp moves 3 pixels a frame: video coders keep
/// them close, and each frame differs from the last.
fn moving_frames(w: usize, h: usize, n: usize) -> Vec<f32> {
    (0..n).flat_map(|f| (0..h).flat_map(move |y| (0..w).flat_map(move |x| [x as f32 / w as f32, y as f32 / h as f32, ((x + 3 * f) % 48) as f32 / 48.0]))).collect()
}
