//! ControlNet (ldm's `cldm.ControlNet`): a copy of the UNet's encoder that sees a hint
//! image and returns one residual per skip connection plus one for the middle block,
//! which the UNet adds to its own ([`ControlResiduals`]).
//!
//! Weights are read in the LDM layout under [`PREFIX`] (`control_model.input_hint_block.N`,
//! `input_blocks.*`, `middle_block.*`, `zero_convs.N.0`, `middle_block_out.0`, `time_embed`,
//! and `label_emb` for SDXL ControlNets). [`standalone_source`] shows the files found in
//! the wild that way: the original single files (`control_model.*`), the same without
//! the prefix, and diffusers `ControlNetModel` files (`controlnet_cond_embedding.*`,
//! `down_blocks.*`, `controlnet_down_blocks.N`, `controlnet_mid_block`).
//!
//! The encoder is the UNet's own code ([`Unet::encode`]); the structure is inferred from
//! the weights as the UNet's is.

use crate::models::nn::conv2d;
use super::unet::{ControlResiduals, Unet, UnetConfig};
use crate::models::{ModelError, Result, Weights};
use crate::ggml::{Context, Tensor};
use crate::io::{Assembled, TensorSource};

/// Where [`standalone_source`] puts the ControlNet's tensors (ldm's module name).
pub const PREFIX: &str = "control_model";

/// One convolution of the hint encoder (`input_hint_block.{index}`), each but the last
/// followed by SiLU.
#[derive(Clone, Debug, PartialEq)]
pub struct HintConv {
    pub index: usize,
    pub cin: i64,
    pub cout: i64,
    pub stride: i32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ControlNetConfig {
    /// The encoder: no output blocks, `out_channels` 0.
    pub unet: UnetConfig,
    pub hint_channels: i64,
    pub hint_convs: Vec<HintConv>,
}

impl ControlNetConfig {
    /// Read the structure off the weights under `prefix` (`control_model`).
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let unet = UnetConfig::infer_encoder(w, prefix)?;
        let mut shapes = Vec::new();
        for index in (0..).step_by(2) {
            let name = format!("{prefix}.input_hint_block.{index}.weight");
            if !w.contains(&name) {
                break;
            }
            shapes.push((index, w.get(&name)?.ne()));
        }
        if shapes.len() < 2 {
            return Err(ModelError::Config(format!("ControlNet under `{prefix}`: {} hint convolutions (input_hint_block.0, .2, ...), at least 2 needed", shapes.len())));
        }
        let last = shapes.len() - 1;
        // ldm's (and diffusers') hint encoder: a convolution in, then pairs of a same-width
        // and a stride-2 widening convolution, then one out to the model's width.
        let hint_convs = shapes
            .iter()
            .enumerate()
            .map(|(k, &(index, ne))| HintConv { index, cin: ne[2], cout: ne[3], stride: if k > 0 && k < last && k % 2 == 0 { 2 } else { 1 } })
            .collect::<Vec<_>>();
        Ok(ControlNetConfig { hint_channels: hint_convs[0].cin, unet, hint_convs })
    }

    /// Hint pixels per latent cell (8 for SD's ControlNets: three stride-2 convolutions).
    pub fn hint_scale(&self) -> i64 {
        self.hint_convs.iter().map(|c| c.stride as i64).product()
    }
}

pub struct ControlNet<'w> {
    encoder: Unet<'w>,
    w: &'w Weights,
    prefix: String,
    pub config: ControlNetConfig,
}

impl<'w> ControlNet<'w> {
    pub fn new(w: &'w Weights, prefix: &str, config: ControlNetConfig) -> Result<Self> {
        let encoder = Unet::new_encoder(w, prefix, config.unet.clone())?;
        let net = ControlNet { encoder, w, prefix: prefix.to_string(), config };
        net.validate()?;
        Ok(net)
    }

    fn n(&self, s: &str) -> String {
        format!("{}.{s}", self.prefix)
    }

