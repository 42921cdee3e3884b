//! The KL autoencoder of Stable Diffusion 1.x/2.x/XL (`AutoencoderKL`), in the LDM
//! single-file key layout (`encoder.down.N.block.M`, `decoder.up.N.block.M`,
//! `mid.attn_1.{q,k,v,proj_out}`, `quant_conv`, `post_quant_conv`).
//!
//! Images are [W, H, 3, N] in [-1, 1]; latents are [w, h, z, N], unscaled (the caller
//! applies the model family's scale factor).

use super::nn::{attention, conv2d, group_norm};
use super::{ModelError, Result, Weights};
use crate::ggml::{Context, Tensor};

#[derive(Clone, Debug, PartialEq)]
pub struct VaeConfig {
    /// Output channels of each resolution level, outermost first ([128, 256, 512, 512]).
    pub channels: Vec<i64>,
    pub num_res_blocks: usize,
    pub z_channels: i64,
    pub image_channels: i64,
    pub has_encoder: bool,
    pub has_quant_convs: bool,
}

const GROUPS: i32 = 32;
const EPS: f32 = 1e-6;

/// Conv weight `{name}.weight` is [k, k, in, out] in ggml order.
fn conv_dims(w: &Weights, name: &str) -> Result<(i64, i64)> {
    let ne = w.get(&format!("{name}.weight"))?.ne();
    Ok((ne[2], ne[3]))
}

impl VaeConfig {
    /// Read levels, widths and block counts off the decoder weights under `prefix`
    /// (e.g. `first_stage_model`).
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let p = |s: &str| format!("{prefix}.{s}");
        let levels = (0..).take_while(|i| w.contains(&p(&format!("decoder.up.{i}.block.0.conv1.weight")))).count();
        if levels == 0 {
            return Err(ModelError::Config(format!("no VAE decoder under `{prefix}`")));
        }
        let blocks = (0..).take_while(|j| w.contains(&p(&format!("decoder.up.0.block.{j}.conv1.weight")))).count();
        if blocks < 2 {
            return Err(ModelError::Config(format!("VAE decoder level 0 under `{prefix}` has {blocks} blocks")));
        }
        let channels = (0..levels)
            .map(|i| conv_dims(w, &p(&format!("decoder.up.{i}.block.0.conv1"))).map(|d| d.1))
            .collect::<Result<Vec<_>>>()?;
        let (z_channels, _) = conv_dims(w, &p("decoder.conv_in"))?;
        let (_, image_channels) = conv_dims(w, &p("decoder.conv_out"))?;
        Ok(VaeConfig {
            channels,
            num_res_blocks: blocks - 1,
            z_channels,
            image_channels,
            has_encoder: w.contains(&p("encoder.conv_in.weight")),
            has_quant_convs: w.contains(&p("post_quant_conv.weight")),
        })
    }

    /// Pixels per latent pixel along each axis.
    pub fn downscale(&self) -> i64 {
        1 << (self.channels.len() - 1)
    }
}

pub struct Vae<'w> {
    w: &'w Weights,
    prefix: String,
    pub config: VaeConfig,
}

impl<'w> Vae<'w> {
    pub fn new(w: &'w Weights, prefix: &str, config: VaeConfig) -> Result<Self> {
        let vae = Vae { w, prefix: prefix.to_string(), config };
        vae.validate()?;
        Ok(vae)
    }

    fn n(&self, s: &str) -> String {
        format!("{}.{s}", self.prefix)
    }

    fn expect_conv(&self, name: &str, k: i64, cin: i64, cout: i64) -> Result<()> {
        self.w.expect(&self.n(&format!("{name}.weight")), &[k, k, cin, cout])?;
        self.w.expect(&self.n(&format!("{name}.bias")), &[cout])?;
        Ok(())
    }

    fn expect_norm(&self, name: &str, c: i64) -> Result<()> {
        if c % GROUPS as i64 != 0 {
            return Err(ModelError::Config(format!("{name}: {c} channels are not a multiple of {GROUPS} groups")));
        }
        self.w.expect(&self.n(&format!("{name}.weight")), &[c])?;
        self.w.expect(&self.n(&format!("{name}.bias")), &[c])?;
        Ok(())
    }

