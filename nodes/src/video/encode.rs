//! Video files from frames: animated WebP through libwebp (the system's, by the
//! `webp-animation` crate: ComfyUI's SaveAnimatedWEBP and sd-cli's `.webp`), WebM of VP8
//! keyframes as sd-cli writes it (libwebp's lossy frames in libwebm's muxer), WebM of VP9
//! or AV1 at a CRF (ComfyUI's SaveWEBM: libvpx or rav1e, the same muxer), MP4 of H.264
//! (ComfyUI's SaveVideo: OpenH264 frames in the `mp4` crate's muxer), and AVI with
//! Motion-JPEG frames (sd-cli's default `.avi`). No maintained crate writes AVI; its RIFF
//! layout is a few fixed headers around the JPEG frames, so it is written here (the JPEGs
//! come from the `image` crate).

use std::io::Write;

/// Frames of 8-bit RGB, `width` × `height` each, frame after frame (row-major, RGB
/// interleaved).
#[derive(Clone, Copy, Debug)]
pub struct Rgb8Frames<'a> {
    pub data: &'a [u8],
    pub width: usize,
    pub height: usize,
}

impl Rgb8Frames<'_> {
    pub fn count(&self) -> usize {
        self.data.len() / (3 * self.width * self.height).max(1)
    }

    fn frame(&self, i: usize) -> &[u8] {
        let per = 3 * self.width * self.height;
        &self.data[i * per..(i + 1) * per]
    }

    fn check(&self) -> Result<(), String> {
        let per = 3 * self.width * self.height;
        if per == 0 || self.data.is_empty() || self.data.len() % per != 0 {
            return Err(format!("{} bytes are not whole {}x{} RGB frames", self.data.len(), self.width, self.height));
        }
        if self.width > 16383 || self.height > 16383 {
            return Err(format!("{}x{} frames are larger than WebP's and AVI's 16383-pixel limit", self.width, self.height));
        }
        Ok(())
    }
}

/// How animated WebP frames are compressed (ComfyUI's SaveAnimatedWEBP inputs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WebpOptions {
    pub lossless: bool,
    /// 0–100: lossy quality, or lossless effort.
    pub quality: f32,
    /// 0 (fastest) – 6 (slowest, smallest).
    pub method: usize,
}

/// An animated WebP of `frames` at `fps` (each frame shown `1000 / fps` ms, as PIL's
/// `duration` in ComfyUI), looping forever.
pub fn animated_webp(frames: Rgb8Frames<'_>, fps: f64, o: WebpOptions) -> Result<Vec<u8>, String> {
    use webp_animation::{ColorMode, Encoder, EncoderOptions, EncodingConfig, EncodingType, LossyEncodingConfig};
    frames.check()?;
    if !(fps.is_finite() && fps > 0.0) {
        return Err(format!("fps {fps} must be positive"));
    }
    let duration = ((1000.0 / fps) as i32).max(1);
    let encoding_type = if o.lossless { EncodingType::Lossless } else { EncodingType::Lossy(LossyEncodingConfig::default()) };
    let options = EncoderOptions {
        color_mode: ColorMode::Rgb,
        encoding_config: Some(EncodingConfig { encoding_type, quality: o.quality.clamp(0.0, 100.0), method: o.method.min(6) }),
        ..Default::default()
    };
    let mut enc = Encoder::new_with_options((frames.width as u32, frames.height as u32), options).map_err(|e| format!("WebP encoder: {e:?}"))?;
    let n = frames.count();
    for i in 0..n {
        enc.add_frame(frames.frame(i), i as i32 * duration).map_err(|e| format!("WebP frame {i}: {e:?}"))?;
    }
    let data = enc.finalize(n as i32 * duration).map_err(|e| format!("WebP: {e:?}"))?;
    Ok(data.to_vec())
}

