//! Latent images.

use crate::runtime::Runtime;
use crate::values::{Latent, Mask};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry, _rt: &Arc<Runtime>) {
    registry.register(Arc::new(EmptyLatentImage));
    registry.register(Arc::new(SetLatentNoiseMask));
}

/// The largest latent batch a node will allocate; past it a clear error beats an
/// out-of-memory abort.
pub const MAX_LATENT_BYTES: u64 = 4 << 30;

/// A latent of `shape` after checking it fits [`MAX_LATENT_BYTES`].
pub fn latent_zeros(shape: [i64; 4]) -> Result<Latent, NodeError> {
    let n = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(u64::try_from(d).ok()?));
    match n.and_then(|n| n.checked_mul(4)) {
        Some(bytes) if bytes <= MAX_LATENT_BYTES && bytes > 0 => Ok(Latent { samples: vec![0.0; bytes as usize / 4], shape, noise_mask: None }),
        _ => Err(NodeError::msg(format!("a latent of {shape:?} is larger than the {} GiB limit", MAX_LATENT_BYTES >> 30))),
    }
}

/// ComfyUI's "Empty Latent Image": zeros, 4 channels at 1/8 of the image size.
struct EmptyLatentImage;

impl Node for EmptyLatentImage {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("EmptyLatentImage")
            .display_name("Empty Latent Image")
            .category("latent")
            .input(InputSpec::int("width", 512).int_range(16, 16384).int_step(8))
            .input(InputSpec::int("height", 512).int_range(16, 16384).int_step(8))
            .input(InputSpec::int("batch_size", 1).int_range(1, 4096))
            .output("LATENT", IoType::LATENT)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let (w, h, n) = (inputs.int("width")?, inputs.int("height")?, inputs.int("batch_size")?);
        if w < 16 || h < 16 || n < 1 {
            return Err(NodeError::msg(format!("{w}x{h} × {n} is not a valid latent size")));
        }
        let latent = latent_zeros([w / 8, h / 8, 4, n])?;
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, latent)]))
    }
}

/// ComfyUI's "Set Latent Noise Mask": sampling changes the latent only where the mask is 1.
struct SetLatentNoiseMask;

impl Node for SetLatentNoiseMask {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("SetLatentNoiseMask")
            .display_name("Set Latent Noise Mask")
            .category("latent/inpaint")
            .input(InputSpec::link("samples", IoType::LATENT))
            .input(InputSpec::link("mask", IoType::MASK))
            .output("LATENT", IoType::LATENT)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let mut latent = inputs.downcast::<Latent>("samples")?.clone();
        let mask = inputs.downcast::<Mask>("mask")?;
        if mask.data.is_empty() {
            return Err(NodeError::msg("the mask is empty"));
        }
        latent.noise_mask = Some(Arc::new(mask.clone()));
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, latent)]))
    }
}
