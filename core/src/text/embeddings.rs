//! Textual-inversion embeddings: a directory of `*.safetensors`, `*.pt`, `*.bin` or
//! `*.gguf` files, each named by its file stem, matched in prompts and loaded on first
//! use.
//!
//! Matching follows A1111's `EmbeddingDatabase`: the stem is tokenized like prompt text
//! and matched as a token sequence, longest name first, wherever it occurs in a weighted
//! piece of the prompt. ComfyUI's explicit `embedding:NAME` words are understood too
//! (see [`crate::text::tokenize_weighted`]). Files are read through [`crate::io`], so
//! every format it reads works. The tensors a file may hold follow A1111's loader:
//!
//! - A1111 `.pt`: `string_to_param` with one tensor (`string_to_param.*`);
//! - safetensors from most trainers: `emb_params`;
//! - SDXL embeddings: `clip_l` (768 wide) and `clip_g` (1280 wide), one set per encoder;
//! - anything else with exactly one tensor.
//!
//! Each set is `[vectors, width]` (a 1-D `[width]` tensor is one vector).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::tokenizer::ClipTokenizer;
use super::TextError;
use crate::io::TensorInfo;

/// File extensions scanned, in the order a stem that exists more than once is resolved.
pub const EMBEDDING_EXTENSIONS: [&str; 4] = ["safetensors", "gguf", "pt", "bin"];

/// Embedding files are a few kilobytes; anything this big is not one.
const MAX_EMBEDDING_FILE: u64 = 64 << 20;
/// Sub-directory depth scanned (A1111 walks the tree; symlink loops must end).
const MAX_SCAN_DEPTH: usize = 8;

/// One set of vectors for one text encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingVectors {
    /// Tensor the vectors came from (`clip_l`, `emb_params`, `string_to_param.*`, …).
    pub key: String,
    /// Row count: how many token positions the embedding fills.
    pub rows: usize,
    /// Hidden width, which tells the encoder it belongs to (768 CLIP-L, 1024
    /// OpenCLIP-H, 1280 OpenCLIP-bigG).
    pub width: usize,
    /// `rows × width`, row-major.
    pub data: Vec<f32>,
}

/// A loaded textual-inversion embedding.
#[derive(Clone, Debug)]
pub struct Embedding {
    pub name: String,
    pub path: PathBuf,
    /// One entry per encoder the file has vectors for; all with the same `rows`.
    pub vectors: Vec<EmbeddingVectors>,
}

impl Embedding {
    /// Token positions the embedding fills.
    pub fn num_vectors(&self) -> usize {
        self.vectors.first().map_or(0, |v| v.rows)
    }

    /// The vectors for an encoder of hidden size `width` (sd.cpp picks by width).
    pub fn for_width(&self, width: usize) -> Option<&EmbeddingVectors> {
        self.vectors.iter().find(|v| v.width == width)
    }

    /// The vectors stored under tensor name `key` (`clip_l`, `clip_g`).
    pub fn for_key(&self, key: &str) -> Option<&EmbeddingVectors> {
        self.vectors.iter().find(|v| v.key == key)
    }
}

#[derive(Debug)]
struct Entry {
    name: String,
    path: PathBuf,
    ids: Vec<u32>,
}

/// The embeddings of one directory, loaded lazily.
#[derive(Debug, Default)]
pub struct EmbeddingLibrary {
    entries: Vec<Entry>,
    /// First token id of each name → entries starting with it, longest name first.
    by_first_token: HashMap<u32, Vec<usize>>,
    loaded: Mutex<HashMap<usize, Arc<Embedding>>>,
}

impl EmbeddingLibrary {
    /// Scans `dir` and its sub-directories. Files starting with `.`, empty files and
    /// other extensions are ignored; a stem found twice keeps the file whose extension
    /// comes first in [`EMBEDDING_EXTENSIONS`], then the first path in sorted order.
    pub fn scan(dir: &Path, tokenizer: &ClipTokenizer) -> Result<Self, TextError> {
        let mut files = Vec::new();
        collect_files(dir, 0, &mut files)?;
        files.sort_by(|a, b| {
            extension_rank(a)
                .cmp(&extension_rank(b))
                .then_with(|| a.cmp(b))
        });
        Ok(Self::from_files(files, tokenizer))
    }

