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
