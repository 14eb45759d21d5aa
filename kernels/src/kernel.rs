//! The one kernel interface the tuner and the runtime share.
//!
//! A backend runs a problem with a config on the caller's buffers. It declares the scratch it
//! needs up front ([`Backend::scratch_len`]) so a caller allocates once and reuses it: nothing is
//! allocated inside a call on the hot path.

use crate::{Config, DType, KernelError, Problem, Result, Tensor};

/// Buffers of a GEMM call: A `[M, K]`, B `[K, N]` or `[N, K]` per the problem, C `[M, N]`.
#[derive(Debug)]
pub struct GemmArgs<'a> {
    pub a: Tensor<'a>,
    pub b: Tensor<'a>,
    /// An fp8 GEMM's scales ([`GemmScales::NONE`] for the other dtypes).
    pub scales: GemmScales<'a>,
    pub c: &'a mut [f32],
}

impl<'a> GemmArgs<'a> {
    /// The buffers of a GEMM of f32, f16 or bf16 inputs.
    pub fn new(a: Tensor<'a>, b: Tensor<'a>, c: &'a mut [f32]) -> Self {
        GemmArgs {
            a,
            b,
            scales: GemmScales::NONE,
            c,
        }
    }

    /// The buffers of an fp8 GEMM and its scales.
    pub fn scaled(a: Tensor<'a>, b: Tensor<'a>, scales: GemmScales<'a>, c: &'a mut [f32]) -> Self {
        GemmArgs { a, b, scales, c }
    }
}

/// The scales of an fp8 GEMM (W8A8), as vLLM's `cutlass_scaled_mm` takes them: A's row `i`
/// holds its fp8 values times `a[i]` (one per token, or one for the tensor), B's column `j`
/// (a Linear layer's output channel) its values times `b[j]` (one per channel, or one for
/// the tensor), so `C[i, j] = a[i] · b[j] · Σ_k A8[i, k] · B8[k, j]`. Data of the call, not
/// of the problem: these granularities scale C once, so they do not change which tiles are
/// fastest, and dynamic per-token scales change every call.
///
/// A block-scaled problem ([`crate::GemmProblem::with_block`], a problem of its own: its
/// scales enter every group of k) takes them as DeepSeek-V3's checkpoints and vLLM's
/// per-token-group quantization hold them: A's `[M, ⌈K / block⌉]`, one per token and group
/// of k, and B's `[⌈N / block⌉, ⌈K / block⌉]` (`weight_scale_inv`), one per block of the
/// weights, both row-major.
///
/// An int4 problem ([`crate::GemmProblem::with_int4`]) takes no `a`, its group scales as `b`
/// and its zero points as `zeros`, both `[K / group, N]` row-major (GPTQ's `scales` and its
/// `qzeros` unpacked, widened to f32; AWQ's repacked with its weights); `zeros` empty for
/// symmetric checkpoints (GPTQ's `sym = true`, compressed-tensors' signed int4 stored offset
/// by 8), whose zero point is 8.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GemmScales<'a> {
    /// `[1]` (per tensor) or `[M]` (per token); block-scaled, `[M, ⌈K / block⌉]`.
    pub a: &'a [f32],
    /// `[1]` (per tensor) or `[N]` (per output channel); block-scaled, `[⌈N / block⌉, ⌈K /
    /// block⌉]`; int4, `[K / group, N]`.
    pub b: &'a [f32],
    /// int4 only: zero points, `[K / group, N]`, or empty for 8 throughout.
    pub zeros: &'a [f32],
}