/// An AVI of Motion-JPEG `frames` at `fps` (JPEG `quality` 1–100), with an index: what
/// sd-cli writes for a video `-o`.
pub fn mjpg_avi(frames: Rgb8Frames<'_>, fps: f64, quality: u8) -> Result<Vec<u8>, String> {
    frames.check()?;
    if !(fps.is_finite() && fps > 0.0 && fps <= 1000.0) {
        return Err(format!("fps {fps} must be in (0, 1000]"));
    }
    let n = frames.count();
    let mut jpegs = Vec::with_capacity(n);
    for i in 0..n {
        let mut out = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality.clamp(1, 100))
            .encode(frames.frame(i), frames.width as u32, frames.height as u32, image::ExtendedColorType::Rgb8)
            .map_err(|e| format!("JPEG frame {i}: {e}"))?;
        jpegs.push(out);
    }
    // A whole frame rate as rate/1, else in thousandths.
    let (rate, scale) = if fps.fract() == 0.0 { (fps as u32, 1u32) } else { ((fps * 1000.0).round() as u32, 1000) };
    let (w, h) = (frames.width as u32, frames.height as u32);
    let max_frame = jpegs.iter().map(Vec::len).max().unwrap_or(0) as u32;
    let u32le = |v: &mut Vec<u8>, x: u32| v.extend_from_slice(&x.to_le_bytes());
    let chunk = |id: &[u8; 4], body: &[u8]| -> Vec<u8> {
        let mut c = Vec::with_capacity(body.len() + 9);
        c.extend_from_slice(id);
        c.extend_from_slice(&(body.len() as u32).to_le_bytes());
        c.extend_from_slice(body);
        if body.len() % 2 == 1 {
            c.push(0);
        }
        c
    };
    let list = |kind: &[u8; 4], parts: &[Vec<u8>]| -> Vec<u8> {
        let mut body = kind.to_vec();
        for p in parts {
            body.extend_from_slice(p);
        }
        chunk(b"LIST", &body)
    };
    let mut avih = Vec::with_capacity(56);
    u32le(&mut avih, (1_000_000.0 / fps).round() as u32); // µs per frame
    u32le(&mut avih, (max_frame as f64 * fps).round() as u32); // max bytes per second
    u32le(&mut avih, 0); // padding granularity
    u32le(&mut avih, 0x10); // AVIF_HASINDEX
    u32le(&mut avih, n as u32);
    u32le(&mut avih, 0); // initial frames
    u32le(&mut avih, 1); // streams
    u32le(&mut avih, max_frame);
    u32le(&mut avih, w);
    u32le(&mut avih, h);
    avih.extend_from_slice(&[0; 16]);
    let mut strh = Vec::with_capacity(56);
    strh.extend_from_slice(b"vidsMJPG");
    u32le(&mut strh, 0); // flags
    u32le(&mut strh, 0); // priority, language
    u32le(&mut strh, 0); // initial frames
    u32le(&mut strh, scale);
    u32le(&mut strh, rate);
    u32le(&mut strh, 0); // start
    u32le(&mut strh, n as u32); // length
    u32le(&mut strh, max_frame);
    u32le(&mut strh, u32::MAX); // quality: default
    u32le(&mut strh, 0); // sample size
    for v in [0u16, 0, w as u16, h as u16] {
        strh.extend_from_slice(&v.to_le_bytes());
    }
    let mut strf = Vec::with_capacity(40);
    u32le(&mut strf, 40);
    u32le(&mut strf, w);
    u32le(&mut strf, h);
    strf.extend_from_slice(&1u16.to_le_bytes()); // planes
    strf.extend_from_slice(&24u16.to_le_bytes()); // bits per pixel
    strf.extend_from_slice(b"MJPG");
    u32le(&mut strf, w * h * 3);
    strf.extend_from_slice(&[0; 16]);
    let hdrl = list(b"hdrl", &[chunk(b"avih", &avih), list(b"strl", &[chunk(b"strh", &strh), chunk(b"strf", &strf)])]);
    // Index offsets count from the `movi` fourcc.
    let mut index = Vec::with_capacity(16 * n);
    let mut movi_parts = Vec::with_capacity(n);
    let mut offset = 4u32;
    for j in &jpegs {
        let c = chunk(b"00dc", j);
        index.extend_from_slice(b"00dc");
        u32le(&mut index, 0x10); // AVIIF_KEYFRAME
        u32le(&mut index, offset);
        u32le(&mut index, j.len() as u32);
        offset += c.len() as u32;
        movi_parts.push(c);
    }
    let movi = list(b"movi", &movi_parts);
    let mut body = b"AVI ".to_vec();
    body.extend_from_slice(&hdrl);
    body.extend_from_slice(&movi);
    body.extend_from_slice(&chunk(b"idx1", &index));
    if body.len() > u32::MAX as usize - 8 {
        return Err(format!("{} bytes of video: larger than an AVI file holds (4 GiB)", body.len()));
    }
    let mut out = Vec::with_capacity(body.len() + 8);
    out.write_all(&chunk(b"RIFF", &body)).map_err(|e| e.to_string())?;
    Ok(out)
}

