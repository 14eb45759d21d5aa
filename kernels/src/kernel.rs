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
    pub c: &'a mut [f32],
}

/// Buffers of a flash attention call, in the layouts of [`crate::FlashProblem`].
#[derive(Debug)]
pub struct FlashArgs<'a> {
    pub q: Tensor<'a>,
    pub k: Tensor<'a>,
    pub v: Tensor<'a>,
    /// `[q_heads]` sink logits when the problem has sinks, else empty.
    pub sinks: &'a [f32],
    pub out: &'a mut [f32],
}

/// Buffers of a paged attention call, in the layouts of [`crate::PagedProblem`].
#[derive(Debug)]
pub struct PagedArgs<'a> {
    pub query: Tensor<'a>,
    pub key_cache: Tensor<'a>,
    pub value_cache: Tensor<'a>,
    /// `[num_seqs, max_blocks_per_seq]` block indices into the caches.
    pub block_tables: &'a [u32],
    pub max_blocks_per_seq: usize,
    /// Each sequence's context length, `1..=problem.context_len`.
    pub context_lens: &'a [u32],
    /// `[q_heads]` sink logits when the problem has sinks, else empty.
    pub sinks: &'a [f32],
    pub out: &'a mut [f32],
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
    /// attention sinks (empty without) and the output. `None` when `inputs` are fewer than the
    /// family takes.
    pub fn new(
        problem: &Problem,
        inputs: &[Tensor<'a>],
        block_tables: &'a [u32],
        max_blocks_per_seq: usize,
        context_lens: &'a [u32],
        sinks: &'a [f32],
        out: &'a mut [f32],
    ) -> Option<Args<'a>> {
        Some(match problem {
            Problem::Gemm(_) => {
                let [a, b, ..] = *inputs else { return None };
                Args::Gemm(GemmArgs { a, b, c: out })
            }
            Problem::Flash(_) => {
                let [q, k, v, ..] = *inputs else { return None };
                Args::Flash(FlashArgs {
                    q,
                    k,
                    v,
                    sinks,
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
    if t.dtype() != want {
        return Err(KernelError::BadBuffer {
            name,
            reason: format!("is {}, the problem's dtype is {want}", t.dtype()),
        });
    }
    Ok(())
}
