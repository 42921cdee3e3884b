//! PyTorch `torch.save` files through a restricted unpickler that never executes anything.
//!
//! The unpickler is a data-only interpreter of pickle protocols 0–5. `GLOBAL` just records
//! a `(module, name)` pair; it is never resolved. `REDUCE`/`NEWOBJ` are interpreted for
//! exactly these callables and produce `None` for every other:
//! - `torch._utils._rebuild_tensor_v2` / `_rebuild_tensor` → a tensor view of a storage,
//! - `torch._utils._rebuild_parameter` → its data argument (an `nn.Parameter` is its tensor),
//! - `collections.OrderedDict` → an empty dict (items arrive through `SETITEMS`),
//! - `NEWOBJ` of any other class and `copyreg._reconstructor` → an inert object record that
//!   keeps only the state its `BUILD` gives it; records whose state has `torch.nn.Module`'s
//!   `_parameters` / `_buffers` / `_modules` are walked like a state dict (Ultralytics
//!   checkpoints pickle the whole model: `model.model.0.conv.weight`, ...).
//!
//! Storages come from `persistent_load` ids `('storage', <storage class>, key, location,
//! numel[, view])`, with the storage class checked against an allowlist. Both container
//! layouts are read: zip (`<dir>/data.pkl` + `<dir>/data/<key>` entries; STORED entries are
//! used in place from the mmap) and the legacy format (magic number, protocol and sys-info
//! pickles, the object pickle, the storage key list, then each storage as `u64 numel` + data).
//!
//! Values live in an arena addressed by index, so shared and self-referencing pickle objects
//! cannot leak or recurse without bound.

use std::collections::{BTreeMap, HashMap};
use std::io::{Cursor, Read};

use super::{Blob, FileSource, Format, IoError, Location, ParseError, TensorInfo};
use crate::dtype::DType;

/// torch's legacy-format magic number (`0x1950a86a20f9469cfc6c`).
const LEGACY_MAGIC: [u8; 10] = [0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19];
/// Nesting depth we follow when flattening dicts; real checkpoints nest two or three deep.
const MAX_DEPTH: usize = 32;

type Idx = usize;

#[derive(Debug, Clone)]
enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer too wide for i64; only ever data we ignore.
    BigInt,
    Float,
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<Idx>),
    List(Vec<Idx>),
    Dict(Vec<(Idx, Idx)>),
    Set,
    Global {
        module: String,
        name: String,
    },
    Storage(usize),
    Tensor(TensorRef),
    /// An instance of some class (NEWOBJ, `copyreg._reconstructor`): never constructed,
    /// only its BUILD state is kept, so that `torch.nn.Module` trees (Ultralytics
    /// checkpoints pickle a whole model) can be walked for their tensors.
    Object { state: Option<Idx> },
}

#[derive(Debug, Clone)]
struct TensorRef {
    storage: usize,
    offset: usize,
    shape: Vec<usize>,
    stride: Vec<usize>,
}

/// A storage named by a persistent id.
#[derive(Debug, Clone)]
pub(crate) struct StorageRef {
    pub key: String,
    pub dtype: DType,
    pub numel: usize,
    /// Legacy view storages: (base key, element offset into the base).
    pub view_of: Option<(String, usize)>,
}

struct Machine<'a> {
    b: &'a [u8],
    pos: usize,
    arena: Vec<Value>,
    stack: Vec<Idx>,
    marks: Vec<usize>,
    memo: HashMap<u64, Idx>,
    storages: Vec<StorageRef>,
    storage_by_key: HashMap<String, usize>,
    /// Whether the pickle carries persistent ids with the legacy 6-field layout.
    legacy: bool,
    /// First offending tensor-rebuild error: reported once flattening names the tensor.
    bad_tensors: HashMap<Idx, String>,
}

fn perr(m: impl Into<String>) -> ParseError {
    ParseError::new(m)
}

/// Storage classes whose data we know how to read, and the dtype of their elements.
fn storage_dtype(module: &str, name: &str) -> Option<DType> {
    if module != "torch" && module != "torch.storage" && module != "torch.cuda" {
        return None;
    }
    Some(match name {
        "FloatStorage" | "float32" | "float" => DType::F32,
        "HalfStorage" | "float16" | "half" => DType::F16,
        "BFloat16Storage" | "bfloat16" => DType::BF16,
        "DoubleStorage" | "float64" | "double" => DType::F64,
        "LongStorage" | "int64" | "long" => DType::I64,
        "IntStorage" | "int32" | "int" => DType::I32,
        "ShortStorage" | "int16" | "short" => DType::I16,
        "CharStorage" | "int8" => DType::I8,
        "ByteStorage" | "uint8" => DType::U8,
        "BoolStorage" | "bool" => DType::Bool,
        "Float8_e4m3fnStorage" | "float8_e4m3fn" => DType::F8E4M3,
        "Float8_e5m2Storage" | "float8_e5m2" => DType::F8E5M2,
        // Untyped storages count bytes.
        "UntypedStorage" => DType::U8,
        _ => return None,
    })
}

