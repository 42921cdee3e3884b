//! Seamless tiling: the nodes of the "ComfyUI-seamless-tiling" pack (spinagon), under its
//! names and inputs so its workflows run, with stable-diffusion.cpp's semantics for sd-cli's
//! `--circular`, `--circularx` and `--circulary`.
//!
//! - SeamlessTile: a MODEL whose convolutions pad circularly (the UNet and the ControlNets
//!   it runs with; FLUX and Chroma wrap their rotary positions around instead, as sd.cpp
//!   does — the pack's PyTorch patch reaches their `Conv2d` layers only).
//! - MakeCircularVAE: a VAE that pads circularly, encoding and decoding.
//! - CircularVAEDecode: VAE Decode with a circular VAE.
//! - OffsetImage: an image rolled by a fraction of its size, to look at the seam.
//!
//! `tiling` picks the axes: `enable` both, `x_only` the width, `y_only` the height,
//! `disable` none. The pack's `copy_model` / `copy_vae` choose whether PyTorch patches the
//! upstream object itself; sdflow's values are never mutated, so both choices give a patched
//! copy and leave the input as it was.

use crate::image::decode_latent;
use crate::runtime::Runtime;
use crate::values::{Circular, Image, Latent, ModelRef, VaeRef};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(SeamlessTile));
    registry.register(Arc::new(MakeCircularVae));
    registry.register(Arc::new(CircularVaeDecode { rt: rt.clone() }));
    registry.register(Arc::new(OffsetImage));
}

/// The pack's `tiling` choices, in its order (the first is the default).
pub const TILING: [&str; 4] = ["enable", "x_only", "y_only", "disable"];

/// The axes a `tiling` choice makes circular.
pub fn tiling_axes(tiling: &str) -> Result<Circular, NodeError> {
    Ok(match tiling {
        "enable" => Circular::BOTH,
        "x_only" => Circular::new(true, false),
        "y_only" => Circular::new(false, true),
        "disable" => Circular::NONE,
        other => return Err(NodeError::msg(format!("tiling `{other}` is not one of enable, x_only, y_only, disable"))),
    })
}

fn tiling_input() -> InputSpec {
    InputSpec::combo("tiling", TILING).tooltip("Which axes wrap around: enable (both), x_only (left-right), y_only (top-bottom), disable (none).")
}

const COPY: [&str; 2] = ["Make a copy", "Modify in place"];

fn copy_input(name: &str) -> InputSpec {
    InputSpec::combo(name, COPY).tooltip("Accepted for the pack's workflows: sdflow always returns a patched copy and leaves the input unchanged.")
}

/// The pack's `copy_model` / `copy_vae` choices, checked.
fn check_copy(inputs: &Inputs, name: &str) -> Result<(), NodeError> {
    if inputs.contains(name) {
        let v = inputs.string(name)?;
        if !COPY.contains(&v) {
            return Err(NodeError::msg(format!("{name} `{v}` is not one of {COPY:?}")));
        }
    }
    Ok(())
}

/// "Seamless Tile": the MODEL with circular padding on the chosen axes (sd-cli's
/// `--circular` on the diffusion model).
struct SeamlessTile;

impl Node for SeamlessTile {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("SeamlessTile")
            .display_name("Seamless Tile")
            .category("conditioning")
            .description("Makes the model's images tile seamlessly: every convolution of a UNet (and of its ControlNets) pads circularly on the chosen axes; FLUX and Chroma wrap their rotary positions around (sd.cpp's --circular). Decode with a circular VAE too (MakeCircularVAE or CircularVAEDecode).")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(tiling_input())
            .input(copy_input("copy_model"))
            .output("MODEL", IoType::MODEL)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let mut model: ModelRef = inputs.downcast::<ModelRef>("model")?.clone();
        check_copy(inputs, "copy_model")?;
        model.circular = tiling_axes(inputs.string("tiling")?)?;
        Ok(Outputs::new(vec![Value::new(IoType::MODEL, model)]))
    }
}

