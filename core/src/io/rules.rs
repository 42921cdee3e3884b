//! Load-time conversion: sd.cpp's `--type` and `--tensor-type-rules`.
//!
//! A tensor's target type is the type of the first rule whose regex matches (anywhere in) its
//! name, else the `--type` default. As in sd.cpp's `tensor_should_be_converted`, some tensors
//! are never converted (biases, norms' `.scale`, embeddings, FLUX/SD3 input and output
//! projections), and a tensor whose row length is not a multiple of the target block size
//! keeps its stored type with a warning. Only floating-point and already-quantized tensors are
//! converted; integer and bool tensors (position ids, masks) keep their type.

use regex::Regex;

use super::{IoError, TensorBytes, TensorInfo, TensorSource};
use crate::dtype::{self, DType};

/// The type a run loads weights as, before any per-tensor rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WeightType {
    /// Each tensor keeps its stored type.
    #[default]
    Stored,
    /// Every convertible tensor (float or quantized) becomes this type: sd-cli's `--type`.
    All(DType),
    /// Float tensors become this type; quantized ones keep theirs. What [`WeightType::for_cpu`]
    /// picks: a q8_0 file stays q8_0 (dequantizing it would only grow it).
    Floats(DType),
}

impl WeightType {
    /// The type this CPU computes fastest in: bf16 where our bf16 kernels run (AVX-512 BF16
    /// or AMX; measured 2.1x ggml's products and faster than PyTorch's f32 on Zen 4), else
    /// each file's own type (f16 and f32 products are exact f32 arithmetic everywhere).
    pub fn for_cpu() -> Self {
        if crate::ggml::bf16::available() {
            WeightType::Floats(DType::BF16)
        } else {
            WeightType::Stored
        }
    }

    /// The type `stored` converts to, if it does. fp8 weights, which ggml cannot compute
    /// with, stay at about a byte as q8_0 (8.5 bits; ComfyUI keeps fp8 and upcasts per
    /// layer, sd.cpp widens to f16) unless a type is asked for.
    fn target(self, stored: DType) -> Option<DType> {
        let fp8 = matches!(stored, DType::F8E4M3 | DType::F8E5M2);
        match self {
            WeightType::All(t) => Some(t),
            _ if fp8 => Some(DType::Q8_0),
            WeightType::Stored => None,
            WeightType::Floats(t) => stored.is_float().then_some(t),
        }
    }
}

impl From<Option<DType>> for WeightType {
    fn from(t: Option<DType>) -> Self {
        t.map_or(WeightType::Stored, WeightType::All)
    }
}

/// `stored`, a type name (`bf16`: every tensor) or `floats:bf16` (float tensors only), the
/// spelling [`FromStr`](std::str::FromStr) reads back.
impl std::fmt::Display for WeightType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightType::Stored => f.write_str("stored"),
            WeightType::All(t) => write!(f, "{t}"),
            WeightType::Floats(t) => write!(f, "floats:{t}"),
        }
    }
}

