//! Element types a model file can hold, and conversion between them.
//!
//! Plain element types (floats, ints, float8) are handled in Rust; ggml's block
//! quantization types are sized, quantized and dequantized through ggml itself so that
//! what we write is exactly what ggml kernels read.

use std::fmt;
use std::str::FromStr;

use ggml_sys as sys;
use half::{bf16, f16};

/// An element type: plain scalars plus every block-quantized type of the bound ggml.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F64,
    F32,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
    F8E4M3,
    F8E5M2,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ2XXS,
    IQ2XS,
    IQ3XXS,
    IQ1S,
    IQ4NL,
    IQ3S,
    IQ2S,
    IQ4XS,
    IQ1M,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
    Q2_0,
}

/// `(dtype, ggml type, canonical name, extra accepted names)`.
///
/// Canonical names are ggml's `ggml_type_name` spelling (what sd.cpp prints and accepts for
/// `--type`); aliases cover safetensors' dtype strings.
const TABLE: &[(DType, Option<sys::ggml_type>, &str, &[&str])] = &[
    (
        DType::F64,
        Some(sys::GGML_TYPE_F64),
        "f64",
        &["float64", "double"],
    ),
    (
        DType::F32,
        Some(sys::GGML_TYPE_F32),
        "f32",
        &["float32", "float"],
    ),
    (
        DType::F16,
        Some(sys::GGML_TYPE_F16),
        "f16",
        &["float16", "half"],
    ),
    (
        DType::BF16,
        Some(sys::GGML_TYPE_BF16),
        "bf16",
        &["bfloat16"],
    ),
    (DType::I64, Some(sys::GGML_TYPE_I64), "i64", &["int64"]),
    (DType::I32, Some(sys::GGML_TYPE_I32), "i32", &["int32"]),
    (DType::I16, Some(sys::GGML_TYPE_I16), "i16", &["int16"]),
    (DType::I8, Some(sys::GGML_TYPE_I8), "i8", &["int8"]),
    (DType::U8, None, "u8", &["uint8"]),
    (DType::Bool, None, "bool", &[]),
    (
        DType::F8E4M3,
        None,
        "f8_e4m3",
        &["f8_e4m3fn", "float8_e4m3fn"],
    ),
    (DType::F8E5M2, None, "f8_e5m2", &["float8_e5m2"]),
    (DType::Q4_0, Some(sys::GGML_TYPE_Q4_0), "q4_0", &[]),
    (DType::Q4_1, Some(sys::GGML_TYPE_Q4_1), "q4_1", &[]),
    (DType::Q5_0, Some(sys::GGML_TYPE_Q5_0), "q5_0", &[]),
    (DType::Q5_1, Some(sys::GGML_TYPE_Q5_1), "q5_1", &[]),
    (DType::Q8_0, Some(sys::GGML_TYPE_Q8_0), "q8_0", &[]),
    (DType::Q8_1, Some(sys::GGML_TYPE_Q8_1), "q8_1", &[]),
    (DType::Q2K, Some(sys::GGML_TYPE_Q2_K), "q2_K", &[]),
    (DType::Q3K, Some(sys::GGML_TYPE_Q3_K), "q3_K", &[]),
    (DType::Q4K, Some(sys::GGML_TYPE_Q4_K), "q4_K", &[]),
    (DType::Q5K, Some(sys::GGML_TYPE_Q5_K), "q5_K", &[]),
    (DType::Q6K, Some(sys::GGML_TYPE_Q6_K), "q6_K", &[]),
    (DType::Q8K, Some(sys::GGML_TYPE_Q8_K), "q8_K", &[]),
    (DType::IQ2XXS, Some(sys::GGML_TYPE_IQ2_XXS), "iq2_xxs", &[]),
    (DType::IQ2XS, Some(sys::GGML_TYPE_IQ2_XS), "iq2_xs", &[]),
    (DType::IQ3XXS, Some(sys::GGML_TYPE_IQ3_XXS), "iq3_xxs", &[]),
    (DType::IQ1S, Some(sys::GGML_TYPE_IQ1_S), "iq1_s", &[]),
    (DType::IQ4NL, Some(sys::GGML_TYPE_IQ4_NL), "iq4_nl", &[]),
    (DType::IQ3S, Some(sys::GGML_TYPE_IQ3_S), "iq3_s", &[]),
    (DType::IQ2S, Some(sys::GGML_TYPE_IQ2_S), "iq2_s", &[]),
    (DType::IQ4XS, Some(sys::GGML_TYPE_IQ4_XS), "iq4_xs", &[]),
    (DType::IQ1M, Some(sys::GGML_TYPE_IQ1_M), "iq1_m", &[]),
    (DType::TQ1_0, Some(sys::GGML_TYPE_TQ1_0), "tq1_0", &[]),
    (DType::TQ2_0, Some(sys::GGML_TYPE_TQ2_0), "tq2_0", &[]),
    (DType::MXFP4, Some(sys::GGML_TYPE_MXFP4), "mxfp4", &[]),
    (DType::NVFP4, Some(sys::GGML_TYPE_NVFP4), "nvfp4", &[]),
    (DType::Q1_0, Some(sys::GGML_TYPE_Q1_0), "q1_0", &[]),
    (DType::Q2_0, Some(sys::GGML_TYPE_Q2_0), "q2_0", &[]),
];

