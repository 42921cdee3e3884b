//! What a saved image carries about how it was made: ComfyUI's `prompt` (API format)
//! and `workflow` (UI format) text chunks, so dropping the PNG on ComfyUI or on our editor
//! reopens the graph, and A1111's `parameters` line, which A1111, sd.cpp and most image
//! browsers show.

use sdflow_executor::{ui, InputValue, NodeSpec, Registry, Workflow};
use serde_json::Value as Json;

/// The PNG text chunks for images a run of `wf` saves.
pub fn png_metadata(wf: &Workflow, registry: &Registry) -> Vec<(String, String)> {
    let mut out = vec![("prompt".to_string(), wf.to_api_json().to_string())];
    if let Ok(ui) = ui::workflow_to_ui(wf, registry) {
        out.push(("workflow".to_string(), ui.to_string()));
    }
    if let Some(p) = a1111_parameters(wf) {
        out.push(("parameters".to_string(), p));
    }
    out
}

fn constant<'a>(node: &'a NodeSpec, input: &str) -> Option<&'a Json> {
    match node.inputs.get(input)? {
        InputValue::Const(v) => Some(v),
        InputValue::Link { .. } => None,
    }
}

/// The node a link input points at.
fn source<'a>(wf: &'a Workflow, node: &NodeSpec, input: &str) -> Option<&'a NodeSpec> {
    match node.inputs.get(input)? {
        InputValue::Link { node, .. } => wf.nodes.get(node),
        InputValue::Const(_) => None,
    }
}

/// A1111's name for a sampler, as its infotext writes it.
fn a1111_sampler(name: &str) -> String {
    match name {
        "euler" => "Euler",
        "euler_ancestral" | "euler_a" => "Euler a",
        "heun" => "Heun",
        "dpm_2" | "dpm2" => "DPM2",
        "lms" => "LMS",
        "dpmpp_2s_ancestral" | "dpm++2s_a" => "DPM++ 2S a",
        "dpmpp_2m" | "dpm++2m" => "DPM++ 2M",
        "dpmpp_2m_sde" | "dpm++2m_sde" => "DPM++ 2M SDE",
        "lcm" => "LCM",
        "ddim" => "DDIM",
        other => other,
    }
    .to_string()
}

/// `prompt\nNegative prompt: …\nSteps: …, Sampler: …, CFG scale: …, Seed: …, Size: WxH,
/// Model: …` from the first KSampler whose prompts are plain CLIPTextEncode texts; `None`
/// for graphs without one (A1111's format has no way to say more).
pub fn a1111_parameters(wf: &Workflow) -> Option<String> {
    let (_, ks) = wf.nodes.iter().find(|(_, n)| n.class_type == "KSampler" || n.class_type == "KSamplerAdvanced")?;
    let text = |input: &str| -> Option<String> {
        let n = source(wf, ks, input)?;
        (n.class_type == "CLIPTextEncode").then(|| constant(n, "text")?.as_str().map(str::to_string))?
    };
    let positive = text("positive")?;
    let mut out = positive;
    if let Some(neg) = text("negative").filter(|t| !t.is_empty()) {
        out.push_str(&format!("\nNegative prompt: {neg}"));
    }
    let mut fields: Vec<String> = Vec::new();
    if let Some(steps) = constant(ks, "steps") {
        fields.push(format!("Steps: {steps}"));
    }
    if let Some(s) = constant(ks, "sampler_name").and_then(Json::as_str) {
        fields.push(format!("Sampler: {}", a1111_sampler(s)));
    }
    if let Some(s) = constant(ks, "scheduler").and_then(Json::as_str) {
        fields.push(format!("Schedule type: {s}"));
    }
    if let Some(cfg) = constant(ks, "cfg") {
        fields.push(format!("CFG scale: {cfg}"));
    }
    if let Some(seed) = constant(ks, "seed").or_else(|| constant(ks, "noise_seed")) {
        fields.push(format!("Seed: {seed}"));
    }
    if let Some(l) = source(wf, ks, "latent_image").filter(|n| n.class_type == "EmptyLatentImage") {
        if let (Some(w), Some(h)) = (constant(l, "width"), constant(l, "height")) {
            fields.push(format!("Size: {w}x{h}"));
        }
    }
    if let Some(m) = source(wf, ks, "model").filter(|n| n.class_type == "CheckpointLoaderSimple") {
        if let Some(name) = constant(m, "ckpt_name").and_then(Json::as_str) {
            let stem = std::path::Path::new(name).file_stem().map_or(name.to_string(), |s| s.to_string_lossy().into_owned());
            fields.push(format!("Model: {stem}"));
        }
    }
    if let Some(d) = constant(ks, "denoise").and_then(Json::as_f64).filter(|d| *d < 1.0) {
        fields.push(format!("Denoising strength: {d}"));
    }
    fields.push("Version: sdflow".to_string());
    out.push('\n');
    out.push_str(&fields.join(", "));
    Some(out)
}