    fn expect_conv(&self, name: &str, k: i64, cin: i64, cout: i64) -> Result<()> {
        self.w.expect_conv(&self.n(name), k, cin, cout)
    }

    fn validate(&self) -> Result<()> {
        let c = &self.config;
        let mut width = c.hint_channels;
        for h in &c.hint_convs {
            self.expect_conv(&format!("input_hint_block.{}", h.index), 3, width, h.cout)?;
            width = h.cout;
        }
        if width != c.unet.model_channels {
            return Err(ModelError::Config(format!(
                "{}: the hint encoder ends at {width} channels, the model's first block has {}",
                self.n(&format!("input_hint_block.{}", c.hint_convs.last().map_or(0, |h| h.index))),
                c.unet.model_channels
            )));
        }
        for (i, ch) in c.unet.skip_channels().into_iter().enumerate() {
            self.expect_conv(&format!("zero_convs.{i}.0"), 1, ch, ch)?;
        }
        let mid = self.w.get(&self.n("middle_block.0.in_layers.0.weight"))?.ne()[0];
        self.expect_conv("middle_block_out.0", 1, mid, mid)
    }

    /// Whether these residuals fit `unet`: the same skip widths and middle width, the
    /// same text width, and a latent input of the UNet's (the ControlNet sees the latent
    /// without an inpainting or instruct-pix2pix UNet's extra channels).
    pub fn check_fits(&self, unet: &UnetConfig) -> Result<()> {
        let own = &self.config.unet;
        let (mine, theirs) = (own.skip_channels(), unet.skip_channels());
        if mine != theirs {
            return Err(ModelError::Config(format!("the ControlNet's skip widths {mine:?} do not fit the UNet's {theirs:?} (a ControlNet for another model family?)")));
        }
        if own.context_dim != unet.context_dim {
            return Err(ModelError::Config(format!("the ControlNet takes {}-wide text conditioning, the UNet {}-wide (a ControlNet for another model family?)", own.context_dim, unet.context_dim)));
        }
        if own.in_channels > unet.in_channels {
            return Err(ModelError::Config(format!("the ControlNet takes {} latent channels, the UNet {}", own.in_channels, unet.in_channels)));
        }
        Ok(())
    }

    /// The residuals for latents `x` [W, H, C, N] (scaled as the UNet sees them) at
    /// timesteps `t` [N], with text `context` [Dc, Tc, N], the ADM vector `y` (SDXL
    /// ControlNets) and the hint image `hint` [W·s, H·s, hint channels, N] in 0..1
    /// (s = [`ControlNetConfig::hint_scale`]), each residual multiplied by `strength`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward<'a>(&'a self, ctx: &'a Context, x: Tensor<'a>, hint: Tensor<'a>, t: Tensor<'a>, context: Tensor<'a>, y: Option<Tensor<'a>>, strength: f32) -> Result<ControlResiduals<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        self.encoder.check_inputs(x, t, context)?;
        let [xw, xh, _, b] = x.ne();
        let s = c.hint_scale();
        if hint.ne() != [xw * s, xh * s, c.hint_channels, b] {
            return Err(ModelError::Input(format!("hint {:?} for a latent of {:?}: the ControlNet takes [{}, {}, {}, {b}]", hint.ne(), x.ne(), xw * s, xh * s, c.hint_channels)));
        }
        let emb = self.encoder.embed(ctx, t, if c.unet.adm_in_channels.is_some() { y } else { None })?;
        let mut g = hint;
        for (k, h) in c.hint_convs.iter().enumerate() {
            g = conv2d(ctx, self.w, &self.n(&format!("input_hint_block.{}", h.index)), g, h.stride, 1)?;
            if k + 1 < c.hint_convs.len() {
                g = ctx.silu(g)?;
            }
        }
        // IP-Adapters patch the UNet's attention only, as in ComfyUI.
        let no_ip = super::unet::IpLayers::new(&[], &c.unet);
        let (skips, middle) = self.encoder.encode(ctx, x, emb, context, Some(g), &no_ip, None)?;
        let scaled = |name: String, h: Tensor<'a>| -> Result<Tensor<'a>> { Ok(ctx.scale(conv2d(ctx, self.w, &self.n(&name), h, 1, 0)?, strength)?) };
        let skips = skips.into_iter().enumerate().map(|(i, h)| scaled(format!("zero_convs.{i}.0"), h)).collect::<Result<Vec<_>>>()?;
        Ok(ControlResiduals { skips, middle: scaled("middle_block_out.0".into(), middle)? })
    }
}

