//! Random-weight checkpoints with the real Stable Diffusion architectures and key layouts.
//!
//! No machine here can download real weights, so tests, benchmarks and `sdflow demo` use
//! checkpoints made here: every tensor the original CompVis (SD1.x) / Stability (SD2.x)
//! single-file `.ckpt`/`.safetensors` holds, under the same names and shapes
//! (`model.diffusion_model.*`, `first_stage_model.*`, `cond_stage_model.*`), filled with
//! seeded random values at scales that keep activations finite through a real forward pass.
//!
//! The layout follows ldm's `openaimodel.UNetModel`, `autoencoder.AutoencoderKL` (KL-f8),
//! transformers' `CLIPTextModel` (SD1) and open_clip's text tower (SD2); the full-size tables
//! are checked against key/shape tables generated from those reference implementations
//! (`core/tests/fixtures/synth/gen_key_tables.py`).
//!
//! Not included: the DDPM schedule buffers (`betas`, `alphas_cumprod`, ...) and the SD1
//! `position_ids` buffer that some real checkpoints also carry; loaders do not need them.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::dtype::DType;

pub mod dit;

/// Errors of config validation and checkpoint writing.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("invalid synthetic model config: {0}")]
    Config(String),
    #[error("synthetic safetensors checkpoints can be written as f32, f16 or bf16, not {0}")]
    UnsupportedDType(DType),
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    File(#[from] crate::io::IoError),
    #[error("tensor '{tensor}': {source}")]
    Convert {
        tensor: String,
        #[source]
        source: crate::dtype::ConvertError,
    },
    #[error("header of {path}: {source}")]
    Header {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// Which Stable Diffusion generation: decides the text encoder and transformer projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SdVersion {
    /// SD 1.x: CLIP ViT-L/14 text encoder (`cond_stage_model.transformer.text_model.*`),
    /// 1x1-conv `proj_in`/`proj_out`.
    Sd1,
    /// SD 2.x: OpenCLIP ViT-H/14 text encoder (`cond_stage_model.model.*`), linear
    /// `proj_in`/`proj_out` (ldm's `use_linear_in_transformer`).
    Sd2,
    /// SDXL: CLIP-L (`conditioner.embedders.0.transformer.text_model.*`) and OpenCLIP-G
    /// (`conditioner.embedders.1.model.*`), per-level transformer depths and the ADM
    /// input (`label_emb`).
    Sdxl,
}

/// How attention heads are sized: ldm's `num_heads` (SD1) or `num_head_channels` (SD2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Heads {
    /// A fixed number of heads at every width (SD1: 8).
    Count(usize),
    /// A fixed channels-per-head (SD2: 64), so wider levels get more heads.
    HeadDim(usize),
}

/// ldm `UNetModel` hyper-parameters (names follow the ldm yaml configs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnetConfig {
    /// 4 for txt2img; 9 for inpainting models (latent + mask + masked-image latent); 8
    /// for instruct-pix2pix (latent + source image latent).
    pub in_channels: usize,
    pub out_channels: usize,
    pub model_channels: usize,
    pub channel_mult: Vec<usize>,
    pub num_res_blocks: usize,
    /// Downsampling factors (1, 2, 4, ...) at which SpatialTransformers are inserted.
    pub attention_resolutions: Vec<usize>,
    pub heads: Heads,
    pub context_dim: usize,
    pub transformer_depth: usize,
    pub use_linear_in_transformer: bool,
    /// Per-level transformer depths (SDXL: 0, 2, 10), overriding `transformer_depth`
    /// and `attention_resolutions` where given; the middle block takes the last.
    #[serde(default)]
    pub transformer_depths: Vec<usize>,
    /// Width of the ADM vector `label_emb` takes (SDXL: 2816).
    #[serde(default)]
    pub adm_in_channels: Option<usize>,
}

/// ldm KL autoencoder (`ddconfig`) hyper-parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VaeConfig {
    pub in_channels: usize,
    pub out_ch: usize,
    pub ch: usize,
    pub ch_mult: Vec<usize>,
    pub num_res_blocks: usize,
    pub z_channels: usize,
    pub embed_dim: usize,
}

/// Text transformer hyper-parameters (CLIP-L for SD1, OpenCLIP-H for SD2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextConfig {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub max_positions: usize,
    /// OpenCLIP's `text_projection` output width (`embed_dim`); unused by SD1's CLIP.
    pub projection_dim: usize,
}

/// One whole single-file SD checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SdConfig {
    pub version: SdVersion,
    pub unet: UnetConfig,
    pub vae: VaeConfig,
    pub text: TextConfig,
    /// SDXL's second text encoder (OpenCLIP-G).
    #[serde(default)]
    pub text2: Option<TextConfig>,
    /// CosXL's EDM v-prediction marker: `edm_vpred.sigma_min` / `sigma_max` scalars.
    #[serde(default)]
    pub edm_vpred: Option<(f32, f32)>,
    /// The empty marker tensors of v-prediction (`v_pred`) and zero-terminal-SNR
    /// (`ztsnr`) checkpoints, as ComfyUI saves them.
    #[serde(default)]
    pub markers: PredictionMarkers,
}

/// Which empty marker tensors a synthetic checkpoint carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PredictionMarkers {
    pub v_pred: bool,
    pub ztsnr: bool,
}

impl VaeConfig {
    /// The KL-f8 autoencoder every SD1.x/SD2.x checkpoint ships.
    pub fn kl_f8() -> Self {
        VaeConfig {
            in_channels: 3,
            out_ch: 3,
            ch: 128,
            ch_mult: vec![1, 2, 4, 4],
            num_res_blocks: 2,
            z_channels: 4,
            embed_dim: 4,
        }
    }

    /// Same structure with 2 levels (f4) at width 32.
    pub fn tiny() -> Self {
        VaeConfig { ch: 32, ch_mult: vec![1, 2], num_res_blocks: 1, ..Self::kl_f8() }
    }
}

impl SdConfig {
    /// Stable Diffusion 1.5 (`v1-inference.yaml`).
    pub fn sd15() -> Self {
        SdConfig {
            version: SdVersion::Sd1,
            unet: UnetConfig {
                in_channels: 4,
                out_channels: 4,
                model_channels: 320,
                channel_mult: vec![1, 2, 4, 4],
                num_res_blocks: 2,
                attention_resolutions: vec![4, 2, 1],
                heads: Heads::Count(8),
                context_dim: 768,
                transformer_depth: 1,
                use_linear_in_transformer: false,
                transformer_depths: Vec::new(),
                adm_in_channels: None,
            },
            vae: VaeConfig::kl_f8(),
            text: TextConfig {
                hidden: 768,
                layers: 12,
                heads: 12,
                intermediate: 3072,
                vocab: 49408,
                max_positions: 77,
                projection_dim: 768,
            },
            text2: None,
            edm_vpred: None,
            markers: PredictionMarkers::default(),
        }
    }

