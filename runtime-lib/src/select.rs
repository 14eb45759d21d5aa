//! How a problem finds its config: the exact tuned problem, the tuned bucket of its dynamic
//! dimension, the nearest tuned problem with the same static dimensions, or the heuristic.
//!
//! Dynamic dimensions are the ones a server's traffic varies call by call: GEMM tokens M,
//! flash-attention sequences and query and key lengths, paged-attention sequences and context
//! length. Every
//! other field is static: it comes from the model and the tensor-parallel degree, a sliding
//! window among them (a windowed layer's calls find only winners tuned with that window, whose
//! GPU builds hold its masks; a window no shorter than a call's keys is none), and sinks
//! (gpt-oss's calls find winners verified with sinks, whose GPU builds add them), and whether
//! scores are soft-capped (Gemma 2; the capped builds hold the tanh) or biased by ALiBi (its
//! builds add the bias; the slopes are the call's), and what a paged
//! cache holds (an fp8 cache's calls find winners built for its format) and how wide its
//! values are (a latent cache's calls, and latent attention's prefill with value heads
//! narrower than its keys, find winners of their value width). The softmax
//! scale is neither: every kernel takes it as an argument and runs at the same speed whatever
//! it is, so selection ignores it, and a server whose scale differs from the tuned one in its
//! last bit (`96 ** -0.5` rounded from f64 against `1 / sqrt(96)` in f32) still finds its
//! winners. So is the soft-cap's value, an argument of the capped builds likewise.

use kerntune_kernels::problem::{BLayout, Scale, SoftCap};
use kerntune_kernels::{DType, Problem};

/// How well a selection matched, for the server to log and count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub enum Match {
    /// This very problem was tuned.
    Exact = 0,
    /// The same problem with its dynamic dimensions rounded up to a tuned bucket.
    Bucket = 1,
    /// The closest tuned problem with the same static dimensions (beyond the largest bucket).
    Nearest = 2,
    /// Nothing tuned applies: the space's heuristic.
    Default = 3,
}

/// The static dimensions of a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StaticKey {
    Gemm {
        n: usize,
        k: usize,
        dtype: DType,
        layout: BLayout,
        /// Block-scaled fp8's block: such a call runs on its own kernels' configs only.
        block: Option<usize>,
        /// Int4 weights' group: likewise.
        int4: Option<usize>,
    },
    Flash {
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        v_head_dim: usize,
        causal: bool,
        dtype: DType,
        window: Option<usize>,
        sinks: bool,
        softcap: bool,
        alibi: bool,
    },
    Paged {
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        v_head_dim: usize,
        block_size: usize,
        dtype: DType,
        kv_dtype: DType,
        window: Option<usize>,
        sinks: bool,
        softcap: bool,
        alibi: bool,
    },
}

/// A problem's dynamic dimensions (up to three; 1 where it has fewer).
pub type Dims = [usize; 3];

/// Splits a problem into its static key and its dynamic dimensions.
pub fn split(p: &Problem) -> (StaticKey, Dims) {
    match p {
        Problem::Gemm(g) => (
            StaticKey::Gemm {
                n: g.n,
                k: g.k,
                dtype: g.dtype,
                layout: g.b_layout,
                block: g.block,
                int4: g.int4,
            },
            [g.m, 1, 1],
        ),
        Problem::Flash(f) => (
            StaticKey::Flash {
                q_heads: f.q_heads,
                kv_heads: f.kv_heads,
                head_dim: f.head_dim,
                v_head_dim: f.v_head_dim,
                causal: f.causal,
                dtype: f.dtype,
                window: f.window,
                sinks: f.sinks,
                softcap: f.softcap.is_some(),
                alibi: f.alibi,
            },
            [f.batch, f.q_len, f.kv_len],
        ),
        Problem::Paged(pg) => (
            StaticKey::Paged {
                q_heads: pg.q_heads,
                kv_heads: pg.kv_heads,
                head_dim: pg.head_dim,
                v_head_dim: pg.v_head_dim,
                block_size: pg.block_size,
                dtype: pg.dtype,
                kv_dtype: pg.kv_dtype,
                window: pg.window,
                sinks: pg.sinks,
                softcap: pg.softcap.is_some(),
                alibi: pg.alibi,
            },
            [pg.num_seqs, pg.context_len, 1],
        ),
    }
}

/// The problem as selection sees it: its softmax scale and soft-cap value, which selection
/// ignores, set to one value each, so that problems differing only in them are one key.
pub fn selection_key(p: &Problem) -> Problem {
    let mut key = *p;
    let one = SoftCap::new(1.0);
    match &mut key {
        Problem::Gemm(_) => {}
        Problem::Flash(f) => {
            f.scale = Scale::default_for(f.head_dim);
            f.softcap = f.softcap.and(one);
        }
        Problem::Paged(pg) => {
            pg.scale = Scale::default_for(pg.head_dim);
            pg.softcap = pg.softcap.and(one);
        }
    }
    key
}

/// Distance between two dynamic-dimension vectors in log2 space.
pub fn log_distance(a: Dims, b: Dims) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, y)| ((x as f64).log2() - (y as f64).log2()).abs())
        .sum()
}
