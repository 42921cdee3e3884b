//! safetensors files (parsed and written by the `safetensors` crate) and sharded
//! `*.safetensors.index.json` sets.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, View};

use super::{
    merge_into, Blob, FileSource, Format, IoError, Location, OpenOptions, ParseError, TensorInfo,
};
use crate::dtype::DType;

/// Size of the little-endian header-length prefix.
const N_LEN: usize = 8;

fn from_st(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::BOOL => DType::Bool,
        Dtype::U8 => DType::U8,
        Dtype::I8 => DType::I8,
        Dtype::F8_E5M2 => DType::F8E5M2,
        Dtype::F8_E4M3 => DType::F8E4M3,
        Dtype::I16 => DType::I16,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::I64 => DType::I64,
        _ => return None,
    })
}

fn to_st(d: DType) -> Option<Dtype> {
    Some(match d {
        DType::Bool => Dtype::BOOL,
        DType::U8 => Dtype::U8,
        DType::I8 => Dtype::I8,
        DType::F8E5M2 => Dtype::F8_E5M2,
        DType::F8E4M3 => Dtype::F8_E4M3,
        DType::I16 => Dtype::I16,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::I64 => Dtype::I64,
        _ => return None,
    })
}

/// A parsed safetensors header: tensors in file order with absolute byte ranges.
#[derive(Debug, Clone)]
pub struct Header {
    pub tensors: Vec<(String, DType, Vec<usize>, std::ops::Range<usize>)>,
    pub metadata: BTreeMap<String, String>,
}

/// Parses and validates the header of a complete safetensors file held in `bytes`: header
/// length within the file and under the crate's limit, JSON well-formed, offsets contiguous,
/// `shape × dtype == byte length`, data ending exactly at the end of the file.
pub fn parse(bytes: &[u8]) -> Result<Header, ParseError> {
    let (n, meta) =
        SafeTensors::read_metadata(bytes).map_err(|e| ParseError::new(e.to_string()))?;
    let data_start = N_LEN + n;
    let mut tensors = Vec::new();
    for name in meta.offset_keys() {
        let info = meta
            .info(&name)
            .ok_or_else(|| ParseError::tensor(&name, "listed but missing"))?;
        let dtype = from_st(info.dtype).ok_or_else(|| {
            ParseError::tensor(&name, format!("unsupported dtype {:?}", info.dtype))
        })?;
        if super::checked_numel(&info.shape).is_none() {
            return Err(ParseError::tensor(
                &name,
                format!("shape {:?} overflows", info.shape),
            ));
        }
        let (s, e) = info.data_offsets;
        let (start, end) = match (data_start.checked_add(s), data_start.checked_add(e)) {
            (Some(a), Some(b)) if a <= b && b <= bytes.len() => (a, b),
            _ => return Err(ParseError::tensor(&name, "data offsets outside the file")),
        };
        tensors.push((name, dtype, info.shape.clone(), start..end));
    }
    let metadata = meta
        .metadata()
        .as_ref()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    Ok(Header { tensors, metadata })
}

pub(crate) fn from_blob(blob: Blob) -> Result<FileSource, IoError> {
    let header = parse(&blob.data).map_err(|e| e.at(&blob.path, Format::Safetensors))?;
    let tensors = header
        .tensors
        .into_iter()
        .map(|(name, dtype, shape, r)| TensorInfo {
            name,
            dtype,
            shape,
            loc: Location::Range {
                blob: 0,
                start: r.start,
                len: r.len(),
            },
        })
        .collect();
    let path = blob.path.clone();
    FileSource::new(
        path,
        Format::Safetensors,
        vec![blob],
        tensors,
        header.metadata,
    )
}

/// Opens one safetensors file.
pub fn open(path: &Path, opts: &OpenOptions) -> Result<FileSource, IoError> {
    from_blob(Blob::load(path, opts)?)
}

