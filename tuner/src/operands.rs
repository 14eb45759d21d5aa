//! The operands a problem is verified and timed on, in memory that a run keeps from one
//! problem to the next: the verification copy, and the copies cold timing rotates through.
//!
//! Every problem's copies add up to twice the last-level cache at least, hundreds of MiB on a
//! server CPU, and memory the process has not touched before costs a page fault per 4 KiB,
//! each page zeroed by the kernel. On a cloud VM whose host backs guest memory lazily, that
//! was 2 to 4 s a problem, more than the search's own budget of 2 s (the main job on a
//! 2-core Xeon, session 34; see bench/HISTORY.md). Pages a process already holds cost
//! nothing to refill, so the next problem's data is drawn in the buffers of the one before,
//! and the copies live in one buffer that grows only when a problem needs more.

use kerntune_kernels::data::ProblemData;
use kerntune_kernels::kernel::Args;
use kerntune_kernels::{DType, Problem, Tensor};

/// Where every buffer of a copy starts: a cache-line boundary, as a tensor of PyTorch's
/// allocator (and [`kerntune_kernels::TensorBuf`]) does.
const ALIGN: usize = 64;

/// One problem's operands: the verification copy (copy 0) and the rotation's copies (1 and
/// up), each laid out alike in one buffer. Outside this crate, the memory a
/// [`crate::measure::Workload`] hands on to the next.
#[derive(Debug, Default)]
pub struct Operands {
    first: Option<ProblemData>,
    buf: Vec<u8>,
    /// Where copy 0 starts in `buf`: its first 64-byte boundary.
    base: usize,
    /// Bytes from one copy to the next.
    stride: usize,
    copies: usize,
    /// Offset in a copy, element type ([`Tensor::dtype`]'s) and length in bytes of each
    /// input.
    inputs: Vec<(usize, Option<DType>, usize)>,
    /// Offset in a copy and length in bytes of the paged block tables, the context lengths
    /// and the output.
    tables: (usize, usize),
    lens: (usize, usize),
    out: (usize, usize),
}

impl Operands {
    /// Draws `problem`'s data (as [`ProblemData::random`] with `seed`) in the verification
    /// copy's buffers, and drops the rotation's copies until [`Operands::rotate`].
    pub(crate) fn draw(&mut self, problem: &Problem, seed: u64) -> &ProblemData {
        self.copies = 0;
        let first = ProblemData::random_reusing(problem, seed, self.first.take());
        self.first.insert(first)
    }

    /// The verification copy, as drawn last.
    pub(crate) fn first(&self) -> &ProblemData {
        self.first.as_ref().expect("operands are drawn before use")
    }

    /// The verification copy, whose output a verification poisons before its call.
    pub(crate) fn first_mut(&mut self) -> &mut ProblemData {
        self.first.as_mut().expect("operands are drawn before use")
    }

    /// How many copies there are: the verification copy and the rotation's.
    pub(crate) fn copies(&self) -> usize {
        1 + self.copies
    }

    /// Fills the rotation with `copies` copies of the verification copy, growing its buffer
    /// only when it holds fewer bytes than they need. A `Vec<u8>` on purpose: growing one
    /// reallocates in place where the system allocator can (a large block is remapped, not
    /// copied), so the pages of the problems before are kept and only new ones are touched.
    pub(crate) fn rotate(&mut self, copies: usize) {
        let first = self.first.as_ref().expect("operands are drawn before use");
        let mut end = 0;
        let mut place = |bytes: usize| {
            let at = end;
            end = (end + bytes).next_multiple_of(ALIGN);
            (at, bytes)
        };
        self.inputs = first
            .inputs
            .iter()
            .map(|t| {
                let (at, bytes) = place(t.view().as_bytes().len());
                (at, t.view().dtype(), bytes)
            })
            .collect();
        self.tables = place(std::mem::size_of_val(first.block_tables.as_slice()));
        self.lens = place(std::mem::size_of_val(first.context_lens.as_slice()));
        self.out = place(std::mem::size_of_val(first.out.as_slice()));
        self.stride = end.max(ALIGN);
        self.copies = copies;
        let needed = ALIGN + copies * self.stride;
        if self.buf.len() < needed {
            self.buf.resize(needed, 0);
        }
        self.base = self.buf.as_ptr().align_offset(ALIGN);
        let parts: Vec<((usize, usize), &[u8])> = self
            .inputs
            .iter()
            .zip(&first.inputs)
            .map(|(&(at, _, bytes), t)| ((at, bytes), t.view().as_bytes()))
            .chain([
                (self.tables, bytemuck::cast_slice(&first.block_tables)),
                (self.lens, bytemuck::cast_slice(&first.context_lens)),
                (self.out, bytemuck::cast_slice(&first.out)),
            ])
            .collect();
        for copy in self.buf[self.base..]
            .chunks_exact_mut(self.stride)
            .take(copies)
        {
            for &((at, bytes), from) in &parts {
                copy[at..at + bytes].copy_from_slice(from);
            }
        }
    }