/// A WebM of VP8 `frames` at `fps` as sd-cli writes `.webm`: each frame libwebp's lossy
/// encoding at `quality` (0–100), its `VP8 ` chunk taken as a keyframe, stamped at
/// `i · round(10⁹ / fps)` ns in libwebm's muxer.
pub fn vp8_webm(frames: Rgb8Frames<'_>, fps: f64, quality: f32) -> Result<Vec<u8>, String> {
    frames.check()?;
    check_fps(fps)?;
    let step = (1e9 / fps).round() as u64;
    let packets = (0..frames.count())
        .map(|i| Ok((vp8_frame(frames.frame(i), frames.width, frames.height, quality).map_err(|e| format!("frame {i}: {e}"))?, i as u64 * step, true)))
        .collect::<Result<Vec<_>, String>>()?;
    webm_file(frames, WebmCodec::Vp8, &packets)
}

fn check_fps(fps: f64) -> Result<(), String> {
    if !(fps.is_finite() && fps > 0.0 && fps <= 1000.0) {
        return Err(format!("fps {fps} must be in (0, 1000]"));
    }
    Ok(())
}

/// What the constant-quality WebM writers (VP9, AV1) take: whole frames, a rate, a CRF of
/// 0–63.
fn check_crf_input(frames: Rgb8Frames<'_>, fps: f64, crf: u32) -> Result<(), String> {
    frames.check()?;
    check_fps(fps)?;
    if crf > 63 {
        return Err(format!("crf {crf} is outside 0..=63"));
    }
    Ok(())
}

/// What a WebM's video track holds.
enum WebmCodec {
    Vp8,
    Vp9,
    /// AV1 with its codec configuration record (`av1C`, Matroska's CodecPrivate) and bit
    /// depth.
    Av1 { av1c: Vec<u8>, bit_depth: u8 },
}

/// libwebm's muxer over encoded frames: (payload, time in ns, keyframe) each.
fn webm_file(frames: Rgb8Frames<'_>, codec: WebmCodec, packets: &[(Vec<u8>, u64, bool)]) -> Result<Vec<u8>, String> {
    use webm::mux::{Segment, Track, VideoCodecId, Writer};
    let mut segment = Segment::new(Writer::new(std::io::Cursor::new(Vec::new()))).ok_or("WebM: the muxer did not start")?;
    segment.set_app_name("sdflow");
    let id = match codec {
        WebmCodec::Vp8 => VideoCodecId::VP8,
        WebmCodec::Vp9 => VideoCodecId::VP9,
        WebmCodec::Av1 { .. } => VideoCodecId::AV1,
    };
    let mut track = segment.add_video_track_opt(frames.width as u32, frames.height as u32, None, id).ok_or("WebM: no video track")?;
    if let WebmCodec::Av1 { av1c, bit_depth } = &codec {
        // 4:2:0, limited range.
        if !track.set_color(*bit_depth, (true, true), false) || !segment.set_codec_private(track.track_number(), av1c) {
            return Err("WebM: the AV1 track's configuration was not taken".into());
        }
    }
    for (i, (bytes, ns, key)) in packets.iter().enumerate() {
        if !track.add_frame(bytes, *ns, *key) {
            return Err(format!("WebM: frame {i} was not muxed"));
        }
    }
    let writer = segment.try_finalize(None).map_err(|_| "WebM: the muxer did not finish".to_string())?;
    Ok(writer.unwrap().into_inner())
}