impl<'a> GemmScales<'a> {
    /// What a GEMM of f32, f16 or bf16 inputs takes.
    pub const NONE: GemmScales<'static> = GemmScales {
        a: &[],
        b: &[],
        zeros: &[],
    };

    /// An fp8 GEMM's scales: A's and B's.
    pub fn fp8(a: &'a [f32], b: &'a [f32]) -> Self {
        GemmScales { a, b, zeros: &[] }
    }

    /// An int4 GEMM's group scales and zero points (empty: 8 throughout).
    pub fn int4(scales: &'a [f32], zeros: &'a [f32]) -> Self {
        GemmScales {
            a: &[],
            b: scales,
            zeros,
        }
    }

    /// [`GemmScales::check`] for an int4 problem.
    fn check_int4(self, p: &crate::GemmProblem, groups: usize) -> Result<()> {
        let group = p.int4.unwrap_or(p.k);
        let shape = format!(
            "[{}, {}]: one per {group} values of k and column",
            p.k / group,
            p.n
        );
        for (name, values, empty_ok) in [
            ("a_scales", self.a, None),
            ("b_scales", self.b, Some(false)),
            ("zeros", self.zeros, Some(true)),
        ] {
            let reason = match empty_ok {
                None => (!values.is_empty()).then(|| {
                    format!(
                        "holds {} values; an int4 GEMM's activations are {}, unscaled: pass none",
                        values.len(),
                        p.dtype
                    )
                }),
                Some(true) if values.is_empty() => None,
                Some(_) if values.len() != groups => Some(format!(
                    "holds {} values; this int4 GEMM takes {groups}, {shape}{}",
                    values.len(),
                    if name == "zeros" {
                        " (or none, for a zero point of 8 throughout)"
                    } else {
                        ""
                    }
                )),
                Some(_) => values
                    .iter()
                    .position(|v| !v.is_finite())
                    .map(|at| format!("[{at}] is {}; must be finite", values[at])),
            };
            if let Some(reason) = reason {
                return Err(KernelError::BadArgument { name, reason });
            }
        }
        Ok(())
    }

    /// Checks these scales against a problem: for fp8 each of one value or one per row of A
    /// (column of B), or for a block-scaled problem the counts above, every value finite and
    /// positive; empty for the other dtypes (a scale
    /// there would be ignored, and a caller who passes one expects it applied).
    pub fn check(self, p: &crate::GemmProblem) -> Result<()> {
        if let Some((_, groups)) = p.int4_lens() {
            return self.check_int4(p, groups);
        }
        if !self.zeros.is_empty() {
            return Err(KernelError::BadArgument {
                name: "zeros",
                reason: format!(
                    "holds {} values; zero points belong to int4 GEMMs: pass none",
                    self.zeros.len()
                ),
            });
        }
        let blocks = p.block_scale_lens();
        for (name, values, per, count) in [
            ("a_scales", self.a, "row of A (token)", p.m),
            ("b_scales", self.b, "column of C (output channel)", p.n),
        ] {
            let block_len = blocks.map(|(a, b)| if name == "a_scales" { a } else { b });
            let reason = if let (Some(len), Some(block)) = (block_len, p.block) {
                (values.len() != len)
                    .then(|| {
                        let groups = p.k_groups();
                        let shape = if name == "a_scales" {
                            format!("[{}, {groups}]: one per token and {block} values of k", p.m)
                        } else {
                            format!(
                                "[{}, {groups}]: one per {block} × {block} block of the weights",
                                p.n.div_ceil(block)
                            )
                        };
                        format!(
                            "holds {} values; this block-scaled fp8 GEMM takes {len}, {shape}",
                            values.len()
                        )
                    })
                    .or_else(|| positive(values))
            } else if p.dtype.fp8().is_none() {
                (!values.is_empty()).then(|| {
                    format!(
                        "holds {} values; scales apply to fp8 GEMMs, and this one's dtype is {}: pass none",
                        values.len(),
                        p.dtype
                    )
                })
            } else if values.len() != 1 && values.len() != count {
                Some(format!(
                    "holds {} values; an fp8 GEMM takes one (per tensor) or {count}, one per {per}",
                    values.len()
                ))
            } else {
                positive(values)
            };
            if let Some(reason) = reason {
                return Err(KernelError::BadArgument { name, reason });
            }
        }
        Ok(())
    }

    /// A's scale at row `i` (one where there are none).
    #[inline]
    pub fn a_at(&self, i: usize) -> f32 {
        scale_at(self.a, i)
    }

    /// B's scale at column `j` (one where there are none).
    #[inline]
    pub fn b_at(&self, j: usize) -> f32 {
        scale_at(self.b, j)
    }
}

/// Why `values` are not scales: the first that is not finite and positive.
fn positive(values: &[f32]) -> Option<String> {
    values
        .iter()
        .position(|v| !(v.is_finite() && *v > 0.0))
        .map(|at| format!("[{at}] is {}; must be finite and positive", values[at]))
}