    /// The buffers of one call on copy `copy`, below [`Operands::copies`].
    pub(crate) fn args(&mut self, copy: usize) -> Args<'_> {
        let first = self.first.as_mut().expect("operands are drawn before use");
        if copy == 0 {
            return first.args();
        }
        let (problem, max_blocks_per_seq) = (first.problem, first.max_blocks_per_seq);
        let start = self.base + (copy - 1) * self.stride;
        let (head, out) = self.buf[start..start + self.stride].split_at_mut(self.out.0);
        let head: &[u8] = head;
        let bytes = |(at, len): (usize, usize)| &head[at..at + len];
        let mut views = [Tensor::F32(&[]); 3];
        for (v, &(at, dtype, len)) in views.iter_mut().zip(&self.inputs) {
            *v = Tensor::from_bytes(dtype, bytes((at, len))).expect("inputs start on 64 bytes");
        }
        Args::new(
            &problem,
            &views[..self.inputs.len()],
            bytemuck::cast_slice(bytes(self.tables)),
            max_blocks_per_seq,
            bytemuck::cast_slice(bytes(self.lens)),
            // A few floats, read only (the sinks and slopes, an fp8 GEMM's scales): every copy
            // shares the verification copy's.
            first.heads(),
            first.kv_scales,
            first.gemm_scales(),
            bytemuck::cast_slice_mut(&mut out[..self.out.1]),
        )
        .expect("a copy holds every input of the problem it was filled with")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(spec: &str) -> Problem {
        spec.parse().unwrap()
    }

    /// Every copy's arguments hold the verification copy's values, at addresses of their own.
    fn assert_copies_match(operands: &mut Operands) {
        let first = operands.first();
        let want: Vec<Vec<u8>> = first
            .inputs
            .iter()
            .map(|t| t.view().as_bytes().to_vec())
            .collect();
        let (tables, lens, paged) = (
            first.block_tables.clone(),
            first.context_lens.clone(),
            matches!(first.problem, Problem::Paged(_)),
        );
        let out_len = first.out.len();
        let mut outs = Vec::new();
        for copy in 0..operands.copies() {
            let (inputs, got_tables, got_lens, out): (Vec<Tensor>, &[u32], &[u32], &mut [f32]) =
                match operands.args(copy) {
                    Args::Gemm(g) => (vec![g.a, g.b], &[], &[], g.c),
                    Args::Flash(f) => (vec![f.q, f.k, f.v], &[], &[], f.out),
                    Args::Paged(p) => (
                        vec![p.query, p.key_cache, p.value_cache],
                        p.block_tables,
                        p.context_lens,
                        p.out,
                    ),
                };
            assert_eq!(inputs.len(), want.len());
            for (t, want) in inputs.iter().zip(&want) {
                assert_eq!(t.as_bytes(), want.as_slice(), "copy {copy}");
                assert_eq!(t.as_bytes().as_ptr() as usize % ALIGN, 0);
            }
            if paged {
                assert_eq!(got_tables, tables.as_slice());
                assert_eq!(got_lens, lens.as_slice());
            }
            assert_eq!(out.len(), out_len);
            outs.push(out.as_ptr() as usize);
        }
        outs.sort_unstable();
        outs.dedup();
        assert_eq!(
            outs.len(),
            operands.copies(),
            "every copy writes its own output"
        );
    }

    #[test]
    fn every_copy_holds_the_verification_copys_values_for_every_family_and_odd_size() {
        let mut operands = Operands::default();
        for spec in [
            "gemm:m=1,n=1,k=1,dtype=f32",
            "gemm:m=7,n=13,k=29,dtype=bf16,b=nk",
            "gemm:m=3,n=5,k=11,dtype=f16",
            "flash:batch=1,q_len=5,kv_len=7,q_heads=2,kv_heads=1,head_dim=16,causal=true,dtype=bf16",
            "paged:num_seqs=3,context_len=37,q_heads=4,kv_heads=2,head_dim=64,block_size=16,dtype=f16",
            // A latent cache: no value cache, an empty operand.
            "paged:num_seqs=2,context_len=37,q_heads=4,kv_heads=1,head_dim=72,v_head_dim=64,dtype=bf16",
        ] {
            let drawn = operands.draw(&problem(spec), 3).inputs.clone();
            assert_eq!(drawn, ProblemData::random(&problem(spec), 3).inputs);
            assert_eq!(operands.copies(), 1, "no rotation before it is filled");
            operands.rotate(5);
            assert_eq!(operands.copies(), 6);
            assert_copies_match(&mut operands);
        }
    }

    #[test]
    fn the_rotations_buffer_is_kept_for_smaller_problems_and_grows_for_larger_ones() {
        let mut operands = Operands::default();
        operands.draw(&problem("gemm:m=64,n=64,k=64,dtype=f32"), 1);
        operands.rotate(4);
        let (at, len) = (operands.buf.as_ptr(), operands.buf.len());
        operands.draw(&problem("gemm:m=2,n=3,k=5,dtype=bf16"), 2);
        operands.rotate(4);
        assert_eq!((operands.buf.as_ptr(), operands.buf.len()), (at, len));
        assert_copies_match(&mut operands);
        operands.draw(&problem("gemm:m=64,n=128,k=64,dtype=f32"), 3);
        operands.rotate(4);
        assert!(operands.buf.len() > len);
        assert_copies_match(&mut operands);
    }
}