impl<'a> Machine<'a> {
    fn new(b: &'a [u8], start: usize) -> Self {
        Machine {
            b,
            pos: start,
            arena: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
            storages: Vec::new(),
            storage_by_key: HashMap::new(),
            legacy: false,
            bad_tensors: HashMap::new(),
        }
    }

    fn alloc(&mut self, v: Value) -> Idx {
        self.arena.push(v);
        self.arena.len() - 1
    }
    fn push(&mut self, v: Value) {
        let i = self.alloc(v);
        self.stack.push(i);
    }
    fn pop(&mut self) -> Result<Idx, ParseError> {
        self.stack
            .pop()
            .ok_or_else(|| perr(format!("pickle stack underflow at offset {}", self.pos)))
    }
    fn top(&self) -> Result<Idx, ParseError> {
        self.stack
            .last()
            .copied()
            .ok_or_else(|| perr(format!("pickle stack empty at offset {}", self.pos)))
    }
    fn pop_mark(&mut self) -> Result<Vec<Idx>, ParseError> {
        let m = self
            .marks
            .pop()
            .ok_or_else(|| perr(format!("pickle MARK missing at offset {}", self.pos)))?;
        if m > self.stack.len() {
            return Err(perr("pickle MARK above the stack"));
        }
        Ok(self.stack.split_off(m))
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], ParseError> {
        if n > self.b.len() - self.pos {
            return Err(perr(format!(
                "pickle truncated at offset {} (wanted {n} bytes)",
                self.pos
            )));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, ParseError> {
        Ok(self.take(1)?[0])
    }
    fn le<const N: usize>(&mut self) -> Result<[u8; N], ParseError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn len_u32(&mut self) -> Result<usize, ParseError> {
        Ok(u32::from_le_bytes(self.le()?) as usize)
    }
    fn len_u64(&mut self) -> Result<usize, ParseError> {
        let n = u64::from_le_bytes(self.le()?);
        usize::try_from(n).map_err(|_| perr("pickle length too large"))
    }
    fn line(&mut self) -> Result<&'a str, ParseError> {
        let rest = &self.b[self.pos..];
        let end = rest
            .iter()
            .position(|&c| c == b'\n')
            .ok_or_else(|| perr("pickle line not terminated"))?;
        self.pos += end + 1;
        let s = &rest[..end];
        let s = s.strip_suffix(b"\r").unwrap_or(s);
        std::str::from_utf8(s).map_err(|_| perr("pickle text argument is not UTF-8"))
    }
    fn utf8(&mut self, n: usize) -> Result<String, ParseError> {
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| perr("pickle string is not UTF-8"))
    }
    fn memo_put(&mut self, key: u64) -> Result<(), ParseError> {
        let t = self.top()?;
        self.memo.insert(key, t);
        Ok(())
    }
    fn memo_get(&mut self, key: u64) -> Result<(), ParseError> {
        let i = *self
            .memo
            .get(&key)
            .ok_or_else(|| perr(format!("pickle memo key {key} missing")))?;
        self.stack.push(i);
        Ok(())
    }