/// The key layout of a ControlNet file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// ldm names under `control_model.` (lllyasviel's files; full checkpoints with a
    /// ControlNet also hold `model.diffusion_model.*`, left out).
    Ldm,
    /// ldm names without the prefix.
    Bare,
    /// diffusers `ControlNetModel`, `nrb` res blocks per level and `hint` convolutions in
    /// `controlnet_cond_embedding.blocks`.
    Diffusers { nrb: usize, hint: usize },
}

/// The LDM name (below [`PREFIX`]) of a diffusers `ControlNetModel` tensor.
fn diffusers_name(name: &str, nrb: usize, hint: usize) -> Option<String> {
    let (module, wb) = name.rsplit_once('.')?;
    let ldm = match module.split_once('.') {
        Some(("controlnet_cond_embedding", "conv_in")) => "input_hint_block.0".to_string(),
        Some(("controlnet_cond_embedding", "conv_out")) => format!("input_hint_block.{}", 2 * hint + 2),
        Some(("controlnet_cond_embedding", rest)) => format!("input_hint_block.{}", 2 * rest.strip_prefix("blocks.")?.parse::<usize>().ok()? + 2),
        Some(("controlnet_down_blocks", n)) => format!("zero_convs.{}.0", n.parse::<usize>().ok()?),
        None if module == "controlnet_mid_block" => "middle_block_out.0".to_string(),
        _ => crate::lora::keys::diffusers_to_ldm_encoder(module, nrb)?,
    };
    Some(format!("{ldm}.{wb}"))
}

/// A ControlNet file as a source whose tensors all sit under [`PREFIX`] in LDM names,
/// ready for [`ControlNetConfig::infer`].
pub fn standalone_source(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    let shown = src.path().display().to_string();
    let names = || src.tensors().iter().map(|t| t.name.as_str());
    let count = |prefix: &str| names().filter_map(|n| n.strip_prefix(prefix)?.split('.').next()?.parse::<usize>().ok()).max().map_or(0, |m| m + 1);
    let layout = if names().any(|n| n.starts_with("control_model.input_hint_block.")) {
        Layout::Ldm
    } else if names().any(|n| n.starts_with("input_hint_block.")) {
        Layout::Bare
    } else if names().any(|n| n.starts_with("controlnet_cond_embedding.")) {
        Layout::Diffusers { nrb: count("down_blocks.0.resnets."), hint: count("controlnet_cond_embedding.blocks.") }
    } else {
        return Err(ModelError::Config(format!(
            "{shown}: not a ControlNet (no `control_model.input_hint_block.*`, `input_hint_block.*` or diffusers `controlnet_cond_embedding.*` tensors)"
        )));
    };
    let renamed = Assembled::renamed(src, |t| {
        let ldm = match layout {
            Layout::Ldm => t.name.strip_prefix("control_model.")?.to_string(),
            Layout::Bare => t.name.clone(),
            Layout::Diffusers { nrb, hint } => diffusers_name(&t.name, nrb, hint)?,
        };
        let mut info = t.clone();
        info.name = format!("{PREFIX}.{ldm}");
        Some(info)
    })
    .map_err(|name| ModelError::Weight { name, detail: format!("{shown}: two tensors map to this name") })?;
    Ok(Box::new(renamed))
}
