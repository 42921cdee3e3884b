//! madebyollin's tiny autoencoder (TAESD; diffusers `AutoencoderTiny`): an encoder and a
//! decoder of plain 3×3 convolutions and ReLU residual blocks, each one `nn.Sequential`.
//!
//! Two key layouts name the same layers:
//! - diffusers (and sd.cpp's `--taesd`): `decoder.layers.N.*` / `encoder.layers.N.*`, the
//!   decoder's first convolution at index 0 (its input clamp is not a layer there);
//! - the original `taesd_decoder.*` / `taesd_encoder.*` files: bare `N.*` keys, the
//!   decoder's clamp at index 0 so every decoder index is one higher.
//!
//! TAEF2 (FLUX.2's) adds to the blocks nearest the latent a pooled GroupNorm branch
//! (`pool.0` 1×1 convolution to four times the width, `pool.1` GroupNorm of 4 groups, ReLU,
//! `pool.3` 1×1 convolution back), added to the block's input; a block has it when its
//! file does.
//!
//! Both halves work in TAESD's latent space, which is the diffusion model's (latents
//! already multiplied by the family's scale factor), and on images in [0, 1]: the caller
//! converts, as ComfyUI's `vae_scale` and sd.cpp's `use_tiny_autoencoder` paths do.
//! Images are [W, H, 3, N], latents [W/8, H/8, z, N].

use crate::models::nn::conv2d;
use crate::models::{ModelError, Result, Weights};
use crate::ggml::{Context, Tensor};

/// Width of every hidden layer in the published TAESD models.
const CHANNELS: i64 = 64;
/// Residual blocks per resolution stage (the encoder's first stage has one).
const BLOCKS: usize = 3;
/// Three ×2 resamplings: a factor of 8.
const STAGES: usize = 3;
/// The decoder's input clamp: `tanh(x / 3) * 3`.
const LATENT_CLAMP: f32 = 3.0;

/// One entry of a half's `nn.Sequential`, in order.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layer {
    Conv { cin: i64, cout: i64, stride: i32, bias: bool },
    Block,
    Relu,
    Upsample,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TaesdConfig {
    pub latent_channels: i64,
    pub channels: i64,
    pub image_channels: i64,
    /// Key prefix of the layers, with its trailing dot (`decoder.layers.`, or empty).
    pub prefix: String,
    /// The index of the first layer in the file: 0 in the diffusers layout; 1 for the
    /// original decoder, whose index 0 is the parameterless clamp.
    pub first_index: usize,
}

/// Which half a model is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    Encoder,
    Decoder,
}

impl Half {
    fn name(self) -> &'static str {
        match self {
            Half::Encoder => "encoder",
            Half::Decoder => "decoder",
        }
    }
}

/// Conv weight `{name}.weight` is [k, k, in, out] in ggml order.
fn conv_ne(w: &Weights, name: &str) -> Option<[i64; 4]> {
    w.get(&format!("{name}.weight")).ok().map(|t| t.ne())
}

impl TaesdConfig {
    /// Find `half` under `prefix` (`decoder.layers.`, `taesd_decoder.`, or `""` for a
    /// single-half file): which numbering its keys use and its latent width.
    pub fn infer(w: &Weights, prefix: &str, half: Half) -> Result<Self> {
        let at = |i: usize| conv_ne(w, &format!("{prefix}{i}"));
        let (first_index, ne) = match (at(0), at(1), half) {
            (Some(ne), _, _) => (0, ne),
            // The original decoder: index 0 is the clamp, the first conv is at 1.
            (None, Some(ne), Half::Decoder) if ne[0] == 3 => (1, ne),
            _ => return Err(ModelError::Config(format!("no TAESD {} under `{prefix}` (expected `{prefix}0.weight`)", half.name()))),
        };
        if ne[0] != 3 || ne[1] != 3 {
            return Err(ModelError::Config(format!("TAESD {} under `{prefix}`: first layer is not a 3x3 convolution ({ne:?})", half.name())));
        }
        let (image_channels, latent_channels) = match half {
            Half::Decoder => {
                let last = first_index + Self::layers_for(half, ne[2], ne[3], 3).len() - 1;
                let out = conv_ne(w, &format!("{prefix}{last}")).ok_or_else(|| ModelError::MissingWeight(format!("{prefix}{last}.weight")))?;
                (out[3], ne[2])
            }
            Half::Encoder => {
                let last = Self::layers_for(half, ne[2], ne[3], 3).len() - 1;
                let out = conv_ne(w, &format!("{prefix}{last}")).ok_or_else(|| ModelError::MissingWeight(format!("{prefix}{last}.weight")))?;
                (ne[2], out[3])
            }
        };
        Ok(TaesdConfig { latent_channels, channels: ne[3], image_channels, prefix: prefix.to_string(), first_index })
    }

