//! Element types of kernel inputs and the borrowed tensors that carry them.
//!
//! Inputs may be f32, f16 or bf16; every kernel accumulates in f32 and writes f32 outputs, which
//! is what a serving stack's next op (a residual add, a norm) reads at full precision.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// The element type of a kernel's inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    Bf16,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        }
    }

    /// Relative tolerance for comparing a kernel's f32 output with the f64 reference (the
    /// largest error against the largest reference value) where the kernel rounds nothing
    /// itself: the reference sees the same rounded inputs, so the error comes from f32
    /// accumulation order alone. [`crate::Problem::tolerance`] widens it for attention.
    pub fn tolerance(self) -> f64 {
        match self {
            DType::F32 => 1e-4,
            DType::F16 | DType::Bf16 => 2e-3,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" => Ok(DType::F32),
            "f16" | "float16" | "half" => Ok(DType::F16),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            _ => Err(format!("unknown dtype `{s}` (expected f32, f16 or bf16)")),
        }
    }
}

/// A borrowed input tensor of any supported element type.
#[derive(Debug, Clone, Copy)]
pub enum Tensor<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
}

impl<'a> Tensor<'a> {
    pub fn dtype(&self) -> DType {
        match self {
            Tensor::F32(_) => DType::F32,
            Tensor::F16(_) => DType::F16,
            Tensor::Bf16(_) => DType::Bf16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Tensor::F32(s) => s.len(),
            Tensor::F16(s) => s.len(),
            Tensor::Bf16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements' bytes, to copy a tensor whatever its element type.
    pub fn as_bytes(&self) -> &'a [u8] {
        match *self {
            Tensor::F32(s) => bytemuck::cast_slice(s),
            Tensor::F16(s) => bytemuck::cast_slice(s),
            Tensor::Bf16(s) => bytemuck::cast_slice(s),
        }
    }

    /// The tensor of `dtype` elements whose bytes are `bytes`; `None` when they do not start
    /// on the element's alignment or are not a whole number of elements.
    pub fn from_bytes(dtype: DType, bytes: &'a [u8]) -> Option<Tensor<'a>> {
        Some(match dtype {
            DType::F32 => Tensor::F32(bytemuck::try_cast_slice(bytes).ok()?),
            DType::F16 => Tensor::F16(bytemuck::try_cast_slice(bytes).ok()?),
            DType::Bf16 => Tensor::Bf16(bytemuck::try_cast_slice(bytes).ok()?),
        })
    }

    /// Element `i` widened to f32.
    #[inline(always)]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            Tensor::F32(s) => s[i],
            Tensor::F16(s) => s[i].to_f32(),
            Tensor::Bf16(s) => s[i].to_f32(),
        }
    }

    /// Widens `len` elements starting at `start` into `out`.
    #[inline]
    pub fn read_into(&self, start: usize, out: &mut [f32]) {
        let len = out.len();
        match self {
            Tensor::F32(s) => out.copy_from_slice(&s[start..start + len]),
            Tensor::F16(s) => {
                for (o, v) in out.iter_mut().zip(&s[start..start + len]) {
                    *o = v.to_f32();
                }
            }
            Tensor::Bf16(s) => {
                for (o, v) in out.iter_mut().zip(&s[start..start + len]) {
                    *o = v.to_f32();
                }
            }
        }
    }
}

/// An owned input tensor; tests, benchmarks and the tuner allocate these.
///
/// Storage starts on a 64-byte boundary, as PyTorch's allocator places every tensor (and so
/// the weights and activations a server hands the runtime): kernels are timed on the
/// alignment they will meet. It matters to AMX, whose tile rows are 64 bytes: weight rows read
/// in place that straddle two cache lines ran at half the speed (Llama-shaped bf16 GEMMs on a
/// Xeon, 16-byte against 64-byte aligned).
#[derive(Debug, Clone, PartialEq)]
pub enum TensorBuf {
    F32(AVec<f32>),
    F16(AVec<f16>),
    Bf16(AVec<bf16>),
}

/// A 64-byte aligned buffer: `aligned-vec`, since `Vec` cannot carry an alignment above its
/// element's.
pub type AVec<T> = aligned_vec::AVec<T, aligned_vec::ConstAlign<64>>;

impl TensorBuf {
    /// Converts f32 values to `dtype`, rounding to nearest.
    pub fn from_f32(dtype: DType, values: &[f32]) -> Self {
        match dtype {
            DType::F32 => TensorBuf::F32(AVec::from_slice(64, values)),
            DType::F16 => TensorBuf::F16(AVec::from_iter(
                64,
                values.iter().map(|&v| f16::from_f32(v)),
            )),
            DType::Bf16 => TensorBuf::Bf16(AVec::from_iter(
                64,
                values.iter().map(|&v| bf16::from_f32(v)),
            )),
        }
    }

    /// `len` values of `next` in turn, rounded to `dtype` as they come: no f32 copy of a
    /// tensor that may be a large share of the host's memory.
    pub fn from_fn(dtype: DType, len: usize, mut next: impl FnMut() -> f32) -> Self {
        match dtype {
            DType::F32 => TensorBuf::F32(AVec::from_iter(64, (0..len).map(|_| next()))),
            DType::F16 => {
                TensorBuf::F16(AVec::from_iter(64, (0..len).map(|_| f16::from_f32(next()))))
            }
            DType::Bf16 => TensorBuf::Bf16(AVec::from_iter(
                64,
                (0..len).map(|_| bf16::from_f32(next())),
            )),
        }
    }

    /// Makes this `len` values of `next` in turn, in the buffer it has where that is large
    /// enough.
    pub fn refill(&mut self, len: usize, mut next: impl FnMut() -> f32) {
        match self {
            TensorBuf::F32(v) => {
                v.resize(len, 0.0);
                v.iter_mut().for_each(|x| *x = next());
            }
            TensorBuf::F16(v) => {
                v.resize(len, f16::ZERO);
                v.iter_mut().for_each(|x| *x = f16::from_f32(next()));
            }
            TensorBuf::Bf16(v) => {
                v.resize(len, bf16::ZERO);
                v.iter_mut().for_each(|x| *x = bf16::from_f32(next()));
            }
        }
    }

    pub fn view(&self) -> Tensor<'_> {
        match self {
            TensorBuf::F32(v) => Tensor::F32(v),
            TensorBuf::F16(v) => Tensor::F16(v),
            TensorBuf::Bf16(v) => Tensor::Bf16(v),
        }
    }

    pub fn len(&self) -> usize {
        self.view().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values widened to f64, for the references.
    pub fn to_f64(&self) -> Vec<f64> {
        let t = self.view();
        (0..t.len()).map(|i| t.get(i) as f64).collect()
    }
}