    /// Stable Diffusion 2.1 (`v2-inference-v.yaml`; 2.0/2.1-base share the layout).
    pub fn sd21() -> Self {
        SdConfig {
            version: SdVersion::Sd2,
            unet: UnetConfig {
                heads: Heads::HeadDim(64),
                context_dim: 1024,
                use_linear_in_transformer: true,
                ..Self::sd15().unet
            },
            vae: VaeConfig::kl_f8(),
            text: TextConfig {
                hidden: 1024,
                layers: 24,
                heads: 16,
                intermediate: 4096,
                vocab: 49408,
                max_positions: 77,
                projection_dim: 1024,
            },
            text2: None,
            edm_vpred: None,
            markers: PredictionMarkers::default(),
        }
    }

    /// SD1 structure at toy size (~3.7 M parameters, most in the real-vocabulary token
    /// embedding): 3 UNet levels with attention on the first two, 1 res block per level.
    pub fn tiny_sd1() -> Self {
        SdConfig {
            version: SdVersion::Sd1,
            unet: UnetConfig {
                in_channels: 4,
                out_channels: 4,
                model_channels: 32,
                channel_mult: vec![1, 2, 2],
                num_res_blocks: 1,
                attention_resolutions: vec![1, 2],
                heads: Heads::Count(2),
                context_dim: 32,
                transformer_depth: 1,
                use_linear_in_transformer: false,
                transformer_depths: Vec::new(),
                adm_in_channels: None,
            },
            vae: VaeConfig::tiny(),
            text: TextConfig {
                hidden: 32,
                layers: 2,
                heads: 2,
                intermediate: 64,
                vocab: 49408,
                max_positions: 77,
                projection_dim: 32,
            },
            text2: None,
            edm_vpred: None,
            markers: PredictionMarkers::default(),
        }
    }

    /// [`SdConfig::tiny_sd1`] with a KL-f8 VAE (4 levels), so images come out at the sizes
    /// a real SD1 checkpoint gives: for end-to-end runs (`sdflow demo`, the workflow tests).
    pub fn tiny_sd1_f8() -> Self {
        let mut cfg = Self::tiny_sd1();
        cfg.vae.ch_mult = vec![1, 1, 2, 2];
        cfg
    }

    /// [`SdConfig::tiny_sd1_f8`] with an instruct-pix2pix UNet: 8 input channels, the
    /// noisy latent and the source image's latent.
    pub fn tiny_sd1_pix2pix() -> Self {
        let mut cfg = Self::tiny_sd1_f8();
        cfg.unet.in_channels = 8;
        cfg
    }

    /// SD2 structure at toy size.
    pub fn tiny_sd2() -> Self {
        let base = Self::tiny_sd1();
        SdConfig {
            version: SdVersion::Sd2,
            unet: UnetConfig {
                heads: Heads::HeadDim(16),
                use_linear_in_transformer: true,
                ..base.unet
            },
            vae: VaeConfig::tiny(),
            text: TextConfig { intermediate: 128, ..base.text },
            text2: None,
            edm_vpred: None,
            markers: PredictionMarkers::default(),
        }
    }

    /// Stable Diffusion XL 1.0 base (`sd_xl_base.yaml`).
    pub fn sdxl() -> Self {
        SdConfig {
            version: SdVersion::Sdxl,
            unet: UnetConfig {
                in_channels: 4,
                out_channels: 4,
                model_channels: 320,
                channel_mult: vec![1, 2, 4],
                num_res_blocks: 2,
                attention_resolutions: vec![2, 4],
                heads: Heads::HeadDim(64),
                context_dim: 2048,
                transformer_depth: 1,
                use_linear_in_transformer: true,
                transformer_depths: vec![0, 2, 10],
                adm_in_channels: Some(2816),
            },
            vae: VaeConfig::kl_f8(),
            text: Self::sd15().text,
            text2: Some(TextConfig { hidden: 1280, layers: 32, heads: 20, intermediate: 5120, vocab: 49408, max_positions: 77, projection_dim: 1280 }),
            edm_vpred: None,
            markers: PredictionMarkers::default(),
        }
    }

    /// SDXL structure at toy size: attention on the lower two of three levels with
    /// depths 1 and 2, a 32-wide CLIP-L and a 64-wide OpenCLIP-G (context 96; the
    /// widths differ as the real ones do, which picks SDXL embeddings' vectors), a
    /// 64-wide pooled output.
    pub fn tiny_sdxl() -> Self {
        let text = Self::tiny_sd1().text;
        let base = Self::sdxl();
        SdConfig {
            unet: UnetConfig {
                model_channels: 32,
                channel_mult: vec![1, 2, 2],
                num_res_blocks: 1,
                heads: Heads::HeadDim(16),
                context_dim: 96,
                transformer_depths: vec![0, 1, 2],
                adm_in_channels: Some(64 + 6 * 256),
                ..base.unet
            },
            vae: VaeConfig { ch_mult: vec![1, 1, 2, 2], ..VaeConfig::tiny() },
            text: text.clone(),
            text2: Some(TextConfig { hidden: 64, intermediate: 128, projection_dim: 64, ..text }),
            ..base
        }
    }

    /// Checks the divisibility constraints the real modules assert at construction.
    pub fn validate(&self) -> Result<(), SynthError> {
        let err = |m: String| Err(SynthError::Config(m));
        let u = &self.unet;
        if u.channel_mult.is_empty() || u.num_res_blocks == 0 || u.model_channels == 0 {
            return err("unet: channel_mult, num_res_blocks and model_channels must be non-zero".into());
        }
        if u.in_channels == 0 || u.out_channels == 0 || u.context_dim == 0 {
            return err("unet: in/out channels and context_dim must be non-zero".into());
        }
        if !u.transformer_depths.is_empty() && u.transformer_depths.len() != u.channel_mult.len() {
            return err(format!("unet: {} transformer depths for {} levels", u.transformer_depths.len(), u.channel_mult.len()));
        }
        if self.version == SdVersion::Sdxl {
            let Some(t2) = &self.text2 else { return err("sdxl: the second text encoder (text2) is missing".into()) };
            if u.context_dim != self.text.hidden + t2.hidden || u.adm_in_channels != Some(t2.projection_dim + 6 * 256) {
                return err(format!("sdxl: context_dim must be {} and adm_in_channels {}", self.text.hidden + t2.hidden, t2.projection_dim + 6 * 256));
            }
        }
        if !self.unet.attention_resolutions.is_empty() && u.transformer_depth == 0 {
            return err("unet: transformer_depth must be at least 1".into());
        }
        for &m in &u.channel_mult {
            let c = u.model_channels * m;
            if !c.is_multiple_of(32) || c == 0 {
                return err(format!("unet: width {c} is not a multiple of 32 (GroupNorm groups)"));
            }
            let ok = match u.heads {
                Heads::Count(h) => h > 0 && c.is_multiple_of(h),
                Heads::HeadDim(d) => d > 0 && c.is_multiple_of(d),
            };
            if !ok {
                return err(format!("unet: width {c} is not divisible by {:?}", u.heads));
            }
        }
        let v = &self.vae;
        if v.ch_mult.is_empty() || v.num_res_blocks == 0 || v.z_channels == 0 || v.embed_dim == 0 {
            return err("vae: ch_mult, num_res_blocks, z_channels and embed_dim must be non-zero".into());
        }
        if v.in_channels == 0 || v.out_ch == 0 {
            return err("vae: in_channels and out_ch must be non-zero".into());
        }
        for &m in &v.ch_mult {
            let c = v.ch * m;
            if !c.is_multiple_of(32) || c == 0 {
                return err(format!("vae: width {c} is not a multiple of 32 (GroupNorm groups)"));
            }
        }
        let t = &self.text;
        if t.hidden == 0 || t.heads == 0 || !t.hidden.is_multiple_of(t.heads) {
            return err(format!("text: hidden {} is not divisible by heads {}", t.hidden, t.heads));
        }
        if t.layers == 0 || t.intermediate == 0 || t.vocab == 0 || t.max_positions == 0 {
            return err("text: layers, intermediate, vocab and max_positions must be non-zero".into());
        }
        if self.version == SdVersion::Sd2 && t.projection_dim == 0 {
            return err("text: projection_dim must be non-zero for OpenCLIP".into());
        }
        Ok(())
    }

