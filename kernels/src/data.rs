//! Deterministic input data for a problem, the reference output, and the buffers to run it.
//!
//! The tuner, the tests and the benchmarks all verify kernels on data built here.

use crate::kernel::{Args, FlashArgs, GemmArgs, PagedArgs};
use rayon::prelude::*;

use crate::{reference, Problem, TensorBuf};

/// SplitMix64: a few lines that fill buffers reproducibly from a seed; a full RNG crate would
/// add a dependency to the library for nothing more than this.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn fill(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }
}

/// Inputs of one problem and a place for its output.
#[derive(Debug, Clone)]
pub struct ProblemData {
    pub problem: Problem,
    pub inputs: Vec<TensorBuf>,
    /// Paged attention only: block tables, blocks per sequence, context lengths.
    pub block_tables: Vec<u32>,
    pub max_blocks_per_seq: usize,
    pub context_lens: Vec<u32>,
    pub out: Vec<f32>,
}

impl ProblemData {
    /// Random inputs in [-1, 1) rounded to the problem's dtype. Paged attention gets a shuffled
    /// block table (so the indirection is exercised) and every sequence at `context_len`.
    pub fn random(problem: &Problem, seed: u64) -> Self {
        let mut rng = SplitMix(seed);
        let dt = problem.dtype();
        let mut data = ProblemData {
            problem: *problem,
            inputs: Vec::new(),
            block_tables: Vec::new(),
            max_blocks_per_seq: 0,
            context_lens: Vec::new(),
            out: Vec::new(),
        };
        match problem {
            Problem::Gemm(p) => {
                data.inputs = vec![
                    TensorBuf::from_f32(dt, &rng.fill(p.a_len())),
                    TensorBuf::from_f32(dt, &rng.fill(p.b_len())),
                ];
                data.out = vec![0.0; p.c_len()];
            }
            Problem::Flash(p) => {
                data.inputs = vec![
                    TensorBuf::from_f32(dt, &rng.fill(p.q_len_elems())),
                    TensorBuf::from_f32(dt, &rng.fill(p.kv_len_elems())),
                    TensorBuf::from_f32(dt, &rng.fill(p.kv_len_elems())),
                ];
                data.out = vec![0.0; p.q_len_elems()];
            }
            Problem::Paged(p) => {
                let mb = p.max_blocks_per_seq();
                let blocks = p.num_seqs * mb;
                let per_block = p.block_size * p.kv_heads * p.head_dim;
                let mut table: Vec<u32> = (0..blocks as u32).collect();
                for i in (1..table.len()).rev() {
                    let j = (rng.next() % (i as u64 + 1)) as usize;
                    table.swap(i, j);
                }
                data.inputs = vec![
                    TensorBuf::from_f32(dt, &rng.fill(p.query_len())),
                    TensorBuf::from_f32(dt, &rng.fill(blocks * per_block)),
                    TensorBuf::from_f32(dt, &rng.fill(blocks * per_block)),
                ];
                data.block_tables = table;
                data.max_blocks_per_seq = mb;
                data.context_lens = vec![p.context_len as u32; p.num_seqs];
                data.out = vec![0.0; p.query_len()];
            }
        }
        data
    }

    /// Sets per-sequence context lengths (paged attention), each `1..=context_len`.
    pub fn with_context_lens(mut self, lens: Vec<u32>) -> Self {
        self.context_lens = lens;
        self
    }