    fn int_of(&self, i: Idx) -> Option<i64> {
        match self.arena[i] {
            Value::Int(v) => Some(v),
            Value::Bool(b) => Some(b as i64),
            _ => None,
        }
    }
    fn usize_of(&self, i: Idx) -> Option<usize> {
        self.int_of(i).and_then(|v| usize::try_from(v).ok())
    }
    fn str_of(&self, i: Idx) -> Option<&str> {
        match &self.arena[i] {
            Value::Str(s) => Some(s),
            Value::Bytes(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }
    fn seq_of(&self, i: Idx) -> Option<&[Idx]> {
        match &self.arena[i] {
            Value::Tuple(v) | Value::List(v) => Some(v),
            _ => None,
        }
    }
    fn usizes_of(&self, i: Idx) -> Option<Vec<usize>> {
        self.seq_of(i)?.iter().map(|&j| self.usize_of(j)).collect()
    }

    fn persistent_load(&mut self, pid: Idx) -> Result<Value, ParseError> {
        // Copy only the fields we read: a pickle may reuse one huge memoized tuple as many ids.
        let items: Vec<Idx> = self
            .seq_of(pid)
            .ok_or_else(|| perr("persistent id is not a tuple"))?
            .iter()
            .take(6)
            .copied()
            .collect();
        if items.first().and_then(|&i| self.str_of(i)) != Some("storage") || items.len() < 5 {
            return Err(perr(
                "persistent id is not a ('storage', type, key, location, size) tuple",
            ));
        }
        let (module, name) = match &self.arena[items[1]] {
            Value::Global { module, name } => (module.clone(), name.clone()),
            _ => return Err(perr("persistent id storage type is not a class name")),
        };
        let dtype = storage_dtype(&module, &name).ok_or_else(|| {
            perr(format!(
                "storage type {module}.{name} is not in the allowlist"
            ))
        })?;
        let key = self
            .str_of(items[2])
            .ok_or_else(|| perr("storage key is not a string"))?
            .to_string();
        let numel = self
            .usize_of(items[4])
            .ok_or_else(|| perr(format!("storage '{key}' size is not a count")))?;
        let mut view_of = None;
        if items.len() >= 6 {
            self.legacy = true;
            if let Some(v) = self
                .seq_of(items[5])
                .map(|s| s.iter().take(2).copied().collect::<Vec<_>>())
            {
                let base = v.first().and_then(|&i| self.str_of(i)).map(str::to_string);
                let off = v.get(1).and_then(|&i| self.usize_of(i));
                match (base, off) {
                    (Some(b), Some(o)) => view_of = Some((b, o)),
                    _ => {
                        return Err(perr(format!(
                            "storage '{key}' has a malformed view description"
                        )))
                    }
                }
            }
        }
        if let Some(&s) = self.storage_by_key.get(&key) {
            let prev = &self.storages[s];
            if prev.dtype != dtype || prev.numel != numel {
                return Err(perr(format!(
                    "storage '{key}' is declared twice with different types or sizes"
                )));
            }
            return Ok(Value::Storage(s));
        }
        self.storages.push(StorageRef {
            key: key.clone(),
            dtype,
            numel,
            view_of,
        });
        self.storage_by_key.insert(key, self.storages.len() - 1);
        Ok(Value::Storage(self.storages.len() - 1))
    }

    /// `_rebuild_tensor_v2(storage, storage_offset, size, stride, ...)`.
    fn rebuild_tensor(&self, args: &[Idx]) -> Result<TensorRef, String> {
        if args.len() < 4 {
            return Err("_rebuild_tensor needs (storage, offset, size, stride)".into());
        }
        let storage = match self.arena[args[0]] {
            Value::Storage(s) => s,
            _ => return Err("tensor storage is not a persistent storage".into()),
        };
        let offset = self
            .usize_of(args[1])
            .ok_or("storage offset is not a non-negative integer")?;
        let shape = self
            .usizes_of(args[2])
            .ok_or("size is not a tuple of non-negative integers")?;
        let stride = self
            .usizes_of(args[3])
            .ok_or("stride is not a tuple of non-negative integers")?;
        if shape.len() != stride.len() {
            return Err(format!(
                "size {shape:?} and stride {stride:?} differ in length"
            ));
        }
        Ok(TensorRef {
            storage,
            offset,
            shape,
            stride,
        })
    }

    fn reduce(&mut self, callable: Idx, args: Idx) -> Value {
        let (module, name) = match &self.arena[callable] {
            Value::Global { module, name } => (module.as_str(), name.as_str()),
            _ => return Value::None,
        };
        // Only the leading arguments are ever read; copying just those keeps a reused huge
        // argument tuple from making each REDUCE cost its length.
        let args: Vec<Idx> = self
            .seq_of(args)
            .map(|s| s.iter().take(4).copied().collect())
            .unwrap_or_default();
        match (module, name) {
            ("torch._utils", "_rebuild_tensor_v2") | ("torch._utils", "_rebuild_tensor") => {
                match self.rebuild_tensor(&args) {
                    Ok(t) => Value::Tensor(t),
                    // Keep going so the error can name the tensor once the dict key is known.
                    Err(e) => {
                        let i = self.arena.len();
                        self.bad_tensors.insert(i, e);
                        Value::None
                    }
                }
            }
            ("torch._utils", "_rebuild_parameter")
            | ("torch._utils", "_rebuild_parameter_with_state") => {
                // An nn.Parameter is its tensor; anything else passed here is not data we read.
                match args.first().map(|&a| &self.arena[a]) {
                    Some(Value::Tensor(t)) => Value::Tensor(t.clone()),
                    _ => Value::None,
                }
            }
            ("collections", "OrderedDict") => Value::Dict(Vec::new()),
            // Protocol 0/1's spelling of `object.__new__(cls)`.
            ("copyreg", "_reconstructor") | ("copy_reg", "_reconstructor") => Value::Object { state: None },
            _ => Value::None,
        }
    }

    /// Runs until STOP; returns the index of the result.
    fn run(&mut self) -> Result<Idx, ParseError> {
        loop {
            let op = self.u8()?;
            match op {
                0x80 => {
                    let p = self.u8()?;
                    if p > 5 {
                        return Err(perr(format!("unsupported pickle protocol {p}")));
                    }
                }
                0x95 => {
                    self.take(8)?;
                }
                b'.' => return self.pop(),
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let t = self.top()?;
                    self.stack.push(t);
                }
                b'N' => self.push(Value::None),
                0x88 => self.push(Value::Bool(true)),
                0x89 => self.push(Value::Bool(false)),
                b'J' => {
                    let v = i32::from_le_bytes(self.le()?);
                    self.push(Value::Int(v.into()))
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Value::Int(v.into()))
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.le()?);
                    self.push(Value::Int(v.into()))
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a {
                        self.u8()? as usize
                    } else {
                        self.len_u32()?
                    };
                    let bytes = self.take(n)?;
                    self.push(long_from_bytes(bytes));
                }
                b'I' => {
                    let l = self.line()?;
                    let v = match l {
                        "00" => Value::Bool(false),
                        "01" => Value::Bool(true),
                        _ => l
                            .parse::<i64>()
                            .map(Value::Int)
                            .map_err(|_| perr("bad INT literal"))?,
                    };
                    self.push(v)
                }
                b'L' => {
                    let l = self.line()?;
                    let v = l
                        .trim_end_matches('L')
                        .parse::<i64>()
                        .map(Value::Int)
                        .unwrap_or(Value::BigInt);
                    self.push(v)
                }
                b'G' => {
                    self.take(8)?;
                    self.push(Value::Float)
                }
                b'F' => {
                    self.line()?
                        .parse::<f64>()
                        .map_err(|_| perr("bad FLOAT literal"))?;
                    self.push(Value::Float)
                }
                b'X' => {
                    let n = self.len_u32()?;
                    let s = self.utf8(n)?;
                    self.push(Value::Str(s))
                }
                0x8c => {
                    let n = self.u8()? as usize;
                    let s = self.utf8(n)?;
                    self.push(Value::Str(s))
                }
                0x8d => {
                    let n = self.len_u64()?;
                    let s = self.utf8(n)?;
                    self.push(Value::Str(s))
                }
                b'V' => {
                    let s = self.line()?.to_string();
                    self.push(Value::Str(s))
                }
                b'S' => {
                    let l = self.line()?;
                    let s = l.trim_matches(|c| c == '\'' || c == '"').to_string();
                    self.push(Value::Str(s))
                }
                b'T' | b'B' => {
                    let n = self.len_u32()?;
                    let s = self.take(n)?.to_vec();
                    self.push(Value::Bytes(s))
                }
                b'U' | b'C' => {
                    let n = self.u8()? as usize;
                    let s = self.take(n)?.to_vec();
                    self.push(Value::Bytes(s))
                }
                0x8e | 0x96 => {
                    let n = self.len_u64()?;
                    let s = self.take(n)?.to_vec();
                    self.push(Value::Bytes(s))
                }
                0x97 | 0x98 => return Err(perr("out-of-band pickle buffers are not supported")),
                b')' => self.push(Value::Tuple(Vec::new())),
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Tuple(items))
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n {
                        return Err(perr("pickle stack underflow building a tuple"));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.push(Value::Tuple(items))
                }
                b']' => self.push(Value::List(Vec::new())),
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Value::List(items))
                }
                b'}' => self.push(Value::Dict(Vec::new())),
                b'd' => {
                    let items = self.pop_mark()?;
                    let pairs = items.chunks_exact(2).map(|c| (c[0], c[1])).collect();
                    self.push(Value::Dict(pairs))
                }
                0x8f => self.push(Value::Set),
                0x91 => {
                    self.pop_mark()?;
                    self.push(Value::Set)
                }
                0x90 => {
                    self.pop_mark()?;
                    self.top()?;
                }
                b'a' => {
                    let v = self.pop()?;
                    let l = self.top()?;
                    if let Value::List(items) = &mut self.arena[l] {
                        items.push(v);
                    }
                }
                b'e' => {
                    let vs = self.pop_mark()?;
                    let l = self.top()?;
                    if let Value::List(items) = &mut self.arena[l] {
                        items.extend(vs);
                    }
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let d = self.top()?;
                    if let Value::Dict(items) = &mut self.arena[d] {
                        items.push((k, v));
                    }
                }
                b'u' => {
                    let kvs = self.pop_mark()?;
                    let d = self.top()?;
                    if let Value::Dict(items) = &mut self.arena[d] {
                        items.extend(kvs.chunks_exact(2).map(|c| (c[0], c[1])));
                    }
                }
                b'c' => {
                    let module = self.line()?.to_string();
                    let name = self.line()?.to_string();
                    self.push(Value::Global { module, name })
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let (Some(m), Some(n)) = (self.str_of(module), self.str_of(name)) else {
                        return Err(perr("STACK_GLOBAL needs two strings"));
                    };
                    let g = Value::Global {
                        module: m.to_string(),
                        name: n.to_string(),
                    };
                    self.push(g)
                }
                b'R' => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let v = self.reduce(callable, args);
                    self.push(v)
                }
                0x81 => {
                    let args = self.pop()?;
                    let cls = self.pop()?;
                    let v = self.reduce_newobj(cls, args);
                    self.push(v)
                }
                0x92 => {
                    let _kwargs = self.pop()?;
                    let args = self.pop()?;
                    let cls = self.pop()?;
                    let v = self.reduce_newobj(cls, args);
                    self.push(v)
                }
                b'i' => {
                    self.line()?;
                    self.line()?;
                    self.pop_mark()?;
                    self.push(Value::None)
                }
                b'o' => {
                    self.pop_mark()?;
                    self.push(Value::None)
                }
                // BUILD sets object state. Dicts and tensors keep none we need; an inert
                // object records it (first BUILD only) for `flatten` to read as data.
                b'b' => {
                    let state = self.pop()?;
                    let obj = self.top()?;
                    if let Value::Object { state: s @ None } = &mut self.arena[obj] {
                        *s = Some(state);
                    }
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let v = self.persistent_load(pid)?;
                    self.push(v)
                }
                b'P' => return Err(perr("text persistent ids (PERSID) are not used by torch")),
                b'q' => {
                    let k = self.u8()? as u64;
                    self.memo_put(k)?
                }
                b'r' => {
                    let k = u32::from_le_bytes(self.le()?) as u64;
                    self.memo_put(k)?
                }
                b'p' => {
                    let k = self
                        .line()?
                        .parse::<u64>()
                        .map_err(|_| perr("bad PUT index"))?;
                    self.memo_put(k)?
                }
                0x94 => {
                    let k = self.memo.len() as u64;
                    self.memo_put(k)?
                }
                b'h' => {
                    let k = self.u8()? as u64;
                    self.memo_get(k)?
                }
                b'j' => {
                    let k = u32::from_le_bytes(self.le()?) as u64;
                    self.memo_get(k)?
                }
                b'g' => {
                    let k = self
                        .line()?
                        .parse::<u64>()
                        .map_err(|_| perr("bad GET index"))?;
                    self.memo_get(k)?
                }
                0x82..=0x84 => {
                    return Err(perr("pickle extension registry codes are not supported"))
                }
                _ => {
                    return Err(perr(format!(
                        "unknown pickle opcode 0x{op:02x} at offset {}",
                        self.pos - 1
                    )))
                }
            }
        }
    }

    fn reduce_newobj(&mut self, cls: Idx, _args: Idx) -> Value {
        match &self.arena[cls] {
            Value::Global { module, name } if module == "collections" && name == "OrderedDict" => {
                Value::Dict(Vec::new())
            }
            Value::Global { .. } => Value::Object { state: None },
            _ => Value::None,
        }
    }

    /// Collects every tensor reachable through dicts/lists from `root`, with dotted names.
    fn flatten(&self, root: Idx) -> Result<Vec<(String, TensorRef)>, ParseError> {
        let mut out = Vec::new();
        let mut stack = vec![(root, String::new(), 0usize)];
        // A pickle can reference a container from inside itself; visiting each container once
        // keeps flattening finite.
        let mut visited = std::collections::HashSet::new();
        while let Some((i, prefix, depth)) = stack.pop() {
            if let Some(e) = self.bad_tensors.get(&i) {
                return Err(ParseError::tensor(prefix, e.clone()));
            }
            match &self.arena[i] {
                Value::Tensor(t) => out.push((prefix, t.clone())),
                Value::Dict(_) | Value::List(_) | Value::Tuple(_) if depth >= MAX_DEPTH => {
                    return Err(ParseError::tensor(
                        prefix,
                        format!("containers nest deeper than {MAX_DEPTH} levels"),
                    ));
                }
                Value::Dict(items) => {
                    if !visited.insert(i) {
                        continue;
                    }
                    // Reverse so that popping the stack walks the dict in file order.
                    for &(k, v) in items.iter().rev() {
                        let key = match &self.arena[k] {
                            Value::Str(s) => s.clone(),
                            Value::Int(n) => n.to_string(),
                            _ => continue,
                        };
                        let name = if prefix.is_empty() {
                            key
                        } else {
                            format!("{prefix}.{key}")
                        };
                        stack.push((v, name, depth + 1));
                    }
                }
                Value::Object { state: Some(st) } => {
                    if !visited.insert(i) {
                        continue;
                    }
                    // A torch.nn.Module: its state_dict names are those of `_parameters`,
                    // `_buffers` and `_modules`, without those attribute names. Every other
                    // attribute (and any other object) is skipped, as `state_dict()` does.
                    let Value::Dict(attrs) = &self.arena[*st] else { continue };
                    let mut children = Vec::new();
                    for attr in ["_parameters", "_buffers", "_modules"] {
                        let found = attrs.iter().find(|&&(k, _)| self.str_of(k) == Some(attr));
                        if let Some(&(_, d)) = found {
                            if let Value::Dict(items) = &self.arena[d] {
                                children.extend(items.iter().copied());
                            }
                        }
                    }
                    for &(k, v) in children.iter().rev() {
                        let Some(key) = self.str_of(k) else { continue };
                        let name = if prefix.is_empty() { key.to_string() } else { format!("{prefix}.{key}") };
                        stack.push((v, name, depth + 1));
                    }
                }
                Value::List(items) | Value::Tuple(items) => {
                    if !visited.insert(i) {
                        continue;
                    }
                    for (n, &v) in items.iter().enumerate().rev() {
                        let name = if prefix.is_empty() {
                            n.to_string()
                        } else {
                            format!("{prefix}.{n}")
                        };
                        stack.push((v, name, depth + 1));
                    }
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

fn long_from_bytes(b: &[u8]) -> Value {
    if b.is_empty() {
        return Value::Int(0);
    }
    if b.len() > 8 {
        // Wider than i64 unless it is a sign extension; torch never needs these.
        let neg = b[b.len() - 1] & 0x80 != 0;
        let fill = if neg { 0xff } else { 0 };
        if b[8..].iter().any(|&x| x != fill) {
            return Value::BigInt;
        }
        return long_from_bytes(&b[..8]);
    }
    let neg = b[b.len() - 1] & 0x80 != 0;
    let mut a = [if neg { 0xff } else { 0 }; 8];
    a[..b.len()].copy_from_slice(b);
    Value::Int(i64::from_le_bytes(a))
}

/// A tensor found in a pickle, before its storage is located in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PickledTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// The storage key (`data/<key>` in zip files).
    pub storage: String,
    /// Byte range inside the storage.
    pub start: usize,
    pub len: usize,
}

/// The outcome of unpickling an object pickle: its tensors and the storages they use.
#[derive(Debug, Clone)]
pub struct Unpickled {
    pub tensors: Vec<PickledTensor>,
    pub(crate) storages: Vec<StorageRef>,
    /// Byte offset just after the STOP opcode.
    pub end: usize,
}

fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1]);
    }
    s
}