fn entry(
    d: DType,
) -> &'static (
    DType,
    Option<sys::ggml_type>,
    &'static str,
    &'static [&'static str],
) {
    // TABLE lists every variant exactly once, in declaration order.
    &TABLE[d as usize]
}

impl DType {
    /// Every dtype, in declaration order.
    pub fn all() -> impl Iterator<Item = DType> {
        TABLE.iter().map(|e| e.0)
    }

    /// The ggml type with the same memory layout, if ggml has one (ggml has no u8, bool or
    /// float8).
    pub fn ggml_type(self) -> Option<sys::ggml_type> {
        entry(self).1
    }

    pub fn from_ggml(t: sys::ggml_type) -> Option<DType> {
        TABLE.iter().find(|e| e.1 == Some(t)).map(|e| e.0)
    }

    /// ggml's spelling (`f16`, `q4_K`, `iq2_xxs`); `f8_e4m3`, `u8`, `bool` for the rest.
    pub fn name(self) -> &'static str {
        entry(self).2
    }

    /// The dtype string safetensors uses, for types safetensors can store.
    pub fn safetensors_name(self) -> Option<&'static str> {
        Some(match self {
            DType::F64 => "F64",
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::I16 => "I16",
            DType::I8 => "I8",
            DType::U8 => "U8",
            DType::Bool => "BOOL",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            _ => return None,
        })
    }

    /// True for ggml's block-quantized types (data is not one value per element).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// True for the floating-point element types (the ones load-time conversion applies to).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F64 | DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2
        )
    }

    /// Elements per block (1 for plain types).
    pub fn block_size(self) -> usize {
        match self.ggml_type() {
            // SAFETY: a table lookup in ggml for a valid enum value.
            Some(t) => usize::try_from(unsafe { sys::ggml_blck_size(t) })
                .unwrap_or(1)
                .max(1),
            None => 1,
        }
    }

    /// Bytes per block (per element for plain types).
    pub fn block_bytes(self) -> usize {
        match self {
            DType::U8 | DType::Bool | DType::F8E4M3 | DType::F8E5M2 => 1,
            // SAFETY: a table lookup in ggml for a valid enum value.
            _ => self
                .ggml_type()
                .map(|t| unsafe { sys::ggml_type_size(t) })
                .unwrap_or(1),
        }
    }

    /// Bytes of `n_elements` values, or `None` when `n_elements` is not a whole number of
    /// blocks or the size overflows.
    pub fn byte_len(self, n_elements: usize) -> Option<usize> {
        let bs = self.block_size();
        if n_elements % bs != 0 {
            return None;
        }
        (n_elements / bs).checked_mul(self.block_bytes())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("unknown type '{0}' (expected one of f32, f16, bf16, q8_0, q4_0, q4_K, ...)")]
pub struct UnknownDType(pub String);

impl FromStr for DType {
    type Err = UnknownDType;

    /// Accepts sd.cpp `--type` names (case-insensitive, so `q4_k` and `q4_K` both work) and
    /// safetensors dtype strings (`F32`, `BF16`, `F8_E4M3`, `BOOL`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        TABLE
            .iter()
            .find(|e| e.2.eq_ignore_ascii_case(t) || e.3.iter().any(|a| a.eq_ignore_ascii_case(t)))
            .map(|e| e.0)
            .ok_or_else(|| UnknownDType(s.to_string()))
    }
}