    /// The layer list of `half` (sd.cpp's tae.hpp and taesd.py spell out the same).
    fn layers_for(half: Half, z: i64, c: i64, img: i64) -> Vec<Layer> {
        let conv = |cin, cout, stride, bias| Layer::Conv { cin, cout, stride, bias };
        let mut l = Vec::new();
        match half {
            Half::Encoder => {
                l.push(conv(img, c, 1, true));
                l.push(Layer::Block);
                for _ in 0..STAGES {
                    l.push(conv(c, c, 2, false));
                    l.extend([Layer::Block; BLOCKS]);
                }
                l.push(conv(c, z, 1, true));
            }
            Half::Decoder => {
                l.push(conv(z, c, 1, true));
                l.push(Layer::Relu);
                for _ in 0..STAGES {
                    l.extend([Layer::Block; BLOCKS]);
                    l.push(Layer::Upsample);
                    l.push(conv(c, c, 1, false));
                }
                l.push(Layer::Block);
                l.push(conv(c, img, 1, true));
            }
        }
        l
    }

    fn layers(&self, half: Half) -> Vec<Layer> {
        Self::layers_for(half, self.latent_channels, self.channels, self.image_channels)
    }

    /// Pixels per latent pixel along each axis.
    pub fn downscale(&self) -> i64 {
        1 << STAGES
    }
}

/// One half of a TAESD, validated against its weights.
pub struct Taesd<'w> {
    w: &'w Weights,
    half: Half,
    pub config: TaesdConfig,
}

impl<'w> Taesd<'w> {
    pub fn new(w: &'w Weights, half: Half, config: TaesdConfig) -> Result<Self> {
        if config.channels != CHANNELS {
            // Other widths are not a published model; accepted, but worth knowing about.
            tracing::debug!(channels = config.channels, "TAESD with a non-standard width");
        }
        let t = Taesd { w, half, config };
        t.validate()?;
        Ok(t)
    }

    /// Find and validate `half` under `prefix` in one step.
    pub fn load(w: &'w Weights, prefix: &str, half: Half) -> Result<Self> {
        let config = TaesdConfig::infer(w, prefix, half)?;
        Self::new(w, half, config)
    }

    /// The file's name of layer `index` of the architecture's list.
    fn layer(&self, index: usize) -> String {
        format!("{}{}", self.config.prefix, index + self.config.first_index)
    }

    fn n(&self, index: usize, s: &str) -> String {
        format!("{}.{s}", self.layer(index))
    }

    fn expect_conv(&self, name: &str, k: i64, cin: i64, cout: i64, bias: bool) -> Result<()> {
        self.w.expect(&format!("{name}.weight"), &[k, k, cin, cout])?;
        let b = format!("{name}.bias");
        if bias {
            self.w.expect(&b, &[cout])?;
        } else if self.w.contains(&b) {
            return Err(ModelError::Config(format!("`{b}`: this TAESD layer has no bias")));
        }
        Ok(())
    }

