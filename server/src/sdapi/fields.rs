//! What each field of an A1111 `txt2img` / `img2img` request means to sdflow, so that
//! nothing a client sends is dropped unsaid: a field is **honoured** (read by
//! [`super::a1111`]), **neutral** (an A1111 feature sdflow does not have, accepted at the
//! value that leaves it off and refused at any other), or **unknown** (refused). A refusal
//! is a 400 naming the field.

use serde_json::Value as Json;

/// The fields [`super::a1111`] reads.
const HONOURED: &[&str] = &[
    "prompt",
    "negative_prompt",
    "width",
    "height",
    "steps",
    "cfg_scale",
    "sampler_name",
    "sampler_index",
    "scheduler",
    "eta",
    "seed",
    "subseed",
    "subseed_strength",
    "refiner_checkpoint",
    "refiner_switch_at",
    "alwayson_scripts",
    "batch_size",
    "n_iter",
    "clip_skip",
    "denoising_strength",
    "override_settings",
    "enable_hr",
    "hr_scale",
    "hr_upscaler",
    "hr_second_pass_steps",
    "hr_steps",
    "hr_resize_x",
    "hr_resize_y",
    "send_images",
    "lora",
    "init_images",
    "mask",
    "inpainting_mask_invert",
    "mask_blur",
    "mask_blur_x",
    "mask_blur_y",
    "resize_mode",
    "inpainting_fill",
    "inpaint_full_res",
    "inpaint_full_res_padding",
    "initial_noise_multiplier",
];

/// Whether `v` is JSON null, or `false`, `0`, `""`, `[]` or `{}`.
pub(super) fn off(v: &Json) -> bool {
    match v {
        Json::Null => true,
        Json::Bool(b) => !b,
        Json::Number(n) => n.as_f64() == Some(0.0),
        Json::String(s) => s.is_empty(),
        Json::Array(a) => a.is_empty(),
        Json::Object(o) => o.is_empty(),
    }
}

fn equals(v: &Json, x: f64) -> bool {
    v.is_null() || v.as_f64() == Some(x)
}

/// For a neutral field: `Some(None)` when the value leaves its feature off, `Some(Some(why))`
/// when it asks for it; `None` for a field that is not neutral.
fn neutral(key: &str, v: &Json) -> Option<Option<&'static str>> {
    let refuse = |ok: bool, why: &'static str| Some((!ok).then_some(why));
    match key {
        // Bookkeeping with no effect on the images (sdflow keeps every result in its
        // output folder and history, as ComfyUI does).
        "do_not_save_samples" | "do_not_save_grid" | "save_images" | "comments" | "force_task_id" | "infotext" | "user" | "override_settings_restore_afterwards" | "include_init_images" => Some(None),
        // Parts of features that are off unless their switch is on; A1111 1.6+ ignores
        // the old hires first-pass size.
        "image_cfg_scale" | "firstphase_width" | "firstphase_height" => Some(None),
        // A1111 rounds the mask (an alpha mask's alpha, the latent mask) unless told not to.
        "mask_round" => refuse(v.is_null() || v == &Json::Bool(true), "only rounded masks (true) are supported"),
        "seed_resize_from_h" | "seed_resize_from_w" => refuse(v.is_null() || v.as_f64().is_some_and(|x| x <= 0.0), "resizing the seed is not supported"),
        "restore_faces" => refuse(off(v), "face restoration is not supported (use the ADetailer nodes)"),
        "tiling" => refuse(v.is_null() || v.is_boolean(), "seamless tiling is true or false"), // honoured: a1111 maps true to circular padding on both axes
        "styles" => refuse(off(v), "saved styles are not supported: put the text in the prompt"),
        "script_name" | "script_args" => refuse(off(v), "A1111 scripts are not supported (of the extensions, ControlNet is, through `alwayson_scripts`)"),
        "disable_extra_networks" => refuse(off(v), "<lora:…> tags are always read"),
        "firstpass_image" | "latent_mask" => refuse(off(v), "not supported"),
        "hr_checkpoint_name" | "hr_sampler_name" | "hr_scheduler" | "hr_prompt" | "hr_negative_prompt" | "hr_additional_modules" => refuse(off(v), "the hires pass uses the first pass's model, sampler and prompts"),
        "s_churn" | "s_tmin" | "s_min_uncond" => refuse(off(v), "sampler noise options are not supported"),
        "s_noise" => refuse(equals(v, 1.0), "sampler noise options are not supported"),
        "s_tmax" => refuse(off(v) || v.as_f64().is_some_and(f64::is_infinite), "sampler noise options are not supported"),
        _ => None,
    }
}

