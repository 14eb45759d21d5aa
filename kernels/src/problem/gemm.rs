//! GEMM: `C[M, N] = A[M, K] · B`, f32 accumulation and output.
//!
//! Inputs are f32, f16, bf16, or fp8 (W8A8: both operands in one fp8 format, each with
//! scales the call passes, [`crate::kernel::GemmScales`]), the dtypes of a serving stack's
//! Linear layers, FP8 checkpoints' (Llama 3.1 FP8, Qwen FP8, Mixtral FP8) included.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{check_dim, spec::Fields, Family};
use crate::{DType, KernelError, Result};

/// How B is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BLayout {
    /// `[K, N]` row-major, a plain matrix.
    Kn,
    /// `[N, K]` row-major, the way a Linear layer stores its weights (`y = x Wᵀ`).
    Nk,
}

impl fmt::Display for BLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BLayout::Kn => "kn",
            BLayout::Nk => "nk",
        })
    }
}

impl FromStr for BLayout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "kn" => Ok(BLayout::Kn),
            "nk" => Ok(BLayout::Nk),
            _ => Err(format!("unknown B layout `{s}` (expected kn or nk)")),
        }
    }
}

/// A matrix product. A is `[M, K]` row-major; C is `[M, N]` row-major f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "GemmFields")]
pub struct GemmProblem {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: DType,
    pub b_layout: BLayout,
}

/// Serde goes through this so a deserialised problem is validated like a constructed one.
#[derive(Deserialize)]
struct GemmFields {
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    b_layout: BLayout,
}

impl TryFrom<GemmFields> for GemmProblem {
    type Error = KernelError;
    fn try_from(f: GemmFields) -> Result<Self> {
        GemmProblem::new(f.m, f.n, f.k, f.dtype, f.b_layout)
    }
}

/// Largest dimension accepted; beyond it index arithmetic of a single call stops being sane.
const MAX_DIM: usize = 1 << 24;

impl GemmProblem {
    pub fn new(m: usize, n: usize, k: usize, dtype: DType, b_layout: BLayout) -> Result<Self> {
        check_dim(Family::Gemm, "m", m, MAX_DIM)?;
        check_dim(Family::Gemm, "n", n, MAX_DIM)?;
        check_dim(Family::Gemm, "k", k, MAX_DIM)?;
        Ok(GemmProblem {
            m,
            n,
            k,
            dtype,
            b_layout,
        })
    }

    /// Spec keys: `m`, `n`, `k` (required), `dtype` (default f32), `b` (kn or nk, default nk).
    pub(super) fn from_fields(mut f: Fields) -> Result<Self> {
        let p = GemmProblem::new(
            f.req("m")?,
            f.req("n")?,
            f.req("k")?,
            f.opt("dtype")?.unwrap_or(DType::F32),
            f.opt("b")?.unwrap_or(BLayout::Nk),
        )?;
        f.finish(&["m", "n", "k", "dtype", "b"])?;
        Ok(p)
    }

    /// The fp8 format of both inputs, for a W8A8 GEMM.
    pub fn fp8(&self) -> Option<crate::Fp8> {
        self.dtype.fp8()
    }

    pub fn key(&self) -> String {
        format!(
            "gemm:m={},n={},k={},dtype={},b={}",
            self.m, self.n, self.k, self.dtype, self.b_layout
        )
    }

    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }

    pub fn min_bytes(&self) -> f64 {
        let e = self.dtype.size() as f64;
        (self.m * self.k + self.k * self.n) as f64 * e + (self.m * self.n) as f64 * 4.0
    }

    pub fn a_len(&self) -> usize {
        self.m * self.k
    }
    pub fn b_len(&self) -> usize {
        self.k * self.n
    }
    pub fn c_len(&self) -> usize {
        self.m * self.n
    }
}
