//! Wan's video latent nodes: EmptyHunyuanLatentVideo's shape (ComfyUI's
//! `[B, 16, (length − 1)/4 + 1, H/8, W/8]`, frames inside the channels here) and
//! TrimVideoLatent cutting leading frames off each channel.

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
