//! Overlapping-tile processing for the VAE, with stable-diffusion.cpp's tile layout and
//! blending, so `--vae-tiling`, `--vae-tile-size`, `--vae-tile-overlap` and
//! `--vae-relative-tile-size` give the tiles sd.cpp gives.
//!
//! Tiles are laid out on the *small* side of the map (the latent: the input of a decode,
//! the output of an encode). Every tile has the same size — the last one along an axis is
//! moved back to end at the border, and the part it shares with its neighbour beyond the
//! nominal overlap is skipped — so one graph shape (and one compute buffer) serves every
//! tile. In the overlaps tiles are cross-faded with smootherstep weights that sum to one.

use std::fmt;

/// sd.cpp's `sd_tiling_params_t` plus what decides when tiling is used.
#[derive(Clone, Debug, PartialEq)]
pub struct VaeTiling {
    /// `--vae-tiling`: always work in tiles.
    pub enabled: bool,
    /// `--vae-tile-size`, in latent pixels (sd.cpp's default 32×32).
    pub tile_size: (usize, usize),
    /// `--vae-relative-tile-size`: per axis, a fraction of the latent side when ≤ 1, a
    /// number of tiles when > 1; 0 leaves `tile_size` in charge.
    pub rel_size: (f32, f32),
    /// `--vae-tile-overlap`: the wanted overlap as a fraction of the tile (at most 0.5).
    pub target_overlap: f32,
    /// Work in tiles when the whole-image compute buffer cannot be allocated.
    pub retry_on_alloc_failure: bool,
    /// Work in tiles when the whole-image compute buffer would be larger than this.
    pub max_compute_bytes: Option<usize>,
}

impl Default for VaeTiling {
    fn default() -> Self {
        VaeTiling { enabled: false, tile_size: (32, 32), rel_size: (0.0, 0.0), target_overlap: 0.5, retry_on_alloc_failure: true, max_compute_bytes: None }
    }
}

/// A tile-size option that does not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{option} `{value}`: {why}")]
pub struct TileOptionError {
    pub option: &'static str,
    pub value: String,
    pub why: &'static str,
}

/// `N` or `NxM`, as sd.cpp reads its tile options.
fn parse_pair<T: std::str::FromStr + Copy>(option: &'static str, s: &str) -> Result<(T, T), TileOptionError> {
    let err = |why| TileOptionError { option, value: s.to_string(), why };
    let parts: Vec<&str> = s.trim().split(['x', 'X']).collect();
    let num = |p: &str| p.trim().parse::<T>().map_err(|_| err("expected a number or NxM"));
    match parts.as_slice() {
        [a] => {
            let a = num(a)?;
            Ok((a, a))
        }
        [a, b] => Ok((num(a)?, num(b)?)),
        _ => Err(err("expected a number or NxM")),
    }
}

impl VaeTiling {
    /// Tiles for a `latent_w`×`latent_h` latent whose whole decode needs `need` bytes of
    /// compute where `limit` are at hand: as few as keep each tile's share (with room for
    /// the overlap's extra area) under the limit, split along the sides in proportion, a
    /// quarter of a tile overlapping its neighbour (ComfyUI's tiled video decode: 64 of
    /// 256 pixels).
    pub fn fitting(latent_w: usize, latent_h: usize, need: usize, limit: usize) -> Self {
        let k = (need as f64 * 1.5 / limit.max(1) as f64).ceil().max(2.0);
        let nx = (k * latent_w as f64 / latent_h.max(1) as f64).sqrt().round().clamp(1.0, latent_w.max(1) as f64);
        let ny = (k / nx).ceil().clamp(1.0, latent_h.max(1) as f64);
        VaeTiling { enabled: true, rel_size: (nx as f32, ny as f32), target_overlap: 0.25, ..VaeTiling::default() }
    }

    /// Parse `--vae-tile-size` ("32" or "32x48", latent pixels).
    pub fn parse_tile_size(s: &str) -> Result<(usize, usize), TileOptionError> {
        let (x, y) = parse_pair::<usize>("--vae-tile-size", s)?;
        if x == 0 || y == 0 || x > 1 << 16 || y > 1 << 16 {
            return Err(TileOptionError { option: "--vae-tile-size", value: s.into(), why: "sides must be between 1 and 65536" });
        }
        Ok((x, y))
    }

