//! Paged attention decode: one new query token per sequence against a paged KV cache.
//!
//! The cache layout is the one vLLM and TGI use: K and V are each
//! `[num_blocks, block_size, kv_heads, head_dim]`, and sequence `s` finds its `t`-th token in
//! block `block_tables[s * max_blocks + t / block_size]` at slot `t % block_size`. The query and
//! output are `[num_seqs, q_heads, head_dim]`.
//!
//! The problem's `context_len` is the longest context a call may carry; each call passes its
//! sequences' own lengths (`1..=context_len`). Tuning uses every sequence at `context_len`.
//!
//! A sliding window (`window`, the layers of Mistral 7B v0.1, Gemma 2 and 3 or gpt-oss that
//! look back a bounded distance) limits each sequence to its last `window` tokens: the new
//! token sees keys `ctx - window .. ctx` of a context of `ctx`, itself included, as
//! FlashAttention's `window_size = (window - 1, 0)` and vLLM's `sliding_window` count it.
//!
//! With `sinks` (gpt-oss), each query head's softmax has a learned logit, a key whose value is
//! zero; the call passes the `q_heads` f32 logits, in the units of the scaled scores.
//!
//! With a soft-cap `softcap=C` (Gemma 2's `attn_logit_softcapping`), each scaled score `s`
//! becomes `C · tanh(s / C)` before the mask and the softmax.
//!
//! With `alibi` (Bloom, MPT, Baichuan 13B, Falcon-RW, JAIS), each query head has a slope
//! `m_h`, and the score of token `t` of a context of `ctx` gains `m_h · (t − (ctx − 1))`
//! after the cap (vLLM's `alibi_slopes`; the call passes the `q_heads` slopes).
//!
//! The caches hold `kv_dtype` values: the query's `dtype`, or with an f16 or bf16 query one of
//! the fp8 formats (vLLM's `--kv-cache-dtype fp8`, half the bytes a decode step reads). An
//! fp8 cache's values are scaled by per-tensor factors the call passes
//! ([`crate::kernel::KvScales`], vLLM's `k_scale` and `v_scale`).
//!
//! With `v_head_dim` below `head_dim`, the problem is multi-head latent attention's decode
//! (DeepSeek-V2 and V3, Kimi K2; FlashMLA's `head_dim_v`): there is one cache, each token's
//! row the latent its keys and values are projected from (`kv_lora_rank` values, then the
//! rotary part), a key is the whole row and its value the row's first `v_head_dim` values.
//! The output is `[num_seqs, q_heads, v_head_dim]`, and calls pass no value cache.

use serde::{Deserialize, Serialize};

use super::{check_compute_dtype, check_dim, check_softcap, spec::Fields, Family, Scale, SoftCap};
use crate::{DType, KernelError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "PagedFields")]
pub struct PagedProblem {
    pub num_seqs: usize,
    pub context_len: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Values per output row: `head_dim`, or fewer for a latent cache whose values are the
    /// first `v_head_dim` of each key row.
    pub v_head_dim: usize,
    pub block_size: usize,
    pub scale: Scale,
    pub dtype: DType,
    /// What the caches hold: `dtype`, or an fp8 format.
    pub kv_dtype: DType,
    /// Tokens a sequence's new token looks back at, itself included; `None` for every token
    /// of the context. Only a window shorter than `context_len` is kept: a longer one bounds
    /// nothing, and the problem is the full attention one, under its key.
    pub window: Option<usize>,
    /// Each query head's softmax has a learned sink logit (the call passes them).
    pub sinks: bool,
    /// Scores soft-capped at `C` (`None`: as they are).
    pub softcap: Option<SoftCap>,
    /// Scores biased by each query head's ALiBi slope times the token's distance (the call
    /// passes the slopes).
    pub alibi: bool,
}