/// Why a conversion could not be made.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ConvertError {
    #[error("{dtype} data of shape {shape:?} should be {expected:?} bytes, got {got}")]
    ByteLength {
        dtype: DType,
        shape: Vec<usize>,
        expected: Option<usize>,
        got: usize,
    },
    #[error(
        "cannot quantize to {dtype}: row length {row} is not a multiple of its block size {block}"
    )]
    RowNotBlockMultiple {
        dtype: DType,
        row: usize,
        block: usize,
    },
    #[error("cannot quantize to {0} without an importance matrix")]
    NeedsImatrix(DType),
    #[error("ggml has no conversion from {0} to f32")]
    NoDequantizer(DType),
    #[error("cannot convert to {0}")]
    Unsupported(DType),
}

fn n_elements(shape: &[usize]) -> Option<usize> {
    crate::io::checked_numel(shape)
}

/// Converts `bytes` holding a `src` tensor of `shape` (PyTorch order) to `dst`.
///
/// Goes through f32. Quantized destinations are quantized row by row with rows = the last
/// dimension (ggml's `ne[0]`), which must be a multiple of the block size.
pub fn convert(
    src: DType,
    bytes: &[u8],
    shape: &[usize],
    dst: DType,
) -> Result<Vec<u8>, ConvertError> {
    let n = n_elements(shape);
    let expected = n.and_then(|n| src.byte_len(n));
    if expected != Some(bytes.len()) {
        return Err(ConvertError::ByteLength {
            dtype: src,
            shape: shape.to_vec(),
            expected,
            got: bytes.len(),
        });
    }
    let n = n.unwrap_or(0);
    if src == dst {
        return Ok(bytes.to_vec());
    }
    // Validate the destination before the (possibly large) dequantization.
    let row = shape.last().copied().unwrap_or(1);
    if dst.is_quantized() {
        check_quantizable(dst, row)?;
    }
    let f = to_f32(src, bytes, n)?;
    from_f32(&f, row, dst)
}

fn check_quantizable(dst: DType, row: usize) -> Result<(), ConvertError> {
    let block = dst.block_size();
    if row == 0 || row % block != 0 {
        return Err(ConvertError::RowNotBlockMultiple {
            dtype: dst,
            row,
            block,
        });
    }
    let t = dst.ggml_type().ok_or(ConvertError::Unsupported(dst))?;
    // SAFETY: pure predicate on a valid type.
    if unsafe { sys::ggml_quantize_requires_imatrix(t) } {
        return Err(ConvertError::NeedsImatrix(dst));
    }
    // Q8_1 and Q8_K are activation-only formats: ggml_quantize_chunk aborts on them.
    if matches!(dst, DType::Q8_1 | DType::Q8K) {
        return Err(ConvertError::Unsupported(dst));
    }
    Ok(())
}

/// Decodes `n` elements of `src` to f32. `bytes` must be exactly `src.byte_len(n)` long.
pub fn to_f32(src: DType, bytes: &[u8], n: usize) -> Result<Vec<f32>, ConvertError> {
    if src.byte_len(n) != Some(bytes.len()) {
        return Err(ConvertError::ByteLength {
            dtype: src,
            shape: vec![n],
            expected: src.byte_len(n),
            got: bytes.len(),
        });
    }
    fn each<const W: usize>(b: &[u8], f: impl Fn([u8; W]) -> f32) -> Vec<f32> {
        b.chunks_exact(W)
            .map(|c| f(c.try_into().unwrap_or([0; W])))
            .collect()
    }
    Ok(match src {
        DType::F32 => each::<4>(bytes, f32::from_le_bytes),
        DType::F64 => each::<8>(bytes, |c| f64::from_le_bytes(c) as f32),
        DType::F16 => each::<2>(bytes, |c| f16::from_le_bytes(c).to_f32()),
        DType::BF16 => each::<2>(bytes, |c| bf16::from_le_bytes(c).to_f32()),
        DType::I64 => each::<8>(bytes, |c| i64::from_le_bytes(c) as f32),
        DType::I32 => each::<4>(bytes, |c| i32::from_le_bytes(c) as f32),
        DType::I16 => each::<2>(bytes, |c| i16::from_le_bytes(c) as f32),
        DType::I8 => bytes.iter().map(|&b| b as i8 as f32).collect(),
        DType::U8 => bytes.iter().map(|&b| b as f32).collect(),
        DType::Bool => bytes
            .iter()
            .map(|&b| if b != 0 { 1.0 } else { 0.0 })
            .collect(),
        DType::F8E4M3 => bytes.iter().map(|&b| f8_e4m3_to_f32(b)).collect(),
        DType::F8E5M2 => bytes.iter().map(|&b| f8_e5m2_to_f32(b)).collect(),
        q => {
            let t = q.ggml_type().ok_or(ConvertError::NoDequantizer(q))?;
            // SAFETY: ggml returns a pointer to its static traits table for valid types.
            let traits = unsafe { sys::ggml_get_type_traits(t).as_ref() };
            let to_float = traits
                .and_then(|t| t.to_float)
                .ok_or(ConvertError::NoDequantizer(q))?;
            let mut out = vec![0f32; n];
            if n > 0 {
                let k = i64::try_from(n).map_err(|_| ConvertError::NoDequantizer(q))?;
                // SAFETY: `bytes` holds exactly n/block blocks of `q` (checked above) and `out`
                // has room for n floats.
                unsafe { to_float(bytes.as_ptr().cast(), out.as_mut_ptr(), k) };
            }
            out
        }
    })
}

