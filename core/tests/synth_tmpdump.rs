#[test]
fn dump() {
    use sdflow_core::synth::*;
    for (n, c) in [("tiny_sd1", SdConfig::tiny_sd1()), ("tiny_sd2", SdConfig::tiny_sd2()), ("sd21", SdConfig::sd21())] {
        write_checkpoint(std::path::Path::new(&format!("/tmp/synth_{n}.safetensors")), &c, sdflow_core::dtype::DType::F16, 0, Format::Safetensors).unwrap();
    }
}