/// Opens `*.safetensors.index.json` and the shards its `weight_map` names (relative to the
/// index's folder). Every tensor must be in the shard the index says.
pub fn open_sharded(index_path: &Path, opts: &OpenOptions) -> Result<FileSource, IoError> {
    let fmt_err = |msg: String| IoError::Format {
        path: index_path.to_path_buf(),
        format: Format::ShardedSafetensors,
        msg,
    };
    let text = std::fs::read_to_string(index_path).map_err(|source| IoError::Io {
        path: index_path.to_path_buf(),
        source,
    })?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| fmt_err(format!("invalid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| fmt_err("no \"weight_map\" object".into()))?;
    let dir = index_path.parent().unwrap_or(Path::new("."));
    let mut shards: Vec<String> = Vec::new();
    let mut expected: HashMap<&str, &str> = HashMap::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| fmt_err(format!("weight_map entry '{tensor}' is not a file name")))?;
        // Shard names are plain file names next to the index; anything else could escape the
        // model folder.
        if file.contains('/') || file.contains('\\') || file.starts_with('.') {
            return Err(fmt_err(format!(
                "shard name '{file}' for tensor '{tensor}' is not a plain file name"
            )));
        }
        if !shards.iter().any(|s| s == file) {
            shards.push(file.to_string());
        }
        expected.insert(tensor.as_str(), file);
    }
    let mut blobs = Vec::new();
    let mut tensors = Vec::new();
    let mut metadata = BTreeMap::new();
    for shard in &shards {
        let shard_path: PathBuf = dir.join(shard);
        let src = open(&shard_path, opts)?;
        for t in src.tensors.iter() {
            match expected.get(t.name.as_str()) {
                Some(f) if f == shard => {}
                Some(f) => {
                    return Err(IoError::Tensor {
                        path: shard_path.clone(),
                        tensor: t.name.clone(),
                        msg: format!("index says this tensor is in '{f}'"),
                    })
                }
                None => {
                    return Err(IoError::Tensor {
                        path: shard_path.clone(),
                        tensor: t.name.clone(),
                        msg: "tensor is not listed in the index".into(),
                    })
                }
            }
        }
        metadata.extend(merge_into(&mut blobs, &mut tensors, src, |n| n.to_string()));
    }
    if tensors.len() != expected.len() {
        let present: std::collections::HashSet<&str> =
            tensors.iter().map(|t| t.name.as_str()).collect();
        if let Some((missing, file)) = expected.iter().find(|(n, _)| !present.contains(*n)) {
            return Err(IoError::Tensor {
                path: dir.join(file),
                tensor: missing.to_string(),
                msg: "listed in the index but not in the shard".into(),
            });
        }
    }
    FileSource::new(
        index_path.to_path_buf(),
        Format::ShardedSafetensors,
        blobs,
        tensors,
        metadata,
    )
}

struct WriteView<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: &'a [u8],
}

impl View for WriteView<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Writes a safetensors file. Quantized dtypes cannot be stored in safetensors.
pub fn write<'a, I, S>(
    path: &Path,
    tensors: I,
    metadata: &BTreeMap<String, String>,
) -> Result<(), IoError>
where
    I: IntoIterator<Item = (S, DType, Vec<usize>, &'a [u8])>,
    S: AsRef<str>,
{
    let mut views = Vec::new();
    for (name, dtype, shape, data) in tensors {
        let name = name.as_ref().to_string();
        let terr = |msg: String| IoError::Tensor {
            path: path.to_path_buf(),
            tensor: name.clone(),
            msg,
        };
        let st =
            to_st(dtype).ok_or_else(|| terr(format!("{dtype} cannot be stored in safetensors")))?;
        let expected = super::checked_numel(&shape).and_then(|n| dtype.byte_len(n));
        if expected != Some(data.len()) {
            return Err(terr(format!(
                "shape {shape:?} of {dtype} needs {expected:?} bytes, got {}",
                data.len()
            )));
        }
        views.push((
            name,
            WriteView {
                dtype: st,
                shape,
                data,
            },
        ));
    }
    let info: Option<HashMap<String, String>> = if metadata.is_empty() {
        None
    } else {
        Some(
            metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    };
    safetensors::serialize_to_file(views, info, path).map_err(|e| IoError::Format {
        path: path.to_path_buf(),
        format: Format::Safetensors,
        msg: format!("cannot write: {e}"),
    })
}