/// Encodes f32 values as `dst`; quantized types use rows of `row` elements.
pub fn from_f32(values: &[f32], row: usize, dst: DType) -> Result<Vec<u8>, ConvertError> {
    fn each<const W: usize>(v: &[f32], f: impl Fn(f32) -> [u8; W]) -> Vec<u8> {
        let mut out = Vec::with_capacity(v.len() * W);
        for &x in v {
            out.extend_from_slice(&f(x));
        }
        out
    }
    // Integer destinations round and saturate, as `tensor.round().to(int)` would for
    // in-range values; out-of-range values clamp instead of wrapping.
    Ok(match dst {
        DType::F32 => each::<4>(values, f32::to_le_bytes),
        DType::F64 => each::<8>(values, |x| (x as f64).to_le_bytes()),
        DType::F16 => each::<2>(values, |x| f16::from_f32(x).to_le_bytes()),
        DType::BF16 => each::<2>(values, |x| bf16::from_f32(x).to_le_bytes()),
        DType::I64 => each::<8>(values, |x| (x.round() as i64).to_le_bytes()),
        DType::I32 => each::<4>(values, |x| (x.round() as i32).to_le_bytes()),
        DType::I16 => each::<2>(values, |x| (x.round() as i16).to_le_bytes()),
        DType::I8 => values.iter().map(|x| x.round() as i8 as u8).collect(),
        DType::U8 => values.iter().map(|x| x.round() as u8).collect(),
        DType::Bool => values.iter().map(|&x| u8::from(x != 0.0)).collect(),
        DType::F8E4M3 => values
            .iter()
            .map(|&x| f32_to_f8(x, &F8_E4M3_TABLE, 0x7f))
            .collect(),
        DType::F8E5M2 => values
            .iter()
            .map(|&x| f32_to_f8(x, &F8_E5M2_TABLE, 0x7f))
            .collect(),
        q => {
            check_quantizable(q, row)?;
            if values.len() % row != 0 {
                return Err(ConvertError::RowNotBlockMultiple {
                    dtype: q,
                    row,
                    block: q.block_size(),
                });
            }
            let t = q.ggml_type().ok_or(ConvertError::Unsupported(q))?;
            let nrows = values.len() / row;
            let row_bytes = (row / q.block_size()) * q.block_bytes();
            let mut out = vec![0u8; nrows * row_bytes];
            if nrows > 0 {
                // SAFETY: `values` holds nrows*row floats, `out` nrows rows of `q`; the type
                // was checked to need no imatrix and to have a quantizer.
                let written = unsafe {
                    sys::ggml_quantize_chunk(
                        t,
                        values.as_ptr(),
                        out.as_mut_ptr().cast(),
                        0,
                        nrows as i64,
                        row as i64,
                        std::ptr::null(),
                    )
                };
                debug_assert_eq!(written, out.len());
            }
            out
        }
    })
}