    /// Every tensor of the checkpoint, in module order.
    pub fn tensors(&self) -> Result<Vec<TensorSpec>, SynthError> {
        self.validate()?;
        let mut out = Specs(Vec::new());
        unet(&mut out, "model.diffusion_model.", &self.unet);
        vae(&mut out, "first_stage_model.", &self.vae);
        match self.version {
            SdVersion::Sd1 => clip_l(&mut out, "cond_stage_model.transformer.text_model.", &self.text),
            SdVersion::Sd2 => open_clip(&mut out, "cond_stage_model.model.", &self.text),
            SdVersion::Sdxl => {
                clip_l(&mut out, "conditioner.embedders.0.transformer.text_model.", &self.text);
                let g = self.text2.as_ref().expect("validated");
                open_clip(&mut out, "conditioner.embedders.1.model.", g);
            }
        }
        if let Some((lo, hi)) = self.edm_vpred {
            let (min_key, max_key) = crate::detect::EDM_VPRED_KEYS;
            out.push(min_key.into(), vec![], Init::Constant(lo));
            out.push(max_key.into(), vec![], Init::Constant(hi));
        }
        for (on, key) in [(self.markers.v_pred, "v_pred"), (self.markers.ztsnr, "ztsnr")] {
            if on {
                out.push(key.into(), vec![0], Init::Constant(0.0));
            }
        }
        Ok(out.0)
    }
}

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Init {
    /// `mean + std * N(0, 1)`.
    Normal { mean: f32, std: f32 },
    Constant(f32),
    /// The sinusoidal positional table of shape [1, len, width] ([`sinusoids`]).
    Sinusoids,
}

/// One tensor of a synthetic checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorSpec {
    pub name: String,
    /// PyTorch order, as in the original checkpoints.
    pub shape: Vec<usize>,
    pub init: Init,
}

impl TensorSpec {
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The values of this tensor for `seed`. They depend only on the seed, the tensor's name
    /// and its init, so a tensor reads the same whatever else the checkpoint holds.
    pub fn values(&self, seed: u64) -> Vec<f32> {
        if self.init == Init::Sinusoids {
            let dim = |i: usize| self.shape.get(i).copied().unwrap_or(1);
            return sinusoids(dim(self.shape.len().saturating_sub(2)), dim(self.shape.len().saturating_sub(1)));
        }
        let mut stream = ValueStream::new(self, seed);
        (0..self.n_elements()).map(|_| stream.next()).collect()
    }
}

/// Draws a tensor's values in order, so large tensors can be written chunk by chunk.
struct ValueStream {
    rng: ChaCha8Rng,
    init: Init,
}

impl ValueStream {
    fn new(spec: &TensorSpec, seed: u64) -> Self {
        ValueStream { rng: ChaCha8Rng::seed_from_u64(seed ^ fnv1a(spec.name.as_bytes())), init: spec.init }
    }

    fn next(&mut self) -> f32 {
        match self.init {
            Init::Constant(c) => c,
            Init::Sinusoids => unreachable!("tables are computed whole"),
            Init::Normal { mean, std } => {
                let z: f32 = StandardNormal.sample(&mut self.rng);
                mean + std * z
            }
        }
    }
}

/// A fixed, platform-independent string hash (std's hasher is randomized per process).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Small scale for biases and norm jitter: non-zero so a missing bias add or norm affine
/// changes results (and a comparison with a reference catches it), small enough not to matter.
const BIAS_STD: f32 = 0.02;

struct Specs(Vec<TensorSpec>);

impl Specs {
    fn push(&mut self, name: String, shape: Vec<usize>, init: Init) {
        self.0.push(TensorSpec { name, shape, init });
    }

    /// Linear or conv weight, `[out, in, kh, kw]`: std 1/sqrt(fan_in) keeps each layer's
    /// output variance near its input's (LeCun), so deep stacks neither vanish nor overflow f16.
    fn weight(&mut self, name: String, shape: Vec<usize>) {
        let fan_in: usize = shape[1..].iter().product::<usize>().max(1);
        let std = 1.0 / (fan_in as f32).sqrt();
        self.push(name, shape, Init::Normal { mean: 0.0, std });
    }

    fn bias(&mut self, name: String, n: usize) {
        self.push(name, vec![n], Init::Normal { mean: 0.0, std: BIAS_STD });
    }

    fn linear(&mut self, p: &str, cin: usize, cout: usize, bias: bool) {
        self.weight(format!("{p}.weight"), vec![cout, cin]);
        if bias {
            self.bias(format!("{p}.bias"), cout);
        }
    }

    fn conv(&mut self, p: &str, cin: usize, cout: usize, k: usize) {
        self.weight(format!("{p}.weight"), vec![cout, cin, k, k]);
        self.bias(format!("{p}.bias"), cout);
    }

    /// GroupNorm or LayerNorm affine: weight ~1, bias ~0.
    fn norm(&mut self, p: &str, c: usize) {
        self.push(format!("{p}.weight"), vec![c], Init::Normal { mean: 1.0, std: BIAS_STD });
        self.bias(format!("{p}.bias"), c);
    }
}

/// ldm `ResBlock` with a timestep embedding.
fn unet_resblock(s: &mut Specs, p: &str, cin: usize, cout: usize, emb: usize) {
    s.norm(&format!("{p}.in_layers.0"), cin);
    s.conv(&format!("{p}.in_layers.2"), cin, cout, 3);
    s.linear(&format!("{p}.emb_layers.1"), emb, cout, true);
    s.norm(&format!("{p}.out_layers.0"), cout);
    s.conv(&format!("{p}.out_layers.3"), cout, cout, 3);
    if cin != cout {
        s.conv(&format!("{p}.skip_connection"), cin, cout, 1);
    }
}