#[derive(Deserialize)]
struct PagedFields {
    num_seqs: usize,
    context_len: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Absent in problems written before latent caches.
    #[serde(default)]
    v_head_dim: Option<usize>,
    block_size: usize,
    scale: Scale,
    dtype: DType,
    /// Absent in problems written before fp8 caches.
    #[serde(default)]
    kv_dtype: Option<DType>,
    /// Absent in problems written before windows.
    #[serde(default)]
    window: Option<usize>,
    /// Absent in problems written before sinks.
    #[serde(default)]
    sinks: bool,
    /// Absent in problems written before soft-caps.
    #[serde(default)]
    softcap: Option<SoftCap>,
    /// Absent in problems written before ALiBi.
    #[serde(default)]
    alibi: bool,
}

impl TryFrom<PagedFields> for PagedProblem {
    type Error = KernelError;
    fn try_from(f: PagedFields) -> Result<Self> {
        PagedProblem::new(
            f.num_seqs,
            f.context_len,
            f.q_heads,
            f.kv_heads,
            f.head_dim,
            f.block_size,
            f.scale,
            f.dtype,
        )?
        .with_v_head_dim(f.v_head_dim.unwrap_or(f.head_dim))?
        .with_kv_dtype(f.kv_dtype.unwrap_or(f.dtype))?
        .with_window(f.window)
        .map(|p| p.with_sinks(f.sinks))
        .map(|p| p.with_cap(f.softcap))
        .and_then(|p| p.with_alibi(f.alibi))
    }
}

/// The largest head: a latent cache row of 1024 values, past DeepSeek's 576 (512 latent, 64
/// rotary); attention heads themselves stop at 256.
pub const MAX_HEAD_DIM: usize = 1024;

/// Block sizes vLLM and TGI allocate caches with (vLLM's `--block-size` choices: 16 by
/// default; 64 and 128 for FlashMLA's and CUTLASS MLA's latent caches, 1 for ROCm AITER's).
/// Powers of two, which the CPU kernels' block arithmetic takes as shifts.
pub const BLOCK_SIZES: [usize; 6] = [1, 8, 16, 32, 64, 128];