fn f8_e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0x0f) as i32;
    let m = (b & 0x07) as f32;
    // E4M3FN: no infinities, only S.1111.111 is NaN.
    if e == 0x0f && (b & 0x07) == 0x07 {
        return f32::NAN;
    }
    if e == 0 {
        sign * (m / 8.0) * 2f32.powi(-6)
    } else {
        sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

fn f8_e5m2_to_f32(b: u8) -> f32 {
    // E5M2 is the top byte of an IEEE half.
    f16::from_bits((b as u16) << 8).to_f32()
}

/// Non-negative values of the codes 0..=0x7e, in code order (ascending by value).
struct F8Table([f32; 127]);

static F8_E4M3_TABLE: std::sync::LazyLock<F8Table> = std::sync::LazyLock::new(|| {
    let mut t = [0f32; 127];
    for (i, v) in t.iter_mut().enumerate() {
        *v = f8_e4m3_to_f32(i as u8);
    }
    F8Table(t)
});

static F8_E5M2_TABLE: std::sync::LazyLock<F8Table> = std::sync::LazyLock::new(|| {
    // Codes 0..=0x7b are finite, 0x7c is +inf; NaNs above are excluded by the table length cut.
    let mut t = [0f32; 127];
    for (i, v) in t.iter_mut().enumerate() {
        *v = if i <= 0x7c {
            f8_e5m2_to_f32(i as u8)
        } else {
            f32::INFINITY
        };
    }
    F8Table(t)
});

/// Round-to-nearest-even onto the code table; magnitudes past the largest finite value
/// saturate to it (E4M3 has no infinity) or to inf for E5M2.
fn f32_to_f8(x: f32, table: &F8Table, nan: u8) -> u8 {
    if x.is_nan() {
        return nan;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    let t = &table.0;
    let idx = t.partition_point(|&v| v < a);
    let code = if idx >= t.len() {
        t.len() - 1
    } else if idx == 0 || t[idx] == a {
        idx
    } else {
        let (lo, hi) = (t[idx - 1], t[idx]);
        if hi.is_infinite() {
            // Values between max finite and inf: IEEE rounds to inf only past max + ulp/2.
            let ulp = lo - t[idx - 2];
            if a >= lo + ulp / 2.0 {
                idx
            } else {
                idx - 1
            }
        } else if a - lo < hi - a || (a - lo == hi - a && (idx - 1) % 2 == 0) {
            idx - 1
        } else {
            idx
        }
    };
    sign | code as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_declaration_order() {
        for (i, e) in TABLE.iter().enumerate() {
            assert_eq!(e.0 as usize, i, "{:?}", e.0);
        }
        assert_eq!(DType::Q2_0 as usize + 1, TABLE.len());
    }

    #[test]
    fn names_match_ggml_and_parse_back() {
        for d in DType::all() {
            assert_eq!(d.name().parse::<DType>(), Ok(d));
            assert_eq!(d.name().to_uppercase().parse::<DType>(), Ok(d));
            if let Some(t) = d.ggml_type() {
                // SAFETY: valid type, static string.
                let g = unsafe { std::ffi::CStr::from_ptr(sys::ggml_type_name(t)) };
                assert_eq!(g.to_str().unwrap(), d.name());
                assert_eq!(DType::from_ggml(t), Some(d));
            }
            if let Some(s) = d.safetensors_name() {
                assert_eq!(s.parse::<DType>(), Ok(d));
            }
        }
        assert!("q4_k".parse::<DType>().is_ok());
        assert!("q9_9".parse::<DType>().is_err());
    }

    #[test]
    fn byte_len_is_block_aware_and_checked() {
        assert_eq!(DType::F32.byte_len(10), Some(40));
        assert_eq!(DType::Q4_0.byte_len(64), Some(36));
        assert_eq!(DType::Q4_0.byte_len(33), None);
        assert_eq!(DType::Q4K.byte_len(256), Some(144));
        assert_eq!(DType::F64.byte_len(usize::MAX / 4), None);
    }

    #[test]
    fn f8_round_trips_every_code() {
        for b in 0..=255u8 {
            let v = f8_e4m3_to_f32(b);
            if v.is_nan() {
                continue;
            }
            let back = f32_to_f8(v, &F8_E4M3_TABLE, 0x7f);
            // -0 and +0 differ only in sign, both fine.
            assert_eq!(back, b, "e4m3 code {b:#x} value {v}");
            let v = f8_e5m2_to_f32(b);
            if v.is_nan() {
                continue;
            }
            assert_eq!(f32_to_f8(v, &F8_E5M2_TABLE, 0x7f), b, "e5m2 code {b:#x}");
        }
        assert_eq!(f8_e4m3_to_f32(0x7e), 448.0);
        assert_eq!(f32_to_f8(1e6, &F8_E4M3_TABLE, 0x7f), 0x7e);
        assert_eq!(f32_to_f8(1e6, &F8_E5M2_TABLE, 0x7f), 0x7c);
    }
}