/// One RGB frame as libwebp's lossy VP8 bitstream (the payload of its `VP8 ` chunk).
fn vp8_frame(rgb: &[u8], width: usize, height: usize, quality: f32) -> Result<Vec<u8>, String> {
    let mut out: *mut u8 = std::ptr::null_mut();
    // SAFETY: `rgb` holds width·height RGB pixels (checked by the caller) with a stride of
    // 3·width; libwebp allocates `out`, freed below with its own WebPFree.
    let size = unsafe { libwebp_sys::WebPEncodeRGB(rgb.as_ptr(), width as i32, height as i32, 3 * width as i32, quality.clamp(0.0, 100.0), &mut out) };
    if size == 0 || out.is_null() {
        return Err("libwebp could not encode it".into());
    }
    // SAFETY: libwebp wrote `size` bytes at `out`.
    let file = unsafe { std::slice::from_raw_parts(out, size) }.to_vec();
    // SAFETY: `out` came from libwebp's encoder.
    unsafe { libwebp_sys::WebPFree(out.cast()) };
    riff_chunk(&file, b"VP8 ").map(<[u8]>::to_vec).ok_or_else(|| "libwebp gave no VP8 chunk".to_string())
}

/// The payload of the first `id` chunk of a RIFF WebP file.
fn riff_chunk<'a>(file: &'a [u8], id: &[u8; 4]) -> Option<&'a [u8]> {
    if file.get(..4)? != b"RIFF" || file.get(8..12)? != b"WEBP" {
        return None;
    }
    let mut at = 12;
    while at + 8 <= file.len() {
        let size = u32::from_le_bytes(file[at + 4..at + 8].try_into().ok()?) as usize;
        let body = file.get(at + 8..at + 8 + size)?;
        if &file[at..at + 4] == id {
            return Some(body);
        }
        at += 8 + size + size % 2;
    }
    None
}

/// An MP4 of H.264 `frames` at `fps` (what ComfyUI's SaveVideo writes for `auto` / `mp4`
/// and `h264`): 4:2:0 frames from OpenH264 (an IDR frame first), each stored as
/// length-prefixed NAL units with the stream's SPS and PPS in the `avc1` box, at a
/// timescale of fps·1000 so fractional rates are exact.
pub fn h264_mp4(frames: Rgb8Frames<'_>, fps: f64) -> Result<Vec<u8>, String> {
    use mp4::{AvcConfig, MediaConfig, Mp4Config, Mp4Sample, Mp4Writer, TrackConfig, TrackType};
    use openh264::encoder::{BitRate, Encoder, EncoderConfig, FrameRate};
    use openh264::formats::{RgbSliceU8, YUVBuffer};
    frames.check()?;
    if frames.width % 2 == 1 || frames.height % 2 == 1 {
        return Err(format!("{}x{} frames: H.264 in 4:2:0 needs even sides", frames.width, frames.height));
    }
    if !(fps.is_finite() && (1.0..=1000.0).contains(&fps)) {
        return Err(format!("fps {fps} must be in 1..=1000"));
    }
    // Quality-first rate control with room for detailed frames (~0.3 bit per pixel).
    let bits = (frames.width * frames.height) as f64 * fps * 0.3;
    let config = EncoderConfig::new().max_frame_rate(FrameRate::from_hz(fps as f32)).bitrate(BitRate::from_bps(bits.clamp(500_000.0, 400_000_000.0) as u32));
    let mut encoder = Encoder::with_api_config(openh264::OpenH264API::from_source(), config).map_err(|e| format!("OpenH264: {e}"))?;
    let (mut sps, mut pps) = (None, None);
    let mut samples = Vec::with_capacity(frames.count());
    for i in 0..frames.count() {
        let yuv = YUVBuffer::from_rgb_source(RgbSliceU8::new(frames.frame(i), (frames.width, frames.height)));
        let stream = encoder.encode(&yuv).map_err(|e| format!("OpenH264 frame {i}: {e}"))?;
        let mut sample = Vec::new();
        let mut sync = false;
        for l in 0..stream.num_layers() {
            let layer = stream.layer(l).expect("a layer below the count");
            for n in 0..layer.nal_count() {
                let nal = strip_start_code(layer.nal_unit(n).expect("a NAL unit below the count"));
                match nal.first().map(|b| b & 0x1f) {
                    Some(7) => sps = sps.or_else(|| Some(nal.to_vec())),
                    Some(8) => pps = pps.or_else(|| Some(nal.to_vec())),
                    Some(t) => {
                        sync |= t == 5;
                        sample.extend_from_slice(&(nal.len() as u32).to_be_bytes());
                        sample.extend_from_slice(nal);
                    }
                    None => {}
                }
            }
        }
        if sample.is_empty() {
            return Err(format!("OpenH264 skipped frame {i}"));
        }
        samples.push((sample, sync));
    }
    let (Some(sps), Some(pps)) = (sps, pps) else { return Err("OpenH264 gave no SPS/PPS".into()) };
    let brand = |b: &[u8; 4]| mp4::FourCC::from(*b);
    let config = Mp4Config { major_brand: brand(b"isom"), minor_version: 512, compatible_brands: vec![brand(b"isom"), brand(b"iso2"), brand(b"avc1"), brand(b"mp41")], timescale: 1000 };
    let mut writer = Mp4Writer::write_start(std::io::Cursor::new(Vec::new()), &config).map_err(|e| format!("MP4: {e}"))?;
    let timescale = (fps * 1000.0).round() as u32;
    let avc = AvcConfig { width: frames.width as u16, height: frames.height as u16, seq_param_set: sps, pic_param_set: pps };
    writer.add_track(&TrackConfig { track_type: TrackType::Video, timescale, language: "und".into(), media_conf: MediaConfig::AvcConfig(avc) }).map_err(|e| format!("MP4: {e}"))?;
    for (i, (bytes, is_sync)) in samples.into_iter().enumerate() {
        let sample = Mp4Sample { start_time: i as u64 * 1000, duration: 1000, rendering_offset: 0, is_sync, bytes: bytes::Bytes::from(bytes) };
        writer.write_sample(1, &sample).map_err(|e| format!("MP4 frame {i}: {e}"))?;
    }
    writer.write_end().map_err(|e| format!("MP4: {e}"))?;
    Ok(writer.into_writer().into_inner())
}