    fn expect_res(&self, name: &str, cin: i64, cout: i64) -> Result<()> {
        self.expect_norm(&format!("{name}.norm1"), cin)?;
        self.expect_conv(&format!("{name}.conv1"), 3, cin, cout)?;
        self.expect_norm(&format!("{name}.norm2"), cout)?;
        self.expect_conv(&format!("{name}.conv2"), 3, cout, cout)?;
        if cin != cout {
            self.expect_conv(&format!("{name}.nin_shortcut"), 1, cin, cout)?;
        }
        Ok(())
    }

    fn expect_mid(&self, side: &str, c: i64) -> Result<()> {
        self.expect_res(&format!("{side}.mid.block_1"), c, c)?;
        self.expect_norm(&format!("{side}.mid.attn_1.norm"), c)?;
        for p in ["q", "k", "v", "proj_out"] {
            self.expect_conv(&format!("{side}.mid.attn_1.{p}"), 1, c, c)?;
        }
        self.expect_res(&format!("{side}.mid.block_2"), c, c)
    }

    /// Every weight the config implies, with its shape.
    fn validate(&self) -> Result<()> {
        let c = &self.config;
        let Some(&top) = c.channels.last() else {
            return Err(ModelError::Config("a VAE needs at least one level".into()));
        };
        let (z, levels) = (c.z_channels, c.channels.len());
        if c.has_quant_convs {
            self.expect_conv("post_quant_conv", 1, z, z)?;
        }
        self.expect_conv("decoder.conv_in", 3, z, top)?;
        self.expect_mid("decoder", top)?;
        let mut cin = top;
        for i in (0..levels).rev() {
            for j in 0..=c.num_res_blocks {
                self.expect_res(&format!("decoder.up.{i}.block.{j}"), cin, c.channels[i])?;
                cin = c.channels[i];
            }
            if i != 0 {
                self.expect_conv(&format!("decoder.up.{i}.upsample.conv"), 3, cin, cin)?;
            }
        }
        self.expect_norm("decoder.norm_out", cin)?;
        self.expect_conv("decoder.conv_out", 3, cin, c.image_channels)?;
        if c.has_encoder {
            let mut cin = c.channels[0];
            self.expect_conv("encoder.conv_in", 3, c.image_channels, cin)?;
            for i in 0..levels {
                for j in 0..c.num_res_blocks {
                    self.expect_res(&format!("encoder.down.{i}.block.{j}"), cin, c.channels[i])?;
                    cin = c.channels[i];
                }
                if i + 1 != levels {
                    self.expect_conv(&format!("encoder.down.{i}.downsample.conv"), 3, cin, cin)?;
                }
            }
            self.expect_mid("encoder", cin)?;
            self.expect_norm("encoder.norm_out", cin)?;
            self.expect_conv("encoder.conv_out", 3, cin, 2 * z)?;
            if c.has_quant_convs {
                self.expect_conv("quant_conv", 1, 2 * z, 2 * z)?;
            }
        }
        Ok(())
    }