/// Runs the restricted unpickler over one pickle starting at `start` and resolves the
/// tensors it builds (names, dtypes, contiguous byte ranges inside their storages).
pub fn unpickle(bytes: &[u8], start: usize) -> Result<Unpickled, ParseError> {
    let mut m = Machine::new(bytes, start);
    let root = m.run()?;
    let mut flat = m.flatten(root)?;
    // Lightning-style checkpoints keep the weights under "state_dict" next to optimizer state;
    // sd.cpp reads names without that prefix.
    if flat.iter().any(|(n, _)| n.starts_with("state_dict.")) {
        flat.retain(|(n, _)| n.starts_with("state_dict."));
        for (n, _) in flat.iter_mut() {
            *n = n["state_dict.".len()..].to_string();
        }
    }
    let mut tensors = Vec::with_capacity(flat.len());
    for (name, t) in flat {
        let s = &m.storages[t.storage];
        let terr = |msg: String| ParseError::tensor(&name, msg);
        let numel = super::checked_numel(&t.shape)
            .ok_or_else(|| terr(format!("shape {:?} overflows", t.shape)))?;
        let contiguous = contiguous_strides(&t.shape);
        let ok = t
            .shape
            .iter()
            .zip(t.stride.iter().zip(&contiguous))
            .all(|(&d, (&s, &c))| d <= 1 || s == c);
        if !ok {
            return Err(terr(format!(
                "stride {:?} is not contiguous for shape {:?}; save with .contiguous()",
                t.stride, t.shape
            )));
        }
        let esize = s.dtype.block_bytes();
        let end_el = t
            .offset
            .checked_add(numel)
            .ok_or_else(|| terr("storage offset overflows".into()))?;
        if numel > 0 && end_el > s.numel {
            return Err(terr(format!(
                "view {}..{} is outside its storage '{}' of {} elements",
                t.offset, end_el, s.key, s.numel
            )));
        }
        let start = t
            .offset
            .checked_mul(esize)
            .ok_or_else(|| terr("byte offset overflows".into()))?;
        let len = s
            .dtype
            .byte_len(numel)
            .ok_or_else(|| terr("byte length overflows".into()))?;
        tensors.push(PickledTensor {
            name,
            dtype: s.dtype,
            shape: t.shape,
            storage: s.key.clone(),
            start,
            len,
        });
    }
    Ok(Unpickled {
        tensors,
        storages: m.storages,
        end: m.pos,
    })
}