fn scale_at(values: &[f32], i: usize) -> f32 {
    match values {
        [] => 1.0,
        [one] => *one,
        all => all[i],
    }
}

/// Buffers of a flash attention call, in the layouts of [`crate::FlashProblem`].
#[derive(Debug)]
pub struct FlashArgs<'a> {
    pub q: Tensor<'a>,
    pub k: Tensor<'a>,
    pub v: Tensor<'a>,
    /// `[q_heads]` sink logits when the problem has sinks, else empty.
    pub sinks: &'a [f32],
    /// `[q_heads]` ALiBi slopes when the problem has ALiBi, else empty.
    pub slopes: &'a [f32],
    pub out: &'a mut [f32],
}

/// Buffers of a paged attention call, in the layouts of [`crate::PagedProblem`].
#[derive(Debug)]
pub struct PagedArgs<'a> {
    pub query: Tensor<'a>,
    pub key_cache: Tensor<'a>,
    /// Empty for a latent problem ([`crate::PagedProblem::is_latent`]): its values are read
    /// from the key cache.
    pub value_cache: Tensor<'a>,
    /// `[num_seqs, max_blocks_per_seq]` block indices into the caches.
    pub block_tables: &'a [u32],
    pub max_blocks_per_seq: usize,
    /// Each sequence's context length, `1..=problem.context_len`.
    pub context_lens: &'a [u32],
    /// `[q_heads]` sink logits when the problem has sinks, else empty.
    pub sinks: &'a [f32],
    /// `[q_heads]` ALiBi slopes when the problem has ALiBi, else empty.
    pub slopes: &'a [f32],
    /// The fp8 caches' scales ([`KvScales::ONE`] for other caches).
    pub kv_scales: KvScales,
    pub out: &'a mut [f32],
}

/// Per-tensor scales of fp8 KV caches, vLLM's `k_scale` and `v_scale`: a cached key's value is
/// its fp8 value times `k`, a cached value's times `v`. Calibrated per layer and fixed while a
/// model serves, so they are call arguments, not part of the problem (tuning is the same for
/// any). Other caches hold their values as they are, and take [`KvScales::ONE`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvScales {
    pub k: f32,
    pub v: f32,
}

impl KvScales {
    pub const ONE: KvScales = KvScales { k: 1.0, v: 1.0 };

    /// Checks these scales against a problem's caches: finite and positive for fp8, exactly
    /// one for the others (a scale there would be ignored, and a caller who passes one
    /// expects it applied).
    pub fn check(self, p: &crate::PagedProblem) -> Result<()> {
        for (name, v) in [("k_scale", self.k), ("v_scale", self.v)] {
            let reason = if p.fp8().is_some() {
                (!(v.is_finite() && v > 0.0))
                    .then(|| format!("is {v}; must be finite and positive"))
            } else {
                (v != 1.0).then(|| {
                    format!(
                        "is {v}; scales apply to fp8 caches, and these hold {}: pass 1",
                        p.kv_dtype
                    )
                })
            };
            if let Some(reason) = reason {
                return Err(KernelError::BadArgument { name, reason });
            }
        }
        if p.is_latent() && self.k != self.v {
            return Err(KernelError::BadArgument {
                name: "v_scale",
                reason: format!(
                    "is {}, k_scale is {}; a latent cache's values are its keys' bytes, under one scale: pass k_scale twice",
                    self.v, self.k
                ),
            });
        }
        Ok(())
    }

    /// The factors the kernels apply to the cache values they read: the scales times the
    /// cache format's [`crate::Fp8::half_factor`] (they read fp8 bytes as f16 bits).
    pub fn for_kernels(self, p: &crate::PagedProblem) -> (f32, f32) {
        let f = p.fp8().map_or(1.0, |f| f.half_factor());
        (self.k * f, self.v * f)
    }
}

impl Default for KvScales {
    fn default() -> Self {
        KvScales::ONE
    }
}

/// What an attention call passes per query head: sink logits and ALiBi slopes, each empty
/// where the problem has none.
#[derive(Debug, Clone, Copy, Default)]
pub struct HeadValues<'a> {
    pub sinks: &'a [f32],
    pub slopes: &'a [f32],
}