/// A NAL unit without its Annex-B start code.
fn strip_start_code(nal: &[u8]) -> &[u8] {
    nal.strip_prefix(&[0, 0, 0, 1][..]).or_else(|| nal.strip_prefix(&[0, 0, 1][..])).unwrap_or(nal)
}

/// A WebM of VP9 `frames` at `fps` as ComfyUI's SaveWEBM writes it (PyAV's `libvpx-vp9`
/// with `crf` and no bitrate, `yuv420p`): libvpx in constant-quality mode at `crf` (0–63),
/// BT.601 limited-range 4:2:0 frames, stamped at fps·1000 ticks and muxed by libwebm.
pub fn vp9_webm(frames: Rgb8Frames<'_>, fps: f64, crf: u32) -> Result<Vec<u8>, String> {
    use vpx_sys::*;
    check_crf_input(frames, fps, crf)?;
    let (w, h) = (frames.width, frames.height);
    let rate = (fps * 1000.0).round() as i32;
    // SAFETY: plain C structs filled by libvpx; every call's result is checked, the
    // context is destroyed on every path after its init succeeded.
    unsafe {
        let iface = vpx_codec_vp9_cx();
        // libvpx fills the configuration (some of its enums have no zero value).
        let mut cfg = std::mem::MaybeUninit::<vpx_codec_enc_cfg_t>::uninit();
        if vpx_codec_enc_config_default(iface, cfg.as_mut_ptr(), 0) != vpx_codec_err_t::VPX_CODEC_OK {
            return Err("libvpx: no VP9 encoder configuration".into());
        }
        let mut cfg = cfg.assume_init();
        cfg.g_w = w as u32;
        cfg.g_h = h as u32;
        cfg.g_timebase = vpx_rational { num: 1000, den: rate };
        cfg.g_threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8) as u32;
        cfg.rc_end_usage = vpx_rc_mode::VPX_Q;
        cfg.rc_target_bitrate = 0;
        let mut ctx: vpx_codec_ctx_t = std::mem::zeroed();
        if vpx_codec_enc_init_ver(&mut ctx, iface, &cfg, 0, VPX_ENCODER_ABI_VERSION as i32) != vpx_codec_err_t::VPX_CODEC_OK {
            return Err("libvpx: the VP9 encoder did not start".into());
        }
        let result = (|| -> Result<Vec<(Vec<u8>, i64, bool)>, String> {
            let mut control = |id: vp8e_enc_control_id, v: i32| if vpx_codec_control_(&mut ctx, id as i32, v) == vpx_codec_err_t::VPX_CODEC_OK { Ok(()) } else { Err(format!("libvpx: control {id:?} refused")) };
            control(vp8e_enc_control_id::VP8E_SET_CQ_LEVEL, crf as i32)?;
            // libvpx's "good" speed ffmpeg uses for libvpx-vp9 (cpu-used 1) is slow for
            // long videos on a CPU; 4 keeps the quality mode at a fraction of the time.
            control(vp8e_enc_control_id::VP8E_SET_CPUUSED, 4)?;
            let mut packets = Vec::new();
            let drain = |ctx: &mut vpx_codec_ctx_t, packets: &mut Vec<(Vec<u8>, i64, bool)>| {
                let mut iter: vpx_codec_iter_t = std::ptr::null();
                loop {
                    let pkt = vpx_codec_get_cx_data(ctx, &mut iter);
                    if pkt.is_null() {
                        break;
                    }
                    if (*pkt).kind == vpx_codec_cx_pkt_kind::VPX_CODEC_CX_FRAME_PKT {
                        let f = (*pkt).data.frame;
                        let bytes = std::slice::from_raw_parts(f.buf as *const u8, f.sz as usize).to_vec();
                        packets.push((bytes, f.pts, f.flags & VPX_FRAME_IS_KEY != 0));
                    }
                }
            };
            let (mut planes, mut yuv) = (Vec::new(), Vec::new());
            for i in 0..frames.count() {
                yuv420(frames.frame(i), w, h, 8, &mut planes);
                yuv.clear();
                yuv.extend(planes.iter().map(|&v| v as u8));
                let mut img = std::mem::MaybeUninit::<vpx_image_t>::uninit();
                let wrapped = vpx_img_wrap(img.as_mut_ptr(), vpx_img_fmt::VPX_IMG_FMT_I420, w as u32, h as u32, 1, yuv.as_mut_ptr());
                if wrapped.is_null() {
                    return Err("libvpx: the frame could not be wrapped".into());
                }
                if vpx_codec_encode(&mut ctx, wrapped, i as i64, 1, 0, VPX_DL_GOOD_QUALITY as _) != vpx_codec_err_t::VPX_CODEC_OK {
                    return Err(format!("libvpx: frame {i} was not encoded"));
                }
                drain(&mut ctx, &mut packets);
            }
            // Flush the frames libvpx holds back (its look-ahead).
            loop {
                let before = packets.len();
                if vpx_codec_encode(&mut ctx, std::ptr::null(), -1, 1, 0, VPX_DL_GOOD_QUALITY as _) != vpx_codec_err_t::VPX_CODEC_OK {
                    return Err("libvpx: the encoder did not flush".into());
                }
                drain(&mut ctx, &mut packets);
                if packets.len() == before {
                    break;
                }
            }
            Ok(packets)
        })();
        vpx_codec_destroy(&mut ctx);
        let packets: Vec<(Vec<u8>, u64, bool)> = result?.into_iter().map(|(bytes, pts, key)| (bytes, (pts as f64 * 1e9 * 1000.0 / rate as f64).round() as u64, key)).collect();
        webm_file(frames, WebmCodec::Vp9, &packets)
    }
}

