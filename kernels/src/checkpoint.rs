//! Four-bit checkpoints' tensors as kerntune's int4 GEMMs take them.
//!
//! An int4 GEMM reads B as GPTQ's `qweight` (`[K / 8, N]` words, value `i` of word `(r, j)`
//! being `q[8r + i, j]` in bits `4i..4i + 4`) and zero points as floats, `[K / group, N]`
//! ([`crate::GemmProblem::with_int4`]). The checkpoints store them otherwise, and a server that
//! passes the wrong one gets wrong answers, not an error: GPTQ's `qzeros` hold each zero point
//! minus one (AutoGPTQ's and GPTQModel's `checkpoint_format = "gptq"`; `"gptq_v2"` holds them
//! as they are), eight columns a word; AWQ's `qweight` is `[K, N / 8]`, eight columns a word in
//! the order 0, 2, 4, 6, 1, 3, 5, 7, and its `qzeros` the same way. These functions convert
//! them once, as a server loads a model (vLLM repacks both for its own kernels too).
//!
//! Written here: no maintained crate reads these packings; each is a few shifts.
//!
//! ```
//! use kerntune_kernels::checkpoint::{int4_words, int4_zeros, Int4Format};
//!
//! // AWQ's qweight for k = 8, n = 8: each row of k one word, column j's value j packed in
//! // AWQ's order 0, 2, 4, 6, 1, 3, 5, 7.
//! let k = 8;
//! let awq_row: u32 = [0u32, 2, 4, 6, 1, 3, 5, 7]
//!     .iter()
//!     .enumerate()
//!     .fold(0, |w, (i, &col)| w | col << (4 * i));
//! let qweight = vec![awq_row; k];
//! let words = int4_words(Int4Format::Awq, &qweight, k, 8).unwrap();
//! // GPTQ's words: column j's 8 values of k in word (0, j), all equal to j.
//! assert_eq!(words[3], 0x3333_3333);
//! // GPTQ's qzeros store 7 for a zero point of 8.
//! let zeros = int4_zeros(Int4Format::Gptq, &[0x7777_7777], 1, 8).unwrap();
//! assert_eq!(zeros, [8.0; 8]);
//! ```

use crate::{KernelError, Result};

/// Which quantizer wrote a 4-bit checkpoint, as its `quantization_config` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int4Format {
    /// `quant_method = "gptq"` with `checkpoint_format = "gptq"` (the default): `qweight` is
    /// already kerntune's words; `qzeros` hold each zero point minus one.
    Gptq,
    /// `checkpoint_format = "gptq_v2"`: as [`Int4Format::Gptq`], zero points as they are.
    GptqV2,
    /// `quant_method = "awq"` (AutoAWQ's GEMM packing): `qweight` `[K, N / 8]` and `qzeros`
    /// `[K / group, N / 8]`, eight columns a word in the order 0, 2, 4, 6, 1, 3, 5, 7.
    Awq,
}

/// The column of a word's eight that AWQ packs in bits `4i..4i + 4`.
const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

impl Int4Format {
    /// Column `8c + COLUMN[i]` of a row of `qzeros` (AWQ's `qweight` too) is value `i` of word
    /// `c`.
    fn columns(self) -> [usize; 8] {
        match self {
            Int4Format::Gptq | Int4Format::GptqV2 => [0, 1, 2, 3, 4, 5, 6, 7],
            Int4Format::Awq => AWQ_ORDER,
        }
    }
}

fn bad(name: &'static str, reason: String) -> KernelError {
    KernelError::BadBuffer { name, reason }
}

/// Checks that `len` words hold `rows` rows of `n / 8` words (eight columns a word).
fn column_words(name: &'static str, len: usize, rows: usize, n: usize) -> Result<()> {
    if n == 0 || !n.is_multiple_of(8) {
        return Err(bad(
            name,
            format!("n = {n}: the checkpoint packs eight columns a word, so n must be a positive multiple of 8"),
        ));
    }
    if len != rows * (n / 8) {
        return Err(bad(
            name,
            format!(
                "holds {len} words; [{rows}, {}] of eight columns each takes {}",
                n / 8,
                rows * (n / 8)
            ),
        ));
    }
    Ok(())
}

/// B's words for an int4 GEMM of `k` × `n` from a checkpoint's `qweight`: GPTQ's as they are
/// (checked: `[k / 8, n]`), AWQ's (`[k, n / 8]`) repacked.
pub fn int4_words(format: Int4Format, qweight: &[u32], k: usize, n: usize) -> Result<Vec<u32>> {
    if format != Int4Format::Awq {
        if k == 0 || !k.is_multiple_of(8) || qweight.len() != k / 8 * n {
            return Err(bad(
                "qweight",
                format!(
                    "holds {} words; GPTQ's qweight for k = {k}, n = {n} is [k / 8, n] (k a positive multiple of 8): {} words",
                    qweight.len(),
                    k / 8 * n
                ),
            ));
        }
        return Ok(qweight.to_vec());
    }
    column_words("qweight", qweight.len(), k, n)?;
    if !k.is_multiple_of(8) {
        return Err(bad(
            "qweight",
            format!(
                "k = {k}: kerntune's words hold eight values of k, so k must be a multiple of 8"
            ),
        ));
    }
    let mut words = vec![0u32; k / 8 * n];
    for (p, row) in qweight.chunks_exact(n / 8).enumerate() {
        let (r, shift) = (p / 8, 4 * (p % 8));
        for (c, &w) in row.iter().enumerate() {
            for (i, &col) in AWQ_ORDER.iter().enumerate() {
                words[r * n + 8 * c + col] |= ((w >> (4 * i)) & 15) << shift;
            }
        }
    }
    Ok(words)
}