/// ldm `SpatialTransformer` (inner dim = heads * head dim = channels for every SD config).
fn spatial_transformer(s: &mut Specs, p: &str, c: usize, u: &UnetConfig, depth: usize) {
    let inner = c;
    s.norm(&format!("{p}.norm"), c);
    let proj = |s: &mut Specs, name: String, cin: usize, cout: usize| {
        if u.use_linear_in_transformer {
            s.linear(&name, cin, cout, true);
        } else {
            s.conv(&name, cin, cout, 1);
        }
    };
    proj(s, format!("{p}.proj_in"), c, inner);
    for d in 0..depth {
        let b = format!("{p}.transformer_blocks.{d}");
        for (attn, kv_dim) in [("attn1", inner), ("attn2", u.context_dim)] {
            s.linear(&format!("{b}.{attn}.to_q"), inner, inner, false);
            s.linear(&format!("{b}.{attn}.to_k"), kv_dim, inner, false);
            s.linear(&format!("{b}.{attn}.to_v"), kv_dim, inner, false);
            s.linear(&format!("{b}.{attn}.to_out.0"), inner, inner, true);
        }
        // GEGLU: one projection yields both the value and the gate halves.
        s.linear(&format!("{b}.ff.net.0.proj"), inner, inner * 4 * 2, true);
        s.linear(&format!("{b}.ff.net.2"), inner * 4, inner, true);
        for n in ["norm1", "norm2", "norm3"] {
            s.norm(&format!("{b}.{n}"), inner);
        }
    }
    proj(s, format!("{p}.proj_out"), inner, c);
}

fn unet(s: &mut Specs, p: &str, u: &UnetConfig) {
    let mc = u.model_channels;
    let emb = mc * 4;
    let mut skip_chans = unet_encoder(s, p, u);
    let mut ch = *skip_chans.last().expect("input_blocks.0 at least");
    let mut ds = 1 << (u.channel_mult.len() - 1);
    let mut idx = 0;
    for (level, &mult) in u.channel_mult.iter().enumerate().rev() {
        for i in 0..=u.num_res_blocks {
            let b = format!("{p}output_blocks.{idx}");
            let skip = skip_chans.pop().expect("one skip per input block");
            unet_resblock(s, &format!("{b}.0"), ch + skip, mc * mult, emb);
            ch = mc * mult;
            let mut layer = 1;
            if depth_at(u, level, ds) > 0 {
                spatial_transformer(s, &format!("{b}.1"), ch, u, depth_at(u, level, ds));
                layer = 2;
            }
            if level > 0 && i == u.num_res_blocks {
                s.conv(&format!("{b}.{layer}.conv"), ch, ch, 3);
                ds /= 2;
            }
            idx += 1;
        }
    }
    s.norm(&format!("{p}out.0"), ch);
    s.conv(&format!("{p}out.2"), mc, u.out_channels, 3);
}

/// The transformer depth at a level (0: none), `ds` its downsampling factor.
fn depth_at(u: &UnetConfig, level: usize, ds: usize) -> usize {
    match u.transformer_depths.get(level) {
        Some(&d) => d,
        None if u.attention_resolutions.contains(&ds) => u.transformer_depth,
        None => 0,
    }
}

/// Time (and label) embedding, input blocks and middle block of ldm's `UNetModel` (what
/// a ControlNet copies); returns each skip's channels, `input_blocks.0` first.
fn unet_encoder(s: &mut Specs, p: &str, u: &UnetConfig) -> Vec<usize> {
    let mc = u.model_channels;
    let emb = mc * 4;
    s.linear(&format!("{p}time_embed.0"), mc, emb, true);
    s.linear(&format!("{p}time_embed.2"), emb, emb, true);
    if let Some(adm) = u.adm_in_channels {
        s.linear(&format!("{p}label_emb.0.0"), adm, emb, true);
        s.linear(&format!("{p}label_emb.0.2"), emb, emb, true);
    }
    s.conv(&format!("{p}input_blocks.0.0"), u.in_channels, mc, 3);
    let mut skip_chans = vec![mc];
    let mut ch = mc;
    let mut ds = 1;
    let mut idx = 1;
    let levels = u.channel_mult.len();
    for (level, &mult) in u.channel_mult.iter().enumerate() {
        for _ in 0..u.num_res_blocks {
            let b = format!("{p}input_blocks.{idx}");
            unet_resblock(s, &format!("{b}.0"), ch, mult * mc, emb);
            ch = mult * mc;
            if depth_at(u, level, ds) > 0 {
                spatial_transformer(s, &format!("{b}.1"), ch, u, depth_at(u, level, ds));
            }
            skip_chans.push(ch);
            idx += 1;
        }
        if level + 1 != levels {
            s.conv(&format!("{p}input_blocks.{idx}.0.op"), ch, ch, 3);
            skip_chans.push(ch);
            ds *= 2;
            idx += 1;
        }
    }
    unet_resblock(s, &format!("{p}middle_block.0"), ch, ch, emb);
    spatial_transformer(s, &format!("{p}middle_block.1"), ch, u, u.transformer_depths.last().copied().unwrap_or(u.transformer_depth).max(1));
    unet_resblock(s, &format!("{p}middle_block.2"), ch, ch, emb);
    skip_chans
}

/// ldm `ControlNet` (cldm) for a UNet of `u`: the hint encoder (ldm's fixed widths 16,
/// 32, 96, 256 from `hint_channels`), the UNet's encoder, and a 1×1 zero convolution
/// per skip and for the middle block (random here, as after training, so they act).
pub fn controlnet_tensors(u: &UnetConfig, hint_channels: usize) -> Vec<TensorSpec> {
    let p = "control_model.";
    let mut s = Specs(Vec::new());
    let mut cin = hint_channels;
    for (i, cout) in [16, 16, 32, 32, 96, 96, 256, u.model_channels].into_iter().enumerate() {
        s.conv(&format!("{p}input_hint_block.{}", 2 * i), cin, cout, 3);
        cin = cout;
    }
    let skips = unet_encoder(&mut s, p, u);
    for (i, &c) in skips.iter().enumerate() {
        s.conv(&format!("{p}zero_convs.{i}.0"), c, c, 1);
    }
    let mid = *skips.last().expect("input_blocks.0 at least");
    s.conv(&format!("{p}middle_block_out.0"), mid, mid, 1);
    s.0
}

/// Writes [`controlnet_tensors`] as an f32 safetensors file (a ControlNet for the
/// checkpoints [`write_checkpoint`] writes with the same UNet config).
pub fn write_controlnet(path: &Path, u: &UnetConfig, hint_channels: usize, seed: u64) -> Result<(), SynthError> {
    let specs = controlnet_tensors(u, hint_channels);
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = specs.iter().map(|t| (t.name.clone(), t.shape.clone(), t.values(seed).iter().flat_map(|v| v.to_le_bytes()).collect())).collect();
    crate::io::safetensors::write(path, data.iter().map(|(n, shape, b)| (n.as_str(), DType::F32, shape.clone(), b.as_slice())), &std::collections::BTreeMap::new())?;
    Ok(())
}

/// ldm autoencoder `ResnetBlock` without timestep embedding.
fn vae_resblock(s: &mut Specs, p: &str, cin: usize, cout: usize) {
    s.norm(&format!("{p}.norm1"), cin);
    s.conv(&format!("{p}.conv1"), cin, cout, 3);
    s.norm(&format!("{p}.norm2"), cout);
    s.conv(&format!("{p}.conv2"), cout, cout, 3);
    if cin != cout {
        s.conv(&format!("{p}.nin_shortcut"), cin, cout, 1);
    }
}