/// The first field of `body` sdflow does not honour and cannot leave off, as the message of
/// a 400.
pub fn check(body: &serde_json::Map<String, Json>) -> Result<(), String> {
    for (key, value) in body {
        if HONOURED.contains(&key.as_str()) {
            continue;
        }
        match neutral(key, value) {
            Some(None) => {}
            Some(Some(why)) => return Err(format!("`{key}`: {value} is not supported ({why})")),
            None => return Err(format!("unknown field `{key}`")),
        }
    }
    Ok(())
}

/// The `override_settings` sdflow honours: the checkpoint, CLIP skip, and settings at
/// the values that change nothing.
pub fn check_overrides(settings: &Json) -> Result<(), String> {
    let Some(map) = settings.as_object() else {
        return if settings.is_null() { Ok(()) } else { Err(format!("`override_settings`: {settings} is not an object")) };
    };
    for (key, v) in map {
        let ok = match key.as_str() {
            "sd_model_checkpoint" | "CLIP_stop_at_last_layers" => true,
            "samples_format" => v.as_str().is_none_or(|f| f.eq_ignore_ascii_case("png")),
            "sd_vae" => v.as_str().is_none_or(|s| matches!(s, "Automatic" | "None" | "")),
            "eta_noise_seed_delta" => off(v),
            _ => return Err(format!("`override_settings.{key}` is not supported (sd_model_checkpoint and CLIP_stop_at_last_layers are)")),
        };
        if !ok {
            return Err(format!("`override_settings.{key}`: {v} is not supported"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Json) -> serde_json::Map<String, Json> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn defaults_pass_features_are_refused_by_name() {
        // What A1111's own API page sends by default.
        assert_eq!(check(&body(json!({"prompt": "x", "styles": [], "subseed": -1, "subseed_strength": 0, "seed_resize_from_h": -1, "restore_faces": false, "tiling": false, "s_noise": 1, "alwayson_scripts": {}, "script_args": [], "refiner_checkpoint": null, "hr_prompt": "", "inpainting_fill": 1, "send_images": true}))), Ok(()));
        // A1111's img2img options are read by the request (their values checked there).
        assert_eq!(check(&body(json!({"prompt": "x", "mask": "AAAA", "inpainting_fill": 0, "inpaint_full_res": true, "inpaint_full_res_padding": 32, "resize_mode": 2, "initial_noise_multiplier": 1.5, "mask_round": true}))), Ok(()));
        for (field, value) in [("tiling", json!("yes")), ("seed_resize_from_w", json!(64)), ("restore_faces", json!(true)), ("styles", json!(["anime"])), ("script_name", json!("x/y/z plot")), ("mask_round", json!(false))] {
            let e = check(&body(json!({"prompt": "x", field: value}))).unwrap_err();
            assert!(e.contains(&format!("`{field}`")), "{e}");
        }
        assert_eq!(check(&body(json!({"prompt": "x", "wings": 2}))), Err("unknown field `wings`".into()));
        assert!(check_overrides(&json!({"sd_model_checkpoint": "a", "samples_format": "png"})).is_ok());
        assert!(check_overrides(&json!({"samples_format": "jpg"})).unwrap_err().contains("samples_format"));
        assert!(check_overrides(&json!({"face_restoration_model": "x"})).unwrap_err().contains("face_restoration_model"));
    }
}
