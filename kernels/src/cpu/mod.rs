//! The CPU backend, the default: runs everywhere, SIMD chosen at run time.
//!
//! Module map: [`simd`] is the vector vocabulary, [`leaf`] the innermost loops written over it,
//! [`table`] their per-ISA instantiation, [`parallel`] and [`team`] the threads; [`gemm`],
//! [`flash`] and [`paged`] are the three kernel drivers. bf16 GEMM has variants of its own:
//! [`dpbf16`] and [`dpbf16_stream`] on AVX-512-BF16, [`amx`] on AMX tiles (whose instructions, and
//! a software model of them for the tests, are in [`amx_tiles`]). [`direct`] reads a Linear layer's
//! weights in place, on the f32 tables or the AVX-512-BF16 pair kernels, and [`amx_direct`] on AMX
//! tiles. [`flash_pairs`] is flash attention with both products on bf16 pairs (AMX tiles or
//! AVX-512-BF16), [`paged_amx`] paged attention on AMX tiles.

mod amx;
mod amx_direct;
mod amx_tiles;
mod direct;
pub(crate) mod dpbf16;
mod dpbf16_stream;
mod flash;
mod flash_pairs;
mod fp8_bf16;
mod gemm;
mod int4;
#[cfg(target_arch = "x86_64")]
mod int4_dpbf16;
mod leaf;
mod paged;
#[cfg(target_arch = "x86_64")]
mod paged_amx;
#[cfg(target_arch = "x86_64")]
mod paged_elems;
#[cfg(target_arch = "x86_64")]
mod paged_tiles;
#[cfg(target_arch = "x86_64")]
mod paged_tiles_avx2;
pub(crate) mod parallel;
pub(crate) mod simd;
pub(crate) mod table;
mod team;
mod transpose;

pub(crate) use amx_direct::scratch_len as amx_direct_scratch_len;
pub(crate) use paged::{part_len as paged_part_len, turn_tokens as paged_turn_tokens};

use half::{bf16, f16};

use crate::config::GemmVariant;
use crate::kernel::{
    check_dtype, check_len, Args, Backend, FlashArgs, GemmArgs, HeadValues, PagedArgs,
};
use crate::space::{CpuSpace, Space};
use crate::{BLayout, Config, Device, Fp8, KernelError, Problem, Result, Tensor};

