//! Which model weight a LoRA key patches.
//!
//! As ComfyUI does (`model_lora_keys_unet`, `model_lora_keys_clip`), the table is built
//! from the model's own weight names: each LDM checkpoint key yields every spelling a
//! trainer may have used for it — kohya's `lora_unet_` / `lora_te_` names over LDM or
//! diffusers module paths, diffusers/PEFT dotted paths (`unet.…`, `text_encoder.…`), and
//! the plain checkpoint path. The DiT families (FLUX, Chroma, SD3) take ComfyUI's
//! spellings too: kohya's `lora_unet_double_blocks_0_img_attn_qkv`, diffusers/PEFT
//! `transformer.transformer_blocks.0.attn.to_q` (one third of a fused q/k/v each; what
//! ai-toolkit and diffusers write), SimpleTuner's `lora_transformer_…`, and
//! `diffusion_model.…`, with or without the checkpoint's `model.diffusion_model.`.

use std::collections::{HashMap, HashSet};

/// Where a LoRA key lands: a weight of the model, or a block of its rows (a q/k/v
/// projection inside OpenCLIP's fused `in_proj_weight`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The model weight's full name (e.g. `model.diffusion_model.out.2.weight`).
    pub weight: String,
    /// `(first row, rows)` along the outermost (PyTorch dim 0) axis; `None`: all of it.
    pub rows: Option<(usize, usize)>,
}

/// LoRA module name (without `.lora_up.weight` etc.) → the weight it patches.
#[derive(Debug, Default, Clone)]
pub struct KeyMap {
    map: HashMap<String, Target>,
}

const UNET: &str = "model.diffusion_model.";