/// ldm `AttnBlock`: single-head attention with 1x1 convs for q, k, v and the output.
fn vae_attn(s: &mut Specs, p: &str, c: usize) {
    s.norm(&format!("{p}.norm"), c);
    for n in ["q", "k", "v", "proj_out"] {
        s.conv(&format!("{p}.{n}"), c, c, 1);
    }
}

fn vae_mid(s: &mut Specs, p: &str, c: usize) {
    vae_resblock(s, &format!("{p}mid.block_1"), c, c);
    vae_attn(s, &format!("{p}mid.attn_1"), c);
    vae_resblock(s, &format!("{p}mid.block_2"), c, c);
}

fn vae(s: &mut Specs, p: &str, v: &VaeConfig) {
    let levels = v.ch_mult.len();
    let e = format!("{p}encoder.");
    s.conv(&format!("{e}conv_in"), v.in_channels, v.ch, 3);
    let mut block_in = v.ch;
    for (i, &mult) in v.ch_mult.iter().enumerate() {
        let block_out = v.ch * mult;
        for j in 0..v.num_res_blocks {
            vae_resblock(s, &format!("{e}down.{i}.block.{j}"), block_in, block_out);
            block_in = block_out;
        }
        if i + 1 != levels {
            s.conv(&format!("{e}down.{i}.downsample.conv"), block_in, block_in, 3);
        }
    }
    vae_mid(s, &e, block_in);
    s.norm(&format!("{e}norm_out"), block_in);
    // double_z: the encoder emits mean and log-variance.
    s.conv(&format!("{e}conv_out"), block_in, 2 * v.z_channels, 3);

    let d = format!("{p}decoder.");
    let mut block_in = v.ch * v.ch_mult[levels - 1];
    s.conv(&format!("{d}conv_in"), v.z_channels, block_in, 3);
    vae_mid(s, &d, block_in);
    for (i, &mult) in v.ch_mult.iter().enumerate().rev() {
        let block_out = v.ch * mult;
        for j in 0..=v.num_res_blocks {
            vae_resblock(s, &format!("{d}up.{i}.block.{j}"), block_in, block_out);
            block_in = block_out;
        }
        if i != 0 {
            s.conv(&format!("{d}up.{i}.upsample.conv"), block_in, block_in, 3);
        }
    }
    s.norm(&format!("{d}norm_out"), block_in);
    s.conv(&format!("{d}conv_out"), block_in, v.out_ch, 3);

    s.conv(&format!("{p}quant_conv"), 2 * v.z_channels, 2 * v.embed_dim, 1);
    s.conv(&format!("{p}post_quant_conv"), v.embed_dim, v.z_channels, 1);
}

/// transformers `CLIPTextModel` (SD1's `FrozenCLIPEmbedder`).
fn clip_l(s: &mut Specs, p: &str, t: &TextConfig) {
    let h = t.hidden;
    s.push(
        format!("{p}embeddings.token_embedding.weight"),
        vec![t.vocab, h],
        Init::Normal { mean: 0.0, std: 0.02 },
    );
    s.push(
        format!("{p}embeddings.position_embedding.weight"),
        vec![t.max_positions, h],
        Init::Normal { mean: 0.0, std: 0.01 },
    );
    for l in 0..t.layers {
        let b = format!("{p}encoder.layers.{l}");
        for n in ["k_proj", "v_proj", "q_proj", "out_proj"] {
            s.linear(&format!("{b}.self_attn.{n}"), h, h, true);
        }
        s.norm(&format!("{b}.layer_norm1"), h);
        s.linear(&format!("{b}.mlp.fc1"), h, t.intermediate, true);
        s.linear(&format!("{b}.mlp.fc2"), t.intermediate, h, true);
        s.norm(&format!("{b}.layer_norm2"), h);
    }
    s.norm(&format!("{p}final_layer_norm"), h);
}

/// open_clip's text tower as SD2's `FrozenOpenCLIPEmbedder` keeps it (visual tower deleted).
fn open_clip(s: &mut Specs, p: &str, t: &TextConfig) {
    let w = t.hidden;
    s.push(format!("{p}positional_embedding"), vec![t.max_positions, w], Init::Normal { mean: 0.0, std: 0.01 });
    // open_clip applies it as `x @ text_projection`, so fan-in is the first dimension.
    s.push(
        format!("{p}text_projection"),
        vec![w, t.projection_dim],
        Init::Normal { mean: 0.0, std: 1.0 / (w as f32).sqrt() },
    );
    // CLIP's learned temperature, initialised to ln(1 / 0.07).
    s.push(format!("{p}logit_scale"), vec![], Init::Constant((1.0f32 / 0.07).ln()));
    s.push(format!("{p}token_embedding.weight"), vec![t.vocab, w], Init::Normal { mean: 0.0, std: 0.02 });
    for l in 0..t.layers {
        let b = format!("{p}transformer.resblocks.{l}");
        s.weight(format!("{b}.attn.in_proj_weight"), vec![3 * w, w]);
        s.bias(format!("{b}.attn.in_proj_bias"), 3 * w);
        s.linear(&format!("{b}.attn.out_proj"), w, w, true);
        s.norm(&format!("{b}.ln_1"), w);
        s.norm(&format!("{b}.ln_2"), w);
        s.linear(&format!("{b}.mlp.c_fc"), w, t.intermediate, true);
        s.linear(&format!("{b}.mlp.c_proj"), t.intermediate, w, true);
    }
    s.norm(&format!("{p}ln_final"), w);
}

/// Container format of a written checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Format {
    /// Streamed; f32, f16 or bf16.
    Safetensors,
    /// GGUF as `sd -M convert` writes it (original tensor names, any ggml type; tensors the
    /// type rules exempt, such as biases and embeddings, stay f32). Written through
    /// `io::gguf::write`, which takes every tensor's bytes at once, so the whole model is
    /// held in memory (once): meant for small configs.
    Gguf,
}

/// What [`write_checkpoint`] wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrittenCheckpoint {
    pub path: PathBuf,
    pub tensors: usize,
    pub elements: u64,
    pub bytes: u64,
}

/// Writes a random-weight checkpoint for `cfg` to `path`.
///
/// Streams tensor by tensor in bounded chunks (memory stays a few MB even for full SD2.1),
/// into `path` + `.partial`, renamed into place only when complete, so an interrupted run
/// never leaves a truncated file that a cache check would take for finished. The config,
/// seed and generator version go into the safetensors `__metadata__`.
pub fn write_checkpoint(
    path: &Path,
    cfg: &SdConfig,
    dtype: DType,
    seed: u64,
    format: Format,
) -> Result<WrittenCheckpoint, SynthError> {
    let config = serde_json::to_string(cfg).map_err(|source| SynthError::Header { path: path.to_path_buf(), source })?;
    write_specs(path, &cfg.tensors()?, &config, dtype, seed, format)
}

/// Writes the tensors `specs` with their seeded values, `config` (the generating config as
/// JSON) recorded in the metadata beside the seed: the writer under [`write_checkpoint`] and
/// the other families' ([`dit`]).
pub fn write_specs(path: &Path, specs: &[TensorSpec], config: &str, dtype: DType, seed: u64, format: Format) -> Result<WrittenCheckpoint, SynthError> {
    match format {
        Format::Safetensors => write_safetensors(path, specs, config, dtype, seed),
        Format::Gguf => write_gguf(path, specs, config, dtype, seed),
    }
}