/// Runs kernels on the host CPU.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn scratch_len(&self, problem: &Problem, config: &Config) -> usize {
        let len = match (problem, config) {
            (Problem::Gemm(p), Config::Gemm(c)) if p.int4.is_some() => match p
                .dequantized_as(c.variant.int4_pass_layout())
            {
                // Dequantized first: the weights and the dense kernel's scratch.
                #[cfg(target_arch = "x86_64")]
                Some(_) if c.variant == GemmVariant::StreamDpbf16 => int4_dpbf16::scratch_len(p),
                Some(dense) if c.variant != GemmVariant::Stream => {
                    int4::dequantize_scratch_len(p, c.threads)
                        + self.scratch_len(&Problem::Gemm(dense), config)
                }
                _ => int4::scratch_len(p),
            },
            (Problem::Gemm(p), Config::Gemm(c)) => gemm::scratch_len(p, c),
            (Problem::Flash(p), Config::Flash(c)) if c.amx || c.dpbf16 => {
                flash_pairs::scratch_len(p, c)
            }
            (Problem::Flash(p), Config::Flash(c)) => flash::scratch_len(p, c),
            (Problem::Paged(p), Config::Paged(c)) => paged::scratch_len(p, c),
            _ => 0,
        };
        // Room to start the kernels' scratch on a cache line, wherever the caller's begins.
        if len == 0 {
            0
        } else {
            len + parallel::LINE_WORDS
        }
    }

    fn run(
        &self,
        problem: &Problem,
        config: &Config,
        args: Args<'_>,
        scratch: &mut [f32],
    ) -> Result<()> {
        CpuSpace.validate(config, problem, Device::host_ref())?;
        let needed = self.scratch_len(problem, config);
        if scratch.len() < needed {
            return Err(KernelError::ScratchTooSmall {
                needed,
                got: scratch.len(),
            });
        }
        // Packed slivers on whole cache lines: an AMX tile row or AVX-512 load that straddles
        // two lines costs two.
        let skip = scratch.as_ptr().align_offset(64).min(scratch.len());
        let scratch = &mut scratch[skip..];
        match (problem, config, args) {
            (Problem::Gemm(p), Config::Gemm(c), Args::Gemm(args)) => {
                let GemmArgs {
                    a,
                    b,
                    scales,
                    c: out,
                } = args;
                check_dtype("a", &a, p.dtype)?;
                if p.int4.is_some() {
                    if !matches!(b, Tensor::Int4(_)) {
                        return Err(KernelError::BadBuffer {
                            name: "b",
                            reason: format!(
                                "is {}; this GEMM's weights are int4, [K / 8, N] words",
                                b.describe()
                            ),
                        });
                    }
                } else {
                    check_dtype("b", &b, p.dtype)?;
                }
                check_len("a", a.len(), p.a_len())?;
                check_len("b", b.len(), p.b_len())?;
                check_len("c", out.len(), p.c_len())?;
                scales.check(p)?;
                use simd::{E4m3Bits, E5m2Bits};
                let layout = c.variant.int4_pass_layout();
                if let (Some(dense), Tensor::Int4(words)) = (p.dequantized_as(layout), b) {
                    let streams = [GemmVariant::Stream, GemmVariant::StreamDpbf16];
                    if !streams.contains(&c.variant) {
                        let dense = Problem::Gemm(dense);
                        let s = scratch;
                        let nk = layout == BLayout::Nk;
                        let (b, rest) = match a {
                            // The kernels reading B in place take f32 and bf16 (validated).
                            Tensor::F32(_) if nk => {
                                let (w, rest) = int4::dequantize_nk::<f32>(p, c, words, scales, s);
                                (Tensor::F32(w), rest)
                            }
                            Tensor::Bf16(_) if nk => {
                                let (w, rest) = int4::dequantize_nk::<bf16>(p, c, words, scales, s);
                                (Tensor::Bf16(w), rest)
                            }
                            Tensor::F32(_) => {
                                let (w, rest) = int4::dequantize::<f32>(p, c, words, scales, s);
                                (Tensor::F32(w), rest)
                            }
                            Tensor::F16(_) => {
                                let (w, rest) = int4::dequantize::<f16>(p, c, words, scales, s);
                                (Tensor::F16(w), rest)
                            }
                            Tensor::Bf16(_) => {
                                let (w, rest) = int4::dequantize::<bf16>(p, c, words, scales, s);
                                (Tensor::Bf16(w), rest)
                            }
                            Tensor::Fp8(..) | Tensor::Int4(_) => unreachable!("dtype checked"),
                        };
                        let args = Args::Gemm(GemmArgs::new(a, b, out));
                        return self.run(&dense, config, args, rest);
                    }
                }
                match (a, b) {
                    // Validated on AVX-512-BF16 hosts only, which are x86-64.
                    #[cfg(target_arch = "x86_64")]
                    (Tensor::Bf16(a), Tensor::Int4(w))
                        if c.variant == GemmVariant::StreamDpbf16 =>
                    {
                        int4_dpbf16::run(p, c, a, w, scales, out, scratch)
                    }
                    (Tensor::F32(a), Tensor::Int4(w)) => {
                        int4::run(p, c, a, w, scales, out, scratch)
                    }
                    (Tensor::F16(a), Tensor::Int4(w)) => {
                        int4::run(p, c, a, w, scales, out, scratch)
                    }
                    (Tensor::Bf16(a), Tensor::Int4(w)) => {
                        int4::run(p, c, a, w, scales, out, scratch)
                    }
                    (Tensor::F32(a), Tensor::F32(b)) if c.variant == GemmVariant::Direct => {
                        direct::run_f32(p, c, a, b, out, scratch)
                    }
                    (Tensor::Bf16(a), Tensor::Bf16(b)) if c.variant == GemmVariant::Direct => {
                        direct::run_bf16(p, c, a, b, out, scratch)
                    }
                    (Tensor::F32(a), Tensor::F32(b)) => gemm::run(p, c, a, b, out, scratch),
                    (Tensor::F16(a), Tensor::F16(b)) => gemm::run::<f16>(p, c, a, b, out, scratch),
                    (Tensor::Bf16(a), Tensor::Bf16(b)) if c.variant == GemmVariant::Dpbf16 => {
                        dpbf16::run(p, c, a, b, out, scratch)
                    }
                    (Tensor::Bf16(a), Tensor::Bf16(b)) if c.variant == GemmVariant::Amx => {
                        amx::run(p, c, a, b, out, scratch)
                    }
                    (Tensor::Bf16(a), Tensor::Bf16(b)) if c.variant == GemmVariant::AmxDirect => {
                        amx_direct::run(p, c, a, b, out, scratch)
                    }
                    (Tensor::Bf16(a), Tensor::Bf16(b))
                        if c.variant == GemmVariant::StreamDpbf16 =>
                    {
                        dpbf16_stream::run(p, c, a, b, out)
                    }
                    (Tensor::Bf16(a), Tensor::Bf16(b)) => {
                        gemm::run::<bf16>(p, c, a, b, out, scratch)
                    }
                    // The kernels multiply the bytes' f16 readings; the formats' factors and
                    // the call's scales are applied to C after (a block-scaled GEMM's scales
                    // inside, on amx-direct or the stream kernel, the two validation admits).
                    (Tensor::Fp8(format, a), Tensor::Fp8(_, b))
                        if p.block.is_some() && c.variant == GemmVariant::AmxDirect =>
                    {
                        amx_direct::run_fp8_blocks(p, c, format, a, b, scales, out, scratch);
                        gemm::scale(p, c, scales, out);
                    }
                    (Tensor::Fp8(Fp8::E5m2, a), Tensor::Fp8(_, b)) if p.block.is_some() => {
                        let (a, b): (&[E5m2Bits], _) = (cast(a), cast(b));
                        gemm::stream_blocks(p, c, a, b, scales, out, scratch);
                        gemm::scale(p, c, scales, out);
                    }
                    (Tensor::Fp8(_, a), Tensor::Fp8(_, b)) if p.block.is_some() => {
                        let (a, b): (&[E4m3Bits], _) = (cast(a), cast(b));
                        gemm::stream_blocks(p, c, a, b, scales, out, scratch);
                        gemm::scale(p, c, scales, out);
                    }
                    (Tensor::Fp8(format, a), Tensor::Fp8(_, b))
                        if c.variant == GemmVariant::Amx =>
                    {
                        amx::run_fp8(p, c, format, a, b, out, scratch);
                        gemm::scale(p, c, scales, out);
                    }
                    (Tensor::Fp8(format, a), Tensor::Fp8(_, b))
                        if c.variant == GemmVariant::AmxDirect =>
                    {
                        amx_direct::run_fp8(p, c, format, a, b, out, scratch);
                        gemm::scale(p, c, scales, out);
                    }
                    (Tensor::Fp8(format, a), Tensor::Fp8(_, b))
                        if c.variant == GemmVariant::StreamDpbf16 =>
                    {
                        dpbf16_stream::run_fp8(p, c, format, a, b, out, scratch);
                        gemm::scale(p, c, scales, out);
                    }
                    (Tensor::Fp8(Fp8::E5m2, a), Tensor::Fp8(_, b)) => {
                        let (a, b): (&[E5m2Bits], _) = (cast(a), cast(b));
                        gemm::run(p, c, a, b, out, scratch);
                        gemm::scale(p, c, scales, out);
                    }
                    (Tensor::Fp8(_, a), Tensor::Fp8(_, b)) => {
                        let (a, b): (&[E4m3Bits], _) = (cast(a), cast(b));
                        gemm::run(p, c, a, b, out, scratch);
                        gemm::scale(p, c, scales, out);
                    }
                    _ => unreachable!("dtypes checked above"),
                }
            }
            (Problem::Flash(p), Config::Flash(c), Args::Flash(a)) => {
                let FlashArgs {
                    q,
                    k,
                    v,
                    sinks,
                    slopes,
                    out,
                } = a;
                for (name, t) in [("q", &q), ("k", &k), ("v", &v)] {
                    check_dtype(name, t, p.dtype)?;
                }
                check_len("q", q.len(), p.q_len_elems())?;
                check_len("k", k.len(), p.kv_len_elems())?;
                check_len("v", v.len(), p.v_len_elems())?;
                check_len("sinks", sinks.len(), problem.sinks_len())?;
                check_len("slopes", slopes.len(), problem.slopes_len())?;
                check_len("out", out.len(), p.out_len())?;
                let heads = HeadValues { sinks, slopes };
                match (q, k, v) {
                    (Tensor::F32(q), Tensor::F32(k), Tensor::F32(v)) => {
                        flash::run(p, c, q, k, v, heads, out, scratch)
                    }
                    (Tensor::F16(q), Tensor::F16(k), Tensor::F16(v)) => {
                        flash::run(p, c, q, k, v, heads, out, scratch)
                    }
                    (Tensor::Bf16(q), Tensor::Bf16(k), Tensor::Bf16(v)) if c.amx || c.dpbf16 => {
                        flash_pairs::run(p, c, q, k, v, heads, out, scratch)
                    }
                    (Tensor::Bf16(q), Tensor::Bf16(k), Tensor::Bf16(v)) => {
                        flash::run(p, c, q, k, v, heads, out, scratch)
                    }
                    _ => unreachable!("dtypes checked above"),
                }
            }
            (Problem::Paged(p), Config::Paged(c), Args::Paged(a)) => run_paged(p, c, a, scratch)?,
            (problem, config, _) => {
                return Err(KernelError::BadBuffer {
                    name: "args",
                    reason: format!(
                        "{} buffers given for a {} problem with a {} config",
                        "other-family",
                        problem.family(),
                        config.family()
                    ),
                })
            }
        }
        Ok(())
    }
}