impl KeyMap {
    /// The table for a model holding the weights `names`, with the dim-0 length of each
    /// weight given by `rows` (needed to split fused projections).
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>, rows: impl Fn(&str) -> usize) -> Self {
        let names: Vec<&str> = names.into_iter().collect();
        let set: HashSet<&str> = names.iter().copied().collect();
        let mut km = KeyMap::default();
        let nrb = unet_res_blocks(&set);
        // The DiTs' width, which splits their fused projections.
        let hidden = names.iter().find(|n| n.strip_prefix(UNET).unwrap_or(n) == "img_in.weight" || n.strip_prefix(UNET).unwrap_or(n) == "x_embedder.proj.weight").map(|n| rows(n));
        for &name in &names {
            if let (Some(d), Some(base)) = (hidden, name.strip_suffix(".weight")) {
                let k = base.strip_prefix(UNET).unwrap_or(base);
                if is_dit_module(k) {
                    km.add_dit(k, name, d, rows(name));
                    if base.starts_with(UNET) {
                        km.add(base, Target { weight: name.to_string(), rows: None });
                    }
                    continue;
                }
            }
            let Some(base) = name.strip_suffix(".weight") else {
                if let Some(b) = name.strip_suffix(".in_proj_weight") {
                    km.open_clip_qkv(name, b, rows(name));
                }
                continue;
            };
            let whole = |w: &str| Target { weight: w.to_string(), rows: None };
            km.add(base, whole(name));
            if let Some(k) = base.strip_prefix(UNET) {
                km.add(&format!("diffusion_model.{k}"), whole(name));
                km.add(&format!("lora_unet_{}", k.replace('.', "_")), whole(name));
                if let Some(d) = nrb.and_then(|n| ldm_to_diffusers(k, n, &set)) {
                    km.add(&format!("lora_unet_{}", d.replace('.', "_")), whole(name));
                    km.add(&format!("lycoris_{}", d.replace('.', "_")), whole(name));
                    // Old diffusers attention processors name `to_q` as `processor.to_q`
                    // and `to_out.0` as `to_out`; PEFT keeps the module path.
                    let mut proc = d.replace(".to_", ".processor.to_");
                    if let Some(p) = proc.strip_suffix(".to_out.0") {
                        proc = format!("{p}.to_out");
                    }
                    for p in ["", "unet.", "base_model.model."] {
                        km.add(&format!("{p}{d}"), whole(name));
                        km.add(&format!("{p}{proc}"), whole(name));
                    }
                }
            } else if let Some(i) = base.find("text_model.") {
                // Hugging Face CLIP (SD1's text encoder, also under a standalone file).
                let k = &base[i + "text_model.".len()..];
                km.add_te(k, whole(name), second_encoder(name));
            } else if let Some((layer, module)) = open_clip_layer(base) {
                let hf = match module {
                    "attn.out_proj" => "self_attn.out_proj",
                    "mlp.c_fc" => "mlp.fc1",
                    "mlp.c_proj" => "mlp.fc2",
                    _ => continue,
                };
                km.add_te(&format!("encoder.layers.{layer}.{hf}"), whole(name), second_encoder(name));
            }
        }
        km
    }

    /// The target of a LoRA module name.
    pub fn get(&self, lora_key: &str) -> Option<&Target> {
        self.map.get(lora_key)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn add(&mut self, key: &str, t: Target) {
        self.map.entry(key.to_string()).or_insert(t);
    }

    /// A DiT module at checkpoint path `k` (weight `name`, `rows` long, the model `d`
    /// wide) under every spelling ComfyUI reads.
    fn add_dit(&mut self, k: &str, name: &str, d: usize, rows: usize) {
        let whole = Target { weight: name.to_string(), rows: None };
        for key in [k.to_string(), format!("diffusion_model.{k}"), format!("lora_unet_{}", k.replace('.', "_"))] {
            self.add(&key, whole.clone());
        }
        for (path, part) in dit_diffusers(k, d, rows) {
            let t = Target { weight: name.to_string(), rows: part };
            for p in ["transformer.", "", "base_model.model."] {
                self.add(&format!("{p}{path}"), t.clone());
            }
            self.add(&format!("lora_transformer_{}", path.replace('.', "_")), t);
        }
    }

    /// A text-encoder module at `k` (Hugging Face path below `text_model.`); `second`:
    /// it belongs to SDXL's second encoder (OpenCLIP-G), which trainers call `te2` /
    /// `text_encoder_2`.
    fn add_te(&mut self, k: &str, t: Target, second: bool) {
        let flat = k.replace('.', "_");
        let (kohya, dotted): (&[&str], &[&str]) = if second {
            (&["lora_te2_text_model_"], &["text_encoder_2.text_model.", "te2.text_model."])
        } else {
            (&["lora_te_text_model_", "lora_te1_text_model_"], &["text_encoder.text_model.", "te.text_model.", "te1.text_model.", "text_model."])
        };
        for p in kohya {
            self.add(&format!("{p}{flat}"), t.clone());
        }
        for p in dotted {
            self.add(&format!("{p}{k}"), t.clone());
        }
    }

    /// OpenCLIP's fused q/k/v: Hugging Face-named LoRAs (what SD2 trainers write) patch
    /// one third of the rows each.
    fn open_clip_qkv(&mut self, name: &str, base: &str, rows: usize) {
        let Some((layer, "attn")) = open_clip_layer(base) else { return };
        if rows == 0 || !rows.is_multiple_of(3) {
            return;
        }
        let d = rows / 3;
        for (i, p) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
            let t = Target { weight: name.to_string(), rows: Some((i * d, d)) };
            self.add_te(&format!("encoder.layers.{layer}.self_attn.{p}"), t, second_encoder(name));
        }
    }
}

/// Whether a checkpoint path (without `model.diffusion_model.`) is a FLUX / Chroma / SD3
/// module.
fn is_dit_module(k: &str) -> bool {
    const ROOTS: [&str; 16] = [
        "double_blocks.", "single_blocks.", "joint_blocks.", "img_in", "txt_in", "time_in.", "vector_in.", "guidance_in.", "final_layer.",
        "distilled_guidance_layer.", "x_embedder.", "context_embedder", "t_embedder.", "y_embedder.", "pos_embed", "context_refiner",
    ];
    ROOTS.iter().any(|r| k.starts_with(r))
}