/// "Make Circular VAE": the VAE with circular padding on the chosen axes, for every
/// encode and decode (sd-cli's `--circular` on the VAE).
struct MakeCircularVae;

impl Node for MakeCircularVae {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("MakeCircularVAE")
            .display_name("Make Circular VAE")
            .category("latent")
            .description("The VAE with circular padding on the chosen axes, encoding and decoding (sd.cpp's --circular). Tiled runs whose tiles do not span an axis lay the tiles around it instead.")
            .input(InputSpec::link("vae", IoType::VAE))
            .input(tiling_input())
            .input(copy_input("copy_vae"))
            .output("VAE", IoType::VAE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let mut vae: VaeRef = inputs.downcast::<VaeRef>("vae")?.clone();
        check_copy(inputs, "copy_vae")?;
        vae.circular = tiling_axes(inputs.string("tiling")?)?;
        Ok(Outputs::new(vec![Value::new(IoType::VAE, vae)]))
    }
}

/// "Circular VAE Decode (tile)": VAE Decode with the VAE made circular on the chosen axes.
struct CircularVaeDecode {
    rt: Arc<Runtime>,
}

impl Node for CircularVaeDecode {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("CircularVAEDecode")
            .display_name("Circular VAE Decode (tile)")
            .category("latent")
            .description("VAE Decode with circular padding on the chosen axes, for latents sampled by a Seamless Tile model.")
            .input(InputSpec::link("samples", IoType::LATENT))
            .input(InputSpec::link("vae", IoType::VAE))
            .input(tiling_input())
            .output("IMAGE", IoType::IMAGE)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let latent = inputs.downcast::<Latent>("samples")?;
        let mut vae: VaeRef = inputs.downcast::<VaeRef>("vae")?.clone();
        vae.circular = tiling_axes(inputs.string("tiling")?)?;
        let image = decode_latent(&self.rt, ctx, latent, &vae, &self.rt.vae_tiling)?;
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, image)]))
    }
}

/// "Offset Image": each image rolled right by `x_percent` and down by `y_percent` of its
/// size (rounded half to even, as Python's `round`), wrapping around — a tiled image shows
/// its seams in the middle.
struct OffsetImage;

impl Node for OffsetImage {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("OffsetImage")
            .display_name("Offset Image")
            .category("image")
            .input(InputSpec::link("pixels", IoType::IMAGE))
            .input(InputSpec::float("x_percent", 50.0).float_range(0.0, 100.0).float_step(1.0))
            .input(InputSpec::float("y_percent", 50.0).float_range(0.0, 100.0).float_step(1.0))
            .output("IMAGE", IoType::IMAGE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("pixels")?;
        let (xp, yp) = (inputs.float("x_percent")?, inputs.float("y_percent")?);
        if !(xp.is_finite() && yp.is_finite()) {
            return Err(NodeError::msg(format!("offsets {xp}%, {yp}% must be numbers")));
        }
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, offset_image(img, xp, yp))]))
    }
}

/// `img` rolled by `x_percent` / `y_percent` of its width / height (torch's `roll`: pixel
/// (y, x) moves to (y + dy, x + dx), wrapping).
pub fn offset_image(img: &Image, x_percent: f64, y_percent: f64) -> Image {
    let (w, h, c) = (img.width, img.height, img.channels);
    let shift = |side: usize, p: f64| -> usize {
        let s = (side as f64 * p / 100.0).round_ties_even() as i64;
        s.rem_euclid(side.max(1) as i64) as usize
    };
    let (dx, dy) = (shift(w, x_percent), shift(h, y_percent));
    let mut data = vec![0f32; img.data.len()];
    let frame = w * h * c;
    for n in 0..img.n {
        for y in 0..h {
            for x in 0..w {
                let src = n * frame + (y * w + x) * c;
                let dst = n * frame + (((y + dy) % h) * w + (x + dx) % w) * c;
                data[dst..dst + c].copy_from_slice(&img.data[src..src + c]);
            }
        }
    }
    Image { data, ..img.clone() }
}
