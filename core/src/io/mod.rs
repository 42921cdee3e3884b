//! One tensor-source abstraction over every model file format we read.
//!
//! Formats: safetensors (single and sharded), GGUF, PyTorch pickles (zip and legacy
//! `torch.save` formats, through a restricted unpickler that never executes anything) and
//! diffusers folders. Every parser checks what sd.cpp's loader checks (data inside the file,
//! sane header sizes, `shape × dtype == bytes`) and reports failures naming the file and the
//! tensor instead of panicking.
//!
//! Shapes are always in PyTorch order (outermost dimension first), whatever the file stores.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use crate::dtype::{ConvertError, DType};

pub mod assembled;
pub mod diffusers;
pub mod gguf;
pub mod pickle;
pub mod rules;
pub mod safetensors;

pub use assembled::{Assembled, Rows};
pub use rules::{read_as, TypeRules, WeightType};

/// The on-disk format a source was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Safetensors,
    /// `*.safetensors.index.json` with its shards.
    ShardedSafetensors,
    Gguf,
    /// `torch.save` output, zip or legacy.
    Pickle,
    /// A diffusers pipeline folder.
    Diffusers,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Safetensors => "safetensors",
            Format::ShardedSafetensors => "sharded safetensors",
            Format::Gguf => "gguf",
            Format::Pickle => "pytorch pickle",
            Format::Diffusers => "diffusers folder",
        })
    }
}

/// Where a tensor's bytes live: a byte range of one of the source's files (or, for
/// deflate-compressed zip entries, of one entry's decompressed contents).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    Range {
        blob: usize,
        start: usize,
        len: usize,
    },
    ZipDeflated {
        blob: usize,
        entry: usize,
        start: usize,
        len: usize,
    },
}

/// One tensor of a source: its name, stored dtype and shape (PyTorch order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub(crate) loc: Location,
}

impl TensorInfo {
    /// A tensor description with no backing file, e.g. for model detection over a key list.
    pub fn detached(name: impl Into<String>, dtype: DType, shape: Vec<usize>) -> Self {
        TensorInfo {
            name: name.into(),
            dtype,
            shape,
            loc: Location::Range {
                blob: usize::MAX,
                start: 0,
                len: 0,
            },
        }
    }

    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of the tensor in its stored dtype.
    pub fn byte_len(&self) -> usize {
        match self.loc {
            Location::Range { len, .. } | Location::ZipDeflated { len, .. } => len,
        }
    }
}

/// Tensor bytes: borrowed from the mmap when possible, owned when they had to be read,
/// decompressed or converted.
#[derive(Debug)]
pub enum TensorBytes<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
}

impl Deref for TensorBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            TensorBytes::Borrowed(b) => b,
            TensorBytes::Owned(v) => v,
        }
    }
}

impl TensorBytes<'_> {
    pub fn into_owned(self) -> Vec<u8> {
        match self {
            TensorBytes::Borrowed(b) => b.to_vec(),
            TensorBytes::Owned(v) => v,
        }
    }
}

/// Any failure reading or writing a model file. Every variant names the file, and the tensor
/// where one is involved.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: invalid {format} file: {msg}", path.display())]
    Format {
        path: PathBuf,
        format: Format,
        msg: String,
    },
    #[error("{}: tensor '{tensor}': {msg}", path.display())]
    Tensor {
        path: PathBuf,
        tensor: String,
        msg: String,
    },
    #[error("{}: no tensor named '{tensor}'", path.display())]
    NotFound { path: PathBuf, tensor: String },
    #[error("{}: unrecognised model file ({reason})", path.display())]
    UnknownFormat { path: PathBuf, reason: String },
    #[error("{}: tensor '{tensor}': {source}", path.display())]
    Convert {
        path: PathBuf,
        tensor: String,
        source: ConvertError,
    },
    #[error("invalid tensor type rules '{rules}': {msg}")]
    Rules { rules: String, msg: String },
}

/// A parse failure inside one file, before the path is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub tensor: Option<String>,
    pub msg: String,
}

