//! Previews of the denoised estimate while sampling, as ComfyUI's `latent_preview.py`
//! makes them: a fixed latent → RGB projection (cheap, latent-sized), or the TAESD
//! decoder (full-sized) when `models/vae_approx` has one. JPEG at quality 95, the long
//! side capped at [`MAX_PREVIEW_RESOLUTION`].

use sdflow_core::placement::Module;
use crate::runtime::Runtime;
use crate::loaders::taesd;
use sdflow_core::detect::ModelFamily;
use sdflow_core::models::vae::taesd::Half;
use sdflow_executor::{PreviewFormat, PreviewImage};
use std::str::FromStr;

/// ComfyUI's default `--preview-size`.
pub const MAX_PREVIEW_RESOLUTION: u32 = 512;

/// ComfyUI's JPEG quality for previews.
const JPEG_QUALITY: u8 = 95;

/// ComfyUI's `SD15` latent format (SD1.x and SD2.x): each latent channel's R, G, B weight.
/// No bias.
pub const SD15_LATENT_RGB_FACTORS: [[f32; 3]; 4] = [
    [0.3512, 0.2297, 0.3227],
    [0.3250, 0.4974, 0.2350],
    [-0.2829, 0.1762, 0.2721],
    [-0.2120, -0.2616, -0.7177],
];

/// ComfyUI's `SDXL` latent format: per-channel RGB weights and a bias.
pub const SDXL_LATENT_RGB_FACTORS: [[f32; 3]; 4] = [
    [0.3651, 0.4232, 0.4341],
    [-0.2533, -0.0042, 0.1068],
    [0.1076, 0.1111, -0.0362],
    [-0.3165, -0.2492, -0.2188],
];
pub const SDXL_LATENT_RGB_BIAS: [f32; 3] = [0.1084, -0.0175, -0.0011];

/// ComfyUI's `latent_formats.Flux` latent→RGB factors (per channel: R, G, B) and bias.
pub const FLUX_LATENT_RGB_FACTORS: [[f32; 3]; 16] = [
    [-0.0346, 0.0244, 0.0681],
    [0.0034, 0.0210, 0.0687],
    [0.0275, -0.0668, -0.0433],
    [-0.0174, 0.0160, 0.0617],
    [0.0859, 0.0721, 0.0329],
    [0.0004, 0.0383, 0.0115],
    [0.0405, 0.0861, 0.0915],
    [-0.0236, -0.0185, -0.0259],
    [-0.0245, 0.0250, 0.1180],
    [0.1008, 0.0755, -0.0421],
    [-0.0515, 0.0201, 0.0011],
    [0.0428, -0.0012, -0.0036],
    [0.0817, 0.0765, 0.0749],
    [-0.1264, -0.0522, -0.1103],
    [-0.0280, -0.0881, -0.0499],
    [-0.1262, -0.0982, -0.0778],
];
pub const FLUX_LATENT_RGB_BIAS: [f32; 3] = [-0.0329, -0.0718, -0.0851];

/// ComfyUI's `latent_formats.SD3` latent→RGB factors (per channel: R, G, B) and bias.
pub const SD3_LATENT_RGB_FACTORS: [[f32; 3]; 16] = [
    [-0.0922, -0.0175, 0.0749],
    [0.0311, 0.0633, 0.0954],
    [0.1994, 0.0927, 0.0458],
    [0.0856, 0.0339, 0.0902],
    [0.0587, 0.0272, -0.0496],
    [-0.0006, 0.1104, 0.0309],
    [0.0978, 0.0306, 0.0427],
    [-0.0042, 0.1038, 0.1358],
    [-0.0194, 0.0020, 0.0669],
    [-0.0488, 0.0130, -0.0268],
    [0.0922, 0.0988, 0.0951],
    [-0.0278, 0.0524, -0.0542],
    [0.0332, 0.0456, 0.0895],
    [-0.0069, -0.0030, -0.0810],
    [-0.0596, -0.0465, -0.0293],
    [-0.1448, -0.1463, -0.1189],
];
pub const SD3_LATENT_RGB_BIAS: [f32; 3] = [0.2394, 0.2135, 0.1925];