    fn validate(&self) -> Result<()> {
        let c = self.config.channels;
        for (i, layer) in self.config.layers(self.half).into_iter().enumerate() {
            match layer {
                Layer::Conv { cin, cout, bias, .. } => self.expect_conv(&self.layer(i), 3, cin, cout, bias)?,
                Layer::Block => {
                    for j in [0, 2, 4] {
                        self.expect_conv(&self.n(i, &format!("conv.{j}")), 3, c, c, true)?;
                    }
                    if self.pooled(i) {
                        self.expect_conv(&self.n(i, "pool.0"), 1, c, 4 * c, false)?;
                        self.w.expect(&format!("{}.weight", self.n(i, "pool.1")), &[4 * c])?;
                        self.w.expect(&format!("{}.bias", self.n(i, "pool.1")), &[4 * c])?;
                        self.expect_conv(&self.n(i, "pool.3"), 1, 4 * c, c, false)?;
                    }
                }
                Layer::Relu | Layer::Upsample => {}
            }
        }
        Ok(())
    }

    /// Block `index` has TAEF2's pooled GroupNorm branch.
    fn pooled(&self, index: usize) -> bool {
        self.w.contains(&format!("{}.weight", self.n(index, "pool.0")))
    }

    /// `conv(x) + x`, ReLU between the three convolutions and after the sum (x first
    /// gains TAEF2's pooled branch where the block has one). Every block keeps the width,
    /// so the skip is the identity.
    fn block<'a>(&'a self, ctx: &'a Context, index: usize, mut x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        if self.pooled(index) {
            let p = conv2d(ctx, self.w, &self.n(index, "pool.0"), x, 1, 0)?;
            let p = ctx.relu(crate::models::nn::group_norm(ctx, self.w, &self.n(index, "pool.1"), p, 4, 1e-5)?)?;
            x = ctx.add(x, conv2d(ctx, self.w, &self.n(index, "pool.3"), p, 1, 0)?)?;
        }
        let mut h = x;
        for j in [0, 2, 4] {
            if j > 0 {
                h = ctx.relu(h)?;
            }
            h = conv2d(ctx, self.w, &self.n(index, &format!("conv.{j}")), h, 1, 1)?;
        }
        Ok(ctx.relu(ctx.add(h, x)?)?)
    }

    fn run<'a>(&'a self, ctx: &'a Context, mut x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        for (i, layer) in self.config.layers(self.half).into_iter().enumerate() {
            x = match layer {
                Layer::Conv { stride, .. } => conv2d(ctx, self.w, &self.layer(i), x, stride, 1)?,
                Layer::Block => self.block(ctx, i, x)?,
                Layer::Relu => ctx.relu(x)?,
                Layer::Upsample => ctx.upscale(x, 2)?,
            };
        }
        Ok(x)
    }

    /// Latents [w, h, z, N] (the diffusion model's scale) → images [8w, 8h, 3, N], about
    /// [0, 1] but not clamped.
    pub fn decode<'a>(&'a self, ctx: &'a Context, z: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        if self.half != Half::Decoder {
            return Err(ModelError::Config("this TAESD half is an encoder, not a decoder".into()));
        }
        if z.ne()[2] != self.config.latent_channels {
            return Err(ModelError::Input(format!("latent has {} channels, the TAESD decoder {}", z.ne()[2], self.config.latent_channels)));
        }
        let x = ctx.tanh(ctx.scale(z, 1.0 / LATENT_CLAMP)?)?;
        let x = ctx.scale(x, LATENT_CLAMP)?;
        self.run(ctx, x)
    }

    /// Images [W, H, 3, N] in [0, 1] → latents [W/8, H/8, z, N] (the diffusion model's scale).
    pub fn encode<'a>(&'a self, ctx: &'a Context, image: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        if self.half != Half::Encoder {
            return Err(ModelError::Config("this TAESD half is a decoder, not an encoder".into()));
        }
        let f = self.config.downscale();
        let [w, h, ch, _] = image.ne();
        if ch != self.config.image_channels || w % f != 0 || h % f != 0 {
            return Err(ModelError::Input(format!("image {w}x{h}x{ch}: TAESD needs {} channels and sides divisible by {f}", self.config.image_channels)));
        }
        self.run(ctx, image)
    }
}
