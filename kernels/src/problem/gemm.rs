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
//!
//! An int4 GEMM (`int4 = 128`: W4A16, the GPTQ, AWQ and compressed-tensors `pack-quantized`
//! checkpoints of serving stacks) takes A in f32, f16 or bf16 and B as 4-bit integers packed
//! eight to a 32-bit word, with a scale and a zero point per group of `int4` values of k and
//! column: `C[i, j] = Σ_k A[i, k] · s[k / g, j] · (q[k, j] − z[k / g, j])`. Reading a
//! quarter of bf16's bytes is what makes decode faster, and its kernels are others, so the
//! group is part of the problem.

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
    /// int4 weights only: the values of k that share a scale and a zero point
    /// ([`GemmProblem::with_int4`]; `None`: B holds `dtype` values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int4: Option<usize>,
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
    /// Absent in problems written before int4 weights.
    #[serde(default)]
    int4: Option<usize>,
}

impl TryFrom<GemmFields> for GemmProblem {
    type Error = KernelError;
    fn try_from(f: GemmFields) -> Result<Self> {
        let mut p = GemmProblem::new(f.m, f.n, f.k, f.dtype, f.b_layout)?;
        if let Some(block) = f.block {
            p = p.with_block(block)?;
        }
        match f.int4 {
            Some(group) => p.with_int4(group),
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
            int4: None,
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

    /// This problem with int4 weights in groups of `group` values of k (GPTQ's and AWQ's
    /// `group_size`; `group = k` for one scale per column, their `group_size = -1`). B is
    /// GPTQ's `qweight`: `[K / 8, N]` 32-bit words, word `(r, j)` holding `q[8r + i, j]` in
    /// bits `4i..4i + 4`, unsigned; the scales and zero points are `[K / group, N]` f32
    /// ([`crate::kernel::GemmScales`]). Needs A in f32, f16 or bf16, `b=kn` (the words' own
    /// layout), and `k` a multiple of `group`, itself a multiple of 8 (whole words).
    pub fn with_int4(self, group: usize) -> Result<Self> {
        let reason = if self.block.is_some() {
            Some("int4 weights have groups of their own; scale blocks are fp8's".into())
        } else if self.dtype.fp8().is_some() {
            Some(format!(
                "int4 weights take activations in f32, f16 or bf16, and this GEMM's dtype is {}",
                self.dtype
            ))
        } else if self.b_layout != BLayout::Kn {
            Some("int4 weights are packed as GPTQ's qweight, [K / 8, N] words of 8 values of k: use b=kn".into())
        } else if group == 0 || !group.is_multiple_of(8) {
            Some("must be a positive multiple of 8 (whole words of 8 values; the checkpoints' group_size is 32, 64 or 128, or k for one group)".into())
        } else if !self.k.is_multiple_of(group) {
            Some(format!(
                "must divide k = {} (GPTQ and AWQ group every k in whole groups)",
                self.k
            ))
        } else {
            None
        };
        match reason {
            Some(reason) => Err(KernelError::InvalidProblem {
                family: Family::Gemm,
                field: "int4",
                value: group.to_string(),
                reason,
            }),
            None => Ok(GemmProblem {
                int4: Some(group),
                ..self
            }),
        }
    }

    /// The problem an int4 one becomes once its weights are dequantized to its dtype, `[K,
    /// N]` as the words hold them: what the CPU's prompt kernels run after the dequantizing
    /// pass. `None` for other problems.
    pub fn dequantized(&self) -> Option<GemmProblem> {
        self.dequantized_as(BLayout::Kn)
    }

    /// [`GemmProblem::dequantized`] with the weights stored as `layout` (`[N, K]` for the
    /// kernels that read B in place).
    pub fn dequantized_as(&self, layout: BLayout) -> Option<GemmProblem> {
        self.int4.map(|_| GemmProblem {
            int4: None,
            b_layout: layout,
            ..*self
        })
    }

    /// An int4 problem's buffer lengths: B's words (`K / 8` rows of `N`), and its scales'
    /// and zero points' (`K / group` rows of `N`).
    pub fn int4_lens(&self) -> Option<(usize, usize)> {
        let group = self.int4?;
        Some((self.k / 8 * self.n, self.k / group * self.n))
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
    /// `block` (fp8: the scale blocks' edge, [`Self::with_block`]), `int4` (int4 weights'
    /// group, [`Self::with_int4`]).
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
        if let Some(group) = f.opt("int4")? {
            p = p.with_int4(group)?;
        }
        f.finish(&["m", "n", "k", "dtype", "b", "block", "int4"])?;
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
        if let Some(group) = self.int4 {
            key.push_str(&format!(",int4={group}"));
        }
        key
    }

    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }

    pub fn min_bytes(&self) -> f64 {
        let e = self.dtype.size() as f64;
        let b = match self.int4_lens() {
            // Half a byte a weight, and a scale and a zero point a group.
            Some((words, groups)) => (4 * words + 8 * groups) as f64,
            None => (self.k * self.n) as f64 * e,
        };
        (self.m * self.k) as f64 * e + b + (self.m * self.n) as f64 * 4.0
    }

    pub fn a_len(&self) -> usize {
        self.m * self.k
    }
    /// B's elements: values, or an int4 problem's words.
    pub fn b_len(&self) -> usize {
        match self.int4_lens() {
            Some((words, _)) => words,
            None => self.k * self.n,
        }
    }
    pub fn c_len(&self) -> usize {
        self.m * self.n
    }
}