/// Returns `path` if it already holds the checkpoint `write_checkpoint` would write for
/// these arguments (judged by the config, seed and generator version in its metadata and by
/// its dtype), writing it first otherwise. For caches such as the load benchmark's and
/// `sdflow demo`'s; `Ok(true)` when it had to write.
pub fn ensure_checkpoint(
    path: &Path,
    cfg: &SdConfig,
    dtype: DType,
    seed: u64,
    format: Format,
) -> Result<bool, SynthError> {
    if path.exists() && is_synth_checkpoint(path, cfg, dtype, seed) {
        return Ok(false);
    }
    write_checkpoint(path, cfg, dtype, seed, format)?;
    Ok(true)
}

fn is_synth_checkpoint(path: &Path, cfg: &SdConfig, dtype: DType, seed: u64) -> bool {
    let Ok(src) = crate::io::open(path) else { return false };
    let meta = src.metadata();
    let stored: Option<SdConfig> =
        meta.get("sdflow.synth.config").and_then(|c| serde_json::from_str(c).ok());
    let seed_ok = meta.get("sdflow.synth.seed") == Some(&seed.to_string());
    let gen_ok = meta.get("sdflow.synth.generator").map(String::as_str) == Some(GENERATOR);
    // The weights (not biases, which the GGUF type rules may keep in f32) carry the dtype.
    let dtype_ok = src
        .get("model.diffusion_model.input_blocks.0.0.weight")
        .is_some_and(|t| t.dtype == dtype || (!dtype.is_float() && t.dtype == DType::F32));
    stored.as_ref() == Some(cfg) && seed_ok && gen_ok && dtype_ok && src.tensors().len() == cfg.tensors().map_or(0, |t| t.len())
}

/// Bumped whenever the values or layout written for a given config and seed change, so
/// caches made by an older generator are rewritten.
const GENERATOR: &str = "1";

fn partial_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

fn write_gguf(path: &Path, specs: &[TensorSpec], config: &str, dtype: DType, seed: u64) -> Result<WrittenCheckpoint, SynthError> {
    use crate::io::{gguf, TensorInfo, TypeRules};
    if dtype.ggml_type().is_none() {
        return Err(SynthError::UnsupportedDType(dtype));
    }
    let rules = TypeRules::new(Some(dtype), "")?;
    let one = |s: &TensorSpec| -> Result<(String, DType, Vec<usize>, Vec<u8>), SynthError> {
        let values = s.values(seed);
        let target = rules.target(&TensorInfo::detached(s.name.clone(), DType::F32, s.shape.clone()));
        let mut bytes = Vec::new();
        match target {
            DType::F32 | DType::F16 | DType::BF16 => encode(target, &values, &mut bytes),
            _ => {
                encode(DType::F32, &values, &mut bytes);
                bytes = crate::dtype::convert(DType::F32, &bytes, &s.shape, target)
                    .map_err(|source| SynthError::Convert { tensor: s.name.clone(), source })?;
            }
        }
        Ok((s.name.clone(), target, s.shape.clone(), bytes))
    };
    // Each tensor's values depend only on its spec and the seed, so the tensors are drawn
    // and quantized on all cores (a full-size FLUX.1 in Q4_K: 12 billion values).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(specs.len().max(1));
    let mut slots: Vec<Option<Result<(String, DType, Vec<usize>, Vec<u8>), SynthError>>> = (0..specs.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let one = &one;
                scope.spawn(move || specs.iter().enumerate().skip(t).step_by(threads).map(|(i, s)| (i, one(s))).collect::<Vec<_>>())
            })
            .collect();
        for w in workers {
            for (i, r) in w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)) {
                slots[i] = Some(r);
            }
        }
    });
    let data = slots.into_iter().map(|r| r.expect("every tensor was drawn")).collect::<Result<Vec<_>, _>>()?;
    let elements = specs.iter().map(|s| s.n_elements() as u64).sum::<u64>();
    let kv = vec![
        ("sdflow.synth.config".to_string(), gguf::Value::String(config.to_string())),
        ("sdflow.synth.seed".to_string(), gguf::Value::String(seed.to_string())),
        ("sdflow.synth.generator".to_string(), gguf::Value::String(GENERATOR.into())),
    ];
    let partial = partial_path(path);
    if let Err(e) = gguf::write(&partial, &kv, data.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice()))) {
        let _ = std::fs::remove_file(&partial);
        return Err(e.into());
    }
    std::fs::rename(&partial, path).map_err(|source| SynthError::Io { path: path.to_path_buf(), source })?;
    let bytes = std::fs::metadata(path).map_err(|source| SynthError::Io { path: path.to_path_buf(), source })?.len();
    Ok(WrittenCheckpoint { path: path.to_path_buf(), tensors: specs.len(), elements, bytes })
}

fn element_bytes(dtype: DType) -> Result<usize, SynthError> {
    match dtype {
        DType::F32 => Ok(4),
        DType::F16 | DType::BF16 => Ok(2),
        other => Err(SynthError::UnsupportedDType(other)),
    }
}

fn encode(dtype: DType, values: &[f32], out: &mut Vec<u8>) {
    out.clear();
    match dtype {
        DType::F32 => values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::F16 => values.iter().for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_le_bytes())),
        DType::BF16 => values.iter().for_each(|v| out.extend_from_slice(&bf16::from_f32(*v).to_le_bytes())),
        _ => unreachable!("element_bytes rejected other dtypes"),
    }
}

fn write_safetensors(path: &Path, specs: &[TensorSpec], config: &str, dtype: DType, seed: u64) -> Result<WrittenCheckpoint, SynthError> {
    let esize = element_bytes(dtype)?;
    let st_name = dtype.safetensors_name().ok_or(SynthError::UnsupportedDType(dtype))?;
    let io_err = |source| SynthError::Io { path: path.to_path_buf(), source };

    let mut header = serde_json::Map::new();
    let meta = serde_json::json!({
        "format": "pt",
        "sdflow.synth.config": config,
        "sdflow.synth.seed": seed.to_string(),
        "sdflow.synth.generator": GENERATOR,
    });
    header.insert("__metadata__".into(), meta);
    let mut offset = 0u64;
    let mut elements = 0u64;
    for s in specs {
        let n = s.n_elements() as u64;
        let len = n * esize as u64;
        header.insert(
            s.name.clone(),
            serde_json::json!({ "dtype": st_name, "shape": s.shape, "data_offsets": [offset, offset + len] }),
        );
        offset += len;
        elements += n;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(header))
        .map_err(|source| SynthError::Header { path: path.to_path_buf(), source })?;
    // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
    while json.len() % 8 != 0 {
        json.push(b' ');
    }

    let partial = partial_path(path);
    let file = File::create(&partial).map_err(|source| SynthError::Io { path: partial.clone(), source })?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let result = (|| -> std::io::Result<()> {
        w.write_all(&(json.len() as u64).to_le_bytes())?;
        w.write_all(&json)?;
        const CHUNK: usize = 1 << 18;
        let mut vals = vec![0f32; CHUNK];
        let mut bytes = Vec::with_capacity(CHUNK * esize);
        for s in specs {
            let mut stream = ValueStream::new(s, seed);
            let mut left = s.n_elements();
            while left > 0 {
                let n = left.min(CHUNK);
                vals[..n].iter_mut().for_each(|v| *v = stream.next());
                encode(dtype, &vals[..n], &mut bytes);
                w.write_all(&bytes)?;
                left -= n;
            }
        }
        w.flush()?;
        w.get_ref().sync_all()
    })();
    if let Err(source) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(SynthError::Io { path: partial, source });
    }
    drop(w);
    std::fs::rename(&partial, path).map_err(io_err)?;
    Ok(WrittenCheckpoint {
        path: path.to_path_buf(),
        tensors: specs.len(),
        elements,
        bytes: 8 + json.len() as u64 + offset,
    })
}

