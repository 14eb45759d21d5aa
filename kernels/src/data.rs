//! Deterministic input data for a problem, the reference output, and the buffers to run it.
//!
//! The tuner, the tests and the benchmarks all verify kernels on data built here.

use crate::kernel::{Args, GemmScales, KvScales};
use rayon::prelude::*;

use crate::{reference, DType, Problem, Tensor, TensorBuf};

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
    /// `len` values times `gain` in `spare`'s buffer when it holds `dtype`, else in a new one.
    fn tensor(
        &mut self,
        spare: Option<TensorBuf>,
        dtype: DType,
        len: usize,
        gain: f32,
    ) -> TensorBuf {
        match spare {
            Some(mut t) if t.view().dtype() == Some(dtype) => {
                t.refill(len, || self.unit() * gain);
                t
            }
            _ => TensorBuf::from_fn(dtype, len, || self.unit() * gain),
        }
    }
    /// `words` int4 words of uniform values, in `spare`'s buffer when it holds words.
    fn int4(&mut self, spare: Option<TensorBuf>, words: usize) -> TensorBuf {
        match spare {
            Some(mut t @ TensorBuf::Int4(_)) => {
                t.refill(words, || self.unit());
                t
            }
            _ => TensorBuf::int4_from_fn(words, || self.unit()),
        }
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
    /// Attention with sinks: each query head's sink logit (empty otherwise).
    pub sinks: Vec<f32>,
    /// Attention with ALiBi: each query head's slope (empty otherwise).
    pub slopes: Vec<f32>,
    /// Paged attention on fp8 caches: their scales ([`ProblemData::FP8_SCALES`]; one
    /// otherwise).
    pub kv_scales: KvScales,
    /// An fp8 GEMM's scales, one per row of A and one per column of B, or an int4 GEMM's
    /// group scales as `b_scales` (empty otherwise).
    pub a_scales: Vec<f32>,
    pub b_scales: Vec<f32>,
    /// An int4 GEMM's zero points, one per group and column (empty otherwise).
    pub zeros: Vec<f32>,
    pub out: Vec<f32>,
}

impl ProblemData {
    /// The scales of random fp8 caches: the cached values are the unit-range keys and values
    /// divided by them, about ±133 and ±95, which every fp8 format holds (fnuz up to 240) at
    /// its full precision; neither is a power of two, so a kernel that drops or misplaces
    /// one is off by more than rounding.
    pub const FP8_SCALES: KvScales = KvScales {
        k: 0.0075,
        v: 0.0105,
    };

    /// The magnitude of a random fp8 GEMM's stored values: ±200, held at full precision by
    /// every fp8 format (fnuz's largest is 240); the scales bring them back to about ±1.
    pub const FP8_GEMM_GAIN: f32 = 200.0;

    /// Random inputs in [-1, 1) rounded to the problem's dtype (fp8 caches: divided by
    /// [`Self::FP8_SCALES`], then rounded; fp8 GEMMs: times [`Self::FP8_GEMM_GAIN`], with
    /// scales of 0.5 to 1.5 over it, every row's and column's its own). Paged attention gets
    /// a shuffled
    /// block table (so the indirection is exercised) and every sequence at `context_len`.
    pub fn random(problem: &Problem, seed: u64) -> Self {
        Self::random_reusing(problem, seed, None)
    }