    /// Parse `--vae-relative-tile-size` ("0.5" or "2x3").
    pub fn parse_rel_size(s: &str) -> Result<(f32, f32), TileOptionError> {
        let (x, y) = parse_pair::<f32>("--vae-relative-tile-size", s)?;
        if !(x.is_finite() && y.is_finite() && x >= 0.0 && y >= 0.0 && x <= 65536.0 && y <= 65536.0) {
            return Err(TileOptionError { option: "--vae-relative-tile-size", value: s.into(), why: "must be a non-negative number" });
        }
        Ok((x, y))
    }

    /// sd.cpp's `get_tile_sizes`: tile sides in latent pixels for a `latent_w`×`latent_h`
    /// latent, and the overlap fraction. Encoding passes 1.30539 as `encoding_factor`
    /// (sd.cpp's choice, keeping the encoder's compute buffer near the decoder's).
    pub fn tile_sizes(&self, latent_w: usize, latent_h: usize, encoding_factor: f32) -> (usize, usize, f32) {
        let overlap = self.target_overlap.clamp(0.0, 0.5);
        let side = |requested: usize, factor: f32, latent: usize| -> usize {
            const DEFAULT: i64 = 32;
            const MIN: i64 = 4;
            let mut tile = DEFAULT;
            if factor > 0.0 {
                let f = if factor > 1.0 { 1.0 / (factor - factor * overlap + overlap) } else { factor };
                tile = (latent as f32 * f).round() as i64;
            } else if requested as i64 >= MIN {
                tile = requested as i64;
            }
            // sd.cpp multiplies an int by the float factor: truncation.
            tile = (tile as f32 * encoding_factor) as i64;
            tile.min(latent as i64).max(MIN) as usize
        };
        (side(self.tile_size.0, self.rel_size.0, latent_w), side(self.tile_size.1, self.rel_size.1, latent_h), overlap)
    }
}

/// Tiles along one axis and the overlap fraction that makes them fit exactly
/// (sd.cpp's `sd_tiling_calc_tiles`).
fn calc_tiles(small: i64, tile: i64, target: f32) -> (i64, f32) {
    let overlap = (tile as f32 * target) as i64;
    let step = (tile - overlap).max(1);
    let mut n = (small - overlap) / step;
    let overshoot = ((n + 1) * step + overlap) % small.max(1);
    // Squeeze in one more tile when they do not fit and the overlap stays ≤ 0.5.
    if overshoot != step && overshoot <= n * (tile / 2 - overlap) {
        n += 1;
    }
    let mut factor = if n > 1 { (tile * n - small) as f32 / (tile * (n - 1)) as f32 } else { 0.0 };
    if n <= 2 {
        if small <= tile {
            n = 1;
            factor = 0.0;
        } else {
            n = 2;
            factor = (2 * tile - small) as f32 / tile as f32;
        }
    }
    (n, factor)
}

/// Where one tile sits: its top-left on the small side, and how many leading pixels (on
/// the output side) it skips because its neighbour already covers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TilePos {
    pub x: usize,
    pub y: usize,
    pub skip_x: usize,
    pub skip_y: usize,
}

/// The tile layout of a map whose small side is `small_w`×`small_h`.
#[derive(Clone, Debug, PartialEq)]
pub struct TileLayout {
    /// Tile sides on the small side.
    pub tile_w: usize,
    pub tile_h: usize,
    /// Overlap between neighbours on the small side.
    pub overlap_x: usize,
    pub overlap_y: usize,
    pub tiles: Vec<TilePos>,
    /// Per axis, whether the tiles wrap around the map (circular padding, seamless
    /// tiling): the last tile runs past the far edge into the first cells, and every
    /// tile is cross-faded on both sides ([`layout_wrapped`]).
    pub wrap_x: bool,
    pub wrap_y: bool,
}

impl fmt::Display for TileLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} tiles of {}x{} (overlap {}x{})", self.tiles.len(), self.tile_w, self.tile_h, self.overlap_x, self.overlap_y)
    }
}

/// Lay out tiles of (at most) `tile_w`×`tile_h` with the wanted overlap fraction over a
/// `small_w`×`small_h` map, as sd.cpp's `sd_tiling_non_square` does. Skips are on the
/// small side here; [`run_tiled`] scales them for a decode.
pub fn layout(small_w: usize, small_h: usize, tile_w: usize, tile_h: usize, target_overlap: f32) -> TileLayout {
    layout_wrapped(small_w, small_h, tile_w, tile_h, target_overlap, (false, false))
}

