//! TAESD files in `models/vae_approx` (ComfyUI's folder), loaded as one set of weights
//! for VAELoader's `taesd`, `taesdxl`, `taesd3`, `taef1` and `taef2` choices and for
//! sampling previews (each latent family its own: TAESD for SD1.x/2.x, TAESDXL, TAESD3,
//! TAEF1 for FLUX, Chroma and Z-Image, TAEF2 for FLUX.2).
//!
//! Two ways to ship it are found: ComfyUI's pair `taesd_encoder.*` + `taesd_decoder.*`
//! (madebyollin's files, bare keys; combined under `taesd_encoder.` / `taesd_decoder.`
//! as ComfyUI does), and sd.cpp's single `--taesd` file in the diffusers layout
//! (`encoder.layers.*` / `decoder.layers.*`), looked for as `taesd.*`.

use crate::err;
use crate::runtime::Runtime;
use sdflow_core::ggml::{Circular, Context, GraphRun};
use sdflow_core::placement::Module;
use sdflow_core::io::{self, TypeRules};
use sdflow_core::models::load::load_weights_prefixed;
use sdflow_core::models::vae::taesd::{Half, Taesd};
use sdflow_core::models::Weights;
use sdflow_core::residency::{Device, WeightHandle, WeightKey};
use sdflow_executor::NodeError;
use std::path::{Path, PathBuf};

/// The tiny autoencoders, one per latent family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaeKind {
    Sd,
    Sdxl,
    Sd3,
    F1,
    /// FLUX.2's: 32 channels; it reads the model's latent (the normalised 2×2 patches) cut
    /// back into its 32 channels, as sd.cpp's TAESD does for FLUX.2.
    F2,
}

impl TaeKind {
    pub const ALL: [TaeKind; 5] = [TaeKind::Sd, TaeKind::Sdxl, TaeKind::Sd3, TaeKind::F1, TaeKind::F2];

    /// VAELoader's entry and the file stem in `models/vae_approx`.
    pub fn name(self) -> &'static str {
        match self {
            TaeKind::Sd => "taesd",
            TaeKind::Sdxl => "taesdxl",
            TaeKind::Sd3 => "taesd3",
            TaeKind::F1 => "taef1",
            TaeKind::F2 => "taef2",
        }
    }

    pub fn from_name(name: &str) -> Option<TaeKind> {
        TaeKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The one whose latents `family`'s diffusion model makes.
    pub fn for_family(family: sdflow_core::detect::ModelFamily) -> Option<TaeKind> {
        use sdflow_core::detect::ModelFamily as F;
        match family {
            F::Sd1 | F::Sd2 { .. } => Some(TaeKind::Sd),
            F::Sdxl | F::SdxlRefiner => Some(TaeKind::Sdxl),
            F::Sd3 => Some(TaeKind::Sd3),
            F::Flux | F::Chroma | F::ZImage => Some(TaeKind::F1),
            F::Flux2 => Some(TaeKind::F2),
            // Qwen-Image has no TAESD.
            F::QwenImage | F::Wan | F::Unknown => None,
        }
    }

    /// ComfyUI's `vae_scale` and `vae_shift` (VAELoader's `load_taesd`): the tiny
    /// autoencoder works on latents at the diffusion model's scale, `(z − shift)·scale`;
    /// the VAE nodes pass the VAE's own.
    pub fn scale_shift(self) -> (f32, f32) {
        match self {
            TaeKind::Sd => (0.18215, 0.0),
            TaeKind::Sdxl => (0.13025, 0.0),
            TaeKind::Sd3 => (1.5305, 0.0609),
            TaeKind::F1 => (0.3611, 0.1159),
            // The model's latent is already normalised.
            TaeKind::F2 => (1.0, 0.0),
        }
    }

    /// Latent pixels per TAESD latent pixel: FLUX.2's latent packs 2×2 of TAEF2's.
    pub fn patch(self) -> usize {
        if self == TaeKind::F2 { 2 } else { 1 }
    }
}

/// A model latent as the tiny decoder reads it: FLUX.2's [128][h][w] patches as TAEF2's
/// [32][2h][2w]; other kinds' as they are.
pub(crate) fn unpack(kind: TaeKind, z: &[f32], w: usize, h: usize) -> Result<Vec<f32>, NodeError> {
    match kind {
        TaeKind::F2 => sdflow_core::models::flux2::latent::unpatched(z, h, w).map_err(err),
        _ => Ok(z.to_vec()),
    }
}