/// ComfyUI's `latent_formats.Wan21` latent→RGB factors (Qwen-Image's and Wan 2.1's
/// normalised latents) and bias.
pub const WAN21_LATENT_RGB_FACTORS: [[f32; 3]; 16] = [
    [-0.1299, -0.1692, 0.2932],
    [0.0671, 0.0406, 0.0442],
    [0.3568, 0.2548, 0.1747],
    [0.0372, 0.2344, 0.1420],
    [0.0313, 0.0189, -0.0328],
    [0.0296, -0.0956, -0.0665],
    [-0.3477, -0.4059, -0.2925],
    [0.0166, 0.1902, 0.1975],
    [-0.0412, 0.0267, -0.1364],
    [-0.1293, 0.0740, 0.1636],
    [0.0680, 0.3019, 0.1128],
    [0.0032, 0.0581, 0.0639],
    [-0.1251, 0.0927, 0.1699],
    [0.0060, -0.0633, 0.0005],
    [0.3477, 0.2275, 0.2950],
    [0.1984, 0.0913, 0.1861],
];
pub const WAN21_LATENT_RGB_BIAS: [f32; 3] = [-0.1835, -0.0868, -0.3360];

/// ComfyUI's `latent_formats.Wan22` latent→RGB factors (Wan 2.2 TI2V's 48 channels) and bias.
pub const WAN22_LATENT_RGB_FACTORS: [[f32; 3]; 48] = [
    [0.0119, 0.0103, 0.0046],
    [-0.1062, -0.0504, 0.0165],
    [0.0140, 0.0409, 0.0491],
    [-0.0813, -0.0677, 0.0607],
    [0.0656, 0.0851, 0.0808],
    [0.0264, 0.0463, 0.0912],
    [0.0295, 0.0326, 0.0590],
    [-0.0244, -0.0270, 0.0025],
    [0.0443, -0.0102, 0.0288],
    [-0.0465, -0.0090, -0.0205],
    [0.0359, 0.0236, 0.0082],
    [-0.0776, 0.0854, 0.1048],
    [0.0564, 0.0264, 0.0561],
    [0.0006, 0.0594, 0.0418],
    [-0.0319, -0.0542, -0.0637],
    [-0.0268, 0.0024, 0.0260],
    [0.0539, 0.0265, 0.0358],
    [-0.0359, -0.0312, -0.0287],
    [-0.0285, -0.1032, -0.1237],
    [0.1041, 0.0537, 0.0622],
    [-0.0086, -0.0374, -0.0051],
    [0.0390, 0.0670, 0.2863],
    [0.0069, 0.0144, 0.0082],
    [0.0006, -0.0167, 0.0079],
    [0.0313, -0.0574, -0.0232],
    [-0.1454, -0.0902, -0.0481],
    [0.0714, 0.0827, 0.0447],
    [-0.0304, -0.0574, -0.0196],
    [0.0401, 0.0384, 0.0204],
    [-0.0758, -0.0297, -0.0014],
    [0.0568, 0.1307, 0.1372],
    [-0.0055, -0.0310, -0.0380],
    [0.0239, -0.0305, 0.0325],
    [-0.0663, -0.0673, -0.0140],
    [-0.0416, -0.0047, -0.0023],
    [0.0166, 0.0112, -0.0093],
    [-0.0211, 0.0011, 0.0331],
    [0.1833, 0.1466, 0.2250],
    [-0.0368, 0.0370, 0.0295],
    [-0.3441, -0.3543, -0.2008],
    [-0.0479, -0.0489, -0.0420],
    [-0.0660, -0.0153, 0.0800],
    [-0.0101, 0.0068, 0.0156],
    [-0.0690, -0.0452, -0.0927],
    [-0.0145, 0.0041, 0.0015],
    [0.0421, 0.0451, 0.0373],
    [0.0504, -0.0483, -0.0356],
    [-0.0837, 0.0168, 0.0055],
];
pub const WAN22_LATENT_RGB_BIAS: [f32; 3] = [0.0317, -0.0878, -0.1388];

