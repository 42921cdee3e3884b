//! GGUF v2/v3, read by our own parser (fuzzable, our errors) and written by our own writer.
//!
//! Every ggml type passes through unchanged. GGUF stores dimensions ggml-style (`ne[0]`
//! innermost); we reverse them to PyTorch order on read and back on write.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;

use super::{Blob, FileSource, Format, IoError, Location, ParseError, TensorInfo};
use crate::dtype::DType;

pub const MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: usize = 32;
/// ggml's GGML_MAX_DIMS.
const MAX_DIMS: usize = 4;

/// A GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    U64(u64),
    I64(i64),
    F64(f64),
    /// Homogeneous array; nested arrays are rejected like ggml does.
    Array(Vec<Value>),
}

impl Value {
    fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// The value as an unsigned integer, for any integer type that holds one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(v) => f.write_str(v),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Array(items) => {
                f.write_str("[")?;
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    match v {
                        Value::String(s) => write!(f, "{s:?}")?,
                        v => write!(f, "{v}")?,
                    }
                }
                f.write_str("]")
            }
        }
    }
}

/// One tensor entry of a GGUF header. `shape` is in PyTorch order; `range` is absolute in
/// the file.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub range: std::ops::Range<usize>,
}

/// A parsed GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub version: u32,
    pub kv: Vec<(String, Value)>,
    pub tensors: Vec<GgufTensor>,
    pub alignment: usize,
    pub data_offset: usize,
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ParseError> {
        if n > self.remaining() {
            return Err(ParseError::new(format!(
                "truncated: {what} needs {n} bytes at offset {}, file has {} left",
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ParseError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self, what: &str) -> Result<u32, ParseError> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64, ParseError> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }
    /// A count that will be followed by at least `min_each` bytes per item: bounded by what
    /// is left in the file, so lying counts cannot trigger huge allocations.
    fn count(&mut self, min_each: usize, what: &str) -> Result<usize, ParseError> {
        let n = self.u64(what)?;
        let left = self.remaining() as u64;
        if min_each > 0 && n > left / min_each as u64 {
            return Err(ParseError::new(format!(
                "{what} {n} is impossible: only {left} bytes remain"
            )));
        }
        usize::try_from(n).map_err(|_| ParseError::new(format!("{what} {n} too large")))
    }
    fn string(&mut self, what: &str) -> Result<String, ParseError> {
        let n = self.count(1, &format!("{what} length"))?;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec())
            .map_err(|_| ParseError::new(format!("{what} is not valid UTF-8")))
    }
    fn value(&mut self, ty: u32, key: &str, in_array: bool) -> Result<Value, ParseError> {
        Ok(match ty {
            0 => Value::U8(self.arr::<1>(key)?[0]),
            1 => Value::I8(self.arr::<1>(key)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.arr(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.arr(key)?)),
            4 => Value::U32(u32::from_le_bytes(self.arr(key)?)),
            5 => Value::I32(i32::from_le_bytes(self.arr(key)?)),
            6 => Value::F32(f32::from_le_bytes(self.arr(key)?)),
            7 => match self.arr::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(ParseError::new(format!(
                        "key '{key}': bool byte {b} is neither 0 nor 1"
                    )))
                }
            },
            8 => Value::String(self.string(&format!("value of '{key}'"))?),
            9 if !in_array => {
                let ety = self.u32(key)?;
                let min = min_value_size(ety).ok_or_else(|| {
                    ParseError::new(format!("key '{key}': bad array element type {ety}"))
                })?;
                let n = self.count(min, &format!("array length of '{key}'"))?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(ety, key, true)?);
                }
                Value::Array(items)
            }
            9 => {
                return Err(ParseError::new(format!(
                    "key '{key}': nested arrays are not supported"
                )))
            }
            10 => Value::U64(u64::from_le_bytes(self.arr(key)?)),
            11 => Value::I64(i64::from_le_bytes(self.arr(key)?)),
            12 => Value::F64(f64::from_le_bytes(self.arr(key)?)),
            t => {
                return Err(ParseError::new(format!(
                    "key '{key}': unknown value type {t}"
                )))
            }
        })
    }
}

