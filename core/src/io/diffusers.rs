//! diffusers pipeline folders as one source.
//!
//! Each known component folder contributes its weights with names prefixed by the folder
//! name (`unet.conv_in.weight`, `vae.encoder.conv_in.weight`, ...). Renaming to LDM names is
//! a separate step.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{merge_into, FileSource, Format, IoError, OpenOptions};

/// Component folders we read, in the order their tensors are listed.
pub const COMPONENTS: &[&str] = &[
    "unet",
    "transformer",
    "vae",
    "text_encoder",
    "text_encoder_2",
    "text_encoder_3",
];

/// Weight files of one component, in order of preference: safetensors (single, sharded,
/// fp16 variant) before pickles.
const WEIGHT_FILES: &[&str] = &[
    "diffusion_pytorch_model.safetensors",
    "model.safetensors",
    "diffusion_pytorch_model.safetensors.index.json",
    "model.safetensors.index.json",
    "diffusion_pytorch_model.fp16.safetensors",
    "model.fp16.safetensors",
    "diffusion_pytorch_model.fp16.safetensors.index.json",
    "model.fp16.safetensors.index.json",
    "diffusion_pytorch_model.bin",
    "pytorch_model.bin",
    "diffusion_pytorch_model.bin.index.json",
    "pytorch_model.bin.index.json",
];

/// True if `dir` looks like a diffusers pipeline (a `model_index.json` or a component folder
/// with a weight file).
pub fn is_diffusers_dir(dir: &Path) -> bool {
    dir.join("model_index.json").is_file()
        || COMPONENTS
            .iter()
            .any(|c| weight_file(&dir.join(c)).is_some())
}

/// Every file of `dir` that a pipeline load reads or may read: `model_index.json`, the
/// scheduler config and the component folders' files, sorted. What a cache key over a
/// folder must cover (the folder's own mtime does not change when a file is rewritten).
pub fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.join("model_index.json")];
    for sub in COMPONENTS.iter().chain(&["scheduler"]) {
        if let Ok(entries) = std::fs::read_dir(dir.join(sub)) {
            out.extend(entries.flatten().map(|e| e.path()));
        }
    }
    out.retain(|p| p.is_file());
    out.sort();
    out
}

fn weight_file(component: &Path) -> Option<PathBuf> {
    WEIGHT_FILES
        .iter()
        .map(|f| component.join(f))
        .find(|p| p.is_file())
}

pub(crate) fn open(dir: &Path, opts: &OpenOptions) -> Result<FileSource, IoError> {
    let mut blobs = Vec::new();
    let mut tensors = Vec::new();
    let mut metadata = BTreeMap::new();
    let mut found = false;
    for comp in COMPONENTS {
        let cdir = dir.join(comp);
        if !cdir.is_dir() {
            continue;
        }
        let Some(file) = weight_file(&cdir) else {
            continue;
        };
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let src = if name.ends_with(".bin.index.json") {
            open_sharded_bin(&file, opts)?
        } else {
            super::open_file_source(&file, opts)?
        };
        found = true;
        let m = merge_into(&mut blobs, &mut tensors, src, |n| format!("{comp}.{n}"));
        metadata.extend(m.into_iter().map(|(k, v)| (format!("{comp}.{k}"), v)));
    }
    if !found {
        return Err(IoError::Format {
            path: dir.to_path_buf(),
            format: Format::Diffusers,
            msg: format!(
                "no weights in any component folder ({}); expected e.g. unet/diffusion_pytorch_model.safetensors",
                COMPONENTS.join(", ")
            ),
        });
    }
    FileSource::new(
        dir.to_path_buf(),
        Format::Diffusers,
        blobs,
        tensors,
        metadata,
    )
}

/// `pytorch_model.bin.index.json`: the same `weight_map` layout as safetensors indexes, over
/// pickle shards.
fn open_sharded_bin(index: &Path, opts: &OpenOptions) -> Result<FileSource, IoError> {
    let ferr = |msg: String| IoError::Format {
        path: index.to_path_buf(),
        format: Format::Pickle,
        msg,
    };
    let text = std::fs::read_to_string(index).map_err(|source| IoError::Io {
        path: index.to_path_buf(),
        source,
    })?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ferr(format!("invalid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| ferr("no \"weight_map\" object".into()))?;
    let mut shards: Vec<&str> = Vec::new();
    for (t, f) in map {
        let f = f
            .as_str()
            .ok_or_else(|| ferr(format!("weight_map entry '{t}' is not a file name")))?;
        if f.contains('/') || f.contains('\\') || f.starts_with('.') {
            return Err(ferr(format!("shard name '{f}' is not a plain file name")));
        }
        if !shards.contains(&f) {
            shards.push(f);
        }
    }
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut blobs = Vec::new();
    let mut tensors = Vec::new();
    for s in shards {
        let src = super::pickle::open(&dir.join(s), opts)?;
        merge_into(&mut blobs, &mut tensors, src, |n| n.to_string());
    }
    FileSource::new(
        index.to_path_buf(),
        Format::Pickle,
        blobs,
        tensors,
        BTreeMap::new(),
    )
}
