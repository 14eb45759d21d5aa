//! Plain reference implementations (simple loops, f64 accumulation) that every kernel config is
//! verified against, and the error measure used to compare.

use crate::problem::{BLayout, FlashProblem, GemmProblem, PagedProblem};
use crate::TensorBuf;

/// `C = A·B` in f64.
pub fn gemm(p: &GemmProblem, a: &TensorBuf, b: &TensorBuf) -> Vec<f64> {
    let (a, b) = (a.to_f64(), b.to_f64());
    let mut c = vec![0.0; p.m * p.n];
    for i in 0..p.m {
        for j in 0..p.n {
            let mut s = 0.0;
            for q in 0..p.k {
                let bv = match p.b_layout {
                    BLayout::Kn => b[q * p.n + j],
                    BLayout::Nk => b[j * p.k + q],
                };
                s += a[i * p.k + q] * bv;
            }
            c[i * p.n + j] = s;
        }
    }
    c
}

/// Softmax-weighted sum of `values` rows with scores `scores`, in f64.
fn attend(scores: &[f64], values: &[&[f64]], out: &mut [f64]) {
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let total: f64 = weights.iter().sum();
    out.fill(0.0);
    for (w, v) in weights.iter().zip(values) {
        for (o, x) in out.iter_mut().zip(v.iter()) {
            *o += w / total * x;
        }
    }
}

/// Attention prefill in f64, bottom-right causal alignment.
pub fn flash(p: &FlashProblem, q: &TensorBuf, k: &TensorBuf, v: &TensorBuf) -> Vec<f64> {
    let (q, k, v) = (q.to_f64(), k.to_f64(), v.to_f64());
    let d = p.head_dim;
    let scale = p.scale.get() as f64;
    let mut out = vec![0.0; p.q_len_elems()];
    let off = p.kv_len - p.q_len;
    for b in 0..p.batch {
        for h in 0..p.q_heads {
            let kvh = h / p.group();
            for i in 0..p.q_len {
                let qrow = &q[((b * p.q_len + i) * p.q_heads + h) * d..][..d];
                let last = if p.causal { i + off + 1 } else { p.kv_len };
                let rows: Vec<&[f64]> = (0..last)
                    .map(|j| &k[((b * p.kv_len + j) * p.kv_heads + kvh) * d..][..d])
                    .collect();
                let scores: Vec<f64> = rows
                    .iter()
                    .map(|kr| scale * kr.iter().zip(qrow).map(|(x, y)| x * y).sum::<f64>())
                    .collect();
                let vals: Vec<&[f64]> = (0..last)
                    .map(|j| &v[((b * p.kv_len + j) * p.kv_heads + kvh) * d..][..d])
                    .collect();
                attend(
                    &scores,
                    &vals,
                    &mut out[((b * p.q_len + i) * p.q_heads + h) * d..][..d],
                );
            }
        }
    }
    out
}

/// Paged attention decode in f64, reading K/V through the block tables.
#[allow(clippy::too_many_arguments)]
pub fn paged(
    p: &PagedProblem,
    query: &TensorBuf,
    key_cache: &TensorBuf,
    value_cache: &TensorBuf,
    block_tables: &[u32],
    max_blocks: usize,
    context_lens: &[u32],
) -> Vec<f64> {
    let (q, kc, vc) = (query.to_f64(), key_cache.to_f64(), value_cache.to_f64());
    let d = p.head_dim;
    let scale = p.scale.get() as f64;
    let mut out = vec![0.0; p.query_len()];
    for s in 0..p.num_seqs {
        for h in 0..p.q_heads {
            let kvh = h / p.group();
            let qrow = &q[(s * p.q_heads + h) * d..][..d];
            let at = |t: usize| {
                let block = block_tables[s * max_blocks + t / p.block_size] as usize;
                ((block * p.block_size + t % p.block_size) * p.kv_heads + kvh) * d
            };
            let ctx = context_lens[s] as usize;
            let scores: Vec<f64> = (0..ctx)
                .map(|t| {
                    scale
                        * kc[at(t)..][..d]
                            .iter()
                            .zip(qrow)
                            .map(|(x, y)| x * y)
                            .sum::<f64>()
                })
                .collect();
            let vals: Vec<&[f64]> = (0..ctx).map(|t| &vc[at(t)..][..d]).collect();
            attend(&scores, &vals, &mut out[(s * p.q_heads + h) * d..][..d]);
        }
    }
    out
}