    /// A library of the given files (first one wins for a repeated stem).
    pub fn from_files(files: impl IntoIterator<Item = PathBuf>, tokenizer: &ClipTokenizer) -> Self {
        let mut lib = Self::default();
        let mut seen: HashMap<String, PathBuf> = HashMap::new();
        for path in files {
            let Some(name) = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned) else {
                tracing::warn!(path = %path.display(), "embedding file name is not UTF-8; skipped");
                continue;
            };
            if let Some(first) = seen.get(&name) {
                tracing::warn!(
                    name,
                    kept = %first.display(),
                    ignored = %path.display(),
                    "two embedding files share a name"
                );
                continue;
            }
            let ids = tokenizer.encode(&name);
            if ids.is_empty() {
                tracing::warn!(path = %path.display(), "embedding name has no tokens; it can never match");
                continue;
            }
            seen.insert(name.clone(), path.clone());
            lib.entries.push(Entry { name, path, ids });
        }
        for (i, e) in lib.entries.iter().enumerate() {
            lib.by_first_token.entry(e.ids[0]).or_default().push(i);
        }
        for list in lib.by_first_token.values_mut() {
            // Stable sort: among equal lengths, scan order decides.
            list.sort_by_key(|&i| std::cmp::Reverse(lib.entries[i].ids.len()));
        }
        lib
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Names (file stems), in scan order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.name.as_str())
    }

    pub fn path_of(&self, name: &str) -> Option<&Path> {
        self.entries
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.path.as_path())
    }

    /// Loads (or returns the cached) embedding called `name`; `None` if there is none.
    pub fn get(&self, name: &str) -> Result<Option<Arc<Embedding>>, TextError> {
        match self.entries.iter().position(|e| e.name == name) {
            Some(i) => self.load(i).map(Some),
            None => Ok(None),
        }
    }

    /// ComfyUI's `embedding:NAME` lookup. `NAME` is a file stem, optionally with the
    /// file's extension and leading directories (only the file name is compared);
    /// trailing commas that are not part of a name come back as leftover text.
    pub fn resolve_name<'n>(
        &self,
        name: &'n str,
    ) -> Result<Option<(Arc<Embedding>, &'n str)>, TextError> {
        if let Some(i) = self.index_of_spelled(name) {
            return Ok(Some((self.load(i)?, "")));
        }
        let stripped = name.trim_end_matches(',');
        if stripped.len() < name.len() {
            if let Some(i) = self.index_of_spelled(stripped) {
                return Ok(Some((self.load(i)?, &name[stripped.len()..])));
            }
        }
        Ok(None)
    }

    fn index_of_spelled(&self, name: &str) -> Option<usize> {
        let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
        let without_ext = match base.rsplit_once('.') {
            Some((stem, ext))
                if EMBEDDING_EXTENSIONS.contains(&ext.to_ascii_lowercase().as_str()) =>
            {
                stem
            }
            _ => base,
        };
        [base, without_ext]
            .iter()
            .find_map(|n| self.entries.iter().position(|e| e.name == *n))
    }

    /// The embedding whose name's tokens start at `ids[position]`, with the number of
    /// those tokens. Loads it if this is its first use.
    pub fn find_at(
        &self,
        ids: &[u32],
        position: usize,
    ) -> Result<Option<(Arc<Embedding>, usize)>, TextError> {
        let Some(candidates) = ids.get(position).and_then(|t| self.by_first_token.get(t)) else {
            return Ok(None);
        };
        for &i in candidates {
            let name_ids = &self.entries[i].ids;
            if ids[position..].starts_with(name_ids) {
                return Ok(Some((self.load(i)?, name_ids.len())));
            }
        }
        Ok(None)
    }

    fn load(&self, index: usize) -> Result<Arc<Embedding>, TextError> {
        let mut loaded = self.loaded.lock();
        if let Some(e) = loaded.get(&index) {
            return Ok(Arc::clone(e));
        }
        let entry = &self.entries[index];
        let embedding = Arc::new(load_embedding_file(&entry.name, &entry.path)?);
        loaded.insert(index, Arc::clone(&embedding));
        Ok(embedding)
    }
}

fn extension_rank(path: &Path) -> usize {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    EMBEDDING_EXTENSIONS
        .iter()
        .position(|&e| e == ext)
        .unwrap_or(EMBEDDING_EXTENSIONS.len())
}