    /// [`ProblemData::random`]'s values, in `spare`'s buffers (an earlier problem's) where
    /// their element types match: a tuner that draws a problem's data after another's keeps
    /// its pages rather than touching fresh ones, which cost a page fault each.
    pub fn random_reusing(problem: &Problem, seed: u64, spare: Option<ProblemData>) -> Self {
        let mut rng = SplitMix(seed);
        let dt = problem.dtype();
        let mut data = spare.unwrap_or(ProblemData {
            problem: *problem,
            inputs: Vec::new(),
            block_tables: Vec::new(),
            max_blocks_per_seq: 0,
            context_lens: Vec::new(),
            sinks: Vec::new(),
            slopes: Vec::new(),
            kv_scales: KvScales::ONE,
            a_scales: Vec::new(),
            b_scales: Vec::new(),
            zeros: Vec::new(),
            out: Vec::new(),
        });
        data.problem = *problem;
        data.block_tables.clear();
        data.max_blocks_per_seq = 0;
        data.context_lens.clear();
        let mut spares = std::mem::take(&mut data.inputs).into_iter();
        let mut tensor =
            |rng: &mut SplitMix, dtype, len, gain| rng.tensor(spares.next(), dtype, len, gain);
        data.kv_scales = KvScales::ONE;
        let (inputs, out) = match problem {
            Problem::Gemm(p) if p.int4.is_some() => {
                let a = tensor(&mut rng, dt, p.a_len(), 1.0);
                (vec![a, rng.int4(spares.next(), p.b_len())], p.c_len())
            }
            Problem::Gemm(p) => {
                let gain = match p.fp8() {
                    Some(_) => Self::FP8_GEMM_GAIN,
                    None => 1.0,
                };
                (
                    vec![
                        tensor(&mut rng, dt, p.a_len(), gain),
                        tensor(&mut rng, dt, p.b_len(), gain),
                    ],
                    p.c_len(),
                )
            }
            Problem::Flash(p) => (
                vec![
                    tensor(&mut rng, dt, p.q_len_elems(), 1.0),
                    tensor(&mut rng, dt, p.kv_len_elems(), 1.0),
                    tensor(&mut rng, dt, p.v_len_elems(), 1.0),
                ],
                p.out_len(),
            ),
            Problem::Paged(p) => {
                let mb = p.max_blocks_per_seq();
                let blocks = p.num_seqs * mb;
                let per_block = p.block_size * p.kv_heads * p.head_dim;
                let table = &mut data.block_tables;
                table.extend(0..blocks as u32);
                for i in (1..table.len()).rev() {
                    let j = (rng.next() % (i as u64 + 1)) as usize;
                    table.swap(i, j);
                }
                data.max_blocks_per_seq = mb;
                data.context_lens.resize(p.num_seqs, p.context_len as u32);
                if p.fp8().is_some() {
                    data.kv_scales = Self::FP8_SCALES;
                    // A latent cache's values are its keys: one scale.
                    if p.is_latent() {
                        data.kv_scales.v = data.kv_scales.k;
                    }
                }
                let KvScales { k, v } = data.kv_scales;
                let cache = blocks * per_block;
                let values = blocks * p.block_size * p.kv_heads * p.cached_v_dim();
                (
                    vec![
                        tensor(&mut rng, dt, p.query_len(), 1.0),
                        tensor(&mut rng, p.kv_dtype, cache, 1.0 / k),
                        tensor(&mut rng, p.kv_dtype, values, 1.0 / v),
                    ],
                    p.out_len(),
                )
            }
        };
        data.inputs = inputs;
        // Drawn last, so a problem's other values are the same with sinks as without. Scaled
        // scores of unit inputs lie within about ±1 and a row sums up to thousands of their
        // exponentials: sinks in [-2, 4) weigh from next to nothing to most of a short row.
        data.sinks.clear();
        data.sinks
            .extend((0..problem.sinks_len()).map(|_| 1.0 + 3.0 * rng.unit()));
        // A model's own slopes (no draw): from 2^-1, under which a score 30 keys back has
        // lost 2^-15 of its weight, to 2^-8 a head at 8 heads, under which a row's weights
        // vary across thousands of keys; every head's differs, so a kernel that reads
        // another head's slope, or counts distance from another position, is caught.
        data.slopes = crate::problem::alibi_slopes(problem.slopes_len());
        data.a_scales.clear();
        data.b_scales.clear();
        data.zeros.clear();
        if let Problem::Gemm(p) = problem {
            if let Some((_, groups)) = p.int4_lens() {
                // Scales of 1/16 to 3/16, so that each weight, up to 15 steps from its zero
                // point, is within about ±2; zero points anywhere in 0..=15, so a kernel that
                // takes another group's or column's, or none, is off by whole steps.
                for _ in 0..groups {
                    data.b_scales.push((2.0 + rng.unit()) / 16.0);
                    data.zeros
                        .push(((rng.unit() + 1.0) * 8.0).floor().min(15.0));
                }
            } else if p.fp8().is_some() {
                let mut scale = || (1.0 + 0.5 * rng.unit()) / Self::FP8_GEMM_GAIN;
                let (a, b) = p.block_scale_lens().unwrap_or((p.m, p.n));
                data.a_scales.extend((0..a).map(|_| scale()));
                data.b_scales.extend((0..b).map(|_| scale()));
            }
        }
        data.out.clear();
        data.out.resize(out, 0.0);
        data
    }

    /// Sets per-sequence context lengths (paged attention), each `1..=context_len`.
    pub fn with_context_lens(mut self, lens: Vec<u32>) -> Self {
        self.context_lens = lens;
        self
    }