/// The inverse of [`unpack`]: the tiny encoder's output at its `w`×`h` as the model's latent.
pub(crate) fn pack(kind: TaeKind, z: &[f32], w: usize, h: usize) -> Result<Vec<f32>, NodeError> {
    match kind {
        TaeKind::F2 => sdflow_core::models::flux2::latent::patched(z, h / 2, w / 2).map_err(err),
        _ => Ok(z.to_vec()),
    }
}

/// A TAESD graph is ~20 layers of a few ops each.
const GRAPH: usize = 2048;

/// The files of one TAESD: each with the prefix its tensors get.
#[derive(Clone, Debug, PartialEq)]
pub struct TaesdFiles {
    pub parts: Vec<(PathBuf, &'static str)>,
}

impl TaesdFiles {
    /// The key prefixes a half may sit under in the loaded weights, most specific first.
    fn prefixes(half: Half) -> [&'static str; 2] {
        match half {
            Half::Encoder => ["encoder.layers.", "taesd_encoder."],
            Half::Decoder => ["decoder.layers.", "taesd_decoder."],
        }
    }
}

fn vae_approx_dir(rt: &Runtime) -> PathBuf {
    rt.models_dir.join("vae_approx")
}

/// `{stem}.{model extension}` in `dir`, if there is one.
fn find_file(dir: &Path, stem: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.file_stem().and_then(|s| s.to_str()) == Some(stem))
        .filter(|p| p.extension().and_then(|x| x.to_str()).is_some_and(|x| ["safetensors", "pth", "pt", "ckpt", "gguf", "bin"].contains(&x.to_ascii_lowercase().as_str())))
        .collect();
    found.sort();
    found.into_iter().next()
}

/// `kind` with both halves (VAELoader's entry), if `vae_approx` has it: ComfyUI's pair
/// `NAME_encoder.*` + `NAME_decoder.*`, or one `NAME.*` file (sd-cli's `--taesd`).
pub fn find_full(rt: &Runtime, kind: TaeKind) -> Option<TaesdFiles> {
    let (dir, name) = (vae_approx_dir(rt), kind.name());
    let (enc, dec) = (find_file(&dir, &format!("{name}_encoder")), find_file(&dir, &format!("{name}_decoder")));
    match (enc, dec) {
        (Some(e), Some(d)) => Some(TaesdFiles { parts: vec![(e, "taesd_encoder."), (d, "taesd_decoder.")] }),
        _ => find_file(&dir, name).map(|f| TaesdFiles { parts: vec![(f, "")] }),
    }
}

/// `kind`'s decoder alone (what previews need), if `vae_approx` has one.
pub fn find_decoder(rt: &Runtime, kind: TaeKind) -> Option<TaesdFiles> {
    let (dir, name) = (vae_approx_dir(rt), kind.name());
    match find_file(&dir, &format!("{name}_decoder")) {
        Some(d) => Some(TaesdFiles { parts: vec![(d, "taesd_decoder.")] }),
        None => find_file(&dir, name).map(|f| TaesdFiles { parts: vec![(f, "")] }),
    }
}

/// The residency handle of `files`' weights; nothing is read until it is pinned.
pub fn weights_handle(rt: &Runtime, files: &TaesdFiles) -> Result<WeightHandle<Weights>, NodeError> {
    // The prefixes given to each file are part of what is loaded: a key per layout.
    let tag: String = files.parts.iter().map(|(_, p)| *p).collect::<Vec<_>>().join("+");
    let key = WeightKey::new(files.parts.iter().map(|(p, _)| p), format!("taesd:{tag}"), rt.weight_type, Device::Cpu).map_err(err)?;
    let (parts, wt) = (files.parts.clone(), rt.weight_type);
    rt.weights(Module::Vae, key, move |memory| {
        let sources = parts.iter().map(|(p, _)| io::open(p)).collect::<Result<Vec<_>, _>>()?;
        let named: Vec<_> = sources.iter().zip(&parts).map(|(s, (_, prefix))| (s.as_ref(), *prefix)).collect();
        Ok(load_weights_prefixed(memory, &named, &TypeRules::new(wt, "")?)?)
    })
}

