//! Video files read back into frames (ComfyUI's LoadVideo): MP4 of H.264 (the `mp4`
//! crate's reader, OpenH264's decoder) and WebM of VP8 / VP9 (sdflow's WebM reader,
//! libvpx's decoders) — what SaveVideo, SaveWEBM and sd-cli's `.webm` write, and what
//! cameras and ComfyUI users mostly hold.

use super::encode::webm_frames;

/// A decoded video: RGB8 frames, frame after frame, and the rate they play at.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    pub rgb: Vec<u8>,
    pub width: usize,
    pub height: usize,
    pub frames: usize,
    pub fps: f64,
}

/// The most frames read from one file (a 4K minute is a few thousand).
const MAX_FRAMES: usize = 20_000;

/// Whether `bytes` start as a video file LoadVideo reads (MP4's `ftyp`, WebM's EBML header)
/// and `name` has a video extension: what the upload endpoint takes besides images.
pub fn looks_like_video(bytes: &[u8], name: &str) -> bool {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "mp4" | "m4v" | "mov" => bytes.len() >= 8 && &bytes[4..8] == b"ftyp",
        "webm" | "mkv" => bytes.starts_with(&[0x1A, 0x45, 0xDF, 0xA3]),
        _ => false,
    }
}

/// `bytes` of a video file, by its signature: MP4 (`ftyp`) or WebM / Matroska (EBML).
pub fn decode_video_file(bytes: &[u8]) -> Result<Decoded, String> {
    if bytes.len() >= 8 && &bytes[4..8] == b"ftyp" {
        decode_mp4(bytes)
    } else if bytes.starts_with(&[0x1A, 0x45, 0xDF, 0xA3]) {
        decode_webm(bytes)
    } else {
        Err("not an MP4 or WebM file".into())
    }
}

fn push_frame(out: &mut Option<Decoded>, rgb: &[u8], w: usize, h: usize) -> Result<(), String> {
    let d = out.get_or_insert_with(|| Decoded { rgb: Vec::new(), width: w, height: h, frames: 0, fps: 0.0 });
    if (d.width, d.height) != (w, h) {
        return Err(format!("frames change size ({}x{} then {w}x{h})", d.width, d.height));
    }
    if d.frames >= MAX_FRAMES {
        return Err(format!("more than {MAX_FRAMES} frames"));
    }
    d.rgb.extend_from_slice(rgb);
    d.frames += 1;
    Ok(())
}

fn decode_mp4(bytes: &[u8]) -> Result<Decoded, String> {
    let mut reader = mp4::Mp4Reader::read_header(std::io::Cursor::new(bytes), bytes.len() as u64).map_err(|e| format!("MP4: {e}"))?;
    let (id, timescale, count, mut stream) = {
        let (id, track) = reader.tracks().iter().find(|(_, t)| t.sequence_parameter_set().is_ok()).ok_or("MP4: no H.264 video track")?;
        let mut stream = Vec::new();
        for nal in [track.sequence_parameter_set().map_err(|e| e.to_string())?, track.picture_parameter_set().map_err(|e| e.to_string())?] {
            stream.extend_from_slice(&[0, 0, 0, 1]);
            stream.extend_from_slice(nal);
        }
        (*id, track.timescale(), track.sample_count(), stream)
    };
    let mut decoder = openh264::decoder::Decoder::new().map_err(|e| format!("OpenH264: {e}"))?;
    let mut out = None;
    let mut first_duration = 0u32;
    for i in 1..=count {
        let sample = reader.read_sample(id, i).map_err(|e| format!("MP4 sample {i}: {e}"))?.ok_or_else(|| format!("MP4: sample {i} missing"))?;
        if i == 1 {
            first_duration = sample.duration;
        }
        // Length-prefixed NAL units to Annex-B, as the decoder reads them.
        let b = &sample.bytes;
        let mut at = 0;
        while at + 4 <= b.len() {
            let len = u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize;
            let nal = b.get(at + 4..at + 4 + len).ok_or_else(|| format!("MP4 sample {i}: a NAL unit runs past it"))?;
            stream.extend_from_slice(&[0, 0, 0, 1]);
            stream.extend_from_slice(nal);
            at += 4 + len;
        }
        if let Some(yuv) = decoder.decode(&stream).map_err(|e| format!("H.264 frame {i}: {e}"))? {
            use openh264::formats::YUVSource;
            let (w, h) = yuv.dimensions();
            let mut rgb = vec![0u8; w * h * 3];
            yuv.write_rgb8(&mut rgb);
            push_frame(&mut out, &rgb, w, h)?;
        }
        stream.clear();
    }
    let mut d = out.ok_or("MP4: no frames decoded")?;
    d.fps = if first_duration > 0 { timescale as f64 / first_duration as f64 } else { 24.0 };
    Ok(d)
}