    fn conv<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>, stride: i32, pad: i32) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        conv2d(ctx, self.w, &self.n(name), x, stride, pad)
    }

    fn norm<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        group_norm(ctx, self.w, &self.n(name), x, GROUPS, EPS)
    }

    fn res_block<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let h = ctx.silu(self.norm(ctx, &format!("{name}.norm1"), x)?)?;
        let h = self.conv(ctx, &format!("{name}.conv1"), h, 1, 1)?;
        let h = ctx.silu(self.norm(ctx, &format!("{name}.norm2"), h)?)?;
        let h = self.conv(ctx, &format!("{name}.conv2"), h, 1, 1)?;
        let skip = format!("{name}.nin_shortcut");
        let x = if self.w.contains(&self.n(&format!("{skip}.weight"))) { self.conv(ctx, &skip, x, 1, 0)? } else { x };
        Ok(ctx.add(x, h)?)
    }

    /// Single-head self-attention over all pixels.
    fn attn_block<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let [w, h, c, n] = x.ne();
        let hn = self.norm(ctx, &format!("{name}.norm"), x)?;
        // [W, H, C, N] → [C, W·H, N]: channels innermost, one token per pixel.
        let tokens = |t: Tensor<'a>| -> Result<Tensor<'a>> {
            let t = ctx.reshape(t, [w * h, c, n, 1])?;
            Ok(ctx.cont(ctx.permute(t, [1, 0, 2, 3])?)?)
        };
        let q = tokens(self.conv(ctx, &format!("{name}.q"), hn, 1, 0)?)?;
        let k = tokens(self.conv(ctx, &format!("{name}.k"), hn, 1, 0)?)?;
        let v = tokens(self.conv(ctx, &format!("{name}.v"), hn, 1, 0)?)?;
        let a = attention(ctx, q, k, v, 1, None)?; // [C, W·H, N]
        let a = ctx.cont(ctx.permute(a, [1, 0, 2, 3])?)?;
        let a = ctx.reshape(a, [w, h, c, n])?;
        let a = self.conv(ctx, &format!("{name}.proj_out"), a, 1, 0)?;
        Ok(ctx.add(x, a)?)
    }

    fn mid<'a>(&'a self, ctx: &'a Context, side: &str, x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let x = self.res_block(ctx, &format!("{side}.mid.block_1"), x)?;
        let x = self.attn_block(ctx, &format!("{side}.mid.attn_1"), x)?;
        self.res_block(ctx, &format!("{side}.mid.block_2"), x)
    }

    /// Latents [w, h, z, N] → images [w·f, h·f, 3, N].
    pub fn decode<'a>(&'a self, ctx: &'a Context, z: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        if z.ne()[2] != c.z_channels {
            return Err(ModelError::Input(format!("latent has {} channels, the VAE {}", z.ne()[2], c.z_channels)));
        }
        let mut x = if c.has_quant_convs { self.conv(ctx, "post_quant_conv", z, 1, 0)? } else { z };
        x = self.conv(ctx, "decoder.conv_in", x, 1, 1)?;
        x = self.mid(ctx, "decoder", x)?;
        for i in (0..c.channels.len()).rev() {
            for j in 0..=c.num_res_blocks {
                x = self.res_block(ctx, &format!("decoder.up.{i}.block.{j}"), x)?;
            }
            if i != 0 {
                x = ctx.upscale(x, 2)?;
                x = self.conv(ctx, &format!("decoder.up.{i}.upsample.conv"), x, 1, 1)?;
            }
        }
        x = ctx.silu(self.norm(ctx, "decoder.norm_out", x)?)?;
        self.conv(ctx, "decoder.conv_out", x, 1, 1)
    }

    /// Images [W, H, 3, N] → the latent distribution's moments [W/f, H/f, 2z, N]
    /// (mean first, then log-variance).
    pub fn encode_moments<'a>(&'a self, ctx: &'a Context, image: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        if !c.has_encoder {
            return Err(ModelError::Config("this VAE has no encoder weights".into()));
        }
        let f = self.config.downscale();
        let [w, h, ch, _] = image.ne();
        if ch != c.image_channels || w % f != 0 || h % f != 0 {
            return Err(ModelError::Input(format!("image {w}x{h}x{ch}: needs {} channels and sides divisible by {f}", c.image_channels)));
        }
        let levels = c.channels.len();
        let mut x = self.conv(ctx, "encoder.conv_in", image, 1, 1)?;
        for i in 0..levels {
            for j in 0..c.num_res_blocks {
                x = self.res_block(ctx, &format!("encoder.down.{i}.block.{j}"), x)?;
            }
            if i + 1 != levels {
                // LDM pads right and bottom only, then convolves with stride 2.
                x = ctx.pad(x, [(0, 1), (0, 1), (0, 0), (0, 0)])?;
                x = self.conv(ctx, &format!("encoder.down.{i}.downsample.conv"), x, 2, 0)?;
            }
        }
        x = self.mid(ctx, "encoder", x)?;
        x = ctx.silu(self.norm(ctx, "encoder.norm_out", x)?)?;
        x = self.conv(ctx, "encoder.conv_out", x, 1, 1)?;
        if c.has_quant_convs {
            x = self.conv(ctx, "quant_conv", x, 1, 0)?;
        }
        Ok(x)
    }

    /// The mean of the latent distribution (deterministic encoding).
    pub fn encode_mean<'a>(&'a self, ctx: &'a Context, image: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let m = self.encode_moments(ctx, image)?;
        let [w, h, _, n] = m.ne();
        let nb = m.nb();
        Ok(ctx.cont(ctx.view(m, [w, h, self.config.z_channels, n], [nb[1], nb[2], nb[3]], 0)?)?)
    }
}
