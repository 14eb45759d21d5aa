//! Plain reference implementations (simple loops, f64 accumulation) that every kernel config is
//! verified against, one output row at a time so large problems can be checked on a sample of
//! rows, and the error measure used to compare.

use crate::problem::{BLayout, FlashProblem, GemmProblem, PagedProblem};

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
