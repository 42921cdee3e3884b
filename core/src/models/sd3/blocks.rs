//! The MMDiT joint block (Stability's `JointBlock` of two `DismantledBlock`s), by the
//! checkpoint's module names.

use crate::ggml::{Context, GType, Tensor};
use crate::models::dit::{self, chunks, gated, modulate};
use crate::models::nn::{attention_typed, linear};
use crate::models::{Result, Weights};

pub(super) struct Blocks<'a> {
    pub ctx: &'a Context,
    pub w: &'a Weights,
    pub heads: i64,
    pub qk_norm: bool,
    pub compute: GType,
}

/// q, k, v of one stream [D, L, B], q and k normed per head where the model has the norms.
struct Qkv<'a> {
    q: Tensor<'a>,
    k: Tensor<'a>,
    v: Tensor<'a>,
}

impl<'a> Blocks<'a> {
    /// `{attn}.qkv` on the modulated stream h [D, L, B], split, with `{attn}.ln_q/ln_k`.
    fn qkv(&self, attn: &str, h: Tensor<'a>) -> Result<Qkv<'a>> {
        let ctx = self.ctx;
        let fused = linear(ctx, self.w, &format!("{attn}.qkv"), h)?;
        let [f, l, b, _] = fused.ne();
        let d = f / 3;
        let part = |j: i64, norm: &str| -> Result<Tensor<'a>> {
            let t = dit::features(ctx, fused, j * d, d)?;
            if !self.qk_norm || norm.is_empty() {
                return Ok(t);
            }
            let t = ctx.rms_norm(ctx.reshape(t, [d / self.heads, self.heads, l, b])?, 1e-6)?;
            let t = ctx.mul(t, self.w.get(&format!("{attn}.{norm}.weight"))?)?;
            Ok(ctx.reshape(t, [d, l, b, 1])?)
        };
        Ok(Qkv {
            q: part(0, "ln_q")?,
            k: part(1, "ln_k")?,
            v: part(2, "")?,
        })
    }

    /// Attention over the sequence of `parts` joined in order; [D, L, B].
    fn attend(&self, parts: &[&Qkv<'a>]) -> Result<Tensor<'a>> {
        let ctx = self.ctx;
        let join = |f: &dyn Fn(&Qkv<'a>) -> Tensor<'a>| -> Result<Tensor<'a>> {
            let mut t = f(parts[0]);
            for p in &parts[1..] {
                t = ctx.concat(t, f(p), 1)?;
            }
            Ok(t)
        };
        Ok(attention_typed(
            ctx,
            join(&|p| p.q)?,
            join(&|p| p.k)?,
            join(&|p| p.v)?,
            self.heads,
            None,
            self.compute,
        )?)
    }

    /// `fc1 → GELU(tanh) → fc2` at `{name}`.
    fn mlp(&self, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
        let h = self
            .ctx
            .gelu_tanh_exact(linear(self.ctx, self.w, &format!("{name}.fc1"), x)?)?;
        linear(self.ctx, self.w, &format!("{name}.fc2"), h)
    }

    /// The joint block at `p` on img [D, L, B] and txt [D, Lt, B] under the SiLU'd vector
    /// `vec` [D, B]. `x2`: the image stream's second self-attention (MMDiT-X); `last`: the
    /// text stream ends here (its block is `pre_only`, and no text comes back).
    pub fn joint(
        &self,
        p: &str,
        img: Tensor<'a>,
        txt: Tensor<'a>,
        vec: Tensor<'a>,
        x2: bool,
        last: bool,
    ) -> Result<(Tensor<'a>, Option<Tensor<'a>>)> {
        let (ctx, w) = (self.ctx, self.w);
        let lt = txt.ne()[1];
        let l = img.ne()[1];
        let xb = format!("{p}.x_block");
        let cb = format!("{p}.context_block");
        // Chunks: shift, scale, gate (attention), shift, scale, gate (MLP), then MMDiT-X's
        // shift, scale, gate of the second attention.
        let xm = chunks(
            ctx,
            linear(ctx, w, &format!("{xb}.adaLN_modulation.1"), vec)?,
            if x2 { 9 } else { 6 },
        )?;
        let cm = chunks(
            ctx,
            linear(ctx, w, &format!("{cb}.adaLN_modulation.1"), vec)?,
            if last { 2 } else { 6 },
        )?;
        let x_norm = ctx.norm(img, 1e-6)?;
        let xq = self.qkv(&format!("{xb}.attn"), modulate(ctx, x_norm, xm[0], xm[1])?)?;
        let cq = self.qkv(
            &format!("{cb}.attn"),
            modulate(ctx, ctx.norm(txt, 1e-6)?, cm[0], cm[1])?,
        )?;
        let a = self.attend(&[&cq, &xq])?;

        let mut img_out = gated(
            ctx,
            img,
            xm[2],
            linear(
                ctx,
                w,
                &format!("{xb}.attn.proj"),
                dit::rows(ctx, a, lt, l)?,
            )?,
        )?;
        if x2 {
            let q2 = self.qkv(&format!("{xb}.attn2"), modulate(ctx, x_norm, xm[6], xm[7])?)?;
            let a2 = linear(ctx, w, &format!("{xb}.attn2.proj"), self.attend(&[&q2])?)?;
            img_out = gated(ctx, img_out, xm[8], a2)?;
        }
        let h = modulate(ctx, ctx.norm(img_out, 1e-6)?, xm[3], xm[4])?;
        let img_out = gated(ctx, img_out, xm[5], self.mlp(&format!("{xb}.mlp"), h)?)?;
        if last {
            return Ok((img_out, None));
        }
        let txt_out = gated(
            ctx,
            txt,
            cm[2],
            linear(
                ctx,
                w,
                &format!("{cb}.attn.proj"),
                dit::rows(ctx, a, 0, lt)?,
            )?,
        )?;
        let h = modulate(ctx, ctx.norm(txt_out, 1e-6)?, cm[3], cm[4])?;
        let txt_out = gated(ctx, txt_out, cm[5], self.mlp(&format!("{cb}.mlp"), h)?)?;
        Ok((img_out, Some(txt_out)))
    }
}