/// Reads what [`Display`](std::fmt::Display) writes, and `auto` ([`WeightType::for_cpu`]).
impl std::str::FromStr for WeightType {
    type Err = dtype::UnknownDType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("auto") {
            Ok(WeightType::for_cpu())
        } else if t.eq_ignore_ascii_case("stored") {
            Ok(WeightType::Stored)
        } else if let Some(f) = t.strip_prefix("floats:") {
            Ok(WeightType::Floats(f.parse()?))
        } else {
            Ok(WeightType::All(t.parse()?))
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct TypeRules {
    default: WeightType,
    rules: Vec<(Regex, DType)>,
}

impl TypeRules {
    /// No conversion: every tensor keeps its stored type.
    pub fn none() -> Self {
        TypeRules::default()
    }

    /// `default` is `--type` (a type, or `None` to keep each tensor's); `rules` is
    /// `--tensor-type-rules` (`"regex=type,regex=type"`, empty for none).
    pub fn new(default: impl Into<WeightType>, rules: &str) -> Result<Self, IoError> {
        let default = default.into();
        let err = |msg: String| IoError::Rules {
            rules: rules.to_string(),
            msg,
        };
        let mut out = Vec::new();
        for part in rules.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (re, ty) = part
                .rsplit_once('=')
                .ok_or_else(|| err(format!("rule '{part}' is not of the form regex=type")))?;
            let ty: DType = ty.parse().map_err(|e| err(format!("rule '{part}': {e}")))?;
            let re = Regex::new(re).map_err(|e| err(format!("rule '{part}': bad regex: {e}")))?;
            out.push((re, ty));
        }
        Ok(TypeRules {
            default,
            rules: out,
        })
    }

    /// Parses `--type` (a type name, empty for none) and `--tensor-type-rules`.
    pub fn parse(type_arg: &str, rules: &str) -> Result<Self, IoError> {
        let default = if type_arg.trim().is_empty() {
            None
        } else {
            Some(type_arg.parse::<DType>().map_err(|e| IoError::Rules {
                rules: type_arg.to_string(),
                msg: e.to_string(),
            })?)
        };
        TypeRules::new(default, rules)
    }

    /// The type the rules ask for a tensor of type `stored`, before the never-convert
    /// exceptions.
    pub fn requested(&self, name: &str, stored: DType) -> Option<DType> {
        self.rules
            .iter()
            .find(|(re, _)| re.is_match(name))
            .map(|(_, t)| *t)
            .or_else(|| self.default.target(stored))
    }

    /// The type `info` will be loaded as.
    pub fn target(&self, info: &TensorInfo) -> DType {
        match self.requested(&info.name, info.dtype) {
            Some(t) if t != info.dtype && should_convert(info, t) => t,
            _ => info.dtype,
        }
    }
}

/// sd.cpp's `tensor_should_be_converted`, plus the source-type restriction described above.
fn should_convert(info: &TensorInfo, to: DType) -> bool {
    let name = info.name.as_str();
    if !(info.dtype.is_float() || info.dtype.is_quantized()) {
        return false;
    }
    if !(to.is_float() || to.is_quantized()) {
        return false;
    }
    if to.is_quantized() {
        let row = info.shape.last().copied().unwrap_or(1);
        if row % to.block_size() != 0 {
            tracing::warn!(
                tensor = name,
                "row length {row} is not a multiple of the {to} block size {}; keeping {}",
                to.block_size(),
                info.dtype
            );
            return false;
        }
    }
    if name.ends_with(".bias") || name.ends_with(".scale") || name.contains("embedding") {
        return false;
    }
    if name.contains("scale_shift_table") {
        return false;
    }
    const FLUX: &[&str] = &[
        "img_in.",
        "txt_in.",
        "time_in.",
        "vector_in.",
        "guidance_in.",
        "final_layer.",
    ];
    const SD3: &[&str] = &[
        "x_embedder.",
        "t_embedder.",
        "y_embedder.",
        "pos_embed",
        "context_embedder.",
    ];
    !FLUX.iter().chain(SD3).any(|p| name.contains(p))
}

/// Reads `name` converted to the type `rules` give it. Returns the dtype of the bytes.
pub fn read_as<'a>(
    src: &'a dyn TensorSource,
    name: &str,
    rules: &TypeRules,
) -> Result<(DType, TensorBytes<'a>), IoError> {
    let info = src.get(name).ok_or_else(|| IoError::NotFound {
        path: src.path().to_path_buf(),
        tensor: name.to_string(),
    })?;
    let target = rules.target(info);
    let bytes = src.read(name)?;
    if target == info.dtype {
        return Ok((info.dtype, bytes));
    }
    match dtype::convert(info.dtype, &bytes, &info.shape, target) {
        Ok(v) => Ok((target, TensorBytes::Owned(v))),
        Err(source) => Err(IoError::Convert {
            path: src.path().to_path_buf(),
            tensor: name.to_string(),
            source,
        }),
    }
}