/// A CLIP vision tower (`CLIPVisionModelWithProjection`, Hugging Face names as ComfyUI's
/// `models/clip_vision` files have them) at any size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClipVisionSynth {
    pub hidden: usize,
    pub layers: usize,
    pub intermediate: usize,
    pub patch: usize,
    pub image_size: usize,
    pub projection_dim: usize,
}

impl ClipVisionSynth {
    /// ViT-H/14's structure at toy width (16 heads of 2), at the real 224-pixel input
    /// with 32-pixel patches (50 tokens), for [`SdConfig::tiny_sd1`]'s 32-wide context.
    pub fn tiny() -> Self {
        ClipVisionSynth { hidden: 32, layers: 2, intermediate: 64, patch: 32, image_size: 224, projection_dim: 32 }
    }

/// Tokens per image: the patch grid and the class token.
    pub fn tokens(&self) -> usize {
        (self.image_size / self.patch).pow(2) + 1
    }

        pub fn tensors(&self) -> Result<Vec<TensorSpec>, SynthError> {
        if self.hidden == 0 || self.layers < 2 || self.patch == 0 || !self.image_size.is_multiple_of(self.patch) || self.projection_dim == 0 {
            return Err(SynthError::Config(format!("clip vision: {self:?}")));
        }
        let mut s = Specs(Vec::new());
        let (d, p) = (self.hidden, "vision_model");
        s.push(format!("{p}.embeddings.class_embedding"), vec![d], Init::Normal { mean: 0.0, std: 0.5 });
        s.push(format!("{p}.embeddings.patch_embedding.weight"), vec![d, 3, self.patch, self.patch], Init::Normal { mean: 0.0, std: 1.0 / ((3 * self.patch * self.patch) as f32).sqrt() });
        let tokens = (self.image_size / self.patch).pow(2) + 1;
        s.push(format!("{p}.embeddings.position_embedding.weight"), vec![tokens, d], Init::Normal { mean: 0.0, std: 0.5 });
        s.norm(&format!("{p}.pre_layrnorm"), d);
        for i in 0..self.layers {
            let l = format!("{p}.encoder.layers.{i}");
            for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                s.linear(&format!("{l}.self_attn.{proj}"), d, d, true);
            }
            s.norm(&format!("{l}.layer_norm1"), d);
            s.norm(&format!("{l}.layer_norm2"), d);
            s.linear(&format!("{l}.mlp.fc1"), d, self.intermediate, true);
            s.linear(&format!("{l}.mlp.fc2"), self.intermediate, d, true);
        }
        s.norm(&format!("{p}.post_layernorm"), d);
        s.linear("visual_projection", d, self.projection_dim, false);
        Ok(s.0)
    }
}

/// Which IP-Adapter image projection [`ip_adapter_tensors`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpAdapterSynth {
    /// `image_proj.proj` + `norm`: `tokens` tokens from `image_embeds` of `embed_dim`.
    Classic { embed_dim: usize, tokens: usize },
    /// The Plus resampler over hidden states of `embed_dim`: `dim` wide with 64-wide
    /// heads, `depth` layers, `tokens` latent queries.
    Plus { embed_dim: usize, dim: usize, depth: usize, tokens: usize },
}

/// Every tensor of an h94 IP-Adapter file (`image_proj.*`, `ip_adapter.N.to_k_ip` /
/// `to_v_ip`) for a UNet whose cross-attention layers have the widths `layers` (in
/// diffusers' processor order, `crate::models::sd::ip_adapter::cross_attention_blocks`) and
/// take `cross_dim`-wide context.
pub fn ip_adapter_tensors(kind: IpAdapterSynth, layers: &[usize], cross_dim: usize) -> Vec<TensorSpec> {
    let mut s = Specs(Vec::new());
    match kind {
        IpAdapterSynth::Classic { embed_dim, tokens } => {
            s.linear("image_proj.proj", embed_dim, tokens * cross_dim, true);
            s.norm("image_proj.norm", cross_dim);
        }
        IpAdapterSynth::Plus { embed_dim, dim, depth, tokens } => {
            s.push("image_proj.latents".into(), vec![1, tokens, dim], Init::Normal { mean: 0.0, std: 1.0 / (dim as f32).sqrt() });
            s.linear("image_proj.proj_in", embed_dim, dim, true);
            for i in 0..depth {
                let l = format!("image_proj.layers.{i}");
                s.norm(&format!("{l}.0.norm1"), dim);
                s.norm(&format!("{l}.0.norm2"), dim);
                s.linear(&format!("{l}.0.to_q"), dim, dim, false);
                s.linear(&format!("{l}.0.to_kv"), dim, 2 * dim, false);
                s.linear(&format!("{l}.0.to_out"), dim, dim, false);
                s.norm(&format!("{l}.1.0"), dim);
                s.linear(&format!("{l}.1.1"), dim, 4 * dim, false);
                s.linear(&format!("{l}.1.3"), 4 * dim, dim, false);
            }
            s.linear("image_proj.proj_out", dim, cross_dim, true);
            s.norm("image_proj.norm_out", cross_dim);
        }
    }
    for (k, &c) in layers.iter().enumerate() {
        s.linear(&format!("ip_adapter.{}.to_k_ip", 2 * k + 1), cross_dim, c, false);
        s.linear(&format!("ip_adapter.{}.to_v_ip", 2 * k + 1), cross_dim, c, false);
    }
    s.0
}