/// The buffers of one call of any family.
#[derive(Debug)]
pub enum Args<'a> {
    Gemm(GemmArgs<'a>),
    Flash(FlashArgs<'a>),
    Paged(PagedArgs<'a>),
}

impl<'a> Args<'a> {
    /// The buffers of one call of `problem`: `inputs` in its family's order (A, B; Q, K, V;
    /// query, key cache, value cache), the paged index (empty for the other families), the
    /// attention sinks and ALiBi slopes (`heads`: empty without), the fp8 caches' scales, an
    /// fp8 GEMM's scales and the output. `None` when `inputs` are fewer than the family
    /// takes.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        problem: &Problem,
        inputs: &[Tensor<'a>],
        block_tables: &'a [u32],
        max_blocks_per_seq: usize,
        context_lens: &'a [u32],
        heads: HeadValues<'a>,
        kv_scales: KvScales,
        gemm_scales: GemmScales<'a>,
        out: &'a mut [f32],
    ) -> Option<Args<'a>> {
        let HeadValues { sinks, slopes } = heads;
        Some(match problem {
            Problem::Gemm(_) => {
                let [a, b, ..] = *inputs else { return None };
                Args::Gemm(GemmArgs {
                    a,
                    b,
                    scales: gemm_scales,
                    c: out,
                })
            }
            Problem::Flash(_) => {
                let [q, k, v, ..] = *inputs else { return None };
                Args::Flash(FlashArgs {
                    q,
                    k,
                    v,
                    sinks,
                    slopes,
                    out,
                })
            }
            Problem::Paged(_) => {
                let [query, key_cache, value_cache, ..] = *inputs else {
                    return None;
                };
                Args::Paged(PagedArgs {
                    query,
                    key_cache,
                    value_cache,
                    block_tables,
                    max_blocks_per_seq,
                    context_lens,
                    sinks,
                    slopes,
                    kv_scales,
                    out,
                })
            }
        })
    }
}

/// A way of running kernels: the CPU now, GPU backends behind Cargo features.
pub trait Backend: Send + Sync {
    /// Name stored with results (`cpu`, `hip`, `cuda`).
    fn name(&self) -> &'static str;

    /// f32 values of scratch one call of `problem` with `config` needs.
    fn scratch_len(&self, problem: &Problem, config: &Config) -> usize;

    /// Runs one call. Invalid configs, mismatched families, wrong buffer sizes or dtypes and
    /// short scratch are errors, never panics.
    fn run(
        &self,
        problem: &Problem,
        config: &Config,
        args: Args<'_>,
        scratch: &mut [f32],
    ) -> Result<()>;
}

/// Scratch memory owned by a caller and grown on demand, outside the hot path.
#[derive(Debug, Default)]
pub struct Scratch {
    buf: Vec<f32>,
}

impl Scratch {
    pub fn new() -> Self {
        Scratch::default()
    }

    /// Grows to at least `len` values (never shrinks) and returns the buffer.
    pub fn get(&mut self, len: usize) -> &mut [f32] {
        if self.buf.len() < len {
            self.buf.resize(len, 0.0);
        }
        &mut self.buf[..len]
    }
}

/// A paged call's value cache: of the problem's `kv_dtype`, or empty for a latent problem
/// (its values are the key rows'; a buffer passed there would be ignored, and a caller who
/// passes one expects it read).
pub(crate) fn check_value_cache(p: &crate::PagedProblem, v: &Tensor<'_>) -> Result<()> {
    if !p.is_latent() {
        return check_dtype("value_cache", v, p.kv_dtype);
    }
    if !v.is_empty() {
        return Err(KernelError::BadBuffer {
            name: "value_cache",
            reason: format!(
                "holds {} values; with v_head_dim = {} below head_dim = {} the problem reads one latent cache, its values the first v_head_dim of each key row: pass an empty value cache",
                v.len(),
                p.v_head_dim,
                p.head_dim
            ),
        });
    }
    Ok(())
}

pub(crate) fn check_len(name: &'static str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(KernelError::BadBuffer {
            name,
            reason: format!("holds {got} values, the problem needs {want}"),
        });
    }
    Ok(())
}

pub(crate) fn check_dtype(name: &'static str, t: &Tensor<'_>, want: DType) -> Result<()> {
    if t.dtype() != Some(want) {
        return Err(KernelError::BadBuffer {
            name,
            reason: format!("is {}, the problem's dtype is {want}", t.describe()),
        });
    }
    Ok(())
}
