//! GEMM: `C[M, N] = A[M, K] · B`, f32 accumulation and output.
//!
//! Inputs are f32, f16, bf16, or fp8 (W8A8: both operands in one fp8 format, each with
//! scales the call passes, [`crate::kernel::GemmScales`]), the dtypes of a serving stack's
//! Linear layers, FP8 checkpoints' (Llama 3.1 FP8, Qwen FP8, Mixtral FP8) included.
//!
//! A block-scaled fp8 GEMM (`block = 128`: DeepSeek-V3's scheme, and Qwen3's and Kimi K2's
//! FP8 checkpoints', `weight_block_size = [128, 128]`) scales each 128 × 128 block of the
//! weights and each token's 128 values of a group of k by a scale of its own, so the scales
//! enter inside the sum over k: `C[i, j] = Σ_g a[i, g] · b[j / 128, g] · Σ_{k in g} A8[i, k]
//! · B8[k, j]`. The kernels that compute it are others than the per-tensor, token or channel
//! ones' (whose scales multiply C once), so the block is part of the problem.

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
    /// fp8 only: the edge of the weights' square scale blocks, and the tokens' groups of k
    /// (`None`: scales per tensor, token or channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<usize>,
}

/// Serde goes through this so a deserialised problem is validated like a constructed one.
#[derive(Deserialize)]
struct GemmFields {
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    b_layout: BLayout,
    /// Absent in problems written before block-scaled fp8.
    #[serde(default)]
    block: Option<usize>,
}

impl TryFrom<GemmFields> for GemmProblem {
    type Error = KernelError;
    fn try_from(f: GemmFields) -> Result<Self> {
        let p = GemmProblem::new(f.m, f.n, f.k, f.dtype, f.b_layout)?;
        match f.block {
            Some(block) => p.with_block(block),
            None => Ok(p),
        }
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
            block: None,
        })
    }

    /// This problem with block-scaled fp8 weights: scales per `block` × `block` of the
    /// weights and per `block` values of k of each token. Needs an fp8 dtype, weights stored
    /// `[N, K]` (a Linear layer's, which the checkpoints' blocks tile), and a block of a
    /// multiple of 32 values (whole AMX and GPU tiles); the checkpoints' is 128.
    pub fn with_block(self, block: usize) -> Result<Self> {
        let reason = if self.fp8().is_none() {
            Some(format!(
                "scale blocks apply to fp8 GEMMs, and this one's dtype is {}",
                self.dtype
            ))
        } else if self.b_layout != BLayout::Nk {
            Some("block-scaled weights are a Linear layer's, stored [N, K]: use b=nk".into())
        } else if block == 0 || !block.is_multiple_of(32) || block > 4096 {
            Some("must be a multiple of 32 up to 4096 (the FP8 checkpoints' weight_block_size is [128, 128])".into())
        } else {
            None
        };
        match reason {
            Some(reason) => Err(KernelError::InvalidProblem {
                family: Family::Gemm,
                field: "block",
                value: block.to_string(),
                reason,
            }),
            None => Ok(GemmProblem {
                block: Some(block),
                ..self
            }),
        }
    }

    /// Groups of `block` values along k: A's scales per row and B's per block row.
    pub fn k_groups(&self) -> usize {
        self.block.map_or(1, |b| self.k.div_ceil(b))
    }

    /// The scale counts of a block-scaled problem: A's (`M` rows of [`Self::k_groups`]) and
    /// B's (`N / block` rounded up, rows of as many).
    pub fn block_scale_lens(&self) -> Option<(usize, usize)> {
        let block = self.block?;
        let groups = self.k_groups();
        Some((self.m * groups, self.n.div_ceil(block) * groups))
    }

    /// Spec keys: `m`, `n`, `k` (required), `dtype` (default f32), `b` (kn or nk, default nk),
    /// `block` (fp8: the scale blocks' edge, [`Self::with_block`]).
    pub(super) fn from_fields(mut f: Fields) -> Result<Self> {
        let mut p = GemmProblem::new(
            f.req("m")?,
            f.req("n")?,
            f.req("k")?,
            f.opt("dtype")?.unwrap_or(DType::F32),
            f.opt("b")?.unwrap_or(BLayout::Nk),
        )?;
        if let Some(block) = f.opt("block")? {
            p = p.with_block(block)?;
        }
        f.finish(&["m", "n", "k", "dtype", "b", "block"])?;
        Ok(p)
    }

    /// The fp8 format of both inputs, for a W8A8 GEMM.
    pub fn fp8(&self) -> Option<crate::Fp8> {
        self.dtype.fp8()
    }

    pub fn key(&self) -> String {
        let mut key = format!(
            "gemm:m={},n={},k={},dtype={},b={}",
            self.m, self.n, self.k, self.dtype, self.b_layout
        );
        if let Some(block) = self.block {
            key.push_str(&format!(",block={block}"));
        }
        key
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
