//! Plain reference implementations (simple loops, f64 accumulation) that every kernel config is
//! verified against, one output row at a time so large problems can be checked on a sample of
//! rows, and the error measure used to compare.

use rayon::prelude::*;

use crate::problem::{BLayout, FlashProblem, GemmProblem, PagedProblem, SoftCap};

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

use crate::kernel::{GemmScales, HeadValues};
use crate::Tensor;

/// Row `i` of `C = A·B`.
pub fn gemm_row(
    p: &GemmProblem,
    a: Tensor<'_>,
    b: Tensor<'_>,
    scales: GemmScales<'_>,
    i: usize,
) -> Vec<f64> {
    gemm_rows(p, a, b, scales, &[i]).pop().unwrap_or_default()
}

/// Rows `rows` of `C = A·B`, each column of B widened once for all of them and the columns
/// spread over the cores: a decode GEMM's 64 rows against a 112 MiB weight took 8.6 s one
/// element at a time, most of a 2 s tuning budget's problem. An fp8 GEMM's values are the
/// bytes' decoded values times their row's and column's `scales`; a block-scaled one's sums
/// over each group of k times its token's and weight block's scales. An int4 GEMM's weights
/// are each 4-bit value less its group's zero point (8 where there are none) times its group's
/// scale.
pub fn gemm_rows(
    p: &GemmProblem,
    a: Tensor<'_>,
    b: Tensor<'_>,
    scales: GemmScales<'_>,
    rows: &[usize],
) -> Vec<Vec<f64>> {
    let widen = |t: &Tensor<'_>, at: &dyn Fn(usize) -> usize, out: &mut [f64]| {
        for (q, o) in out.iter_mut().enumerate() {
            *o = t.get(at(q)) as f64;
        }
    };
    let a_rows: Vec<Vec<f64>> = rows
        .iter()
        .map(|&i| {
            let mut row = vec![0.0; p.k];
            widen(&a, &|q| i * p.k + q, &mut row);
            row
        })
        .collect();
    // Column j of C at every requested row.
    let columns: Vec<Vec<f64>> = (0..p.n)
        .into_par_iter()
        .map_init(
            || vec![0.0; p.k],
            |col, j| {
                match (p.int4, p.b_layout) {
                    (Some(group), _) => {
                        // Value q of column j: nibble q % 8 of word (q / 8, j).
                        widen(&b, &|q| ((q / 8) * p.n + j) * 8 + q % 8, col);
                        for (q, v) in col.iter_mut().enumerate() {
                            let at = q / group * p.n + j;
                            let zero = scales.zeros.get(at).map_or(8.0, |&z| z as f64);
                            *v = (*v - zero) * scales.b[at] as f64;
                        }
                        return a_rows.iter().map(|row| dot(row, col)).collect();
                    }
                    (None, BLayout::Kn) => widen(&b, &|q| q * p.n + j, col),
                    (None, BLayout::Nk) => widen(&b, &|q| j * p.k + q, col),
                }
                if let Some(block) = p.block {
                    let groups = p.k_groups();
                    let sb = &scales.b[j / block * groups..][..groups];
                    return a_rows
                        .iter()
                        .zip(rows)
                        .map(|(row, &i)| {
                            let sa = &scales.a[i * groups..][..groups];
                            (row.chunks(block).zip(col.chunks(block)))
                                .zip(sa.iter().zip(sb))
                                .map(|((r, c), (&sa, &sb))| dot(r, c) * sa as f64 * sb as f64)
                                .sum()
                        })
                        .collect();
                }
                let sb = scales.b_at(j) as f64;
                a_rows
                    .iter()
                    .zip(rows)
                    .map(|(row, &i)| dot(row, col) * scales.a_at(i) as f64 * sb)
                    .collect()
            },
        )
        .collect();
    (0..rows.len())
        .map(|r| columns.iter().map(|c| c[r]).collect())
        .collect()
}

/// A dot product in f64, in eight running sums so that the additions need not wait on each
/// other.
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut sums = [0.0; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f64 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for l in 0..8 {
            sums[l] += x[l] * y[l];
        }
    }
    sums.iter().sum::<f64>() + tail
}

/// ALiBi's bias of one query row: its head's slope and its position.
#[derive(Clone, Copy)]
struct Alibi {
    slope: f64,
    pos: usize,
}