    /// The buffers of one call; the output is this struct's `out`.
    pub fn args(&mut self) -> Args<'_> {
        let mut views = [Tensor::F32(&[]); 3];
        for (v, t) in views.iter_mut().zip(&self.inputs) {
            *v = t.view();
        }
        Args::new(
            &self.problem,
            &views[..self.inputs.len()],
            &self.block_tables,
            self.max_blocks_per_seq,
            &self.context_lens,
            crate::kernel::HeadValues {
                sinks: &self.sinks,
                slopes: &self.slopes,
            },
            self.kv_scales,
            GemmScales {
                a: &self.a_scales,
                b: &self.b_scales,
                zeros: &self.zeros,
            },
            &mut self.out,
        )
        .expect("random() makes every input of the family")
    }

    /// An fp8 or int4 GEMM's scales ([`GemmScales::NONE`] for any other problem).
    pub fn gemm_scales(&self) -> GemmScales<'_> {
        GemmScales {
            a: &self.a_scales,
            b: &self.b_scales,
            zeros: &self.zeros,
        }
    }

    /// The sink logits and ALiBi slopes of a call.
    pub fn heads(&self) -> crate::kernel::HeadValues<'_> {
        crate::kernel::HeadValues {
            sinks: &self.sinks,
            slopes: &self.slopes,
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
            .map(|t| t.view().as_bytes().len())
            .sum::<usize>()
            + self.out.len() * 4
            + self.block_tables.len() * 4
            + (self.sinks.len() + self.slopes.len()) * 4
            + (self.a_scales.len() + self.b_scales.len() + self.zeros.len()) * 4
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
            Problem::Flash(p) => p.v_head_dim,
            Problem::Paged(p) => p.v_head_dim,
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
            Problem::Gemm(p) => reference::gemm_rows(
                p,
                self.inputs[0].view(),
                self.inputs[1].view(),
                self.gemm_scales(),
                rows,
            ),
            Problem::Flash(_) | Problem::Paged(_) => {
                rows.par_iter().map(|&r| self.reference_row(r)).collect()
            }
        }
    }

    /// The reference values of output row `r`, in f64.
    pub fn reference_row(&self, r: usize) -> Vec<f64> {
        let i = &self.inputs;
        match &self.problem {
            Problem::Gemm(p) => {
                reference::gemm_row(p, i[0].view(), i[1].view(), self.gemm_scales(), r)
            }
            Problem::Flash(p) => {
                reference::flash_row(p, i[0].view(), i[1].view(), i[2].view(), self.heads(), r)
            }
            Problem::Paged(p) => reference::paged_row(
                p,
                i[0].view(),
                i[1].view(),
                i[2].view(),
                &self.block_tables,
                self.max_blocks_per_seq,
                &self.context_lens,
                self.heads(),
                self.kv_scales,
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
            "gemm:m=3,n=5,k=16,dtype=f16,b=kn,int4=8",
        ] {
            let problem: Problem = spec.parse().unwrap();
            let data = ProblemData::random(&problem, 1);
            for (i, t) in data.inputs.iter().enumerate() {
                let at = t.view().as_bytes().as_ptr() as usize;
                assert_eq!(at % 64, 0, "{spec} input {i} at {at:#x}");
            }
        }
    }

    /// Drawn in another problem's buffers, of any family, dtype or size, the data is what
    /// [`ProblemData::random`] draws.
    #[test]
    fn data_drawn_in_spare_buffers_is_the_same() {
        let specs = [
            "gemm:m=1,n=1,k=1,dtype=f32",
            "gemm:m=7,n=13,k=29,dtype=bf16,b=nk",
            "flash:batch=2,q_len=5,kv_len=7,q_heads=4,kv_heads=2,head_dim=16,causal=true,dtype=bf16",
            "paged:num_seqs=3,context_len=37,q_heads=4,kv_heads=2,head_dim=64,block_size=16,dtype=f16",
            "paged:num_seqs=1,context_len=5,q_heads=2,kv_heads=1,head_dim=64,block_size=8,dtype=bf16",
            "flash:q_len=3,q_heads=2,head_dim=8,sinks=true",
            "paged:num_seqs=2,context_len=9,q_heads=4,kv_heads=1,head_dim=64,sinks=true",
            "gemm:m=5,n=11,k=17,dtype=fp8_e4m3",
            "gemm:m=3,n=9,k=32,dtype=bf16,b=kn,int4=16",
            "gemm:m=2,n=5,k=16,dtype=f32,b=kn,int4=8",
        ];
        for before in specs {
            for spec in specs {
                let problem: Problem = spec.parse().unwrap();
                let spare = ProblemData::random(&before.parse().unwrap(), 9);
                let got = ProblemData::random_reusing(&problem, 4, Some(spare));
                let want = ProblemData::random(&problem, 4);
                let what = format!("{spec} after {before}");
                assert_eq!(got.problem, want.problem, "{what}");
                assert_eq!(got.inputs, want.inputs, "{what}");
                assert_eq!(got.block_tables, want.block_tables, "{what}");
                assert_eq!(got.max_blocks_per_seq, want.max_blocks_per_seq, "{what}");
                assert_eq!(got.context_lens, want.context_lens, "{what}");
                assert_eq!(got.sinks, want.sinks, "{what}");
                assert_eq!(got.a_scales, want.a_scales, "{what}");
                assert_eq!(got.b_scales, want.b_scales, "{what}");
                assert_eq!(got.zeros, want.zeros, "{what}");
                assert_eq!(got.out, want.out, "{what}");
            }
        }
    }

    #[test]
    fn a_spare_buffer_large_enough_is_kept() {
        let large = ProblemData::random(&"gemm:m=4,n=64,k=64,dtype=bf16".parse().unwrap(), 1);
        let at = large.inputs[1].view().as_bytes().as_ptr();
        let small = "gemm:m=2,n=16,k=32,dtype=bf16".parse().unwrap();
        let data = ProblemData::random_reusing(&small, 1, Some(large));
        assert_eq!(data.inputs[1].view().as_bytes().as_ptr(), at);
    }
}
