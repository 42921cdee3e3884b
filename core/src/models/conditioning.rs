//! What every image family's denoiser takes: the text conditioning of one sample (tokens,
//! pooled vector, SDXL's size conditioning, FLUX's distilled guidance), the latent shape,
//! and what a model predicts. Born when FLUX joined the SD UNet family: the families share
//! these, so they live beside them rather than in one of them.

use super::{ModelError, Result};

/// What a diffusion model was trained to predict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prediction {
    /// The added noise (SD1.x, SD2 base 512).
    Epsilon,
    /// The velocity v = α·ε − σ·x₀ (SD2 768-v).
    V,
    /// EDM's v-prediction with σ_data = 1 (CosXL, CosXL-Edit): the scalings of `V`, but
    /// the UNet is told `0.25·ln σ` instead of a training timestep, over a continuous
    /// log-uniform schedule ([`crate::sampling::schedule::DiscreteSchedule::edm`]).
    EdmV,
    /// The velocity ε − x₀ of a rectified-flow model (SD3, FLUX): the latent at σ is
    /// `(1 − σ)·x₀ + σ·ε`, the denoised estimate `x − σ·v`, the input unscaled
    /// (ComfyUI's `CONST`). Its noise levels follow a [`crate::sampling::flow::FlowShift`].
    Flow,
}

/// Text conditioning for one sample: `tokens` vectors of width `dim`, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Conditioning {
    pub data: Vec<f32>,
    pub dim: i64,
    pub tokens: i64,
    /// The pooled text embedding (SDXL: OpenCLIP-G's projected end token).
    pub pooled: Option<Vec<f32>>,
    /// SDXL's size and crop conditioning.
    pub size: SizeCond,
    /// The distilled guidance of guidance-embedding models (FLUX.1 dev: ComfyUI's
    /// FluxGuidance / CLIPTextEncodeFlux / FluxDisableGuidance).
    pub guidance: Guidance,
    /// Latents the model sees beside the one it denoises (ComfyUI's `reference_latents`:
    /// FLUX.1 Kontext's input images), VAE space, in the order given.
    pub references: Vec<std::sync::Arc<ReferenceLatent>>,
    /// Where the references sit in the model's position ids (ComfyUI's
    /// `reference_latents_method`, FluxKontextMultiReferenceLatentMethod).
    /// `None`: the model's own (Kontext's offsets, FLUX.2's and Qwen-Image's indices).
    pub reference_method: Option<ReferenceMethod>,
    /// How many leading text tokens a transformer attends to (sd.cpp's Chroma DiT mask:
    /// the prompt, `</s>` and `mask_pad` pads; the rest of T5's padding is hidden as
    /// keys); `None`: all of them.
    pub text_keys: Option<i64>,
    /// Wan image to video (ComfyUI's `concat_latent_image` and `concat_mask`): what the
    /// model reads beside the noisy latent.
    pub video_image: Option<std::sync::Arc<VideoImage>>,
    /// CLIP-vision penultimate states the model reads beside the text (ComfyUI's
    /// `clip_vision_output` on a Wan I2V conditioning): [tokens][width].
    pub image_tokens: Option<std::sync::Arc<ImageTokens>>,
    /// Wan VACE controls (ComfyUI's `vace_frames`, `vace_mask`, `vace_strength`), in the
    /// order WanVaceToVideo nodes appended them.
    pub vace: Vec<std::sync::Arc<VaceControl>>,
}

/// A control video for Wan VACE, at latent resolution.
#[derive(Clone, Debug, PartialEq)]
pub struct VaceControl {
    /// VAE space, [32][T][H][W]: the inactive then the reactive part's latent (a
    /// reference image's latent, with the VAE's zero latent, as the first frame when given).
    pub frames: Vec<f32>,
    /// [64][T][H][W]: each latent pixel's 8×8 mask cells (1: the control applies).
    pub mask: Vec<f32>,
    pub length: usize,
    pub height: usize,
    pub width: usize,
    pub strength: f32,
}

/// A video's known frames for Wan I2V: their VAE latent over the whole video (grey where
/// no frame is given) and which latent sub-frames are known.
#[derive(Clone, Debug, PartialEq)]
pub struct VideoImage {
    /// VAE space, [C][T][H][W].
    pub latent: Vec<f32>,
    pub channels: usize,
    pub frames: usize,
    pub height: usize,
    pub width: usize,
    /// [4][T][H][W], 1 where the video's frame is given (channel k of latent frame t
    /// stands for video frame 4·t + k − 3, the first frame for all four).
    pub known: Vec<f32>,
}

/// Image tokens beside a text: [tokens][width] row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageTokens {
    pub data: Vec<f32>,
    pub width: usize,
}

/// A conditioning's distilled guidance.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Guidance {
    /// The model's default (FLUX.1 dev 3.5, Chroma 0).
    #[default]
    Default,
    Scale(f32),
    /// Not embedded at all (ComfyUI's FluxDisableGuidance: `guidance` None, so the model
    /// skips its guidance embedder; Chroma reads 0).
    Off,
}

impl Guidance {
    /// The scale, `default` for [`Guidance::Default`], `None` when off.
    pub fn scale_or(self, default: f32) -> Option<f32> {
        match self {
            Guidance::Default => Some(default),
            Guidance::Scale(g) => Some(g),
            Guidance::Off => None,
        }
    }
}