fn decode_webm(bytes: &[u8]) -> Result<Decoded, String> {
    use vpx_sys::*;
    let webm = webm_frames(bytes)?;
    // SAFETY: the decoder interfaces are libvpx's statics.
    let iface = unsafe {
        match webm.codec.as_str() {
            "V_VP8" => vpx_codec_vp8_dx(),
            "V_VP9" => vpx_codec_vp9_dx(),
            other => return Err(format!("WebM: the {other} codec is not read (VP8 and VP9 are)")),
        }
    };
    let mut out = None;
    // SAFETY: the context is initialised before use and destroyed on every path after; each
    // image libvpx returns is read before the next decode call.
    unsafe {
        let mut ctx = std::mem::MaybeUninit::<vpx_codec_ctx_t>::zeroed().assume_init();
        if vpx_codec_dec_init_ver(&mut ctx, iface, std::ptr::null(), 0, VPX_DECODER_ABI_VERSION as i32) != vpx_codec_err_t::VPX_CODEC_OK {
            return Err("libvpx: the decoder did not start".into());
        }
        let result = (|| -> Result<(), String> {
            for (i, (_, _, frame)) in webm.blocks.iter().enumerate() {
                if vpx_codec_decode(&mut ctx, frame.as_ptr(), frame.len() as u32, std::ptr::null_mut(), 0) != vpx_codec_err_t::VPX_CODEC_OK {
                    return Err(format!("{} frame {i} does not decode", webm.codec));
                }
                let mut iter: vpx_codec_iter_t = std::ptr::null();
                loop {
                    let img = vpx_codec_get_frame(&mut ctx, &mut iter);
                    if img.is_null() {
                        break;
                    }
                    let img = &*img;
                    if img.fmt != vpx_img_fmt::VPX_IMG_FMT_I420 {
                        return Err(format!("{} frame {i}: {:?} frames are not read (4:2:0 8-bit is)", webm.codec, img.fmt));
                    }
                    let (w, h) = (img.d_w as usize, img.d_h as usize);
                    let plane = |p: usize, x: usize, y: usize| *img.planes[p].add(y * img.stride[p] as usize + x) as f32;
                    let mut rgb = Vec::with_capacity(w * h * 3);
                    for y in 0..h {
                        for x in 0..w {
                            // BT.601 limited range, the inverse of the writers' conversion.
                            let (l, u, v) = (1.164 * (plane(0, x, y) - 16.0), plane(1, x / 2, y / 2) - 128.0, plane(2, x / 2, y / 2) - 128.0);
                            for c in [l + 1.596 * v, l - 0.392 * u - 0.813 * v, l + 2.017 * u] {
                                rgb.push(c.round().clamp(0.0, 255.0) as u8);
                            }
                        }
                    }
                    push_frame(&mut out, &rgb, w, h)?;
                }
            }
            Ok(())
        })();
        vpx_codec_destroy(&mut ctx);
        result?;
    }
    let mut d = out.ok_or("WebM: no frames decoded")?;
    let times: Vec<i64> = webm.blocks.iter().map(|b| b.0).collect();
    d.fps = match (times.first(), times.last()) {
        (Some(a), Some(b)) if b > a => 1000.0 * (times.len() - 1) as f64 / (b - a) as f64,
        _ => 24.0,
    };
    Ok(d)
}