/// The `half` of a TAESD in `w`, wherever its layout put it.
pub fn model(w: &Weights, half: Half) -> Result<Taesd<'_>, NodeError> {
    let mut first_err = None;
    for prefix in TaesdFiles::prefixes(half) {
        match Taesd::load(w, prefix, half) {
            Ok(m) => return Ok(m),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    Err(NodeError::msg(format!("TAESD: {}", first_err.expect("two prefixes tried"))))
}

/// One sample through `model` on the compute backend: `input` is planar [C][H][W] with
/// sides `w`×`h` (latents at the diffusion model's scale to decode, images in [0, 1] to
/// encode). Returns the planar output.
pub fn run(rt: &Runtime, model: &Taesd<'_>, half: Half, input: &[f32], w: usize, h: usize) -> Result<Vec<f32>, NodeError> {
    run_circular(rt, model, half, input, w, h, Circular::NONE)
}

/// [`run`] with the convolutions padding circularly on the axes of `circular`.
pub fn run_circular(rt: &Runtime, model: &Taesd<'_>, half: Half, input: &[f32], w: usize, h: usize, circular: Circular) -> Result<Vec<f32>, NodeError> {
    let c = match half {
        Half::Decoder => model.config.latent_channels,
        Half::Encoder => model.config.image_channels,
    };
    if input.len() != w * h * c as usize {
        return Err(NodeError::msg(format!("TAESD: {} values for a {w}x{h}x{c} input", input.len())));
    }
    rt.with_backend(Module::Vae, |b| {
        let g = Context::new(GRAPH, GRAPH).map_err(err)?;
        g.set_circular(circular);
        let mut run = GraphRun::new(&g);
        let x = run.input_f32(&[w as i64, h as i64, c, 1], input.to_vec()).map_err(err)?;
        let out = match half {
            Half::Decoder => model.decode(&g, x),
            Half::Encoder => model.encode(&g, x),
        }
        .map_err(err)?;
        Ok(run.compute(b, &[out], GRAPH).map_err(err)?.remove(0))
    })
}

/// A tiny autoencoder standing in for the KL VAE (VAELoader's `taesd`, …), in the KL VAE's
/// conventions: unscaled latents and images in [-1, 1], converted around TAESD's as
/// ComfyUI's `TAESD.decode` / `encode` do with the kind's `vae_scale` and `vae_shift`.
pub struct TaesdVae<'w> {
    pub kind: TaeKind,
    pub decoder: Taesd<'w>,
    /// sd.cpp's single `--taesd` file may hold the decoder only.
    pub encoder: Option<Taesd<'w>>,
    /// Seamless tiling: the axes its convolutions pad circularly on.
    pub circular: Circular,
}

impl<'w> TaesdVae<'w> {
    pub fn new(w: &'w Weights, kind: TaeKind) -> Result<Self, NodeError> {
        let decoder = model(w, Half::Decoder)?;
        let has_encoder = TaesdFiles::prefixes(Half::Encoder).iter().any(|p| w.names().any(|n| n.starts_with(p)));
        let encoder = if has_encoder { Some(model(w, Half::Encoder)?) } else { None };
        if let Some(e) = &encoder {
            if e.config.latent_channels != decoder.config.latent_channels {
                return Err(NodeError::msg(format!("TAESD: the encoder makes {} latent channels, the decoder takes {}", e.config.latent_channels, decoder.config.latent_channels)));
            }
        }
        Ok(TaesdVae { kind, decoder, encoder, circular: Circular::NONE })
    }

    pub fn downscale(&self) -> i64 {
        self.decoder.config.downscale() * self.kind.patch() as i64
    }

    pub fn z_channels(&self) -> i64 {
        self.decoder.config.latent_channels * (self.kind.patch() * self.kind.patch()) as i64
    }

    /// One sample, planar, sides `w`×`h`: unscaled latents → image in [-1, 1], or image in
    /// [-1, 1] → unscaled latents.
    pub fn run(&self, rt: &Runtime, op: sdflow_core::models::vae::VaeOp, input: &[f32], w: usize, h: usize) -> Result<Vec<f32>, NodeError> {
        use sdflow_core::models::vae::VaeOp;
        match op {
            VaeOp::Decode => {
                let (scale, shift) = self.kind.scale_shift();
                let p = self.kind.patch();
                let z: Vec<f32> = unpack(self.kind, input, w, h)?.iter().map(|v| (v - shift) * scale).collect();
                Ok(run_circular(rt, &self.decoder, Half::Decoder, &z, w * p, h * p, self.circular)?.into_iter().map(|v| v * 2.0 - 1.0).collect())
            }
            VaeOp::EncodeMean => {
                let enc = self.encoder.as_ref().ok_or_else(|| NodeError::msg("this TAESD has no encoder (taesd_encoder.* is missing from models/vae_approx)"))?;
                let x: Vec<f32> = input.iter().map(|v| (v + 1.0) * 0.5).collect();
                let (scale, shift) = self.kind.scale_shift();
                let z: Vec<f32> = run_circular(rt, enc, Half::Encoder, &x, w, h, self.circular)?.into_iter().map(|v| v / scale + shift).collect();
                let f = enc.config.downscale() as usize;
                pack(self.kind, &z, w / f, h / f)
            }
        }
    }
}