/// FLUX.2's projection of the normalised latent's 32 channels (its 2×2 patches undone):
/// stable-diffusion.cpp's `flux2_latent_rgb_proj` / `_bias` (`latent-preview.h`).
pub const FLUX2_LATENT_RGB_FACTORS: [[f32; 3]; 32] = [
    [0.000736, -0.008385, -0.019710],
    [-0.001352, -0.016392, 0.020693],
    [-0.006376, 0.002428, 0.036736],
    [0.039384, 0.074167, 0.119789],
    [0.007464, -0.005705, -0.004734],
    [-0.004086, 0.005287, -0.000409],
    [-0.032835, 0.050802, -0.028120],
    [-0.003158, -0.000835, 0.000406],
    [-0.112840, -0.084337, -0.023083],
    [0.001462, -0.006656, 0.000549],
    [-0.009980, -0.007480, 0.009702],
    [0.032540, 0.000214, -0.061388],
    [0.011023, 0.000694, 0.007143],
    [-0.001468, -0.006723, -0.001678],
    [-0.005921, -0.010320, -0.003907],
    [-0.028434, 0.027584, 0.018457],
    [0.014349, 0.011523, 0.000441],
    [0.009874, 0.003081, 0.001507],
    [0.002218, 0.005712, 0.001563],
    [0.053010, -0.019844, 0.008683],
    [-0.002507, 0.005384, 0.000938],
    [-0.002177, -0.011366, 0.003559],
    [-0.000261, 0.015121, -0.003240],
    [-0.003944, -0.002083, 0.005043],
    [-0.009138, 0.011336, 0.003781],
    [0.011429, 0.003985, -0.003855],
    [0.010518, -0.005586, 0.010131],
    [0.007883, 0.002912, -0.001473],
    [-0.003318, -0.003160, 0.003684],
    [-0.034560, -0.008740, 0.012996],
    [0.000166, 0.001079, -0.012153],
    [0.017772, 0.000937, -0.011953],
];
pub const FLUX2_LATENT_RGB_BIAS: [f32; 3] = [-0.028738, -0.098463, -0.107619];

/// ComfyUI's `--preview-method`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PreviewMethod {
    /// No previews.
    None,
    /// ComfyUI's `auto`: the latent → RGB projection.
    Auto,
    #[default]
    Latent2Rgb,
    /// The TAESD decoder, falling back to the projection when none is installed.
    Taesd,
}

impl PreviewMethod {
    pub const ALL: [PreviewMethod; 4] = [PreviewMethod::None, PreviewMethod::Auto, PreviewMethod::Latent2Rgb, PreviewMethod::Taesd];