/// SVT-AV1's qindex for each CRF (its `quantizer_to_qindex`, libaom's too): ComfyUI's
/// `crf` goes to SVT-AV1, ours to rav1e's quantizer, which is a qindex.
fn crf_qindex(crf: u32) -> usize {
    match crf {
        0..=61 => 4 * crf as usize,
        62 => 249,
        _ => 255,
    }
}

/// rav1e's speed preset (0 slowest – 10 fastest) for SaveWEBM's av1: ComfyUI asks SVT-AV1
/// for its preset 6 of 13, the middle; rav1e is slower at equal settings.
const AV1_SPEED: u8 = 8;

/// A WebM of AV1 `frames` at `fps` as ComfyUI's SaveWEBM writes its `av1` codec (PyAV's
/// `libsvtav1` at `crf`, `yuv420p10le`): rav1e — xiph's encoder in Rust; SVT-AV1 and
/// libaom have no maintained crate — at a constant quantizer (SVT-AV1's qindex for the
/// crf), 10-bit BT.601 limited-range 4:2:0 frames, stamped at fps·1000 ticks, muxed by
/// libwebm with the stream's `av1C` record.
pub fn av1_webm(frames: Rgb8Frames<'_>, fps: f64, crf: u32) -> Result<Vec<u8>, String> {
    use rav1e::prelude::*;
    check_crf_input(frames, fps, crf)?;
    let (w, h) = (frames.width, frames.height);
    let rate = (fps * 1000.0).round() as u64;
    let bt601 = ColorDescription { color_primaries: ColorPrimaries::BT601, transfer_characteristics: TransferCharacteristics::BT601, matrix_coefficients: MatrixCoefficients::BT601 };
    let enc = EncoderConfig {
        width: w,
        height: h,
        bit_depth: 10,
        chroma_sampling: ChromaSampling::Cs420,
        pixel_range: PixelRange::Limited,
        color_description: Some(bt601),
        time_base: Rational::new(1000, rate),
        quantizer: crf_qindex(crf),
        bitrate: 0,
        // Frames in order, one packet each: no hidden reference frames to time.
        low_latency: true,
        speed_settings: SpeedSettings::from_preset(AV1_SPEED),
        ..Default::default()
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    let mut ctx: Context<u16> = Config::new().with_encoder_config(enc).with_threads(threads).new_context().map_err(|e| format!("rav1e: {e}"))?;
    let mut packets = Vec::new();
    // Takes what the encoder has ready; true once it has given its last frame.
    let mut receive = |ctx: &mut Context<u16>| -> Result<bool, String> {
        loop {
            match ctx.receive_packet() {
                Ok(p) => packets.push((p.data, (p.input_frameno as f64 * 1e9 * 1000.0 / rate as f64).round() as u64, p.frame_type == FrameType::KEY)),
                Err(EncoderStatus::Encoded) => {}
                Err(EncoderStatus::NeedMoreData) => return Ok(false),
                Err(EncoderStatus::LimitReached) => return Ok(true),
                Err(e) => return Err(format!("rav1e: {e}")),
            }
        }
    };
    let (cw, mut planes) = (w.div_ceil(2), Vec::new());
    for i in 0..frames.count() {
        yuv420(frames.frame(i), w, h, 10, &mut planes);
        let mut f = ctx.new_frame();
        let (y, uv) = planes.split_at(w * h);
        for (plane, (values, stride)) in f.planes.iter_mut().zip([(y, w), (&uv[..uv.len() / 2], cw), (&uv[uv.len() / 2..], cw)]) {
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            plane.copy_from_raw_u8(&bytes, 2 * stride, 2);
        }
        ctx.send_frame(f).map_err(|e| format!("rav1e: frame {i}: {e}"))?;
        receive(&mut ctx)?;
    }
    ctx.flush();
    if !receive(&mut ctx)? {
        return Err("rav1e: the encoder stopped before its last frame".into());
    }
    if packets.len() != frames.count() {
        return Err(format!("rav1e: {} frames in, {} out", frames.count(), packets.len()));
    }
    let av1c = ctx.container_sequence_header();
    webm_file(frames, WebmCodec::Av1 { av1c, bit_depth: 10 }, &packets)
}

/// One RGB frame as planar 4:2:0 of `bits` (8 or 10) per sample (Y, then U and V at half
/// size rounded up), BT.601 limited range as swscale converts `rgb24` to `yuv420p` (or
/// `yuv420p10le`: the same levels 2^(bits−8) times finer); chroma averages 2×2 pixels.
fn yuv420(rgb: &[u8], w: usize, h: usize, bits: u32, out: &mut Vec<u16>) {
    let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
    let shift = bits - 8;
    let max = (1i32 << bits) - 1;
    out.clear();
    out.reserve(w * h + 2 * cw * ch);
    let px = |x: usize, y: usize| {
        let p = &rgb[(y * w + x) * 3..][..3];
        (p[0] as i32, p[1] as i32, p[2] as i32)
    };
    for y in 0..h {
        for x in 0..w {
            let (r, g, b) = px(x, y);
            out.push(((((66 * r + 129 * g + 25 * b) << shift) + 128) >> 8) as u16 + (16 << shift));
        }
    }
    for plane in 0..2 {
        for cy in 0..ch {
            for cx in 0..cw {
                let (mut sum, mut n) = (0i32, 0i32);
                for (x, y) in [(2 * cx, 2 * cy), (2 * cx + 1, 2 * cy), (2 * cx, 2 * cy + 1), (2 * cx + 1, 2 * cy + 1)] {
                    if x < w && y < h {
                        let (r, g, b) = px(x, y);
                        sum += (if plane == 0 { (-38 * r - 74 * g + 112 * b) << shift } else { (112 * r - 94 * g - 18 * b) << shift } + 128) >> 8;
                        n += 1;
                    }
                }
                out.push((sum / n + (128 << shift)).clamp(0, max) as u16);
            }
        }
    }
}

/// The frames of a WebM file: its document type, its video track's codec (`V_VP8`,
/// `V_VP9`, …) and each SimpleBlock's payload with its time (ms) and keyframe flag.
#[derive(Debug, Default)]
pub struct WebmFrames {
    pub doc_type: String,
    pub codec: String,
    pub blocks: Vec<(i64, bool, Vec<u8>)>,
}

/// Reads `file`'s EBML: the header, Segment, Tracks and Clusters entered, every
/// SimpleBlock taken (lacing is not read: sdflow's and libwebm's blocks have none).
pub fn webm_frames(file: &[u8]) -> Result<WebmFrames, String> {
    fn vint(b: &[u8], at: &mut usize, keep_marker: bool) -> Result<u64, String> {
        let first = *b.get(*at).ok_or("EBML: truncated")?;
        let len = first.leading_zeros() as usize + 1;
        if len > 8 || *at + len > b.len() {
            return Err(format!("EBML: a bad number at {}", *at));
        }
        let mut v = if keep_marker { first as u64 } else { (first as u64) & ((1u64 << (8 - len)) - 1) };
        for i in 1..len {
            v = (v << 8) | b[*at + i] as u64;
        }
        *at += len;
        Ok(v)
    }
    fn walk(b: &[u8], from: usize, to: usize, cluster: &mut i64, out: &mut WebmFrames) -> Result<(), String> {
        let mut at = from;
        while at < to {
            let id = vint(b, &mut at, true)?;
            let size = vint(b, &mut at, false)? as usize;
            let body = b.get(at..at + size).ok_or_else(|| format!("EBML: element {id:#x} runs past the file"))?;
            match id {
                // EBML header, Segment, Tracks, TrackEntry, Cluster: their children.
                0x1A45_DFA3 | 0x1853_8067 | 0x1654_AE6B | 0xAE | 0x1F43_B675 => walk(b, at, at + size, cluster, out)?,
                0x4282 => out.doc_type = String::from_utf8_lossy(body).into_owned(),
                0x86 => out.codec = String::from_utf8_lossy(body).into_owned(),
                0xE7 => *cluster = body.iter().fold(0i64, |v, x| (v << 8) | *x as i64),
                0xA3 => {
                    let mut p = 0;
                    vint(body, &mut p, false)?;
                    let head = body.get(p..p + 3).ok_or("EBML: a short SimpleBlock")?;
                    let offset = i16::from_be_bytes([head[0], head[1]]) as i64;
                    out.blocks.push((*cluster + offset, head[2] & 0x80 != 0, body[p + 3..].to_vec()));
                }
                _ => {}
            }
            at += size;
        }
        Ok(())
    }
    let mut out = WebmFrames::default();
    walk(file, 0, file.len(), &mut 0, &mut out)?;
    Ok(out)
}