impl ParseError {
    pub(crate) fn new(msg: impl Into<String>) -> Self {
        ParseError {
            tensor: None,
            msg: msg.into(),
        }
    }
    pub(crate) fn tensor(tensor: impl Into<String>, msg: impl Into<String>) -> Self {
        ParseError {
            tensor: Some(tensor.into()),
            msg: msg.into(),
        }
    }
    pub(crate) fn at(self, path: &Path, format: Format) -> IoError {
        match self.tensor {
            Some(tensor) => IoError::Tensor {
                path: path.to_path_buf(),
                tensor,
                msg: self.msg,
            },
            None => IoError::Format {
                path: path.to_path_buf(),
                format,
                msg: self.msg,
            },
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tensor {
            Some(t) => write!(f, "tensor '{t}': {}", self.msg),
            None => f.write_str(&self.msg),
        }
    }
}

impl std::error::Error for ParseError {}

/// A set of tensors backed by model files.
pub trait TensorSource: Send + Sync {
    fn path(&self) -> &Path;
    fn format(&self) -> Format;
    fn tensors(&self) -> &[TensorInfo];
    fn get(&self, name: &str) -> Option<&TensorInfo>;
    /// The raw bytes of `name` in its stored dtype.
    fn read(&self, name: &str) -> Result<TensorBytes<'_>, IoError>;
    /// The caller has copied `name` out and will not read it again soon: a mapped file
    /// drops those pages from this process (they stay in the page cache, and a later
    /// read maps them back). Loading a model tensor by tensor with this keeps its peak
    /// resident memory at the loaded weights plus one tensor, not plus the whole file.
    fn release(&self, _name: &str) {}
    /// safetensors `__metadata__`, GGUF key/values rendered as strings.
    fn metadata(&self) -> &BTreeMap<String, String> {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        &EMPTY
    }
}

/// How to open a model file.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Map files into memory (zero-copy reads). With `false`, files are read into memory.
    pub mmap: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { mmap: true }
    }
}

/// The bytes of one file, mapped or read.
pub(crate) enum Backing {
    Mmap(memmap2::Mmap),
    Memory(Vec<u8>),
}

impl Backing {
    /// Drop the mapped pages of `start..start + len` from this process's memory.
    fn release(&self, start: usize, len: usize) {
        if let Backing::Mmap(m) = self {
            if len > 0 && start.checked_add(len).is_some_and(|end| end <= m.len()) {
                // SAFETY: the mapping is read-only and file-backed: after DONTNEED a read
                // faults the same bytes back in from the file, so no borrowed slice of it
                // (another thread may hold one) can see different contents. Failure only
                // means the pages stay resident.
                let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
            }
        }
    }
}

impl Deref for Backing {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Memory(v) => v,
        }
    }
}

pub(crate) struct Blob {
    pub path: PathBuf,
    pub data: Backing,
}

impl Blob {
    pub(crate) fn load(path: &Path, opts: &OpenOptions) -> Result<Blob, IoError> {
        let ioerr = |source| IoError::Io {
            path: path.to_path_buf(),
            source,
        };
        let data = if opts.mmap {
            let file = File::open(path).map_err(ioerr)?;
            // SAFETY: the mapping is read-only; like every mmap-based loader we rely on the
            // file not being truncated while it is open.
            Backing::Mmap(unsafe { memmap2::Mmap::map(&file) }.map_err(ioerr)?)
        } else {
            Backing::Memory(std::fs::read(path).map_err(ioerr)?)
        };
        Ok(Blob {
            path: path.to_path_buf(),
            data,
        })
    }
}

/// The one implementation of [`TensorSource`]: tensors located in a list of files.
pub struct FileSource {
    path: PathBuf,
    format: Format,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    blobs: Vec<Blob>,
    metadata: BTreeMap<String, String>,
}

impl FileSource {
    pub(crate) fn new(
        path: PathBuf,
        format: Format,
        blobs: Vec<Blob>,
        tensors: Vec<TensorInfo>,
        metadata: BTreeMap<String, String>,
    ) -> Result<FileSource, IoError> {
        let mut index = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if index.insert(t.name.clone(), i).is_some() {
                return Err(IoError::Tensor {
                    path: path.clone(),
                    tensor: t.name.clone(),
                    msg: "tensor name appears twice".into(),
                });
            }
        }
        Ok(FileSource {
            path,
            format,
            tensors,
            index,
            blobs,
            metadata,
        })
    }

    /// Splits into parts so that sources can be merged (sharded files, diffusers folders).
    pub(crate) fn into_parts(self) -> (Vec<Blob>, Vec<TensorInfo>, BTreeMap<String, String>) {
        (self.blobs, self.tensors, self.metadata)
    }

    fn blob_path(&self, loc: &Location) -> &Path {
        let b = match loc {
            Location::Range { blob, .. } | Location::ZipDeflated { blob, .. } => *blob,
        };
        self.blobs
            .get(b)
            .map(|b| b.path.as_path())
            .unwrap_or(&self.path)
    }
}