/// Where the tensors of a whole torch file live, as ranges of the file (or of deflated zip
/// entries).
#[derive(Debug, Clone)]
pub struct Parsed {
    pub tensors: Vec<(String, DType, Vec<usize>, ParsedLoc)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParsedLoc {
    Range {
        start: usize,
        len: usize,
    },
    ZipDeflated {
        entry: usize,
        start: usize,
        len: usize,
    },
}

/// Parses a complete torch file (zip or legacy) held in `bytes`.
pub fn parse(bytes: &[u8]) -> Result<Parsed, ParseError> {
    if bytes.starts_with(b"PK") {
        parse_zip(bytes)
    } else {
        parse_legacy(bytes)
    }
}

fn parse_zip(bytes: &[u8]) -> Result<Parsed, ParseError> {
    let mut zip = zip::ZipArchive::new(Cursor::new(bytes))
        .map_err(|e| perr(format!("bad zip archive: {e}")))?;
    let names: Vec<String> = zip.file_names().map(str::to_string).collect();
    let pkl: Vec<&String> = names
        .iter()
        .filter(|n| n.ends_with("/data.pkl") && n.matches('/').count() == 1)
        .collect();
    let pkl_name = match pkl.as_slice() {
        [one] => (*one).clone(),
        [] => return Err(perr("zip has no <dir>/data.pkl entry")),
        _ => return Err(perr("zip has several <dir>/data.pkl entries")),
    };
    let prefix = &pkl_name[..pkl_name.len() - "data.pkl".len()];
    if let Some(i) = zip.index_for_name(&format!("{prefix}byteorder")) {
        let mut order = String::new();
        let mut f = zip
            .by_index(i)
            .map_err(|e| perr(format!("byteorder entry: {e}")))?;
        (&mut f)
            .take(16)
            .read_to_string(&mut order)
            .map_err(|e| perr(format!("byteorder entry: {e}")))?;
        if order.trim() != "little" {
            return Err(perr(format!(
                "byte order '{}' is not supported",
                order.trim()
            )));
        }
    }
    let pkl_bytes = read_entry_by_name(&mut zip, &pkl_name, 1 << 30)?;
    let u = unpickle(&pkl_bytes, 0)?;

    // Storage entries: (zip index, stored?, data start, size).
    let mut entries: HashMap<String, (usize, bool, usize, usize)> = HashMap::new();
    for s in &u.storages {
        let name = format!("{prefix}data/{}", s.key);
        let idx = zip
            .index_for_name(&name)
            .ok_or_else(|| perr(format!("storage entry '{name}' is missing")))?;
        let f = zip
            .by_index_raw(idx)
            .map_err(|e| perr(format!("entry '{name}': {e}")))?;
        let size =
            usize::try_from(f.size()).map_err(|_| perr(format!("entry '{name}' too large")))?;
        let need = s
            .dtype
            .byte_len(s.numel)
            .ok_or_else(|| perr(format!("storage '{}' size overflows", s.key)))?;
        if size < need {
            return Err(perr(format!(
                "entry '{name}' holds {size} bytes but storage '{}' needs {need} ({} x {})",
                s.key, s.numel, s.dtype
            )));
        }
        let stored = f.compression() == zip::CompressionMethod::Stored;
        if f.encrypted() {
            return Err(perr(format!("entry '{name}' is encrypted")));
        }
        let start = usize::try_from(f.data_start())
            .map_err(|_| perr(format!("entry '{name}' offset too large")))?;
        if stored {
            let csize = usize::try_from(f.compressed_size()).unwrap_or(usize::MAX);
            if csize != size || start.checked_add(size).is_none_or(|e| e > bytes.len()) {
                return Err(perr(format!(
                    "entry '{name}' data is past the end of the file"
                )));
            }
        } else if f.compression() != zip::CompressionMethod::Deflated {
            return Err(perr(format!(
                "entry '{name}' uses unsupported compression {:?}",
                f.compression()
            )));
        } else if f.size()
            > f.compressed_size()
                .saturating_mul(1032)
                .saturating_add(1024)
        {
            // 1032:1 is deflate's maximum ratio; a larger claim is a lie about the contents.
            return Err(perr(format!(
                "entry '{name}' claims {} bytes from {} compressed",
                f.size(),
                f.compressed_size()
            )));
        }
        entries.insert(s.key.clone(), (idx, stored, start, size));
    }
    let mut tensors = Vec::with_capacity(u.tensors.len());
    for t in u.tensors {
        let &(idx, stored, start, _size) = entries
            .get(&t.storage)
            .ok_or_else(|| ParseError::tensor(&t.name, "storage entry missing"))?;
        let loc = if stored {
            ParsedLoc::Range {
                start: start + t.start,
                len: t.len,
            }
        } else {
            ParsedLoc::ZipDeflated {
                entry: idx,
                start: t.start,
                len: t.len,
            }
        };
        tensors.push((t.name, t.dtype, t.shape, loc));
    }
    Ok(Parsed { tensors })
}

fn read_entry_by_name(
    zip: &mut zip::ZipArchive<Cursor<&[u8]>>,
    name: &str,
    limit: u64,
) -> Result<Vec<u8>, ParseError> {
    let f = zip
        .by_name(name)
        .map_err(|e| perr(format!("entry '{name}': {e}")))?;
    if f.size() > limit {
        return Err(perr(format!(
            "entry '{name}' is implausibly large ({} bytes)",
            f.size()
        )));
    }
    // The declared size is untrusted: let the buffer grow with what actually decompresses.
    let mut out = Vec::with_capacity((f.size() as usize).min(1 << 20));
    f.take(limit)
        .read_to_end(&mut out)
        .map_err(|e| perr(format!("entry '{name}': {e}")))?;
    Ok(out)
}

/// Decompresses `len` bytes at `start` of zip entry `entry` (for DEFLATED storages).
pub(crate) fn read_zip_entry(
    bytes: &[u8],
    entry: usize,
    start: usize,
    len: usize,
) -> Result<Vec<u8>, ParseError> {
    let mut zip = zip::ZipArchive::new(Cursor::new(bytes))
        .map_err(|e| perr(format!("bad zip archive: {e}")))?;
    let f = zip
        .by_index(entry)
        .map_err(|e| perr(format!("zip entry {entry}: {e}")))?;
    let end = start
        .checked_add(len)
        .ok_or_else(|| perr("range overflows"))?;
    let mut out = Vec::with_capacity(end.min(1 << 26));
    f.take(end as u64)
        .read_to_end(&mut out)
        .map_err(|e| perr(format!("zip entry {entry}: {e}")))?;
    if out.len() < end {
        return Err(perr(format!(
            "zip entry {entry} decompresses to {} bytes, need {end}",
            out.len()
        )));
    }
    out.drain(..start);
    Ok(out)
}

fn parse_legacy(bytes: &[u8]) -> Result<Parsed, ParseError> {
    // Magic number, protocol version and sys info are each a tiny pickle of plain values;
    // the magic is a LONG1 of ten bytes right after the PROTO opcode.
    let at = if bytes.first() == Some(&0x80) { 2 } else { 0 };
    let is_magic = bytes.get(at..at + 2) == Some(&[0x8a, 0x0a][..])
        && bytes.get(at + 2..at + 12) == Some(&LEGACY_MAGIC[..]);
    if !is_magic {
        return Err(perr(
            "not a torch file: no zip signature and no legacy magic number",
        ));
    }
    let mut m = Machine::new(bytes, 0);
    m.run()?;
    let magic = m.pos;
    let mut m = Machine::new(bytes, magic);
    let r = m.run()?;
    if m.int_of(r) != Some(1001) {
        return Err(perr("legacy torch file protocol version is not 1001"));
    }
    let sys_start = m.pos;
    let mut m = Machine::new(bytes, sys_start);
    let r = m.run()?;
    if let Value::Dict(items) = &m.arena[r] {
        for &(k, v) in items {
            if m.str_of(k) == Some("little_endian") && matches!(m.arena[v], Value::Bool(false)) {
                return Err(perr("big-endian legacy torch files are not supported"));
            }
        }
    }
    let u = unpickle(bytes, m.pos)?;
    let mut km = Machine::new(bytes, u.end);
    let keys_root = km.run()?;
    let keys: Vec<String> = km
        .seq_of(keys_root)
        .ok_or_else(|| perr("legacy storage key list is not a list"))?
        .iter()
        .map(|&i| {
            km.str_of(i)
                .map(str::to_string)
                .ok_or_else(|| perr("legacy storage key is not a string"))
        })
        .collect::<Result<_, _>>()?;

    // Storage data follow in key-list order, each as u64 element count + raw elements.
    let by_key: HashMap<&str, &StorageRef> =
        u.storages.iter().map(|s| (s.key.as_str(), s)).collect();
    let mut pos = km.pos;
    let mut data_at: HashMap<&str, (usize, usize)> = HashMap::new();
    for key in &keys {
        let s = by_key.get(key.as_str()).ok_or_else(|| {
            perr(format!(
                "storage '{key}' is listed but no tensor declares its type"
            ))
        })?;
        let head = bytes.get(pos..pos.saturating_add(8)).ok_or_else(|| {
            perr(format!(
                "storage '{key}' header is past the end of the file"
            ))
        })?;
        let n = u64::from_le_bytes(head.try_into().map_err(|_| perr("short storage header"))?);
        let n =
            usize::try_from(n).map_err(|_| perr(format!("storage '{key}' size {n} too large")))?;
        let nbytes = s
            .dtype
            .byte_len(n)
            .ok_or_else(|| perr(format!("storage '{key}' size overflows")))?;
        let start = pos + 8;
        let end = start
            .checked_add(nbytes)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| {
                perr(format!(
                    "storage '{key}' ({n} x {}) runs past the end of the file",
                    s.dtype
                ))
            })?;
        if n < s.numel {
            return Err(perr(format!(
                "storage '{key}' holds {n} elements, its id says {}",
                s.numel
            )));
        }
        data_at.insert(key.as_str(), (start, nbytes));
        pos = end;
    }
    let mut tensors = Vec::with_capacity(u.tensors.len());
    for t in u.tensors {
        let s = by_key
            .get(t.storage.as_str())
            .ok_or_else(|| ParseError::tensor(&t.name, "storage missing"))?;
        // Legacy view storages point into a base storage at an element offset.
        let (base_key, extra) = match &s.view_of {
            Some((b, o)) => (b.as_str(), o.checked_mul(s.dtype.block_bytes())),
            None => (t.storage.as_str(), Some(0)),
        };
        let extra = extra.ok_or_else(|| ParseError::tensor(&t.name, "view offset overflows"))?;
        let &(start, nbytes) = data_at.get(base_key).ok_or_else(|| {
            ParseError::tensor(
                &t.name,
                format!("storage '{base_key}' has no data in the file"),
            )
        })?;
        let off = extra
            .checked_add(t.start)
            .ok_or_else(|| ParseError::tensor(&t.name, "offset overflows"))?;
        if off.checked_add(t.len).is_none_or(|e| e > nbytes) {
            return Err(ParseError::tensor(
                &t.name,
                format!("data is outside storage '{base_key}'"),
            ));
        }
        tensors.push((
            t.name,
            t.dtype,
            t.shape,
            ParsedLoc::Range {
                start: start + off,
                len: t.len,
            },
        ));
    }
    Ok(Parsed { tensors })
}

pub(crate) fn from_blob(blob: Blob) -> Result<FileSource, IoError> {
    let parsed = parse(&blob.data).map_err(|e| e.at(&blob.path, Format::Pickle))?;
    if parsed.tensors.is_empty() {
        return Err(IoError::Format {
            path: blob.path.clone(),
            format: Format::Pickle,
            msg: "the pickle holds no tensors".into(),
        });
    }
    let tensors = parsed
        .tensors
        .into_iter()
        .map(|(name, dtype, shape, loc)| TensorInfo {
            name,
            dtype,
            shape,
            loc: match loc {
                ParsedLoc::Range { start, len } => Location::Range {
                    blob: 0,
                    start,
                    len,
                },
                ParsedLoc::ZipDeflated { entry, start, len } => Location::ZipDeflated {
                    blob: 0,
                    entry,
                    start,
                    len,
                },
            },
        })
        .collect();
    let path = blob.path.clone();
    FileSource::new(path, Format::Pickle, vec![blob], tensors, BTreeMap::new())
}

/// Opens a torch file.
pub fn open(path: &std::path::Path, opts: &super::OpenOptions) -> Result<FileSource, IoError> {
    from_blob(Blob::load(path, opts)?)
}