fn invalid(field: &'static str, value: impl ToString, reason: &str) -> KernelError {
    KernelError::InvalidProblem {
        family: Family::Paged,
        field,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

impl PagedProblem {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        num_seqs: usize,
        context_len: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        scale: Scale,
        dtype: DType,
    ) -> Result<Self> {
        let f = Family::Paged;
        check_dim(f, "num_seqs", num_seqs, 1 << 16)?;
        check_dim(f, "context_len", context_len, 1 << 22)?;
        check_dim(f, "q_heads", q_heads, 1024)?;
        check_dim(f, "kv_heads", kv_heads, 1024)?;
        check_dim(f, "head_dim", head_dim, MAX_HEAD_DIM)?;
        check_compute_dtype(f, dtype)?;
        if !q_heads.is_multiple_of(kv_heads) {
            return Err(invalid(
                "kv_heads",
                kv_heads,
                &format!("must divide q_heads = {q_heads}"),
            ));
        }
        if !BLOCK_SIZES.contains(&block_size) {
            return Err(invalid(
                "block_size",
                block_size,
                "must be 1, 8, 16, 32, 64 or 128",
            ));
        }
        Ok(PagedProblem {
            num_seqs,
            context_len,
            q_heads,
            kv_heads,
            head_dim,
            v_head_dim: head_dim,
            block_size,
            scale,
            dtype,
            kv_dtype: dtype,
            window: None,
            sinks: false,
            softcap: None,
            alibi: false,
        })
    }

    /// This problem on a latent cache whose values are the first `v_head_dim` of each key row
    /// (`head_dim`: separate key and value caches, as other attention has).
    pub fn with_v_head_dim(mut self, v_head_dim: usize) -> Result<Self> {
        check_dim(Family::Paged, "v_head_dim", v_head_dim, MAX_HEAD_DIM)?;
        if v_head_dim > self.head_dim {
            return Err(invalid(
                "v_head_dim",
                v_head_dim,
                &format!(
                    "must be at most head_dim = {}: a latent cache's values are the first \
                     v_head_dim values of its key rows",
                    self.head_dim
                ),
            ));
        }
        self.v_head_dim = v_head_dim;
        // Checked again, whichever of the two came first.
        self.with_alibi(self.alibi)
    }

    /// Whether the problem reads one latent cache, its values a prefix of its keys.
    pub fn is_latent(&self) -> bool {
        self.v_head_dim < self.head_dim
    }

    /// This problem with its scores soft-capped at `softcap` (`None`: not capped).
    pub fn with_softcap(self, softcap: Option<f32>) -> Result<Self> {
        Ok(self.with_cap(check_softcap(Family::Paged, softcap)?))
    }

    /// [`Self::with_softcap`] of a cap already validated.
    pub fn with_cap(mut self, softcap: Option<SoftCap>) -> Self {
        self.softcap = softcap;
        self
    }

    /// This problem on caches of `kv_dtype`: its `dtype`, or an fp8 format with an f16 or
    /// bf16 query (vLLM's fp8 caches serve 16-bit models).
    pub fn with_kv_dtype(mut self, kv_dtype: DType) -> Result<Self> {
        if kv_dtype != self.dtype {
            let fp8_on_16_bits = kv_dtype.fp8().is_some() && self.dtype != DType::F32;
            if !fp8_on_16_bits {
                return Err(invalid(
                    "kv_dtype",
                    kv_dtype,
                    &format!(
                        "must be the query's dtype ({}) or, with an f16 or bf16 query, \
                         fp8_e4m3, fp8_e4m3fnuz or fp8_e5m2",
                        self.dtype
                    ),
                ));
            }
        }
        self.kv_dtype = kv_dtype;
        Ok(self)
    }

    /// The fp8 format of the caches, if they hold fp8.
    pub fn fp8(&self) -> Option<crate::Fp8> {
        self.kv_dtype.fp8()
    }

    /// This problem with (or without) a sink logit in each query head's softmax.
    pub fn with_sinks(mut self, sinks: bool) -> Self {
        self.sinks = sinks;
        self
    }

    /// This problem with (or without) ALiBi's linear bias on each score. Not on a latent cache:
    /// multi-head latent attention's models take rotary embeddings.
    pub fn with_alibi(mut self, alibi: bool) -> Result<Self> {
        if alibi && self.is_latent() {
            return Err(invalid(
                "alibi",
                alibi,
                &format!(
                    "ALiBi is not taken on a latent cache (v_head_dim = {} below head_dim = {}): \
                     no latent-attention model uses it",
                    self.v_head_dim, self.head_dim
                ),
            ));
        }
        self.alibi = alibi;
        Ok(self)
    }

    /// This problem looking back at most `window` tokens (`None`: all of them). A window of
    /// `context_len` tokens or more is dropped: no call of the problem reaches past it.
    pub fn with_window(mut self, window: Option<usize>) -> Result<Self> {
        if let Some(w) = window {
            check_dim(Family::Paged, "window", w, 1 << 22)?;
        }
        self.window = window.filter(|&w| w < self.context_len);
        Ok(self)
    }

    /// Tokens of its context a sequence of `ctx` tokens attends to.
    pub fn span_of(&self, ctx: usize) -> usize {
        self.window.map_or(ctx, |w| ctx.min(w))
    }

    /// The first token a sequence of `ctx` tokens attends to: `ctx - span_of(ctx)`.
    pub fn first_token(&self, ctx: usize) -> usize {
        ctx - self.span_of(ctx)
    }

    /// Tokens the longest sequence attends to: the context, or the window within it.
    pub fn span(&self) -> usize {
        self.span_of(self.context_len)
    }

    /// Spec keys: `context_len`, `q_heads`, `head_dim` (required); `num_seqs` (1), `kv_heads`
    /// (q_heads), `v_head_dim` (head_dim), `block_size` (16), `scale` (1/sqrt(head_dim)), `dtype` (f32), `kv_dtype`
    /// (dtype), `window` (none), `sinks` (false), `softcap` (none), `alibi` (false).
    pub(super) fn from_fields(mut f: Fields) -> Result<Self> {
        let context_len = f.req("context_len")?;
        let q_heads: usize = f.req("q_heads")?;
        let head_dim: usize = f.req("head_dim")?;
        let scale = match f.opt::<f32>("scale")? {
            None => Scale::default_for(head_dim.max(1)),
            Some(v) => {
                Scale::new(v).ok_or_else(|| invalid("scale", v, "must be finite and positive"))?
            }
        };
        let p = PagedProblem::new(
            f.opt("num_seqs")?.unwrap_or(1),
            context_len,
            q_heads,
            f.opt("kv_heads")?.unwrap_or(q_heads),
            head_dim,
            f.opt("block_size")?.unwrap_or(16),
            scale,
            f.opt("dtype")?.unwrap_or(DType::F32),
        )?;
        let p = p
            .with_v_head_dim(f.opt("v_head_dim")?.unwrap_or(head_dim))?
            .with_kv_dtype(f.opt("kv_dtype")?.unwrap_or(p.dtype))?
            .with_window(f.opt("window")?)?
            .with_sinks(f.opt("sinks")?.unwrap_or(false))
            .with_softcap(f.opt("softcap")?)?
            .with_alibi(f.opt("alibi")?.unwrap_or(false))?;
        f.finish(&[
            "num_seqs",
            "context_len",
            "q_heads",
            "kv_heads",
            "head_dim",
            "v_head_dim",
            "block_size",
            "scale",
            "dtype",
            "kv_dtype",
            "window",
            "sinks",
            "softcap",
            "alibi",
        ])?;
        Ok(p)
    }

    pub fn key(&self) -> String {
        let mut key = format!(
            "paged:num_seqs={},context_len={},q_heads={},kv_heads={},head_dim={},block_size={},dtype={}",
            self.num_seqs,
            self.context_len,
            self.q_heads,
            self.kv_heads,
            self.head_dim,
            self.block_size,
            self.dtype
        );
        if self.is_latent() {
            key.push_str(&format!(",v_head_dim={}", self.v_head_dim));
        }
        if self.kv_dtype != self.dtype {
            key.push_str(&format!(",kv_dtype={}", self.kv_dtype));
        }
        if let Some(w) = self.window {
            key.push_str(&format!(",window={w}"));
        }
        if self.sinks {
            key.push_str(",sinks=true");
        }
        if let Some(c) = self.softcap {
            key.push_str(&format!(",softcap={}", c.get()));
        }
        if self.alibi {
            key.push_str(",alibi=true");
        }
        if self.scale != Scale::default_for(self.head_dim) {
            key.push_str(&format!(",scale={}", self.scale.get()));
        }
        key
    }

    pub fn group(&self) -> usize {
        self.q_heads / self.kv_heads
    }

    /// Blocks one sequence needs at `context_len`.
    pub fn max_blocks_per_seq(&self) -> usize {
        self.context_len.div_ceil(self.block_size)
    }

    pub fn flops(&self) -> f64 {
        let dims = self.head_dim + self.v_head_dim;
        2.0 * (self.num_seqs * self.q_heads * dims) as f64 * self.span() as f64
    }

    /// Decode is bound by reading every sequence's K and V once, within its window (a
    /// latent cache's one row per token).
    pub fn min_bytes(&self) -> f64 {
        let rows = (self.num_seqs * self.span() * self.kv_heads) as f64;
        let kv = rows * (self.head_dim + self.cached_v_dim()) as f64;
        let q = (self.num_seqs * self.q_heads * self.head_dim) as f64;
        let out = (self.num_seqs * self.q_heads * self.v_head_dim) as f64;
        kv * self.kv_dtype.size() as f64 + q * self.dtype.size() as f64 + out * 4.0
    }

    /// Values per token and KV head the value cache holds: `head_dim`, none for a latent
    /// cache (its values are read from the key cache).
    pub fn cached_v_dim(&self) -> usize {
        if self.is_latent() {
            0
        } else {
            self.head_dim
        }
    }

    pub fn query_len(&self) -> usize {
        self.num_seqs * self.q_heads * self.head_dim
    }

    /// Values of the output: `[num_seqs, q_heads, v_head_dim]`.
    pub fn out_len(&self) -> usize {
        self.num_seqs * self.q_heads * self.v_head_dim
    }
}