/// Largest absolute difference relative to the reference's largest magnitude. Scale-free, and
/// robust to single outputs near zero where a per-element relative error would explode.
pub fn relative_error(out: &[f32], reference: &[f64]) -> f64 {
    let scale = reference
        .iter()
        .fold(0f64, |m, r| m.max(r.abs()))
        .max(1e-30);
    let worst = out
        .iter()
        .zip(reference)
        .map(|(&o, &r)| {
            let o = o as f64;
            if o.is_finite() {
                (o - r).abs()
            } else {
                f64::INFINITY
            }
        })
        .fold(0f64, f64::max);
    if out.len() != reference.len() {
        return f64::INFINITY;
    }
    worst / scale
}

use crate::Tensor;

/// Row `i` of `C = A·B`.
pub fn gemm_row(p: &GemmProblem, a: Tensor<'_>, b: Tensor<'_>, i: usize) -> Vec<f64> {
    (0..p.n)
        .map(|j| {
            (0..p.k)
                .map(|q| {
                    let bv = match p.b_layout {
                        BLayout::Kn => b.get(q * p.n + j),
                        BLayout::Nk => b.get(j * p.k + q),
                    };
                    a.get(i * p.k + q) as f64 * bv as f64
                })
                .sum()
        })
        .collect()
}

fn attend_rows(
    scale: f64,
    q: &[f64],
    keys: impl Iterator<Item = usize> + Clone,
    k: Tensor<'_>,
    v: Tensor<'_>,
) -> Vec<f64> {
    let d = q.len();
    let scores: Vec<f64> = keys
        .clone()
        .map(|off| scale * (0..d).map(|x| q[x] * k.get(off + x) as f64).sum::<f64>())
        .collect();
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let total: f64 = w.iter().sum();
    let mut out = vec![0.0; d];
    for (wi, off) in w.iter().zip(keys) {
        for (x, o) in out.iter_mut().enumerate() {
            *o += wi / total * v.get(off + x) as f64;
        }
    }
    out
}

/// Output vector `r` (flattened `[batch, q_len, q_heads]` index) of attention prefill.
pub fn flash_row(
    p: &FlashProblem,
    q: Tensor<'_>,
    k: Tensor<'_>,
    v: Tensor<'_>,
    r: usize,
) -> Vec<f64> {
    let d = p.head_dim;
    let (h, i, b) = (
        r % p.q_heads,
        r / p.q_heads % p.q_len,
        r / p.q_heads / p.q_len,
    );
    let kvh = h / p.group();
    let qrow: Vec<f64> = (0..d).map(|x| q.get(r * d + x) as f64).collect();
    let last = if p.causal {
        i + p.kv_len - p.q_len + 1
    } else {
        p.kv_len
    };
    let keys = (0..last).map(move |j| ((b * p.kv_len + j) * p.kv_heads + kvh) * d);
    attend_rows(p.scale.get() as f64, &qrow, keys, k, v)
}

/// Output vector `r` (flattened `[num_seqs, q_heads]` index) of paged decode.
#[allow(clippy::too_many_arguments)]
pub fn paged_row(
    p: &PagedProblem,
    query: Tensor<'_>,
    key_cache: Tensor<'_>,
    value_cache: Tensor<'_>,
    block_tables: &[u32],
    max_blocks: usize,
    context_lens: &[u32],
    r: usize,
) -> Vec<f64> {
    let d = p.head_dim;
    let (s, h) = (r / p.q_heads, r % p.q_heads);
    let kvh = h / p.group();
    let qrow: Vec<f64> = (0..d).map(|x| query.get(r * d + x) as f64).collect();
    let keys = (0..context_lens[s] as usize).map(move |t| {
        let block = block_tables[s * max_blocks + t / p.block_size] as usize;
        ((block * p.block_size + t % p.block_size) * p.kv_heads + kvh) * d
    });
    attend_rows(p.scale.get() as f64, &qrow, keys, key_cache, value_cache)
}