/// Smallest encoding of one value of type `ty` (arrays: their type + count header).
fn min_value_size(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

fn align_up(x: usize, a: usize) -> Option<usize> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

/// Parses and validates a whole GGUF file held in `bytes`.
pub fn parse(bytes: &[u8]) -> Result<Header, ParseError> {
    let mut r = Reader { b: bytes, pos: 0 };
    if r.take(4, "magic")? != MAGIC {
        return Err(ParseError::new("bad magic (expected GGUF)"));
    }
    let version = r.u32("version")?;
    if version != 2 && version != 3 {
        return Err(ParseError::new(format!(
            "unsupported GGUF version {version} (only 2 and 3)"
        )));
    }
    // Each tensor info is at least name length (8) + n_dims (4) + type (4) + offset (8).
    let n_tensors = r.count(24, "tensor count")?;
    // Each kv is at least key length (8) + type (4) + 1 byte of value.
    let n_kv = r.count(13, "key/value count")?;

    let mut kv = Vec::with_capacity(n_kv);
    let mut keys = HashSet::new();
    for _ in 0..n_kv {
        let key = r.string("key")?;
        let ty = r.u32(&key)?;
        let v = r.value(ty, &key, false)?;
        if !keys.insert(key.clone()) {
            return Err(ParseError::new(format!("duplicate key '{key}'")));
        }
        kv.push((key, v));
    }
    let alignment = match kv.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if *a != 0 && a.is_power_of_two() => *a as usize,
        Some((_, v)) => {
            return Err(ParseError::new(format!(
                "general.alignment {v:?} is not a power-of-two u32"
            )))
        }
    };

    struct Raw {
        name: String,
        dtype: DType,
        shape: Vec<usize>,
        offset: usize,
        len: usize,
    }
    let mut raws = Vec::with_capacity(n_tensors);
    let mut names = HashSet::new();
    for _ in 0..n_tensors {
        let name = r.string("tensor name")?;
        let terr = |m: String| ParseError::tensor(&name, m);
        let n_dims = r.u32("n_dims")? as usize;
        if n_dims > MAX_DIMS {
            return Err(terr(format!(
                "{n_dims} dimensions, at most {MAX_DIMS} are supported"
            )));
        }
        let mut ne = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            let d = r.u64("dimension")?;
            let d = usize::try_from(d)
                .ok()
                .filter(|&d| d as u64 <= i64::MAX as u64)
                .ok_or_else(|| terr(format!("dimension {d} out of range")))?;
            ne.push(d);
        }
        let ty = r.u32("tensor type")?;
        let dtype = DType::from_ggml(ty).ok_or_else(|| terr(format!("unknown ggml type {ty}")))?;
        let offset = r.u64("tensor offset")?;
        let offset =
            usize::try_from(offset).map_err(|_| terr(format!("offset {offset} out of range")))?;
        let numel =
            super::checked_numel(&ne).ok_or_else(|| terr(format!("shape {ne:?} overflows")))?;
        if ne.first().is_some_and(|&d| d % dtype.block_size() != 0) {
            return Err(terr(format!(
                "row length {} is not a multiple of the {dtype} block size {}",
                ne[0],
                dtype.block_size()
            )));
        }
        let len = dtype
            .byte_len(numel)
            .ok_or_else(|| terr(format!("byte size of {ne:?} {dtype} overflows")))?;
        if offset % alignment != 0 {
            return Err(terr(format!(
                "offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        if !names.insert(name.clone()) {
            return Err(terr("tensor name appears twice".into()));
        }
        ne.reverse();
        raws.push(Raw {
            name,
            dtype,
            shape: ne,
            offset,
            len,
        });
    }

    let data_offset =
        align_up(r.pos, alignment).ok_or_else(|| ParseError::new("data offset overflows"))?;
    if !raws.is_empty() && data_offset > bytes.len() {
        return Err(ParseError::new(format!(
            "data section starts at {data_offset}, past the end of the file ({} bytes)",
            bytes.len()
        )));
    }
    let data_len = bytes.len().saturating_sub(data_offset);
    let mut tensors = Vec::with_capacity(raws.len());
    for t in raws {
        let end = t
            .offset
            .checked_add(t.len)
            .filter(|&e| e <= data_len)
            .ok_or_else(|| {
                ParseError::tensor(
                    &t.name,
                    format!(
                        "data {}..+{} is past the end of the data section ({} bytes)",
                        t.offset, t.len, data_len
                    ),
                )
            })?;
        // Both bounds are below bytes.len(), so these cannot overflow.
        tensors.push(GgufTensor {
            name: t.name,
            dtype: t.dtype,
            shape: t.shape,
            range: data_offset + t.offset..data_offset + end,
        });
    }
    Ok(Header {
        version,
        kv,
        tensors,
        alignment,
        data_offset,
    })
}

/// ComfyUI-GGUF's key for a tensor stored in another shape than its own: 5-D kernels
/// (Wan's and HunyuanVideo's patch embeddings, which GGUF cannot hold) and tensors flattened
/// into rows of 256 so they quantize.
const ORIG_SHAPE: &str = "comfy.gguf.orig_shape.";

/// The shape a tensor had before ComfyUI-GGUF stored it (PyTorch order), where its
/// `comfy.gguf.orig_shape` entry holds the same elements in a shape its type can take
/// (a quantized tensor's rows whole blocks); `None` otherwise, and it keeps its stored
/// shape.
fn orig_shape(kv: &[(String, Value)], t: &GgufTensor) -> Option<Vec<usize>> {
    let key = format!("{ORIG_SHAPE}{}", t.name);
    let Value::Array(dims) = &kv.iter().find(|(k, _)| *k == key)?.1 else { return None };
    let shape: Vec<usize> = dims.iter().map(|d| d.as_u64().and_then(|v| usize::try_from(v).ok())).collect::<Option<_>>()?;
    let whole_blocks = shape.last().is_some_and(|&d| d % t.dtype.block_size() == 0);
    (!shape.is_empty() && super::checked_numel(&shape) == super::checked_numel(&t.shape) && whole_blocks).then_some(shape)
}

pub(crate) fn from_blob(blob: Blob) -> Result<FileSource, IoError> {
    let h = parse(&blob.data).map_err(|e| e.at(&blob.path, Format::Gguf))?;
    let metadata =
        h.kv.iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect();
    let kv = h.kv;
    let tensors = h
        .tensors
        .into_iter()
        .map(|t| TensorInfo {
            shape: orig_shape(&kv, &t).unwrap_or(t.shape),
            name: t.name,
            dtype: t.dtype,
            loc: Location::Range {
                blob: 0,
                start: t.range.start,
                len: t.range.len(),
            },
        })
        .collect();
    let path = blob.path.clone();
    FileSource::new(path, Format::Gguf, vec![blob], tensors, metadata)
}

/// Reads the typed key/values of a GGUF file (the source's `metadata()` has them as strings).
pub fn read_kv(path: &Path) -> Result<Vec<(String, Value)>, IoError> {
    let blob = Blob::load(path, &super::OpenOptions::default())?;
    parse(&blob.data)
        .map(|h| h.kv)
        .map_err(|e| e.at(path, Format::Gguf))
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value, key: &str) -> Result<(), String> {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(items) => {
            let ety = items.first().map(Value::type_id).unwrap_or(0);
            if items.iter().any(|i| i.type_id() != ety) {
                return Err(format!("key '{key}': array elements have different types"));
            }
            if ety == 9 {
                return Err(format!("key '{key}': nested arrays are not supported"));
            }
            out.extend_from_slice(&ety.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for i in items {
                put_value(out, i, key)?;
            }
        }
    }
    Ok(())
}

/// Writes a GGUF v3 file. `tensors` are `(name, dtype, shape in PyTorch order, bytes)`; any
/// ggml type is written as is. Alignment is `general.alignment` from `kv` if present, else 32.
pub fn write<'a, I, S>(path: &Path, kv: &[(String, Value)], tensors: I) -> Result<(), IoError>
where
    I: IntoIterator<Item = (S, DType, Vec<usize>, &'a [u8])>,
    S: AsRef<str>,
{
    let ferr = |msg: String| IoError::Format {
        path: path.to_path_buf(),
        format: Format::Gguf,
        msg,
    };
    let alignment = match kv.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if *a != 0 && a.is_power_of_two() => *a as usize,
        Some(_) => return Err(ferr("general.alignment must be a power-of-two u32".into())),
    };
    let mut head = Vec::new();
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&3u32.to_le_bytes());
    let mut kv = kv.to_vec();
    let tensors: Vec<(String, DType, Vec<usize>, &[u8])> = tensors
        .into_iter()
        .map(|(n, d, s, b)| {
            let name = n.as_ref().to_string();
            // A 5-D kernel (Wan's patch embedding) as sd.cpp's convert stores it, its first
            // two axes merged, and its own shape under ComfyUI-GGUF's key, which our reader
            // and ComfyUI-GGUF restore (sd.cpp reads the 4-D shape as its Conv3d holds it).
            if let [o, c, rest @ ..] = &s[..] {
                if s.len() == MAX_DIMS + 1 {
                    let key = format!("{ORIG_SHAPE}{name}");
                    if !kv.iter().any(|(k, _)| *k == key) {
                        kv.push((key, Value::Array(s.iter().map(|&d| Value::U64(d as u64)).collect())));
                    }
                    let merged = std::iter::once(o * c).chain(rest.iter().copied()).collect();
                    return (name, d, merged, b);
                }
            }
            (name, d, s, b)
        })
        .collect();
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    let mut seen = HashSet::new();
    for (k, v) in &kv {
        if !seen.insert(k.as_str()) {
            return Err(ferr(format!("duplicate key '{k}'")));
        }
        put_str(&mut head, k);
        head.extend_from_slice(&v.type_id().to_le_bytes());
        put_value(&mut head, v, k).map_err(ferr)?;
    }
    let mut offset = 0usize;
    let mut names = HashSet::new();
    for (name, dtype, shape, data) in &tensors {
        let terr = |msg: String| IoError::Tensor {
            path: path.to_path_buf(),
            tensor: name.clone(),
            msg,
        };
        if !names.insert(name.as_str()) {
            return Err(terr("tensor name appears twice".into()));
        }
        let ty = dtype
            .ggml_type()
            .ok_or_else(|| terr(format!("{dtype} has no ggml type")))?;
        if shape.len() > MAX_DIMS {
            return Err(terr(format!(
                "{} dimensions, GGUF allows at most {MAX_DIMS}",
                shape.len()
            )));
        }
        if shape.last().is_some_and(|&d| d % dtype.block_size() != 0) {
            return Err(terr(format!(
                "row length is not a multiple of the {dtype} block size"
            )));
        }
        let expected = super::checked_numel(shape).and_then(|n| dtype.byte_len(n));
        if expected != Some(data.len()) {
            return Err(terr(format!(
                "shape {shape:?} of {dtype} needs {expected:?} bytes, got {}",
                data.len()
            )));
        }
        put_str(&mut head, name);
        head.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for d in shape.iter().rev() {
            head.extend_from_slice(&(*d as u64).to_le_bytes());
        }
        head.extend_from_slice(&ty.to_le_bytes());
        head.extend_from_slice(&(offset as u64).to_le_bytes());
        offset = align_up(offset + data.len(), alignment)
            .ok_or_else(|| terr("file too large".into()))?;
    }
    let pad = |n: usize| align_up(n, alignment).unwrap_or(n) - n;
    head.resize(head.len() + pad(head.len()), 0);

    let ioerr = |source| IoError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::create(path).map_err(ioerr)?;
    let mut w = std::io::BufWriter::new(file);
    w.write_all(&head).map_err(ioerr)?;
    let zeros = vec![0u8; alignment];
    for (_, _, _, data) in &tensors {
        w.write_all(data).map_err(ioerr)?;
        w.write_all(&zeros[..pad(data.len())]).map_err(ioerr)?;
    }
    w.flush().map_err(ioerr)?;
    Ok(())
}

/// The kv metadata as a map of strings (what `TensorSource::metadata` returns).
pub fn kv_strings(kv: &[(String, Value)]) -> BTreeMap<String, String> {
    kv.iter().map(|(k, v)| (k.clone(), v.to_string())).collect()
}
