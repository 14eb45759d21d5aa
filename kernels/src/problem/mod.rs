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

    /// ALiBi slopes a call passes: one per query head of attention with ALiBi, else none.
    pub fn slopes_len(&self) -> usize {
        match self {
            Problem::Flash(p) if p.alibi => p.q_heads,
            Problem::Paged(p) if p.alibi => p.q_heads,
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
            // Int4 weights dequantized to a 16-bit dtype before the product (the prompt
            // kernels' pass, as a GPU's int4 kernels dequantize in registers) are rounded once
            // more than the reference's: up to 2^-9 each in bf16. Twice the dtype's.
            (Family::Gemm, dtype @ (crate::DType::Bf16 | crate::DType::F16)) if matches!(self, Problem::Gemm(g) if g.int4.is_some()) => {
                2.0 * dtype.tolerance()
            }
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

/// Checks an attention problem's `dtype` is one its kernels compute in: fp8 is a KV-cache
/// type there.
pub(crate) fn check_compute_dtype(family: Family, dtype: crate::DType) -> Result<()> {
    if dtype.fp8().is_some() {
        return Err(KernelError::InvalidProblem {
            family,
            field: "dtype",
            value: dtype.to_string(),
            reason: "must be f32, f16 or bf16 (fp8 is a KV cache type here: `kv_dtype` of a \
                     paged problem; GEMMs take fp8 inputs)"
                .into(),
        });
    }
    Ok(())
}

/// A soft-cap given as a number (a spec's `softcap`, a config's, a C caller's), checked:
/// finite and positive, or an error naming the family's field.
pub(crate) fn check_softcap(family: Family, value: Option<f32>) -> Result<Option<SoftCap>> {
    value
        .map(|c| {
            SoftCap::new(c).ok_or_else(|| KernelError::InvalidProblem {
                family,
                field: "softcap",
                value: c.to_string(),
                reason: "must be finite and positive".into(),
            })
        })
        .transpose()
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

/// A logit soft-cap `C` (Gemma 2's `attn_logit_softcapping`): each scaled score `s` becomes
/// `C · tanh(s / C)` before the softmax. Stored by its bit pattern, as [`Scale`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "f32", try_from = "f32")]
pub struct SoftCap(u32);

impl SoftCap {
    pub fn new(value: f32) -> Option<Self> {
        (value.is_finite() && value > 0.0).then(|| SoftCap(value.to_bits()))
    }
    pub fn get(self) -> f32 {
        f32::from_bits(self.0)
    }
    /// `x` capped, where `x` is a scaled score times `unit / C` (the kernels hold scores in
    /// units of their own: `unit` is `C` in those units).
    pub fn apply(unit: f32, x: f32) -> f32 {
        unit * tanh(x / unit)
    }
}

impl From<SoftCap> for f32 {
    fn from(s: SoftCap) -> f32 {
        s.get()
    }
}

impl TryFrom<f32> for SoftCap {
    type Error = String;
    fn try_from(v: f32) -> std::result::Result<Self, String> {
        SoftCap::new(v).ok_or_else(|| format!("soft-cap {v} must be finite and positive"))
    }
}

/// The ALiBi slopes of a model with `heads` attention heads, head 0 first: `2^(−8h/n)` for
/// `h = 1..=n` where `n` is a power of two, else those of the power `n` below `heads` and then
/// every other slope of `2n` heads (`2^(−4h/n)`, `h = 1, 3, 5, …`), as ALiBi's paper and
/// Bloom, Baichuan and vLLM compute them. A tensor-parallel rank's heads take the consecutive
/// slice of the whole model's slopes its heads are.
pub fn alibi_slopes(heads: usize) -> Vec<f32> {
    if heads == 0 {
        return Vec::new();
    }
    let n = 1usize << heads.ilog2();
    let mut slopes: Vec<f32> = (1..=n)
        .map(|h| (-8.0 * h as f64 / n as f64).exp2() as f32)
        .collect();
    slopes.extend((0..heads - n).map(|x| (-4.0 * (2 * x + 1) as f64 / n as f64).exp2() as f32));
    slopes
}

/// `tanh(x)` within a few ulp, in branch-free scalar code that LLVM vectorises with the
/// loop around it (the standard library's calls libm once per value, which cost more than
/// the rest of a soft-capped attention kernel): an odd polynomial near 0, where the
/// exponential form cancels, `(1 - e) / (1 + e)` with `e = exp(-2|x|)` beyond.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let e = exp2_nonpositive(-2.0 * std::f32::consts::LOG2_E * a);
    let far = (1.0 - e) / (1.0 + e);
    let a2 = a * a;
    // tanh's Taylor series to x^9: below 0.125 the next term is under 2^-30 of it.
    let near = a
        * (1.0
            + a2 * (-1.0 / 3.0 + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0 + a2 * (62.0 / 2835.0)))));
    let t = if a < 0.125 { near } else { far };
    t.copysign(x)
}

/// `2^y` for `y <= 0` within 2e-8 (0 below 2^-126): the nearest whole power, times `2^f` for
/// the rest `f` in [-1/2, 1/2] by its Taylor series to degree 7 (the last term left out is
/// under 5e-9). The softmax's `exp2_approx` reduces to [0, 1) and is off by up to 6e-6 near
/// 1, too much for tanh, whose `1 - e` magnifies it.
#[inline(always)]
fn exp2_nonpositive(y: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2^23: adding it rounds to a whole number.
    let y = y.max(-126.0);
    let n = (y + ROUND) - ROUND;
    let g = (y - n) * std::f32::consts::LN_2;
    let mut p = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * g + c;
    }
    // 2^n for n in [-126, 0], by its exponent bits.
    let scale = f32::from_bits(((n + 127.0 + ROUND).to_bits() - ROUND.to_bits()) << 23);
    p * scale
}

#[cfg(test)]
mod tests {
    use super::tanh;

    /// The kernels' tanh against f64's, from zero (the series) across the switch at 0.125 to
    /// where it is 1 in f32, both signs: within 4e-7 of the value (a few ulp), and exactly odd.
    #[test]
    fn tanh_is_within_a_few_ulp() {
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = i as f32 * 1e-4;
            for x in [x, -x] {
                let want = (x as f64).tanh();
                let err = (tanh(x) as f64 - want).abs() / want.abs().max(1e-30);
                worst = worst.max(if want == 0.0 {
                    tanh(x).abs() as f64
                } else {
                    err
                });
                assert_eq!(tanh(-x), -tanh(x));
            }
        }
        assert!(worst < 4e-7, "worst relative error {worst:e}");
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
    }
}
