//! Kernel problems: what one call computes, independent of how.
//!
//! A problem is validated on construction and has a canonical text key
//! (`gemm:m=1,n=1280,k=8192,dtype=bf16,b=nk`) that is stable across releases: the database stores
//! it, the runtime looks it up, and `tune --shapes` parses the same syntax back.

mod flash;
mod gemm;
mod paged;
mod spec;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use flash::FlashProblem;
pub use gemm::{BLayout, GemmProblem};
pub use paged::PagedProblem;

use crate::{KernelError, Result};

/// The kernel families kerntune tunes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Gemm,
    Flash,
    Paged,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::Gemm, Family::Flash, Family::Paged];

    pub fn as_str(self) -> &'static str {
        match self {
            Family::Gemm => "gemm",
            Family::Flash => "flash",
            Family::Paged => "paged",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Family {
    type Err = KernelError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "gemm" => Ok(Family::Gemm),
            "flash" | "flash_attention" | "prefill" => Ok(Family::Flash),
            "paged" | "paged_attention" | "decode" => Ok(Family::Paged),
            _ => Err(KernelError::BadSpec {
                spec: s.to_string(),
                reason: "unknown kernel family (expected gemm, flash or paged)".into(),
            }),
        }
    }
}

/// One kernel problem of any family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "family", rename_all = "lowercase")]
pub enum Problem {
    Gemm(GemmProblem),
    Flash(FlashProblem),
    Paged(PagedProblem),
}

impl Problem {
    pub fn family(&self) -> Family {
        match self {
            Problem::Gemm(_) => Family::Gemm,
            Problem::Flash(_) => Family::Flash,
            Problem::Paged(_) => Family::Paged,
        }
    }

    pub fn dtype(&self) -> crate::DType {
        match self {
            Problem::Gemm(p) => p.dtype,
            Problem::Flash(p) => p.dtype,
            Problem::Paged(p) => p.dtype,
        }
    }

    /// Sink logits a call passes: one per query head of attention with sinks, else none.
    pub fn sinks_len(&self) -> usize {
        match self {
            Problem::Flash(p) if p.sinks => p.q_heads,
            Problem::Paged(p) if p.sinks => p.q_heads,
            _ => 0,
        }
    }

    /// Relative tolerance of a kernel's output against the f64 reference (see
    /// [`crate::DType::tolerance`]). Attention on bf16 may round its probabilities to bf16
    /// for the `P·V` product, as PyTorch's CPU flash attention and the GPU flash-attention
    /// kernels do: each weight is then off by up to 2^-9 of itself, and against the largest
    /// output that reaches 8.1e-3 where outputs are small averages of many near-equal weights
    /// (head_dim 2, 213 tokens; the worst of 1600 random problems). 1.6e-2 is the bf16
    /// tolerance of PyTorch's `assert_close`.
    pub fn tolerance(&self) -> f64 {
        match (self.family(), self.dtype()) {
            (Family::Flash | Family::Paged, crate::DType::Bf16) => 1.6e-2,
            (_, dtype) => dtype.tolerance(),
        }
    }

    /// The canonical key: every field in a fixed order, defaults included.
    pub fn key(&self) -> String {
        match self {
            Problem::Gemm(p) => p.key(),
            Problem::Flash(p) => p.key(),
            Problem::Paged(p) => p.key(),
        }
    }

    /// Floating-point operations of one call (a multiply-add counts two).
    pub fn flops(&self) -> f64 {
        match self {
            Problem::Gemm(p) => p.flops(),
            Problem::Flash(p) => p.flops(),
            Problem::Paged(p) => p.flops(),
        }
    }

    /// Bytes a call must move at least once: inputs read and outputs written.
    pub fn min_bytes(&self) -> f64 {
        match self {
            Problem::Gemm(p) => p.min_bytes(),
            Problem::Flash(p) => p.min_bytes(),
            Problem::Paged(p) => p.min_bytes(),
        }
    }

    /// Whether throughput is better judged in bytes per second than in FLOP/s: decode GEMMs and
    /// paged attention stream their operands once.
    pub fn memory_bound(&self) -> bool {
        match self {
            Problem::Gemm(p) => p.m <= 16,
            Problem::Flash(_) => false,
            Problem::Paged(_) => true,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}

impl FromStr for Problem {
    type Err = KernelError;

    /// Parses `family:key=value,...`; omitted keys take the defaults each family documents.
    fn from_str(s: &str) -> Result<Self> {
        let (family, rest) = s.split_once(':').ok_or_else(|| KernelError::BadSpec {
            spec: s.to_string(),
            reason: "expected `family:key=value,...`, e.g. `gemm:m=1,n=1280,k=8192,dtype=bf16`"
                .into(),
        })?;
        let fields = spec::Fields::parse(s, rest)?;
        match family
            .trim()
            .parse::<Family>()
            .map_err(|_| KernelError::BadSpec {
                spec: s.to_string(),
                reason: format!("unknown kernel family `{family}` (expected gemm, flash or paged)"),
            })? {
            Family::Gemm => GemmProblem::from_fields(fields).map(Problem::Gemm),
            Family::Flash => FlashProblem::from_fields(fields).map(Problem::Flash),
            Family::Paged => PagedProblem::from_fields(fields).map(Problem::Paged),
        }
    }
}

/// Checks a dimension lies in `1..=max`.
pub(crate) fn check_dim(
    family: Family,
    field: &'static str,
    value: usize,
    max: usize,
) -> Result<()> {
    if value == 0 || value > max {
        return Err(KernelError::InvalidProblem {
            family,
            field,
            value: value.to_string(),
            reason: format!("must be between 1 and {max}"),
        });
    }
    Ok(())
}

/// The softmax scale stored by its bit pattern, so problems stay `Eq + Hash`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "f32", try_from = "f32")]
pub struct Scale(u32);

impl Scale {
    pub fn new(value: f32) -> Option<Self> {
        (value.is_finite() && value > 0.0).then(|| Scale(value.to_bits()))
    }
    /// `1 / sqrt(head_dim)`, what attention uses unless told otherwise.
    pub fn default_for(head_dim: usize) -> Self {
        Scale((1.0 / (head_dim as f32).sqrt()).to_bits())
    }
    pub fn get(self) -> f32 {
        f32::from_bits(self.0)
    }
}

impl From<Scale> for f32 {
    fn from(s: Scale) -> f32 {
        s.get()
    }
}

impl TryFrom<f32> for Scale {
    type Error = String;
    fn try_from(v: f32) -> std::result::Result<Self, String> {
        Scale::new(v).ok_or_else(|| format!("softmax scale {v} must be finite and positive"))
    }
}