/// Every tensor of an official PhotoMaker file (`id_encoder.*`, `lora_weights.unet.*`) at
/// toy widths, for tests: the ID encoder over the vision tower `vision` (its projection
/// is CLIP-L's part of the prompt) with `visual_projection_2` to `proj2` (OpenCLIP-G's
/// part), fused `vision.projection_dim + proj2` wide; with `face_dim`, v2's face-token
/// path (two tokens per image, one resampler layer with a single head, as a toy width
/// allows); and a rank-4 LoRA over every attention projection of `unet`'s UNet in the
/// old diffusers attention-processor names PhotoMaker ships.
pub fn photomaker_tensors(vision: &ClipVisionSynth, proj2: usize, face_dim: Option<usize>, unet: &SdConfig) -> Result<Vec<TensorSpec>, SynthError> {
    let mut s = Specs(Vec::new());
    for mut t in vision.tensors()? {
        t.name = format!("id_encoder.{}", t.name);
        s.0.push(t);
    }
    let (h, d) = (vision.hidden, vision.projection_dim + proj2);
    s.linear("id_encoder.visual_projection_2", h, proj2, false);
    for (name, cin) in [("mlp1", 2 * d), ("mlp2", d)] {
        s.norm(&format!("id_encoder.fuse_module.{name}.layernorm"), cin);
        s.linear(&format!("id_encoder.fuse_module.{name}.fc1"), cin, d, true);
        s.linear(&format!("id_encoder.fuse_module.{name}.fc2"), d, d, true);
    }
    s.norm("id_encoder.fuse_module.layer_norm", d);
    if let Some(f) = face_dim {
        let q = "id_encoder.qformer_perceiver";
        s.linear(&format!("{q}.token_proj.0"), f, 4 * f, true);
        s.linear(&format!("{q}.token_proj.2"), 4 * f, 2 * d, true);
        s.norm(&format!("{q}.token_norm"), d);
        let r = format!("{q}.perceiver_resampler");
        s.linear(&format!("{r}.proj_in"), h, d, true);
        let l = format!("{r}.layers.0");
        s.norm(&format!("{l}.0.norm1"), d);
        s.norm(&format!("{l}.0.norm2"), d);
        s.linear(&format!("{l}.0.to_q"), d, d, false);
        s.linear(&format!("{l}.0.to_kv"), d, 2 * d, false);
        s.linear(&format!("{l}.0.to_out"), d, d, false);
        s.norm(&format!("{l}.1.0"), d);
        s.linear(&format!("{l}.1.1"), d, 4 * d, false);
        s.linear(&format!("{l}.1.3"), 4 * d, d, false);
        s.linear(&format!("{r}.proj_out"), d, d, true);
        s.norm(&format!("{r}.norm_out"), d);
    }
    s.0.extend(processor_lora_tensors(unet, "lora_weights.unet.")?);
    Ok(s.0)
}

/// A rank-4 LoRA over every attention projection of `unet`'s UNet in the old diffusers
/// attention-processor names (`down_blocks.0.attentions.0.transformer_blocks.0.attn1.
/// processor.to_q_lora.down.weight`, `to_out` for `to_out.0`) under `prefix`: what
/// PhotoMaker ships (`lora_weights.unet.`) and AnimateDiff's v3 domain adapter (no prefix).
pub fn processor_lora_tensors(unet: &SdConfig, prefix: &str) -> Result<Vec<TensorSpec>, SynthError> {
    let mut s = Specs(Vec::new());
    let ckpt = unet.tensors()?;
    let names: std::collections::HashSet<&str> = ckpt.iter().map(|t| t.name.as_str()).collect();
    let nrb = unet.unet.num_res_blocks;
    for t in &ckpt {
        let Some(k) = t.name.strip_prefix("model.diffusion_model.").and_then(|k| k.strip_suffix(".weight")) else { continue };
        if !(k.contains(".attn1.to_") || k.contains(".attn2.to_")) {
            continue;
        }
        let Some(d) = crate::lora::keys::ldm_to_diffusers(k, nrb, &names) else { continue };
        let module = d.replace(".to_", ".processor.to_").replace(".to_out.0", ".to_out");
        let (o, i) = (t.shape[0], t.shape[1]);
        s.push(format!("{prefix}{module}_lora.down.weight"), vec![4, i], Init::Normal { mean: 0.0, std: 1.0 / (i as f32).sqrt() });
        s.push(format!("{prefix}{module}_lora.up.weight"), vec![o, 4], Init::Normal { mean: 0.0, std: 0.05 });
    }
    Ok(s.0)
}

/// The sinusoidal table of "Attention Is All You Need" that AnimateDiff's releases store as
/// `pos_encoder.pe`: row `pos`, column `2i` is `sin(pos / 10000^(2i/width))`, `2i+1` the
/// cosine.
pub fn sinusoids(len: usize, width: usize) -> Vec<f32> {
    let mut pe = vec![0f32; len * width];
    for pos in 0..len {
        for i in (0..width).step_by(2) {
            let div = (i as f64 * -(10000f64.ln()) / width as f64).exp() as f32;
            let a = pos as f32 * div;
            pe[pos * width + i] = a.sin();
            if i + 1 < width {
                pe[pos * width + i + 1] = a.cos();
            }
        }
    }
    pe
}

/// Every tensor of an AnimateDiff SD1.5 motion-module file in the original names, for the
/// UNet of `unet`: a module after each res/attention pair of each encoder level
/// (`num_res_blocks`) and decoder level (one more), v2's mid-block module with `mid`, and
/// positional tables of `max_frames` (24 for v1, 32 for v2/v3).
pub fn motion_module_tensors(unet: &UnetConfig, mid: bool, max_frames: usize) -> Vec<TensorSpec> {
    let mut s = Specs(Vec::new());
    let widths: Vec<usize> = unet.channel_mult.iter().map(|m| m * unet.model_channels).collect();
    let module = |s: &mut Specs, name: String, c: usize| {
        let t = format!("{name}.temporal_transformer");
        s.norm(&format!("{t}.norm"), c);
        s.linear(&format!("{t}.proj_in"), c, c, true);
        let b = format!("{t}.transformer_blocks.0");
        for a in 0..2 {
            let at = format!("{b}.attention_blocks.{a}");
            for p in ["to_q", "to_k", "to_v"] {
                s.linear(&format!("{at}.{p}"), c, c, false);
            }
            s.linear(&format!("{at}.to_out.0"), c, c, true);
            s.push(format!("{at}.pos_encoder.pe"), vec![1, max_frames, c], Init::Sinusoids);
            s.norm(&format!("{b}.norms.{a}"), c);
        }
        s.norm(&format!("{b}.ff_norm"), c);
        s.linear(&format!("{b}.ff.net.0.proj"), c, 8 * c, true);
        s.linear(&format!("{b}.ff.net.2"), 4 * c, c, true);
        s.linear(&format!("{t}.proj_out"), c, c, true);
    };
    for (l, &c) in widths.iter().enumerate() {
        for j in 0..unet.num_res_blocks {
            module(&mut s, format!("down_blocks.{l}.motion_modules.{j}"), c);
        }
    }
    if mid {
        module(&mut s, "mid_block.motion_modules.0".into(), *widths.last().unwrap_or(&unet.model_channels));
    }
    for (l, &c) in widths.iter().rev().enumerate() {
        for j in 0..=unet.num_res_blocks {
            module(&mut s, format!("up_blocks.{l}.motion_modules.{j}"), c);
        }
    }
    s.0
}

/// Write `tensors` with their values for `seed` as an f32 safetensors file.
pub fn write_tensors(path: &Path, tensors: &[TensorSpec], seed: u64) -> Result<(), SynthError> {
    let data: Vec<Vec<u8>> = tensors.iter().map(|t| t.values(seed).iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
    crate::io::safetensors::write(path, tensors.iter().zip(&data).map(|(t, b)| (t.name.as_str(), DType::F32, t.shape.clone(), b.as_slice())), &Default::default())?;
    Ok(())
}