fn collect_files(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<(), TextError> {
    let dir_err = |source| TextError::EmbeddingDir {
        path: dir.to_owned(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(dir_err)? {
        let entry = entry.map_err(dir_err)?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        // Follows symlinks, like A1111's os.walk(followlinks=True).
        let Ok(meta) = std::fs::metadata(&path) else {
            tracing::warn!(path = %path.display(), "unreadable entry in embeddings directory; skipped");
            continue;
        };
        if meta.is_dir() {
            if depth < MAX_SCAN_DEPTH {
                collect_files(&path, depth + 1, out)?;
            }
        } else if meta.is_file()
            && meta.len() > 0
            && extension_rank(&path) < EMBEDDING_EXTENSIONS.len()
        {
            out.push(path);
        }
    }
    Ok(())
}

/// Reads an embedding file and picks its vectors by A1111's rules (module docs).
/// Only the chosen tensors are read; the other entries of an A1111 `.pt` file
/// (`string_to_token.*`, an integer tensor) are never touched.
pub fn load_embedding_file(name: &str, path: &Path) -> Result<Embedding, TextError> {
    let err = |reason: String| TextError::Embedding {
        path: path.to_owned(),
        reason,
    };
    let size = std::fs::metadata(path)
        .map_err(|e| err(e.to_string()))?
        .len();
    if size > MAX_EMBEDDING_FILE {
        return Err(err(format!(
            "{size} bytes is too large for an embedding (limit {MAX_EMBEDDING_FILE})"
        )));
    }
    let source = crate::io::open(path)?;
    let tensors = source.tensors();
    let find = |key: &str| tensors.iter().find(|t| t.name == key);
    let chosen: Vec<&TensorInfo> = if let (Some(l), Some(g)) = (find("clip_l"), find("clip_g")) {
        vec![l, g]
    } else if let Some(t) = find("emb_params") {
        vec![t]
    } else {
        let params: Vec<&TensorInfo> = tensors
            .iter()
            .filter(|t| t.name.starts_with("string_to_param."))
            .collect();
        match (params.len(), tensors.len()) {
            (1, _) => params,
            (0, 1) => vec![&tensors[0]],
            (0, 0) => return Err(err("holds no tensors".into())),
            _ => {
                let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
                return Err(err(format!(
                    "no embedding tensor found (expected string_to_param, emb_params, clip_l+clip_g or a single tensor); tensors: {}",
                    names.join(", ")
                )));
            }
        }
    };
    let mut vectors: Vec<EmbeddingVectors> = Vec::with_capacity(chosen.len());
    for info in chosen {
        let (rows, width) = match info.shape.as_slice() {
            [w] => (1, *w),
            [r, w] => (*r, *w),
            _ => {
                return Err(err(format!(
                    "tensor '{}' has shape {:?}; an embedding is [vectors, width]",
                    info.name, info.shape
                )))
            }
        };
        if rows == 0 || width == 0 {
            return Err(err(format!(
                "tensor '{}' is empty (shape {:?})",
                info.name, info.shape
            )));
        }
        if let Some(first) = vectors.first().filter(|v| v.rows != rows) {
            return Err(err(format!(
                "tensor '{}' has {rows} vectors but '{}' has {}",
                info.name, first.key, first.rows
            )));
        }
        // Integer tensors would convert, but vectors stored as integers are not an
        // embedding anyone trained.
        if !(info.dtype.is_float() || info.dtype.is_quantized()) {
            return Err(err(format!(
                "tensor '{}' has dtype {:?}; embeddings are floating point",
                info.name, info.dtype
            )));
        }
        let n = rows
            .checked_mul(width)
            .ok_or_else(|| err(format!("tensor '{}' shape overflows", info.name)))?;
        let bytes = source.read(&info.name)?;
        let data = crate::dtype::to_f32(info.dtype, &bytes, n)
            .map_err(|e| err(format!("tensor '{}': {e}", info.name)))?;
        vectors.push(EmbeddingVectors {
            key: info.name.clone(),
            rows,
            width,
            data,
        });
    }
    Ok(Embedding {
        name: name.to_owned(),
        path: path.to_owned(),
        vectors,
    })
}
