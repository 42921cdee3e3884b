//! txt2img with the weights converted at load (`--type`): f16, bf16, q8_0 and q4_0 each
//! give a finite image close to the f32 run's, the coarser the type the looser the bound.
//!
//! The tiny checkpoint's matrices have rows of 32 or 64 values, so q8_0/q4_0 (blocks of 32)
//! do quantize every linear layer; 3×3 convolution kernels have rows of 3 and keep f32
//! (sd.cpp's rule, see `TypeRules`), and 1-D tensors (norm weights) load as f32 whatever
//! the rules ask, which the last test pins down.

use sdflow_core::dtype::DType;
use sdflow_core::io::{TensorInfo, TypeRules};
use sdflow_core::models::load::load_type;
use sdflow_core::synth::{write_checkpoint, Format, SdConfig};
use sdflow_executor::{stub, CancelToken, Executor, ExecutorConfig, InputValue, NullSink, Registry, RunOptions, Workflow};
use sdflow_nodes::Runtime;
use std::sync::Arc;

/// The image (RGB8, 64×64) txt2img gives with weights loaded as `weight_type`.
fn txt2img(weight_type: Option<DType>, seed: u64) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let ckpts = dir.path().join("models/checkpoints");
    std::fs::create_dir_all(&ckpts).unwrap();
    write_checkpoint(&ckpts.join("model.safetensors"), &SdConfig::tiny_sd1_f8(), DType::F32, 7, Format::Safetensors).unwrap();
    let out = dir.path().join("output");
    let rt = Arc::new(Runtime::new(dir.path().join("models"), &out, 2, weight_type).unwrap());
    let mut reg = Registry::new();
    stub::register(&mut reg);
    sdflow_nodes::register_all(&mut reg, rt);
    let exec = Executor::new(Arc::new(reg), ExecutorConfig::default());
    let text = std::fs::read_to_string(sdflow_tests::workflows_dir().join("txt2img.json")).unwrap();
    let mut wf = Workflow::parse(&text, exec.registry()).unwrap();
    let c = |v: serde_json::Value| InputValue::Const(v);
    wf.set_input("4", "width", c(serde_json::json!(64))).unwrap();
    wf.set_input("4", "height", c(serde_json::json!(64))).unwrap();
    wf.set_input("5", "steps", c(serde_json::json!(3))).unwrap();
    // A deterministic sampler, so the difference is the weights' alone.
    wf.set_input("5", "sampler_name", c(serde_json::json!("euler"))).unwrap();
    wf.set_input("5", "seed", c(serde_json::json!(seed))).unwrap();
    let report = exec.run(&wf, &NullSink, &CancelToken::new(), &RunOptions { output_dir: Some(out.clone()), ..Default::default() }).unwrap();
    let path = out.join(report.ui_outputs["7"]["images"][0]["filename"].as_str().unwrap());
    let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap()));
    let mut r = dec.read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size()];
    let info = r.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (64, 64));
    buf.truncate(info.buffer_size());
    buf
}


fn distinct(px: &[u8]) -> usize {
    px.iter().collect::<std::collections::HashSet<_>>().len()
}

#[test]
fn converted_weights_stay_close_to_f32() {
    let reference = txt2img(None, 42);
    // A NaN or infinity anywhere in the pipeline ends as a flat (black or saturated)
    // image; random weights otherwise give a busy one.
    assert!(distinct(&reference) > 16, "the f32 image is flat");
    // The scale of "different": another seed's image.
    let (unrelated, _) = sdflow_tests::pixel_difference(&txt2img(None, 43), &reference);
    // Each type's mean pixel difference from f32 as a fraction of that. Measured here
    // (other seed: 71.2 steps): f16 0.145 (0.002), bf16 0.947 (0.013), q8_0 2.16 (0.030),
    // q4_0 18.6 (0.26, worst pixel 120: 32-value rows of random weights are q4_0's worst case).
    for (ty, max_frac) in [(DType::F16, 0.01), (DType::BF16, 0.04), (DType::Q8_0, 0.08), (DType::Q4_0, 0.45)] {
        let px = txt2img(Some(ty), 42);
        assert!(distinct(&px) > 16, "{ty}: flat image (non-finite values?)");
        let (mean, worst) = sdflow_tests::pixel_difference(&px, &reference);
        assert!(mean <= max_frac * unrelated, "{ty}: mean pixel difference {mean:.3} is over {max_frac} of another seed's {unrelated:.3} (worst {worst})");
        if ty != DType::F16 {
            assert!(mean > 0.0, "{ty}: identical to f32, so the conversion did not happen");
        }
    }
}

/// What `--type q4_0` does to the tiny checkpoint's tensors: matrices with 32-value rows
/// are quantized, 3×3 kernels (rows of 3), biases and embeddings are not.
#[test]
fn quantized_types_skip_rows_that_do_not_fill_a_block() {
    let rules = TypeRules::new(Some(DType::Q4_0), "").unwrap();
    let t = |name: &str, shape: &[usize]| rules.target(&TensorInfo::detached(name, DType::F32, shape.to_vec()));
    assert_eq!(t("model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight", &[32, 32]), DType::Q4_0);
    assert_eq!(t("model.diffusion_model.input_blocks.1.0.in_layers.2.weight", &[32, 32, 3, 3]), DType::F32);
    assert_eq!(t("model.diffusion_model.input_blocks.1.0.in_layers.2.bias", &[32]), DType::F32);
    assert_eq!(t("cond_stage_model.transformer.text_model.embeddings.token_embedding.weight", &[49408, 32]), DType::F32);
    assert_eq!(t("first_stage_model.decoder.mid.attn_1.q.weight", &[64, 48]), DType::F32, "48 is not a multiple of 32");
    // A norm's 32 weights fill a block, and the rules would quantize them; they load as
    // f32 because ggml has no element-wise multiply for quantized tensors.
    let norm = TensorInfo::detached("cond_stage_model.transformer.text_model.encoder.layers.0.layer_norm1.weight", DType::F32, vec![32]);
    assert_eq!(rules.target(&norm), DType::Q4_0);
    assert_eq!(load_type(&norm, &rules), DType::F32);
    let matrix = TensorInfo::detached("model.diffusion_model.time_embed.0.weight", DType::F32, vec![128, 32]);
    assert_eq!(load_type(&matrix, &rules), DType::Q4_0);
}