/// The diffusers module paths (below `transformer.`) of a FLUX / Chroma / SD3 checkpoint
/// module `k`, `rows` long in a model `d` wide, each with the rows it covers of the
/// checkpoint's (fused q/k/v and FLUX's `linear1` split; diffusers' `norm_out` and SD3's
/// last `norm1_context`, whose halves swap, have no row range and are left out).
fn dit_diffusers(k: &str, d: usize, rows: usize) -> Vec<(String, Option<(usize, usize)>)> {
    let one = |p: String| vec![(p, None)];
    let qkv = |p: &str, names: [&str; 3]| -> Vec<(String, Option<(usize, usize)>)> {
        if rows != 3 * d {
            return Vec::new();
        }
        names.iter().enumerate().map(|(i, n)| (format!("{p}{n}"), Some((i * d, d)))).collect()
    };
    let (block, rest) = match k.split_once('.').and_then(|(b, r)| r.split_once('.').map(|(i, m)| (b, i, m))) {
        Some((b, i, m)) if i.parse::<usize>().is_ok() => ((b, i), m),
        _ => (("", ""), k),
    };
    match block {
        ("double_blocks", i) => {
            let p = format!("transformer_blocks.{i}.");
            match rest {
                "img_attn.qkv" => qkv(&p, ["attn.to_q", "attn.to_k", "attn.to_v"]),
                "txt_attn.qkv" => qkv(&p, ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"]),
                "img_attn.proj" => one(format!("{p}attn.to_out.0")),
                "txt_attn.proj" => one(format!("{p}attn.to_add_out")),
                "img_mlp.0" => one(format!("{p}ff.net.0.proj")),
                "img_mlp.2" => one(format!("{p}ff.net.2")),
                "txt_mlp.0" => one(format!("{p}ff_context.net.0.proj")),
                "txt_mlp.2" => one(format!("{p}ff_context.net.2")),
                "img_mod.lin" => one(format!("{p}norm1.linear")),
                "txt_mod.lin" => one(format!("{p}norm1_context.linear")),
                _ => Vec::new(),
            }
        }
        ("single_blocks", i) => {
            let p = format!("single_transformer_blocks.{i}.");
            match rest {
                "linear1" if rows > 3 * d => {
                    let mut v: Vec<_> = ["attn.to_q", "attn.to_k", "attn.to_v"].iter().enumerate().map(|(j, n)| (format!("{p}{n}"), Some((j * d, d)))).collect();
                    v.push((format!("{p}proj_mlp"), Some((3 * d, rows - 3 * d))));
                    v
                }
                "linear2" => one(format!("{p}proj_out")),
                "modulation.lin" => one(format!("{p}norm.linear")),
                _ => Vec::new(),
            }
        }
        ("joint_blocks", i) => {
            let p = format!("transformer_blocks.{i}.");
            match rest {
                "x_block.attn.qkv" => qkv(&p, ["attn.to_q", "attn.to_k", "attn.to_v"]),
                "x_block.attn2.qkv" => qkv(&p, ["attn2.to_q", "attn2.to_k", "attn2.to_v"]),
                "context_block.attn.qkv" => qkv(&p, ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"]),
                "x_block.attn.proj" => one(format!("{p}attn.to_out.0")),
                "x_block.attn2.proj" => one(format!("{p}attn2.to_out.0")),
                "context_block.attn.proj" => one(format!("{p}attn.to_add_out")),
                "x_block.mlp.fc1" => one(format!("{p}ff.net.0.proj")),
                "x_block.mlp.fc2" => one(format!("{p}ff.net.2")),
                "context_block.mlp.fc1" => one(format!("{p}ff_context.net.0.proj")),
                "context_block.mlp.fc2" => one(format!("{p}ff_context.net.2")),
                "x_block.adaLN_modulation.1" => one(format!("{p}norm1.linear")),
                "context_block.adaLN_modulation.1" if rows == 6 * d => one(format!("{p}norm1_context.linear")),
                _ => Vec::new(),
            }
        }
        _ => match k {
            "img_in" => one("x_embedder".into()),
            "txt_in" | "context_embedder" => one("context_embedder".into()),
            "time_in.in_layer" | "t_embedder.mlp.0" => one("time_text_embed.timestep_embedder.linear_1".into()),
            "time_in.out_layer" | "t_embedder.mlp.2" => one("time_text_embed.timestep_embedder.linear_2".into()),
            "guidance_in.in_layer" => one("time_text_embed.guidance_embedder.linear_1".into()),
            "guidance_in.out_layer" => one("time_text_embed.guidance_embedder.linear_2".into()),
            "vector_in.in_layer" | "y_embedder.mlp.0" => one("time_text_embed.text_embedder.linear_1".into()),
            "vector_in.out_layer" | "y_embedder.mlp.2" => one("time_text_embed.text_embedder.linear_2".into()),
            "x_embedder.proj" => one("pos_embed.proj".into()),
            "final_layer.linear" => one("proj_out".into()),
            _ => Vec::new(),
        },
    }
}

/// Whether a checkpoint weight belongs to SDXL's second text encoder.
fn second_encoder(name: &str) -> bool {
    name.starts_with("conditioner.embedders.1.")
}

/// `(layer, module)` of an OpenCLIP text transformer path
/// (`….transformer.resblocks.3.mlp.c_fc` → `(3, "mlp.c_fc")`).
fn open_clip_layer(base: &str) -> Option<(usize, &str)> {
    let i = base.find("transformer.resblocks.")?;
    let rest = &base[i + "transformer.resblocks.".len()..];
    let (n, module) = rest.split_once('.')?;
    Some((n.parse().ok()?, module))
}

/// Res blocks per UNet level: the first downsampler sits right after them.
fn unet_res_blocks(names: &HashSet<&str>) -> Option<usize> {
    (2..64).find(|i| names.contains(format!("{UNET}input_blocks.{i}.0.op.weight").as_str())).map(|i| i - 1)
}

/// A res block's LDM module paths and their diffusers names.
const RESNET: [(&str, &str); 6] = [
    ("in_layers.0", "norm1"),
    ("in_layers.2", "conv1"),
    ("emb_layers.1", "time_emb_proj"),
    ("out_layers.0", "norm2"),
    ("out_layers.3", "conv2"),
    ("skip_connection", "conv_shortcut"),
];

fn resnet(rest: &str) -> Option<&'static str> {
    RESNET.iter().find(|(l, _)| *l == rest).map(|(_, d)| *d)
}

/// The LDM path of a diffusers encoder module path (below `unet.`, or of a
/// `ControlNetModel`): conv_in, the time and add (SDXL label) embeddings, down and mid
/// blocks, with `nrb` res blocks per level. The inverse of [`ldm_to_diffusers`] there.
pub fn diffusers_to_ldm_encoder(k: &str, nrb: usize) -> Option<String> {
    let fixed = match k {
        "time_embedding.linear_1" => Some("time_embed.0"),
        "time_embedding.linear_2" => Some("time_embed.2"),
        "add_embedding.linear_1" => Some("label_emb.0.0"),
        "add_embedding.linear_2" => Some("label_emb.0.2"),
        "conv_in" => Some("input_blocks.0.0"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let parts: Vec<&str> = k.splitn(5, '.').collect();
    let idx = |s: &str| s.parse::<usize>().ok();
    let ldm_resnet = |r: &str| RESNET.iter().find(|(_, d)| *d == r).map(|(l, _)| *l);
    let per = nrb + 1;
    match parts.as_slice() {
        ["down_blocks", level, "resnets", r, rest] if idx(r)? < nrb => Some(format!("input_blocks.{}.0.{}", idx(level)? * per + idx(r)? + 1, ldm_resnet(rest)?)),
        ["down_blocks", level, "attentions", r, rest] if idx(r)? < nrb => Some(format!("input_blocks.{}.1.{rest}", idx(level)? * per + idx(r)? + 1)),
        ["down_blocks", level, "downsamplers", "0", "conv"] => Some(format!("input_blocks.{}.0.op", (idx(level)? + 1) * per)),
        ["mid_block", "resnets", j, rest] if idx(j)? < 2 => Some(format!("middle_block.{}.{}", 2 * idx(j)?, ldm_resnet(rest)?)),
        ["mid_block", "attentions", "0", a, rest] => Some(format!("middle_block.1.{a}.{rest}")),
        ["mid_block", "attentions", "0", a] => Some(format!("middle_block.1.{a}")),
        _ => None,
    }
}

/// The LDM path of a diffusers `UNet2DConditionModel` module path (below `unet.` in a
/// pipeline folder), with `nrb` res blocks per down level; `up_attn(level)` tells whether
/// an up level has attentions (its upsampler then sits third, not second, in the LDM
/// output block). The inverse of [`ldm_to_diffusers`].
pub fn diffusers_to_ldm_unet(k: &str, nrb: usize, up_attn: impl Fn(usize) -> bool) -> Option<String> {
    match k {
        "conv_norm_out" => return Some("out.0".into()),
        "conv_out" => return Some("out.2".into()),
        _ => {}
    }
    let parts: Vec<&str> = k.splitn(5, '.').collect();
    let idx = |s: &str| s.parse::<usize>().ok();
    let per = nrb + 1;
    match parts.as_slice() {
        ["up_blocks", level, "resnets", r, rest] if idx(r)? < per => {
            let ldm = RESNET.iter().find(|(_, d)| d == rest).map(|(l, _)| *l)?;
            Some(format!("output_blocks.{}.0.{ldm}", idx(level)? * per + idx(r)?))
        }
        ["up_blocks", level, "attentions", r, rest] if idx(r)? < per => Some(format!("output_blocks.{}.1.{rest}", idx(level)? * per + idx(r)?)),
        ["up_blocks", level, "upsamplers", "0", "conv"] => {
            let level = idx(level)?;
            Some(format!("output_blocks.{}.{}.conv", level * per + nrb, if up_attn(level) { 2 } else { 1 }))
        }
        ["up_blocks", ..] => None,
        _ => diffusers_to_ldm_encoder(k, nrb),
    }
}

/// The diffusers `UNet2DConditionModel` path of an LDM UNet module path (below
/// `diffusion_model.`), for SD1.x/2.x UNets with `nrb` res blocks per level: the
/// inverse of diffusers' `convert_ldm_unet_checkpoint`.
pub fn ldm_to_diffusers(k: &str, nrb: usize, names: &HashSet<&str>) -> Option<String> {
    let fixed = match k {
        "time_embed.0" => Some("time_embedding.linear_1"),
        "time_embed.2" => Some("time_embedding.linear_2"),
        "input_blocks.0.0" => Some("conv_in"),
        "out.0" => Some("conv_norm_out"),
        "out.2" => Some("conv_out"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let mut parts = k.splitn(4, '.');
    let block = parts.next()?;
    let per = nrb + 1;
    if block == "middle_block" {
        let j: usize = parts.next()?.parse().ok()?;
        let rest = parts.collect::<Vec<_>>().join(".");
        return match j {
            0 | 2 => Some(format!("mid_block.resnets.{}.{}", j / 2, resnet(&rest)?)),
            1 => Some(format!("mid_block.attentions.0.{rest}")),
            _ => None,
        };
    }
    let i: usize = parts.next()?.parse().ok()?;
    let j: usize = parts.next()?.parse().ok()?;
    let rest = parts.next()?;
    match block {
        "input_blocks" if i >= 1 => {
            let (level, r) = ((i - 1) / per, (i - 1) % per);
            match (r == nrb, j) {
                (true, 0) if rest == "op" => Some(format!("down_blocks.{level}.downsamplers.0.conv")),
                (false, 0) => Some(format!("down_blocks.{level}.resnets.{r}.{}", resnet(rest)?)),
                (false, 1) => Some(format!("down_blocks.{level}.attentions.{r}.{rest}")),
                _ => None,
            }
        }
        "output_blocks" => {
            let (level, r) = (i / per, i % per);
            let upsampler = rest == "conv" && names.contains(format!("{UNET}output_blocks.{i}.{j}.conv.weight").as_str());
            match j {
                0 => Some(format!("up_blocks.{level}.resnets.{r}.{}", resnet(rest)?)),
                1 | 2 if upsampler => Some(format!("up_blocks.{level}.upsamplers.0.conv")),
                1 => Some(format!("up_blocks.{level}.attentions.{r}.{rest}")),
                _ => None,
            }
        }
        _ => None,
    }
}