fn run_paged(
    p: &crate::PagedProblem,
    c: &crate::config::PagedConfig,
    a: PagedArgs<'_>,
    scratch: &mut [f32],
) -> Result<()> {
    check_dtype("query", &a.query, p.dtype)?;
    check_dtype("key_cache", &a.key_cache, p.kv_dtype)?;
    crate::kernel::check_value_cache(p, &a.value_cache)?;
    a.kv_scales.check(p)?;
    check_len("query", a.query.len(), p.query_len())?;
    check_len("out", a.out.len(), p.out_len())?;
    check_len("context_lens", a.context_lens.len(), p.num_seqs)?;
    check_len("sinks", a.sinks.len(), Problem::Paged(*p).sinks_len())?;
    check_len("slopes", a.slopes.len(), Problem::Paged(*p).slopes_len())?;
    let row = p.block_size * p.kv_heads * p.head_dim;
    let values = a.key_cache.len() / p.head_dim * p.cached_v_dim();
    if !a.key_cache.len().is_multiple_of(row) || a.value_cache.len() != values {
        return Err(KernelError::BadBuffer {
            name: "key_cache",
            reason: format!(
                "K ({}) and V ({}) caches must be equal whole blocks of block_size·kv_heads·head_dim = {row}",
                a.key_cache.len(),
                a.value_cache.len()
            ),
        });
    }
    let num_blocks = a.key_cache.len() / row;
    if a.max_blocks_per_seq < p.max_blocks_per_seq() {
        return Err(KernelError::BadBuffer {
            name: "block_tables",
            reason: format!(
                "max_blocks_per_seq = {} cannot cover context_len = {} in blocks of {}",
                a.max_blocks_per_seq, p.context_len, p.block_size
            ),
        });
    }
    check_len(
        "block_tables",
        a.block_tables.len(),
        p.num_seqs * a.max_blocks_per_seq,
    )?;
    for (s, &len) in a.context_lens.iter().enumerate() {
        let len = len as usize;
        if len == 0 || len > p.context_len {
            return Err(KernelError::BadBuffer {
                name: "context_lens",
                reason: format!(
                    "sequence {s} has context length {len}; must be 1..={}",
                    p.context_len
                ),
            });
        }
        let used = &a.block_tables[s * a.max_blocks_per_seq..][..len.div_ceil(p.block_size)];
        if let Some(&bad) = used.iter().find(|&&b| b as usize >= num_blocks) {
            return Err(KernelError::BadBuffer {
                name: "block_tables",
                reason: format!(
                    "sequence {s} refers to block {bad}; the caches hold {num_blocks} blocks"
                ),
            });
        }
    }
    let mb = a.max_blocks_per_seq;
    let tables = (a.block_tables, mb, a.context_lens);
    let heads = HeadValues {
        sinks: a.sinks,
        slopes: a.slopes,
    };
    let extra = (heads, a.kv_scales.for_kernels(p));
    // Each combination of query and cache types the problem validation admits.
    macro_rules! run {
        ($q:expr, $k:expr, $v:expr) => {
            paged::run(
                p, c, $q, $k, $v, tables.0, tables.1, tables.2, extra, a.out, scratch,
            )
        };
    }
    use simd::{E4m3Bits, E5m2Bits};
    let e4m3 = cast::<E4m3Bits>;
    let e5m2 = cast::<E5m2Bits>;
    // A latent cache's values are read from its key rows.
    let value_cache = if p.is_latent() {
        a.key_cache
    } else {
        a.value_cache
    };
    match (a.query, a.key_cache, value_cache) {
        (Tensor::F32(q), Tensor::F32(k), Tensor::F32(v)) => run!(q, k, v),
        (Tensor::F16(q), Tensor::F16(k), Tensor::F16(v)) => run!(q, k, v),
        (Tensor::Bf16(q), Tensor::Bf16(k), Tensor::Bf16(v)) => run!(q, k, v),
        (Tensor::F16(q), Tensor::Fp8(Fp8::E5m2, k), Tensor::Fp8(_, v)) => {
            run!(q, e5m2(k), e5m2(v))
        }
        (Tensor::F16(q), Tensor::Fp8(_, k), Tensor::Fp8(_, v)) => run!(q, e4m3(k), e4m3(v)),
        (Tensor::Bf16(q), Tensor::Fp8(Fp8::E5m2, k), Tensor::Fp8(_, v)) => {
            run!(q, e5m2(k), e5m2(v))
        }
        (Tensor::Bf16(q), Tensor::Fp8(_, k), Tensor::Fp8(_, v)) => run!(q, e4m3(k), e4m3(v)),
        _ => unreachable!("dtypes checked above"),
    }
    Ok(())
}

/// fp8 bytes as the kernels' element type for their format.
fn cast<T: bytemuck::Pod>(bytes: &[u8]) -> &[T] {
    bytemuck::cast_slice(bytes)
}

/// The weight `2^(sink − m)` that query head `head`'s sink adds to a softmax sum whose
/// maximum is `m` (the kernels' scores are in base 2); 0 without sinks.
pub(super) fn sink_weight(sinks: &[f32], head: usize, m: f32) -> f32 {
    match sinks.get(head) {
        Some(&s) => (s * std::f32::consts::LOG2_E - m).exp2(),
        None => 0.0,
    }
}

/// Microkernel shapes (mr, nr) of the AVX-512-BF16 GEMM variant.
pub const DPBF16_SHAPES: &[(usize, usize)] = dpbf16::BF16_SHAPES;

/// Microkernel shapes (mr, nr) of the AMX GEMM variant.
pub const AMX_SHAPES: &[(usize, usize)] = amx::AMX_SHAPES;

/// Microkernel shapes (MR, NR) available for an ISA level, as GEMM configs name them.
pub fn microkernel_shapes(isa: crate::Isa) -> Vec<(usize, usize)> {
    table::table(isa).shapes.to_vec()
}
