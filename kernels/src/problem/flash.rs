//! Flash attention forward (prefill).
//!
//! Layouts follow the flash-attention and vLLM convention: Q and O are
//! `[batch, q_len, q_heads, head_dim]`, K and V `[batch, kv_len, kv_heads, head_dim]`. With
//! `causal` and `q_len < kv_len` the query block is aligned to the end of the keys (query `i` sees
//! keys `0..=i + kv_len - q_len`), as a chunked prefill continuing a cached prefix needs.
//!
//! A sliding window (`window`, causal only) bounds how far back a query looks: the query at
//! position `pos = i + kv_len - q_len` sees keys `pos + 1 - window ..= pos`, itself included,
//! as FlashAttention's `window_size = (window - 1, 0)` and vLLM's `sliding_window` count it.
//!
//! With `sinks` (gpt-oss), each query head has a learned logit that joins every row's softmax
//! as a key whose value is zero: rows are scaled by `Σ exp(s) / (Σ exp(s) + exp(sink))`. The
//! logits are data of the call, `q_heads` f32 values, in the units of the scaled scores.
//!
//! With a soft-cap `softcap=C` (Gemma 2's `attn_logit_softcapping`), each scaled score `s`
//! becomes `C · tanh(s / C)` before the mask and the softmax.
//!
//! With `alibi` (causal only; Bloom, MPT, Baichuan 13B, Falcon-RW, JAIS), each query head has
//! a slope `m_h` and the score of the query at position `pos` for key `j` gains
//! `m_h · (j − pos)` (after the cap, before the mask): a linear penalty on distance, in place
//! of rotary embeddings. The slopes are data of the call, `q_heads` f32 values, as vLLM's
//! `alibi_slopes` (a rank of a tensor-parallel group passes its own heads' slopes).
//!
//! With `v_head_dim` below `head_dim`, value heads are narrower than query and key heads: V is
//! `[batch, kv_len, kv_heads, v_head_dim]` and O `[batch, q_len, q_heads, v_head_dim]`. That is
//! multi-head latent attention's prefill (DeepSeek-V2 and V3, Kimi K2): its keys decompressed
//! from the latent are 192 wide (128 projected, 64 rotary) and its values 128, FlashAttention
//! 3's `head_dim_v`.

use serde::{Deserialize, Serialize};

use super::{check_compute_dtype, check_dim, check_softcap, spec::Fields, Family, Scale, SoftCap};
use crate::{DType, KernelError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "FlashFields")]
pub struct FlashProblem {
    pub batch: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Values per value and output row: `head_dim`, or fewer where value heads are narrower
    /// than key heads (latent attention's prefill).
    pub v_head_dim: usize,
    pub causal: bool,
    pub scale: Scale,
    pub dtype: DType,
    /// Keys a query looks back at, itself included; `None` for all it may see. Only a window
    /// shorter than `kv_len` is kept: a longer one hides nothing, and the problem is the
    /// full attention one, under its key.
    pub window: Option<usize>,
    /// Each query head's softmax has a learned sink logit (the call passes them).
    pub sinks: bool,
    /// Scores soft-capped at `C` (`None`: as they are).
    pub softcap: Option<SoftCap>,
    /// Scores biased by each query head's ALiBi slope times the key's distance (the call
    /// passes the slopes).
    pub alibi: bool,
}