/// [`layout`] with the axes of `wrap` (x, y) wrapping around, as sd.cpp tiles a circular
/// axis (`sd_tiling_calc_tiles` with `circular`, `process_tiles_2d`): ⌊side/step⌋ tiles
/// (at least 2 when they overlap), the overlap recomputed so they meet evenly, starts `step`
/// apart from 0, none moved back; the last tiles run past the edge into the first cells.
pub fn layout_wrapped(small_w: usize, small_h: usize, tile_w: usize, tile_h: usize, target_overlap: f32, wrap: (bool, bool)) -> TileLayout {
    let (sw, sh) = (small_w as i64, small_h as i64);
    let (pw, ph) = (tile_w.max(1) as i64, tile_h.max(1) as i64);
    let factor = |small: i64, tile: i64, wrap: bool| if wrap { calc_tiles_wrapped(small, tile, target_overlap).1 } else { calc_tiles(small, tile, target_overlap).1 };
    let (fx, fy) = (factor(sw, pw, wrap.0), factor(sh, ph, wrap.1));
    let (ox, oy) = ((pw as f32 * fx) as i64, (ph as f32 * fy) as i64);
    let (step_x, step_y) = ((pw - ox).max(1), (ph - oy).max(1));
    let (tw, th) = (pw.min(sw), ph.min(sh));
    let starts = |size: i64, tile: i64, step: i64, wrap: bool| if wrap { (0..size).step_by(step as usize).map(|p| (p as usize, 0)).collect() } else { axis_starts(size, tile, step) };
    let xs = starts(sw, tw, step_x, wrap.0);
    let tiles = starts(sh, th, step_y, wrap.1).into_iter().flat_map(|(y, skip_y)| xs.iter().map(move |&(x, skip_x)| TilePos { x, y, skip_x, skip_y })).collect();
    TileLayout { tile_w: tw as usize, tile_h: th as usize, overlap_x: ox.max(0) as usize, overlap_y: oy.max(0) as usize, tiles, wrap_x: wrap.0, wrap_y: wrap.1 }
}

/// sd.cpp's `sd_tiling_calc_tiles` for a circular axis: the tile count and overlap factor.
fn calc_tiles_wrapped(small: i64, tile: i64, target: f32) -> (i64, f32) {
    let overlap = (tile as f32 * target) as i64;
    let step = (tile - overlap).max(1);
    let mut n = (small / step).max(1);
    let mut factor = (tile - small / n) as f32 / tile as f32;
    // A single overlapping tile would overlap itself: two, half overlapping.
    if n == 1 && factor > 0.0 {
        n = 2;
        factor = 0.5;
    }
    (n, factor)
}

/// Tile starts along one axis of `size` cells, `step` apart; the last tile is moved back
/// to end at the edge, and its skip is how far it moved (the cells its predecessor covers).
fn axis_starts(size: i64, tile: i64, step: i64) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut p = 0i64;
    while p < size {
        if p + tile >= size {
            let end = size - tile;
            out.push((end as usize, (p - end) as usize));
            break;
        }
        out.push((p as usize, 0));
        p += step;
    }
    out
}

fn smootherstep(x: f32) -> f32 {
    let x = x.clamp(0.0, 1.0);
    x * x * x * (x * (6.0 * x - 15.0) + 10.0)
}

/// Which way a tiled map goes through the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Small input, output `scale` times larger (VAE decode).
    Upscale,
    /// Input `scale` times larger than the output (VAE encode).
    Downscale,
}