    pub fn name(self) -> &'static str {
        match self {
            PreviewMethod::None => "none",
            PreviewMethod::Auto => "auto",
            PreviewMethod::Latent2Rgb => "latent2rgb",
            PreviewMethod::Taesd => "taesd",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown preview method `{0}` (valid: none, auto, latent2rgb, taesd)")]
pub struct UnknownPreviewMethod(String);

impl FromStr for PreviewMethod {
    type Err = UnknownPreviewMethod;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        PreviewMethod::ALL.into_iter().find(|m| m.name() == lower).ok_or_else(|| UnknownPreviewMethod(s.to_string()))
    }
}

/// ComfyUI's `preview_to_image`: [-1, 1] → 0..=255, rounded as torch rounds (half to even).
fn to_byte(v: f32) -> u8 {
    ((v.clamp(-1.0, 1.0) + 1.0) * 127.5).round_ties_even() as u8
}

/// The projection of the first sample of `latent` (dimensions [W, H, C, N], planar, at
/// the diffusion model's scale) through `factors` (one RGB row per channel) and `bias`:
/// row-major RGB8 pixels, W×H.
pub fn latent_to_rgb(latent: &[f32], shape: [i64; 4], factors: &[[f32; 3]], bias: [f32; 3]) -> Option<Vec<u8>> {
    let [w, h, c, _] = shape.map(|d| d.max(0) as usize);
    if c != factors.len() || latent.len() < w * h * c {
        return None;
    }
    let plane = w * h;
    let mut out = Vec::with_capacity(plane * 3);
    for p in 0..plane {
        for (ch, b) in bias.iter().enumerate() {
            let v = factors.iter().enumerate().fold(*b, |acc, (k, f)| acc + latent[k * plane + p] * f[ch]);
            out.push(to_byte(v));
        }
    }
    Some(out)
}

/// The preview of the sampler's current denoised estimate `denoised` (dimensions
/// `shape`, at the diffusion model's scale), as the runtime's preview method makes it;
/// `None` when previews are off or `family` has no preview.
pub fn preview(rt: &Runtime, family: ModelFamily, denoised: &[f32], shape: [i64; 4]) -> Option<PreviewImage> {
    if rt.preview == PreviewMethod::None {
        return None;
    }
    // Each latent family's own tiny decoder (ComfyUI's `taesd_decoder_name`).
    if let (PreviewMethod::Taesd, Some(kind)) = (rt.preview, taesd::TaeKind::for_family(family)) {
        match taesd_rgb(rt, kind, denoised, shape) {
            Ok(Some((rgb, w, h))) => return jpeg(rgb, w, h),
            Ok(None) => tracing::debug!("TAESD previews asked for, but models/vae_approx has no {}_decoder; using latent2rgb", kind.name()),
            Err(e) => tracing::warn!("TAESD preview failed, using latent2rgb: {e}"),
        }
    }
    let (factors, bias) = match family {
        ModelFamily::Sd1 | ModelFamily::Sd2 { .. } => (&SD15_LATENT_RGB_FACTORS[..], [0.0; 3]),
        ModelFamily::Sdxl | ModelFamily::SdxlRefiner => (&SDXL_LATENT_RGB_FACTORS[..], SDXL_LATENT_RGB_BIAS),
        ModelFamily::Flux | ModelFamily::Chroma | ModelFamily::ZImage => (&FLUX_LATENT_RGB_FACTORS[..], FLUX_LATENT_RGB_BIAS),
        ModelFamily::Sd3 => (&SD3_LATENT_RGB_FACTORS[..], SD3_LATENT_RGB_BIAS),
        ModelFamily::Wan if shape[2] == WAN22_LATENT_RGB_FACTORS.len() as i64 => (&WAN22_LATENT_RGB_FACTORS[..], WAN22_LATENT_RGB_BIAS),
        ModelFamily::QwenImage | ModelFamily::Wan => (&WAN21_LATENT_RGB_FACTORS[..], WAN21_LATENT_RGB_BIAS),
        // FLUX.2: its 2×2 patches as the 32 channels they are, at twice the size (sd.cpp's).
        ModelFamily::Flux2 => {
            let [w, h, c, _] = shape.map(|d| d.max(0) as usize);
            let first = denoised.get(..w * h * c)?;
            let planes = sdflow_core::models::flux2::latent::unpatched(first, h, w).ok()?;
            let rgb = latent_to_rgb(&planes, [2 * w as i64, 2 * h as i64, 32, 1], &FLUX2_LATENT_RGB_FACTORS[..], FLUX2_LATENT_RGB_BIAS)?;
            return jpeg(rgb, 2 * w as u32, 2 * h as u32);
        }
        _ => return None,
    };
    let rgb = latent_to_rgb(denoised, shape, factors, bias)?;
    jpeg(rgb, shape[0] as u32, shape[1] as u32)
}

/// The TAESD decoding of the first sample, if a decoder is installed.
fn taesd_rgb(rt: &Runtime, kind: taesd::TaeKind, denoised: &[f32], shape: [i64; 4]) -> Result<Option<(Vec<u8>, u32, u32)>, sdflow_executor::NodeError> {
    let Some(files) = taesd::find_decoder(rt, kind) else { return Ok(None) };
    let weights = rt.pin(Module::Vae, &taesd::weights_handle(rt, &files)?)?;
    let model = taesd::model(&weights, Half::Decoder)?;
    let [w, h, c, _] = shape.map(|d| d.max(0) as usize);
    let first = denoised.get(..w * h * c).ok_or_else(|| sdflow_executor::NodeError::msg("preview: short latent"))?;
    let p = kind.patch();
    let chw = taesd::run(rt, &model, Half::Decoder, &taesd::unpack(kind, first, w, h)?, w * p, h * p)?;
    let f = model.config.downscale() as usize * p;
    let (iw, ih) = (w * f, h * f);
    let plane = iw * ih;
    // TAESD's [0, 1] to preview_to_image's [-1, 1], as ComfyUI's TAESD.decode does.
    let rgb = (0..plane).flat_map(|p| (0..3).map(move |ch| (ch, p))).map(|(ch, p)| to_byte(chw[ch * plane + p] * 2.0 - 1.0)).collect();
    Ok(Some((rgb, iw as u32, ih as u32)))
}

/// JPEG of row-major RGB8 `rgb`, shrunk (bilinear, aspect kept) to fit the preview size.
fn jpeg(rgb: Vec<u8>, w: u32, h: u32) -> Option<PreviewImage> {
    let img = image::RgbImage::from_raw(w, h, rgb)?;
    let long = w.max(h);
    let img = if long > MAX_PREVIEW_RESOLUTION {
        let scale = MAX_PREVIEW_RESOLUTION as f64 / long as f64;
        let (nw, nh) = (((w as f64 * scale).round() as u32).max(1), ((h as f64 * scale).round() as u32).max(1));
        image::imageops::resize(&img, nw, nh, image::imageops::FilterType::Triangle)
    } else {
        img
    };
    let mut data = Vec::new();
    if let Err(e) = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut data, JPEG_QUALITY).encode_image(&img) {
        tracing::warn!("preview JPEG encoding failed: {e}");
        return None;
    }
    Some(PreviewImage { format: PreviewFormat::Jpeg, width: img.width(), height: img.height(), data: data.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ComfyUI's Latent2RGBPreviewer on a 3×2 latent, run with torch (`F.linear` with the
    /// SD15 factors, then preview_to_image's clamp, add, mul and round).
    #[test]
    fn latent2rgb_matches_comfyui() {
        #[rustfmt::skip]
        let latent = [
            0.5, -1.2, 2.0, 0.0, 0.8, -0.3,
            1.1, 0.4, -2.5, 0.2, -0.9, 0.7,
            -0.6, 1.5, 0.3, 0.0, 0.1, -1.4,
            0.9, -0.2, 1.8, 0.0, -1.1, 0.6,
        ];
        let want = [193, 168, 78, 42, 158, 160, 54, 0, 0, 136, 140, 133, 152, 133, 238, 177, 112, 33];
        assert_eq!(latent_to_rgb(&latent, [3, 2, 4, 1], &SD15_LATENT_RGB_FACTORS, [0.0; 3]).unwrap(), want);
        // Only the first sample of a batch is previewed.
        let mut batch = latent.to_vec();
        batch.extend([9.0; 24]);
        assert_eq!(latent_to_rgb(&batch, [3, 2, 4, 2], &SD15_LATENT_RGB_FACTORS, [0.0; 3]).unwrap(), want);
        assert!(latent_to_rgb(&latent[..20], [3, 2, 4, 1], &SD15_LATENT_RGB_FACTORS, [0.0; 3]).is_none(), "short latent");
        assert!(latent_to_rgb(&latent, [3, 2, 3, 1], &SD15_LATENT_RGB_FACTORS, [0.0; 3]).is_none(), "3 channels");
    }

    #[test]
    fn preview_methods_parse() {
        for m in PreviewMethod::ALL {
            assert_eq!(m.name().parse::<PreviewMethod>().unwrap(), m);
        }
        assert_eq!(" TAESD ".parse::<PreviewMethod>().unwrap(), PreviewMethod::Taesd);
        let e = "fast".parse::<PreviewMethod>().unwrap_err().to_string();
        assert!(e.contains("fast") && e.contains("latent2rgb"), "{e}");
    }

    #[test]
    fn jpeg_is_capped_on_the_long_side_only_when_larger() {
        let big = jpeg(vec![128; 1024 * 256 * 3], 1024, 256).unwrap();
        assert_eq!((big.width, big.height), (512, 128));
        let small = jpeg(vec![128; 64 * 48 * 3], 64, 48).unwrap();
        assert_eq!((small.width, small.height), (64, 48));
        assert!(jpeg(vec![0; 10], 64, 48).is_none(), "wrong pixel count");
    }
}