#[derive(Deserialize)]
struct FlashFields {
    batch: usize,
    q_len: usize,
    kv_len: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Absent in problems written before narrower value heads.
    #[serde(default)]
    v_head_dim: Option<usize>,
    causal: bool,
    scale: Scale,
    dtype: DType,
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

impl TryFrom<FlashFields> for FlashProblem {
    type Error = KernelError;
    fn try_from(f: FlashFields) -> Result<Self> {
        FlashProblem::new(
            f.batch, f.q_len, f.kv_len, f.q_heads, f.kv_heads, f.head_dim, f.causal, f.scale,
            f.dtype,
        )?
        .with_v_head_dim(f.v_head_dim.unwrap_or(f.head_dim))?
        .with_window(f.window)
        .map(|p| p.with_sinks(f.sinks))
        .map(|p| p.with_cap(f.softcap))
        .and_then(|p| p.with_alibi(f.alibi))
    }
}

pub(crate) fn invalid(field: &'static str, value: impl ToString, reason: &str) -> KernelError {
    KernelError::InvalidProblem {
        family: Family::Flash,
        field,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

impl FlashProblem {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        batch: usize,
        q_len: usize,
        kv_len: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        causal: bool,
        scale: Scale,
        dtype: DType,
    ) -> Result<Self> {
        let f = Family::Flash;
        check_dim(f, "batch", batch, 1 << 16)?;
        check_dim(f, "q_len", q_len, 1 << 22)?;
        check_dim(f, "kv_len", kv_len, 1 << 22)?;
        check_dim(f, "q_heads", q_heads, 1024)?;
        check_dim(f, "kv_heads", kv_heads, 1024)?;
        check_dim(f, "head_dim", head_dim, 512)?;
        check_compute_dtype(f, dtype)?;
        if !q_heads.is_multiple_of(kv_heads) {
            return Err(invalid(
                "kv_heads",
                kv_heads,
                &format!("must divide q_heads = {q_heads} (MHA, GQA or MQA)"),
            ));
        }
        if causal && q_len > kv_len {
            return Err(invalid(
                "q_len",
                q_len,
                &format!("a causal problem needs q_len <= kv_len = {kv_len}; the first queries would see no key"),
            ));
        }
        Ok(FlashProblem {
            batch,
            q_len,
            kv_len,
            q_heads,
            kv_heads,
            head_dim,
            v_head_dim: head_dim,
            causal,
            scale,
            dtype,
            window: None,
            sinks: false,
            softcap: None,
            alibi: false,
        })
    }

    /// This problem with value (and output) heads of `v_head_dim` values (`head_dim`: as wide
    /// as the keys, as most attention has).
    pub fn with_v_head_dim(mut self, v_head_dim: usize) -> Result<Self> {
        check_dim(Family::Flash, "v_head_dim", v_head_dim, 512)?;
        if v_head_dim > self.head_dim {
            return Err(invalid(
                "v_head_dim",
                v_head_dim,
                &format!(
                    "must be at most head_dim = {}: narrower value heads are latent attention's \
                     (keys of 192, values of 128); wider ones are no model's",
                    self.head_dim
                ),
            ));
        }
        self.v_head_dim = v_head_dim;
        Ok(self)
    }

    /// Whether value heads are narrower than key heads.
    pub fn narrow_values(&self) -> bool {
        self.v_head_dim < self.head_dim
    }

    /// This problem with its scores soft-capped at `softcap` (`None`: not capped).
    pub fn with_softcap(self, softcap: Option<f32>) -> Result<Self> {
        Ok(self.with_cap(check_softcap(Family::Flash, softcap)?))
    }

    /// [`Self::with_softcap`] of a cap already validated.
    pub fn with_cap(mut self, softcap: Option<SoftCap>) -> Self {
        self.softcap = softcap;
        self
    }

    /// This problem with (or without) a sink logit in each query head's softmax.
    pub fn with_sinks(mut self, sinks: bool) -> Self {
        self.sinks = sinks;
        self
    }

    /// This problem with (or without) ALiBi's linear bias on each score. Causal problems only:
    /// the bias counts distance back from each query's position, and every ALiBi model is a
    /// decoder.
    pub fn with_alibi(mut self, alibi: bool) -> Result<Self> {
        if alibi && !self.causal {
            return Err(invalid(
                "alibi",
                alibi,
                "ALiBi biases each score by its key's distance back from the query: it needs causal=true",
            ));
        }
        self.alibi = alibi;
        Ok(self)
    }

    /// The position of query `i` among the keys (`i` itself without the causal mask, where
    /// `q_len` may exceed `kv_len`).
    pub fn query_pos(&self, i: usize) -> usize {
        if self.causal {
            i + self.kv_len - self.q_len
        } else {
            i
        }
    }

    /// This problem with each query looking back at most `window` keys, itself included
    /// (`None`: every key the mask leaves it). Causal problems only: a window bounds how far
    /// back a decoder looks. A window of `kv_len` keys or more is dropped, as it hides none.
    pub fn with_window(mut self, window: Option<usize>) -> Result<Self> {
        if let Some(w) = window {
            check_dim(Family::Flash, "window", w, 1 << 22)?;
            if !self.causal {
                return Err(invalid(
                    "window",
                    w,
                    "a sliding window looks back from each query: it needs causal=true",
                ));
            }
        }
        self.window = window.filter(|&w| w < self.kv_len);
        Ok(self)
    }

    /// The first key query `i` sees: its window's start (0 without one).
    pub fn first_key(&self, i: usize) -> usize {
        match self.window {
            Some(w) => (i + self.kv_len - self.q_len + 1).saturating_sub(w),
            None => 0,
        }
    }

    /// Spec keys: `q_len`, `q_heads`, `head_dim` (required); `batch` (1), `kv_len` (q_len),
    /// `kv_heads` (q_heads), `v_head_dim` (head_dim), `causal` (true), `scale`
    /// (1/sqrt(head_dim)), `dtype` (f32), `window` (none), `sinks` (false), `softcap` (none),
    /// `alibi` (false).
    pub(super) fn from_fields(mut f: Fields) -> Result<Self> {
        let q_len: usize = f.req("q_len")?;
        let q_heads: usize = f.req("q_heads")?;
        let head_dim: usize = f.req("head_dim")?;
        let scale = match f.opt::<f32>("scale")? {
            None => Scale::default_for(head_dim.max(1)),
            Some(v) => {
                Scale::new(v).ok_or_else(|| invalid("scale", v, "must be finite and positive"))?
            }
        };
        let p = FlashProblem::new(
            f.opt("batch")?.unwrap_or(1),
            q_len,
            f.opt("kv_len")?.unwrap_or(q_len),
            q_heads,
            f.opt("kv_heads")?.unwrap_or(q_heads),
            head_dim,
            f.opt("causal")?.unwrap_or(true),
            scale,
            f.opt("dtype")?.unwrap_or(DType::F32),
        )?
        .with_v_head_dim(f.opt("v_head_dim")?.unwrap_or(head_dim))?
        .with_window(f.opt("window")?)?
        .with_sinks(f.opt("sinks")?.unwrap_or(false))
        .with_softcap(f.opt("softcap")?)?
        .with_alibi(f.opt("alibi")?.unwrap_or(false))?;
        f.finish(&[
            "batch",
            "q_len",
            "kv_len",
            "q_heads",
            "kv_heads",
            "head_dim",
            "v_head_dim",
            "causal",
            "scale",
            "dtype",
            "window",
            "sinks",
            "softcap",
            "alibi",
        ])?;
        Ok(p)
    }

    pub fn key(&self) -> String {
        let mut key = format!(
            "flash:batch={},q_len={},kv_len={},q_heads={},kv_heads={},head_dim={},causal={},dtype={}",
            self.batch,
            self.q_len,
            self.kv_len,
            self.q_heads,
            self.kv_heads,
            self.head_dim,
            self.causal,
            self.dtype
        );
        if self.narrow_values() {
            key.push_str(&format!(",v_head_dim={}", self.v_head_dim));
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

    /// Query rows per KV head (1 for MHA).
    pub fn group(&self) -> usize {
        self.q_heads / self.kv_heads
    }

    /// Number of (query, key) pairs that are not masked, per head and batch item.
    pub fn visible_pairs(&self) -> f64 {
        if !self.causal {
            return self.q_len as f64 * self.kv_len as f64;
        }
        // Keys seen by the queries at positions 0..n: min(x, window) for x = 1..=n.
        let upto = |n: f64| match self.window.map(|w| w as f64) {
            Some(w) if n > w => w * (w + 1.0) / 2.0 + (n - w) * w,
            _ => n * (n + 1.0) / 2.0,
        };
        let offset = (self.kv_len - self.q_len) as f64;
        upto(offset + self.q_len as f64) - upto(offset)
    }

    /// Two matrix products (QKᵀ and PV) over the visible pairs.
    pub fn flops(&self) -> f64 {
        let dims = (self.head_dim + self.v_head_dim) as f64;
        2.0 * self.batch as f64 * self.q_heads as f64 * dims * self.visible_pairs()
    }

    pub fn min_bytes(&self) -> f64 {
        let e = self.dtype.size() as f64;
        let q = (self.batch * self.q_len * self.q_heads * self.head_dim) as f64;
        // Keys before the first query's window are never read.
        let keys = self.kv_len - self.first_key(0);
        let kv = (self.batch * keys * self.kv_heads * (self.head_dim + self.v_head_dim)) as f64;
        (q + kv) * e + self.out_len() as f64 * 4.0
    }

    pub fn q_len_elems(&self) -> usize {
        self.batch * self.q_len * self.q_heads * self.head_dim
    }
    pub fn kv_len_elems(&self) -> usize {
        self.batch * self.kv_len * self.kv_heads * self.head_dim
    }
    /// Values of V: `[batch, kv_len, kv_heads, v_head_dim]`.
    pub fn v_len_elems(&self) -> usize {
        self.batch * self.kv_len * self.kv_heads * self.v_head_dim
    }
    /// Values of the output: `[batch, q_len, q_heads, v_head_dim]`.
    pub fn out_len(&self) -> usize {
        self.batch * self.q_len * self.q_heads * self.v_head_dim
    }
}