/// Run `f` on every tile of one planar map `input` ([C][H][W] floats, `in_w`×`in_h`) and
/// blend the tiles' outputs (`out_c` planes each) into one map. `f` receives a tile
/// (planar, its width and height) and returns its output, `scale` times larger or smaller
/// per side as `dir` says.
#[allow(clippy::too_many_arguments)]
pub fn run_tiled<E>(
    input: &[f32],
    in_w: usize,
    in_h: usize,
    in_c: usize,
    out_c: usize,
    scale: usize,
    dir: Direction,
    layout: &TileLayout,
    mut f: impl FnMut(Vec<f32>, usize, usize) -> Result<Vec<f32>, E>,
) -> Result<Vec<f32>, TiledError<E>> {
    if input.len() != in_w * in_h * in_c || scale == 0 {
        return Err(TiledError::Shape(format!("input of {} values is not {in_w}x{in_h}x{in_c}", input.len())));
    }
    let (up, down) = match dir {
        Direction::Upscale => (scale, 1),
        Direction::Downscale => (1, scale),
    };
    let (out_w, out_h) = (in_w * up / down, in_h * up / down);
    // Tile sides on the input and output sides.
    let (tiw, tih) = (layout.tile_w * down, layout.tile_h * down);
    let (tow, toh) = (layout.tile_w * up, layout.tile_h * up);
    let (ovx, ovy) = (layout.overlap_x * up, layout.overlap_y * up);
    let mut out = vec![0f32; out_w * out_h * out_c];
    let mut tile = vec![0f32; tiw * tih * in_c];
    let (wrap_x, wrap_y) = (layout.wrap_x, layout.wrap_y);
    if (wrap_x && (tiw > in_w || tow > out_w)) || (wrap_y && (tih > in_h || toh > out_h)) {
        return Err(TiledError::Shape(format!("wrapped tiles of {tiw}x{tih} larger than the {in_w}x{in_h} input")));
    }
    for t in &layout.tiles {
        let (xi, yi) = (t.x * down, t.y * down);
        if (!wrap_x && xi + tiw > in_w) || (!wrap_y && yi + tih > in_h) || xi >= in_w || yi >= in_h {
            return Err(TiledError::Shape(format!("tile at {xi},{yi} leaves the {in_w}x{in_h} input")));
        }
        for c in 0..in_c {
            for y in 0..tih {
                let row = &input[(c * in_h + (yi + y) % in_h) * in_w..][..in_w];
                let dst = &mut tile[(c * tih + y) * tiw..][..tiw];
                if xi + tiw <= in_w {
                    dst.copy_from_slice(&row[xi..xi + tiw]);
                } else {
                    // Past the right edge (a wrapped axis): the row's first cells follow.
                    let first = in_w - xi;
                    dst[..first].copy_from_slice(&row[xi..]);
                    dst[first..].copy_from_slice(&row[..tiw - first]);
                }
            }
        }
        let got = f(tile.clone(), tiw, tih).map_err(TiledError::Tile)?;
        if got.len() != tow * toh * out_c {
            return Err(TiledError::Shape(format!("a {tiw}x{tih} tile gave {} values, expected {tow}x{toh}x{out_c}", got.len())));
        }
        let (xo, yo) = (t.x * up, t.y * up);
        let (sx, sy) = (t.skip_x * up, t.skip_y * up);
        let blend = ovx > 0 || ovy > 0;
        // Ramps only face neighbours: none at the map's own borders (a wrapped axis has
        // none: there every tile has neighbours on both sides).
        let (has_left, has_right) = (wrap_x || xo > 0, wrap_x || xo < out_w - tow);
        let (has_top, has_bottom) = (wrap_y || yo > 0, wrap_y || yo < out_h - toh);
        let ramp = |i: usize, skip: usize, side: usize, ov: usize, lo: bool, hi: bool| -> f32 {
            let a = if ov > 0 && lo { (i - skip) as f32 / ov as f32 } else { 1.0 };
            let b = if ov > 0 && hi { (side - i) as f32 / ov as f32 } else { 1.0 };
            smootherstep(a.min(b).min(1.0))
        };
        let wx: Vec<f32> = (sx..tow).map(|i| ramp(i, sx, tow, ovx, has_left, has_right)).collect();
        for c in 0..out_c {
            for y in sy..toh {
                let wy = ramp(y, sy, toh, ovy, has_top, has_bottom);
                let row = &got[(c * toh + y) * tow..][..tow];
                let dst_row = &mut out[(c * out_h + (yo + y) % out_h) * out_w..][..out_w];
                if xo + tow <= out_w {
                    let dst = &mut dst_row[xo..xo + tow];
                    if blend {
                        for (k, x) in (sx..tow).enumerate() {
                            dst[x] += row[x] * wy * wx[k];
                        }
                    } else {
                        dst[sx..].copy_from_slice(&row[sx..]);
                    }
                } else {
                    // Past the right edge (only a wrapped axis gets there, checked above).
                    for (k, x) in (sx..tow).enumerate() {
                        let d = &mut dst_row[(xo + x) % out_w];
                        *d = if blend { *d + row[x] * wy * wx[k] } else { row[x] };
                    }
                }
            }
        }
    }
    Ok(out)
}

