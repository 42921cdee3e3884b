//! FLUX.2's latent space: its 32-channel KL VAE's latent cut into 2×2 patches (128
//! channels at 1/16 of the image) and normalised per channel with the VAE's batch-norm
//! statistics. This is what the transformer reads, and what sdflow's LATENT holds for
//! FLUX.2 (the VAE nodes convert on the way in and out).

use crate::models::dit::{patchify, unpatchify};
use crate::models::{ModelError, Result};

/// The VAE's latent channels (before the 2×2 patches).
pub const VAE_CHANNELS: usize = 32;

/// The patched, normalised latent's channels.
pub const CHANNELS: usize = 4 * VAE_CHANNELS;

/// The released FLUX.2 VAE's per-channel statistics of the patched latent
/// (`bn.running_mean` and `sqrt(bn.running_var + 1e-4)`, as sd.cpp tabulates them in
/// `AutoEncoderKL::get_latents_mean_std`), channel `c·4 + row·2 + column`.
pub const MEAN: [f32; CHANNELS] = [
    -0.0676, -0.0715, -0.0753, -0.0745, 0.0223, 0.0180, 0.0142, 0.0184, -0.0001, -0.0063, -0.0002, -0.0031, -0.0272, -0.0281, -0.0276, -0.0290, -0.0769, -0.0672, -0.0902, -0.0892, 0.0168, 0.0152, 0.0079, 0.0086,
    0.0083, 0.0015, 0.0003, -0.0043, -0.0439, -0.0419, -0.0438, -0.0431, -0.0102, -0.0132, -0.0066, -0.0048, -0.0311, -0.0306, -0.0279, -0.0180, 0.0030, 0.0015, 0.0126, 0.0145, 0.0347, 0.0338, 0.0337, 0.0283,
    0.0020, 0.0047, 0.0047, 0.0050, 0.0123, 0.0081, 0.0081, 0.0146, 0.0681, 0.0679, 0.0767, 0.0732, -0.0462, -0.0474, -0.0392, -0.0511, -0.0528, -0.0477, -0.0470, -0.0517, -0.0317, -0.0316, -0.0345, -0.0283,
    0.0510, 0.0445, 0.0578, 0.0458, -0.0412, -0.0458, -0.0487, -0.0467, -0.0088, -0.0106, -0.0088, -0.0046, -0.0376, -0.0432, -0.0436, -0.0499, 0.0118, 0.0166, 0.0203, 0.0279, 0.0113, 0.0129, 0.0016, 0.0072,
    -0.0118, -0.0018, -0.0141, -0.0054, -0.0091, -0.0138, -0.0145, -0.0187, 0.0323, 0.0305, 0.0259, 0.0300, 0.0540, 0.0614, 0.0495, 0.0590, -0.0511, -0.0603, -0.0478, -0.0524, -0.0227, -0.0274, -0.0154, -0.0255,
    -0.0572, -0.0565, -0.0518, -0.0496, 0.0116, 0.0054, 0.0163, 0.0104,
];

/// See [`MEAN`].
pub const STD: [f32; CHANNELS] = [
    1.8029, 1.7786, 1.7868, 1.7837, 1.7717, 1.7590, 1.7610, 1.7479, 1.7336, 1.7373, 1.7340, 1.7343, 1.8626, 1.8527, 1.8629, 1.8589, 1.7593, 1.7526, 1.7556, 1.7583, 1.7363, 1.7400, 1.7355, 1.7394, 1.7342, 1.7246,
    1.7392, 1.7304, 1.7551, 1.7513, 1.7559, 1.7488, 1.8449, 1.8454, 1.8550, 1.8535, 1.8240, 1.7813, 1.7854, 1.7945, 1.8047, 1.7876, 1.7695, 1.7676, 1.7782, 1.7667, 1.7925, 1.7848, 1.7579, 1.7407, 1.7483, 1.7368,
    1.7961, 1.7998, 1.7920, 1.7925, 1.7780, 1.7747, 1.7727, 1.7749, 1.7526, 1.7447, 1.7657, 1.7495, 1.7775, 1.7720, 1.7813, 1.7813, 1.8162, 1.8013, 1.8023, 1.8033, 1.7527, 1.7331, 1.7563, 1.7482, 1.7610, 1.7507,
    1.7681, 1.7613, 1.7665, 1.7545, 1.7828, 1.7726, 1.7896, 1.7999, 1.7864, 1.7760, 1.7613, 1.7625, 1.7560, 1.7577, 1.7783, 1.7671, 1.7810, 1.7799, 1.7201, 1.7068, 1.7265, 1.7091, 1.7793, 1.7578, 1.7502, 1.7455,
    1.7587, 1.7500, 1.7525, 1.7362, 1.7616, 1.7572, 1.7444, 1.7430, 1.7509, 1.7610, 1.7634, 1.7612, 1.7254, 1.7135, 1.7321, 1.7226, 1.7664, 1.7624, 1.7718, 1.7664, 1.7457, 1.7441, 1.7569, 1.7530,
];

/// One sample of the VAE's latent ([32][2h][2w]) in the model's space ([128][h][w]).
pub fn to_model(vae: &[f32], h: usize, w: usize) -> Result<Vec<f32>> {
    let mut x = patched(vae, h, w)?;
    let plane = h * w;
    for (c, p) in x.chunks_exact_mut(plane).enumerate() {
        p.iter_mut().for_each(|v| *v = (*v - MEAN[c]) / STD[c]);
    }
    Ok(x)
}

/// The inverse of [`to_model`]: [128][h][w] → [32][2h][2w].
pub fn from_model(model: &[f32], h: usize, w: usize) -> Result<Vec<f32>> {
    if model.len() != CHANNELS * h * w {
        return Err(ModelError::Input(format!("{} values for a {CHANNELS}×{h}×{w} FLUX.2 latent", model.len())));
    }
    let plane = h * w;
    let x: Vec<f32> = model.chunks_exact(plane).enumerate().flat_map(|(c, p)| p.iter().map(move |v| v * STD[c] + MEAN[c])).collect();
    unpatched(&x, h, w)
}

/// [128][h][w] patches as their [32][2h][2w] values, unchanged otherwise (TAEF2 and the
/// latent previews read the normalised latent this way, as sd.cpp's do).
pub fn unpatched(model: &[f32], h: usize, w: usize) -> Result<Vec<f32>> {
    let tokens = patchify(model, [1, CHANNELS, h, w], 1)?;
    unpatchify(&tokens, [1, VAE_CHANNELS, 2 * h, 2 * w], 2)
}

/// The inverse of [`unpatched`]: [32][2h][2w] → [128][h][w].
pub fn patched(planes: &[f32], h: usize, w: usize) -> Result<Vec<f32>> {
    let x = patchify(planes, [1, VAE_CHANNELS, 2 * h, 2 * w], 2)?;
    // Tokens [h·w][128] back to planes [128][h][w].
    unpatchify(&x, [1, CHANNELS, h, w], 1)
}