/// Appends `src`'s blobs and tensors to the accumulators, renaming tensors with `rename` and
/// shifting blob indices.
pub(crate) fn merge_into(
    blobs: &mut Vec<Blob>,
    tensors: &mut Vec<TensorInfo>,
    src: FileSource,
    rename: impl Fn(&str) -> String,
) -> BTreeMap<String, String> {
    let base = blobs.len();
    let (b, t, m) = src.into_parts();
    blobs.extend(b);
    tensors.extend(t.into_iter().map(|mut t| {
        t.name = rename(&t.name);
        match &mut t.loc {
            Location::Range { blob, .. } | Location::ZipDeflated { blob, .. } => *blob += base,
        }
        t
    }));
    m
}

impl TensorSource for FileSource {
    fn path(&self) -> &Path {
        &self.path
    }
    fn format(&self) -> Format {
        self.format
    }
    fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }
    fn read(&self, name: &str) -> Result<TensorBytes<'_>, IoError> {
        let info = self.get(name).ok_or_else(|| IoError::NotFound {
            path: self.path.clone(),
            tensor: name.to_string(),
        })?;
        let err = |msg: String| IoError::Tensor {
            path: self.blob_path(&info.loc).to_path_buf(),
            tensor: name.to_string(),
            msg,
        };
        match info.loc {
            Location::Range { blob, start, len } => {
                let data = self
                    .blobs
                    .get(blob)
                    .ok_or_else(|| err("tensor has no backing file".into()))?;
                let end = start
                    .checked_add(len)
                    .ok_or_else(|| err("data range overflows".into()))?;
                data.data
                    .get(start..end)
                    .map(TensorBytes::Borrowed)
                    .ok_or_else(|| {
                        err(format!(
                            "data range {start}..{end} is past the end of the file"
                        ))
                    })
            }
            Location::ZipDeflated {
                blob,
                entry,
                start,
                len,
            } => {
                let data = self
                    .blobs
                    .get(blob)
                    .ok_or_else(|| err("tensor has no backing file".into()))?;
                let bytes = pickle::read_zip_entry(&data.data, entry, start, len)
                    .map_err(|e| err(e.msg))?;
                Ok(TensorBytes::Owned(bytes))
            }
        }
    }
    fn release(&self, name: &str) {
        if let Some(Location::Range { blob, start, len }) = self.get(name).map(|i| &i.loc) {
            if let Some(b) = self.blobs.get(*blob) {
                b.data.release(*start, *len);
            }
        }
    }
    fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
}

/// Opens a model file or diffusers folder with default options (mmap on).
pub fn open(path: &Path) -> Result<Box<dyn TensorSource>, IoError> {
    open_with(path, &OpenOptions::default())
}

/// Opens a model file or diffusers folder, detecting the format by directory layout, magic
/// bytes, then extension.
pub fn open_with(path: &Path, opts: &OpenOptions) -> Result<Box<dyn TensorSource>, IoError> {
    Ok(Box::new(open_file_source(path, opts)?))
}

pub(crate) fn open_file_source(path: &Path, opts: &OpenOptions) -> Result<FileSource, IoError> {
    let meta = std::fs::metadata(path).map_err(|source| IoError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.is_dir() {
        return diffusers::open(path, opts);
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    if name.ends_with(".index.json") {
        return safetensors::open_sharded(path, opts);
    }
    let blob = Blob::load(path, opts)?;
    let head = &blob.data[..blob.data.len().min(16)];
    if head.starts_with(b"GGUF") {
        return gguf::from_blob(blob);
    }
    if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
        return pickle::from_blob(blob);
    }
    // Safetensors before the bare-pickle byte: a header length whose low byte is 0x80
    // (e.g. 128 + 256·k bytes) would otherwise read as a pickle protocol marker.
    if (head.len() >= 9 && head[8] == b'{') || name.ends_with(".safetensors") {
        return safetensors::from_blob(blob);
    }
    if head.first() == Some(&0x80) {
        return pickle::from_blob(blob);
    }
    if name.ends_with(".gguf") {
        return gguf::from_blob(blob);
    }
    if [".ckpt", ".pt", ".pth", ".bin"]
        .iter()
        .any(|e| name.ends_with(e))
    {
        return pickle::from_blob(blob);
    }
    Err(IoError::UnknownFormat {
        path: path.to_path_buf(),
        reason: "no safetensors, GGUF, zip or pickle signature, and no known extension".into(),
    })
}

/// Number of elements of `shape`, or `None` on overflow.
///
/// The product of the non-zero dimensions must fit even when some dimension is zero, so that
/// later code multiplying dimensions in any order (strides, row sizes) cannot overflow.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    let nonzero = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |a, &d| a.checked_mul(d))?;
    Some(if shape.contains(&0) { 0 } else { nonzero })
}