/// A tiled run that failed: in a tile's computation, or because shapes disagree.
#[derive(Debug, thiserror::Error)]
pub enum TiledError<E> {
    #[error("{0}")]
    Tile(E),
    #[error("tiling: {0}")]
    Shape(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_tile_when_the_map_fits() {
        let l = layout(20, 12, 32, 32, 0.5);
        assert_eq!(l.tiles, vec![TilePos { x: 0, y: 0, skip_x: 0, skip_y: 0 }]);
        assert_eq!((l.tile_w, l.tile_h), (20, 12));
    }

    #[test]
    fn tiles_cover_the_map_and_weights_sum_to_one() {
        for (w, h, t, ov) in [(70, 45, 32, 0.5), (64, 64, 32, 0.25), (33, 80, 32, 0.5), (100, 9, 16, 0.0), (96, 40, 24, 0.3)] {
            let l = layout(w, h, t, t, ov);
            let ones = vec![1f32; w * h];
            // Identity "model": blending a constant map must give it back everywhere.
            let out = run_tiled(&ones, w, h, 1, 1, 1, Direction::Upscale, &l, |t, _, _| Ok::<_, ()>(t)).unwrap();
            let worst = out.iter().map(|v| (v - 1.0).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-5, "{w}x{h} tile {t} overlap {ov}: {l}, weights off by {worst}");
            // Upscaling identity (nearest ×2) also sums to one.
            let out = run_tiled(&ones, w, h, 1, 1, 2, Direction::Upscale, &l, |t, tw, th| Ok::<_, ()>((0..tw * th * 4).map(|i| t[(i / (2 * tw) / 2) * tw + (i % (2 * tw)) / 2]).collect())).unwrap();
            assert!(out.iter().all(|v| (v - 1.0).abs() < 1e-5), "{w}x{h} ×2");
        }
    }

    #[test]
    fn sd_cpp_tile_counts() {
        // 64 latent pixels, tiles of 32 at overlap 0.5: sd.cpp lays out 3 tiles, 16 apart.
        let l = layout(64, 32, 32, 32, 0.5);
        assert_eq!(l.tiles.iter().map(|t| t.x).collect::<Vec<_>>(), vec![0, 16, 32]);
        assert_eq!(l.overlap_x, 16);
        // Tile options as sd-cli reads them.
        let t = VaeTiling::default();
        assert_eq!(t.tile_sizes(64, 20, 1.0), (32, 20, 0.5));
        assert_eq!(t.tile_sizes(64, 64, 1.30539), (41, 41, 0.5));
        assert_eq!(t.tile_sizes(2, 2, 1.0), (4, 4, 0.5), "never below 4");
        let rel = VaeTiling { rel_size: (0.5, 2.0), ..VaeTiling::default() };
        // 2 tiles at overlap 0.5 → each 1/1.5 of the side.
        assert_eq!(rel.tile_sizes(60, 60, 1.0), (30, 40, 0.5));
        assert_eq!(VaeTiling::parse_tile_size("32x48").unwrap(), (32, 48));
        assert_eq!(VaeTiling::parse_tile_size("16").unwrap(), (16, 16));
        assert!(VaeTiling::parse_tile_size("0x3").is_err());
        assert!(VaeTiling::parse_tile_size("axb").is_err());
        assert_eq!(VaeTiling::parse_rel_size("0.5").unwrap(), (0.5, 0.5));
        assert!(VaeTiling::parse_rel_size("-1").is_err());
    }

    #[test]
    fn shape_mismatches_are_errors() {
        let l = layout(8, 8, 4, 4, 0.0);
        assert!(run_tiled(&[0.0; 10], 8, 8, 1, 1, 1, Direction::Upscale, &l, |t, _, _| Ok::<_, ()>(t)).is_err());
        assert!(run_tiled(&[0.0; 64], 8, 8, 1, 1, 1, Direction::Upscale, &l, |_, _, _| Ok::<_, ()>(vec![0.0; 3])).is_err());
    }
}