/// ComfyUI's placements of reference latents in FLUX's position ids.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ReferenceMethod {
    /// Index 1, each reference below or right of those before it (Kontext's default).
    #[default]
    Offset,
    /// Index 1, 2, … per reference, no spatial offset.
    Index,
    /// Index 0, each reference diagonally past the image and those before it (UXO/UNO).
    Uxo,
    /// `Index`, the references' tokens modulated as at σ = 0 (Qwen-Image-Edit-2511's
    /// `zero_cond_t`).
    IndexTimestepZero,
    /// `Offset`'s placement with the offsets counted in latent pixels, not patches (about
    /// twice ComfyUI's from the second reference on): sd.cpp's Kontext default.
    OffsetLatent,
    /// Index −1, −2, … per reference, no spatial offset (ComfyUI's `negative_index`,
    /// sd.cpp's DECREASE): Qwen-Image-Layered's input image before its layers.
    NegativeIndex,
}

/// One reference latent: the first sample of a VAE-space latent, planar [C][H][W].
#[derive(Clone, Debug, PartialEq)]
pub struct ReferenceLatent {
    pub data: Vec<f32>,
    pub channels: usize,
    pub height: usize,
    pub width: usize,
}

/// SDXL's micro-conditioning, as ComfyUI's CLIPTextEncodeSDXL(Refiner) sets it. Sizes
/// left unset are the image's (ComfyUI and sd.cpp both default to the latent's size
/// × 8), targets default to the size.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct SizeCond {
    pub width: Option<f64>,
    pub height: Option<f64>,
    pub crop_w: f64,
    pub crop_h: f64,
    pub target_width: Option<f64>,
    pub target_height: Option<f64>,
    /// The refiner's aesthetic score (ComfyUI: 6 for the positive prompt by default).
    pub aesthetic_score: Option<f64>,
}

/// Width of one scalar's sinusoidal embedding in SDXL's ADM vector.
const ADM_EMBED: usize = 256;

/// LDM's `timestep_embedding` of one value: cos of every frequency, then sin.
fn fourier(v: f64, out: &mut Vec<f32>) {
    let half = ADM_EMBED / 2;
    let freqs = (0..half).map(|i| (-(10000f64.ln()) * i as f64 / half as f64).exp());
    let args: Vec<f64> = freqs.map(|f| v * f).collect();
    out.extend(args.iter().map(|a| a.cos() as f32));
    out.extend(args.iter().map(|a| a.sin() as f32));
}

/// A1111's and sd.cpp's emphasis on one chunk's hidden states (`values`, rows of `d` by
/// token): each token scaled by its weight, then the whole chunk rescaled to its original
/// mean. Nothing changes when every weight is 1 or the new mean is zero or not finite.
pub fn emphasize(values: &mut [f32], weights: &[f32], d: usize) {
    if weights.iter().all(|&w| w == 1.0) {
        return;
    }
    let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
    let before = mean(values);
    for (row, &w) in values.chunks_mut(d).zip(weights) {
        row.iter_mut().for_each(|x| *x *= w);
    }
    let after = mean(values);
    if after != 0.0 && after.is_finite() && before.is_finite() {
        let k = (before / after) as f32;
        values.iter_mut().for_each(|x| *x *= k);
    }
}

impl Conditioning {
    pub fn new(data: Vec<f32>, dim: i64, tokens: i64) -> Result<Self> {
        if dim < 1 || tokens < 1 || data.len() as i64 != dim * tokens {
            return Err(ModelError::Input(format!("conditioning of {} values is not {tokens} tokens × {dim}", data.len())));
        }
        Ok(Conditioning { data, dim, tokens, pooled: None, size: SizeCond::default(), guidance: Guidance::Default, references: Vec::new(), reference_method: None, text_keys: None, video_image: None, image_tokens: None, vace: Vec::new() })
    }

    /// The ADM vector `y` of `width` values for an image of `image_w`×`image_h` pixels:
    /// the pooled embedding, then the embeddings of height, width, crop top, crop
    /// left and either target height and width (SDXL base, 6 scalars) or the aesthetic
    /// score (the refiner, 5), as `comfy/model_base.py`'s `encode_adm` lays them out.
    pub fn adm(&self, width: i64, image_w: i64, image_h: i64) -> Result<Vec<f32>> {
        let pooled = self.pooled.as_ref().ok_or_else(|| {
            ModelError::Input("this UNet (SDXL) needs a pooled text embedding, and the conditioning has none: encode the prompt with the SDXL checkpoint's CLIP".into())
        })?;
        let s = &self.size;
        let (w, h) = (s.width.unwrap_or(image_w as f64), s.height.unwrap_or(image_h as f64));
        let mut scalars = vec![h, w, s.crop_h, s.crop_w];
        let extra = width - pooled.len() as i64;
        if extra == 6 * ADM_EMBED as i64 {
            scalars.extend([s.target_height.unwrap_or(h), s.target_width.unwrap_or(w)]);
        } else if extra == 5 * ADM_EMBED as i64 {
            scalars.push(s.aesthetic_score.unwrap_or(6.0));
        } else {
            return Err(ModelError::Input(format!(
                "the UNet takes a {width}-wide ADM vector; a {}-wide pooled embedding leaves {extra} values, not 5 or 6 size embeddings of {ADM_EMBED}",
                pooled.len()
            )));
        }
        let mut y = Vec::with_capacity(width as usize);
        y.extend_from_slice(pooled);
        for v in scalars {
            fourier(v, &mut y);
        }
        Ok(y)
    }
}

/// Latent dimensions [W, H, C, N] (ggml order).
pub type LatentShape = [i64; 4];