/// The zero points, `[groups, n]` floats, from a checkpoint's `qzeros` (`[groups, n / 8]`
/// words): GPTQ's plus one, GPTQ v2's and AWQ's as they are.
pub fn int4_zeros(format: Int4Format, qzeros: &[u32], groups: usize, n: usize) -> Result<Vec<f32>> {
    column_words("qzeros", qzeros.len(), groups, n)?;
    let offset = if format == Int4Format::Gptq { 1 } else { 0 };
    let mut zeros = vec![0.0f32; groups * n];
    for (row, out) in qzeros.chunks_exact(n / 8).zip(zeros.chunks_exact_mut(n)) {
        for (c, &w) in row.iter().enumerate() {
            for (i, &col) in format.columns().iter().enumerate() {
                out[8 * c + col] = (((w >> (4 * i)) & 15) + offset) as f32;
            }
        }
    }
    Ok(zeros)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packs `values` (`rows` × `n`, row-major) eight columns a word, value `i` of a word the
    /// column `order[i]` of its eight: how the quantizers write `qzeros` and AWQ's `qweight`.
    fn pack_columns(values: &[u32], n: usize, order: [usize; 8]) -> Vec<u32> {
        values
            .chunks(n)
            .flat_map(|row| {
                row.chunks(8)
                    .map(move |eight| (0..8).fold(0u32, |w, i| w | (eight[order[i]] << (4 * i))))
            })
            .collect()
    }

    /// GPTQ's `qweight`: eight rows of k a word.
    fn pack_rows(values: &[u32], k: usize, n: usize) -> Vec<u32> {
        let mut words = vec![0u32; k / 8 * n];
        for p in 0..k {
            for j in 0..n {
                words[p / 8 * n + j] |= values[p * n + j] << (4 * (p % 8));
            }
        }
        words
    }

    fn values(rows: usize, n: usize, seed: u32) -> Vec<u32> {
        (0..rows * n)
            .map(|x| (x as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 28)
            .collect()
    }

    #[test]
    fn awq_weights_become_gptqs_words() {
        let (k, n) = (24, 16);
        let q = values(k, n, 7);
        let awq = pack_columns(&q, n, [0, 2, 4, 6, 1, 3, 5, 7]);
        assert_eq!(
            int4_words(Int4Format::Awq, &awq, k, n).unwrap(),
            pack_rows(&q, k, n)
        );
        // GPTQ's are kerntune's already.
        let gptq = pack_rows(&q, k, n);
        assert_eq!(int4_words(Int4Format::Gptq, &gptq, k, n).unwrap(), gptq);
        // Read as if in order, AWQ's words put columns in the wrong places: the order counts.
        assert_ne!(
            pack_columns(&q, n, [0, 1, 2, 3, 4, 5, 6, 7]),
            awq,
            "the test's values must tell the orders apart"
        );
    }

    #[test]
    fn zero_points_unpack_by_format() {
        let (groups, n) = (3, 16);
        let z = values(groups, n, 3);
        let widened: Vec<f32> = z.iter().map(|&v| v as f32).collect();
        let gptq_v1: Vec<u32> = z.iter().map(|&v| v.wrapping_sub(1) & 15).collect();
        let cases = [
            (
                Int4Format::Gptq,
                pack_columns(&gptq_v1, n, [0, 1, 2, 3, 4, 5, 6, 7]),
            ),
            (
                Int4Format::GptqV2,
                pack_columns(&z, n, [0, 1, 2, 3, 4, 5, 6, 7]),
            ),
            (
                Int4Format::Awq,
                pack_columns(&z, n, [0, 2, 4, 6, 1, 3, 5, 7]),
            ),
        ];
        for (format, packed) in cases {
            let got = int4_zeros(format, &packed, groups, n).unwrap();
            // A stored 15 under GPTQ's offset is a zero point of 16.
            let want: Vec<f32> = if format == Int4Format::Gptq {
                gptq_v1.iter().map(|&v| (v + 1) as f32).collect()
            } else {
                widened.clone()
            };
            assert_eq!(got, want, "{format:?}");
        }
    }

    #[test]
    fn sizes_that_hold_no_whole_words_are_refused_by_name() {
        for (result, name, needle) in [
            (
                int4_words(Int4Format::Awq, &[0; 6], 4, 12).map(drop),
                "qweight",
                "n = 12",
            ),
            (
                int4_words(Int4Format::Awq, &[0; 5], 4, 16).map(drop),
                "qweight",
                "takes 8",
            ),
            (
                int4_words(Int4Format::Awq, &[0; 6], 3, 16).map(drop),
                "qweight",
                "k = 3",
            ),
            (
                int4_words(Int4Format::Gptq, &[0; 4], 16, 4).map(drop),
                "qweight",
                "[k / 8, n]",
            ),
            (
                int4_zeros(Int4Format::Gptq, &[0; 3], 2, 16).map(drop),
                "qzeros",
                "takes 4",
            ),
        ] {
            match result {
                Err(KernelError::BadBuffer { name: got, reason }) => {
                    assert_eq!(got, name);
                    assert!(reason.contains(needle), "{reason}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
    }
}