/// One query row's attention over the rows of `k` at `keys` (each key's position and offset);
/// its output is the first `dv` values of the rows of `v` at the offsets `values` gives each
/// key's.
#[allow(clippy::too_many_arguments)]
fn attend_rows(
    scale: f64,
    q: &[f64],
    keys: impl Iterator<Item = (usize, usize)> + Clone,
    values: impl Fn(usize) -> usize,
    k: Tensor<'_>,
    v: Tensor<'_>,
    dv: usize,
    sink: Option<f64>,
    softcap: Option<SoftCap>,
    alibi: Option<Alibi>,
) -> Vec<f64> {
    let d = q.len();
    let cap = |s: f64| match softcap.map(|c| c.get() as f64) {
        Some(c) => c * (s / c).tanh(),
        None => s,
    };
    let bias = |j: usize| alibi.map_or(0.0, |a| a.slope * (j as f64 - a.pos as f64));
    let scores: Vec<f64> = keys
        .clone()
        .map(|(j, off)| {
            cap(scale * (0..d).map(|x| q[x] * k.get(off + x) as f64).sum::<f64>()) + bias(j)
        })
        .collect();
    let m = scores
        .iter()
        .copied()
        .chain(sink)
        .fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    // A sink is one more term of the softmax, with no value to add.
    let total: f64 = w.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
    let mut out = vec![0.0; dv];
    for (wi, (_, off)) in w.iter().zip(keys) {
        let off = values(off);
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
    heads: HeadValues<'_>,
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
    let keys =
        (p.first_key(i)..last).map(move |j| (j, ((b * p.kv_len + j) * p.kv_heads + kvh) * d));
    // Key offsets count rows of head_dim; V's rows hold v_head_dim.
    let dv = p.v_head_dim;
    let values = |off: usize| off / d * dv;
    let sink = heads.sinks.get(h).map(|&s| s as f64);
    let alibi = heads.slopes.get(h).map(|&s| Alibi {
        slope: s as f64,
        pos: p.query_pos(i),
    });
    attend_rows(
        p.scale.get() as f64,
        &qrow,
        keys,
        values,
        k,
        v,
        dv,
        sink,
        p.softcap,
        alibi,
    )
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
    heads: HeadValues<'_>,
    kv_scales: crate::kernel::KvScales,
    r: usize,
) -> Vec<f64> {
    let d = p.head_dim;
    let (s, h) = (r / p.q_heads, r % p.q_heads);
    let kvh = h / p.group();
    let qrow: Vec<f64> = (0..d).map(|x| query.get(r * d + x) as f64).collect();
    let ctx = context_lens[s] as usize;
    let keys = (p.first_token(ctx)..ctx).map(move |t| {
        let block = block_tables[s * max_blocks + t / p.block_size] as usize;
        (
            t,
            ((block * p.block_size + t % p.block_size) * p.kv_heads + kvh) * d,
        )
    });
    let sink = heads.sinks.get(h).map(|&s| s as f64);
    // The new token is the context's last.
    let alibi = heads.slopes.get(h).map(|&s| Alibi {
        slope: s as f64,
        pos: ctx - 1,
    });
    // A latent cache's values are the first v_head_dim of its key rows.
    let values = if p.is_latent() {
        key_cache
    } else {
        value_cache
    };
    // Each cached key is its value times k_scale: the factor moves out of the dot product,
    // and v_scale out of the weighted sum.
    let out = attend_rows(
        p.scale.get() as f64 * kv_scales.k as f64,
        &qrow,
        keys,
        |off| off,
        key_cache,
        values,
        p.v_head_dim,
        sink,
        p.softcap,
        alibi,
    );
    out.into_iter().map(|o| o * kv_scales.v as f64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::ProblemData;
    use crate::Problem;

    /// The batched, parallel GEMM reference against the definition, one product at a time in
    /// order, on sizes that leave a remainder of every dot-product lane count (k = 1, 7, 13,
    /// 37), both layouts, every input type, and rows asked for in any order.
    #[test]
    fn gemm_rows_is_the_sum_of_products() {
        for dtype in ["f32", "f16", "bf16", "fp8_e4m3", "fp8_e4m3fnuz", "fp8_e5m2"] {
            for (m, n, k) in [(1, 1, 1), (3, 5, 7), (5, 3, 13), (7, 11, 37), (2, 17, 64)] {
                for b in ["kn", "nk"] {
                    let spec = format!("gemm:m={m},n={n},k={k},dtype={dtype},b={b}");
                    let problem: Problem = spec.parse().unwrap();
                    let Problem::Gemm(p) = problem else {
                        unreachable!()
                    };
                    let data = ProblemData::random(&problem, 7);
                    let (a, bt) = (data.inputs[0].view(), data.inputs[1].view());
                    let rows: Vec<usize> = (0..m).rev().collect();
                    let scales = data.gemm_scales();
                    let got = gemm_rows(&p, a, bt, scales, &rows);
                    for (&i, row) in rows.iter().zip(&got) {
                        for (j, &value) in row.iter().enumerate() {
                            let mut want = 0f64;
                            for q in 0..k {
                                let bv = if b == "kn" {
                                    bt.get(q * n + j)
                                } else {
                                    bt.get(j * k + q)
                                };
                                want += a.get(i * k + q) as f64 * bv as f64;
                            }
                            // An fp8 GEMM's values are its bytes' times their scales.
                            if p.fp8().is_some() {
                                want *= data.a_scales[i] as f64 * data.b_scales[j] as f64;
                            }
                            assert!(
                                (value - want).abs() <= 1e-12 * want.abs().max(1.0),
                                "{spec} C[{i}][{j}] = {value}, the sum of products is {want}"
                            );
                        }
                    }
                    assert_eq!(gemm_row(&p, a, bt, scales, m - 1), got[0], "{spec}");
                }
            }
        }
    }
}