    /// The buffers of one call; the output is this struct's `out`.
    pub fn args(&mut self) -> Args<'_> {
        let i = &self.inputs;
        match &self.problem {
            Problem::Gemm(_) => Args::Gemm(GemmArgs {
                a: i[0].view(),
                b: i[1].view(),
                c: &mut self.out,
            }),
            Problem::Flash(_) => Args::Flash(FlashArgs {
                q: i[0].view(),
                k: i[1].view(),
                v: i[2].view(),
                out: &mut self.out,
            }),
            Problem::Paged(_) => Args::Paged(PagedArgs {
                query: i[0].view(),
                key_cache: i[1].view(),
                value_cache: i[2].view(),
                block_tables: &self.block_tables,
                max_blocks_per_seq: self.max_blocks_per_seq,
                context_lens: &self.context_lens,
                out: &mut self.out,
            }),
        }
    }

    /// The reference output, in f64: every row of [`ProblemData::reference_row`].
    pub fn reference(&self) -> Vec<f64> {
        let all: Vec<usize> = (0..self.rows()).collect();
        self.reference_rows(&all).concat()
    }

    /// Bytes of all buffers, for sizing cold-cache rotations.
    pub fn bytes(&self) -> usize {
        self.inputs
            .iter()
            .map(|t| t.len() * t.view().dtype().size())
            .sum::<usize>()
            + self.out.len() * 4
            + self.block_tables.len() * 4
    }
}

impl ProblemData {
    /// Output rows: GEMM rows of C, or one (position, head) vector of attention output.
    pub fn rows(&self) -> usize {
        self.out.len() / self.row_len()
    }

    pub fn row_len(&self) -> usize {
        match &self.problem {
            Problem::Gemm(p) => p.n,
            Problem::Flash(p) => p.head_dim,
            Problem::Paged(p) => p.head_dim,
        }
    }

    /// The rows a verification compares: all of them for small problems; otherwise the first,
    /// the last and an even spread, so edge tiles are always checked while the f64 reference
    /// stays cheap on problems of hundreds of GFLOP.
    pub fn verify_rows(&self) -> Vec<usize> {
        let rows = self.rows();
        let per_row = self.problem.flops() / rows as f64;
        let budget = (2e8 / per_row.max(1.0)).max(4.0) as usize;
        if rows <= budget.max(64) {
            return (0..rows).collect();
        }
        let n = budget.clamp(4, 64);
        let mut picked: Vec<usize> = (0..n).map(|i| i * (rows - 1) / (n - 1)).collect();
        picked.dedup();
        picked
    }

    /// The reference values of output rows `rows`, in f64, computed on every core (a GEMM's
    /// rows together, each column of B widened once).
    pub fn reference_rows(&self, rows: &[usize]) -> Vec<Vec<f64>> {
        match &self.problem {
            Problem::Gemm(p) => {
                reference::gemm_rows(p, self.inputs[0].view(), self.inputs[1].view(), rows)
            }
            Problem::Flash(_) | Problem::Paged(_) => {
                rows.par_iter().map(|&r| self.reference_row(r)).collect()
            }
        }
    }

    /// The reference values of output row `r`, in f64.
    pub fn reference_row(&self, r: usize) -> Vec<f64> {
        let i = &self.inputs;
        match &self.problem {
            Problem::Gemm(p) => reference::gemm_row(p, i[0].view(), i[1].view(), r),
            Problem::Flash(p) => reference::flash_row(p, i[0].view(), i[1].view(), i[2].view(), r),
            Problem::Paged(p) => reference::paged_row(
                p,
                i[0].view(),
                i[1].view(),
                i[2].view(),
                &self.block_tables,
                self.max_blocks_per_seq,
                &self.context_lens,
                r,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs start on a cache line, as a framework's tensors do, for every dtype.
    #[test]
    fn inputs_start_on_a_cache_line() {
        for spec in [
            "gemm:m=3,n=5,k=7,dtype=f32",
            "gemm:m=3,n=5,k=7,dtype=f16",
            "gemm:m=3,n=5,k=7,dtype=bf16",
        ] {
            let problem: Problem = spec.parse().unwrap();
            let data = ProblemData::random(&problem, 1);
            for (i, t) in data.inputs.iter().enumerate() {
                let at = match t.view() {
                    crate::Tensor::F32(s) => s.as_ptr() as usize,
                    crate::Tensor::F16(s) => s.as_ptr() as usize,
                    crate::Tensor::Bf16(s) => s.as_ptr() as usize,
                };
                assert_eq!(at % 64, 0, "{spec} input {i} at {at:#x}");
            }
        }
    }
}
