//! bf16 GEMM on AMX tiles (`tdpbf16ps`, Sapphire Rapids and later): the packed loop nest of
//! [`super::gemm`] with a microkernel of 16 × 16 f32 accumulator tiles, each instruction a
//! 16 × 16 × 32 multiply-add, f32 accumulation.
//!
//! A sliver is stored as the A tiles load it: `[k block][mr rows][16 pairs]` (32 consecutive k
//! values of a row fill one 64-byte tile row), so packing A copies row segments. A B sliver is
//! the pair layout of [`super::dpbf16`], `[pairs][nr]`, which is what a B tile (the "VNNI" rows
//! of 16 columns × one pair) loads with a stride of `nr` words. Depth is padded with zeros to
//! whole 32-value blocks, since the tiles stay configured for full 16-pair rows.
//!
//! An fp8 GEMM runs here too: its bytes are widened to bf16 as they are packed (exactly, see
//! [`super::fp8_bf16`]), a B sliver's rows first into a row-major bf16 copy at the end of the
//! thread's panel, which the bf16 packing then transposes.
//!
//! The instructions go through [`super::amx_tiles::Tiles`]: the hardware where the host has
//! AMX, and in this module's tests a software model, so packing, strides and edges are verified
//! on every machine.

use half::bf16;

use super::amx_tiles::{c_tile, Configured, TileConfig, Tiles, A_TILE, B_TILE, ROWS, ROW_BYTES};
use crate::config::GemmConfig;
use crate::problem::{BLayout, GemmProblem};
use crate::Fp8;

/// What a call multiplies: bf16 values, or fp8 bytes widened to bf16 as they are packed.
#[derive(Debug, Clone, Copy)]
pub(super) enum Operands<'a> {
    Bf16(&'a [bf16], &'a [bf16]),
    Fp8(Fp8, &'a [u8], &'a [u8]),
}

/// Microkernel shapes (mr, nr): 2 × 2, 1 × 2 or 2 × 1 accumulator tiles, with one A tile per
/// 16 rows and one B tile per 16 columns, within AMX's eight tile registers.
pub const AMX_SHAPES: &[(usize, usize)] = &[(32, 32), (16, 32), (32, 16)];

/// bf16 pairs in one tile row: a k block is 32 values deep.
const BLOCK_PAIRS: usize = ROW_BYTES / 4;

/// Pair rows of a `kcur`-deep slice, padded to whole k blocks.
pub(super) fn depth(kcur: usize) -> usize {
    kcur.div_ceil(2 * BLOCK_PAIRS) * BLOCK_PAIRS
}

/// Scratch (32-bit words) a call needs: one packed A block and one B panel per thread, and
/// for fp8 the bf16 copy of one B sliver's rows.
pub fn scratch_len(p: &GemmProblem, c: &GemmConfig) -> usize {
    let mc = c.mc.min(p.m.next_multiple_of(c.mr));
    let copy = match p.fp8() {
        Some(_) => (c.nr * c.kc.min(p.k)).div_ceil(2),
        None => 0,
    };
    super::parallel::shares_len(
        c.threads,
        mc * depth(c.kc.min(p.k)) + panel_words(p, c) + copy,
    )
}

/// Words of one thread's packed B panel.
fn panel_words(p: &GemmProblem, c: &GemmConfig) -> usize {
    depth(c.kc.min(p.k)) * c.nc.min(p.n.next_multiple_of(c.nr))
}

/// Runs a config validated against the detected host (dtype bf16, a shape of [`AMX_SHAPES`],
/// a host whose level is `avx512-amx`, which includes the kernel's permission for tile data).
pub fn run(
    p: &GemmProblem,
    c: &GemmConfig,
    a: &[bf16],
    b: &[bf16],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    debug_assert_eq!(crate::CpuInfo::detect().isa, crate::Isa::Avx512Amx);
    run_on::<super::amx_tiles::Hardware>(p, c, Operands::Bf16(a, b), out, scratch);
}

/// [`run`] for an fp8 GEMM: C is the sums of the bytes' f16 readings, which
/// [`super::gemm::scale`] turns into values.
pub fn run_fp8(
    p: &GemmProblem,
    c: &GemmConfig,
    format: Fp8,
    a: &[u8],
    b: &[u8],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    debug_assert_eq!(crate::CpuInfo::detect().isa, crate::Isa::Avx512Amx);
    run_on::<super::amx_tiles::Hardware>(p, c, Operands::Fp8(format, a, b), out, scratch);
}

/// The kernel on a given implementation of the tile operations.
pub(super) fn run_on<T: Tiles + Default>(
    p: &GemmProblem,
    c: &GemmConfig,
    ops: Operands<'_>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let (mr, nr) = (c.mr, c.nr);
    let ukr: Ukr<T> = match (mr, nr) {
        (32, 32) => ukr::<T, 2, 2>,
        (16, 32) => ukr::<T, 1, 2>,
        (32, 16) => ukr::<T, 2, 1>,
        _ => unreachable!("validated configs have an AMX shape"),
    };
    let words = super::dpbf16::pair_words(scratch);
    let panel = panel_words(p, c);
    super::gemm::loop_nest(
        p,
        c,
        out,
        words,
        depth,
        |pc, kcur, jc, ncur, dst| match ops {
            Operands::Bf16(_, b) => {
                super::dpbf16::pack_b(p, b, pc, kcur, jc, ncur, nr, depth(kcur), dst)
            }
            Operands::Fp8(format, _, b) => {
                let (panel, copy) = dst.split_at_mut(panel);
                pack_b_fp8(p, format, b, (pc, kcur), (jc, ncur), nr, panel, copy)
            }
        },
        |ic, mcur, pc, kcur, dst| match ops {
            Operands::Bf16(a, _) => pack_a(p, ic, mcur, pc, kcur, mr, dst, |at, row| {
                row.copy_from_slice(&a[at..at + row.len()])
            }),
            Operands::Fp8(format, a, _) => pack_a(p, ic, mcur, pc, kcur, mr, dst, |at, row| {
                super::fp8_bf16::widen(format, &a[at..at + row.len()], row)
            }),
        },
        // SAFETY: validation checked the host runs AMX, or T is the software model.
        || unsafe { Configured::new(T::default(), &TileConfig::full(mr / ROWS, nr / ROWS)) },
        // SAFETY: loop_nest's contract on slivers (`depth` pair rows) and C; the task's tiles
        // are configured for this shape.
        |tiles, d, ap, bp, cp, rows, cols, accumulate| unsafe {
            ukr(&mut **tiles, d, ap, bp, cp, p.n, rows, cols, accumulate)
        },
    );
}

/// Packs `kcur` rows × `ncur` columns of an fp8 B into `nr`-column slivers of bf16 pairs,
/// [`super::dpbf16::pack_b`]'s layout: each sliver's bytes widened into `copy` as the bf16
/// rows of a `[live, kcur]` (`b=nk`) or `[kcur, live]` (`b=kn`) matrix, which that packing
/// then transposes into pairs.
#[allow(clippy::too_many_arguments)]
fn pack_b_fp8(
    p: &GemmProblem,
    format: Fp8,
    b: &[u8],
    (pc, kcur): (usize, usize),
    (jc, ncur): (usize, usize),
    nr: usize,
    panel: &mut [u32],
    copy: &mut [u32],
) {
    let d = depth(kcur);
    // SAFETY: bf16 is two bytes with alignment 2, and any bits are a bf16.
    let copy =
        unsafe { std::slice::from_raw_parts_mut(copy.as_mut_ptr().cast::<bf16>(), 2 * copy.len()) };
    for (s, sliver) in panel[..ncur.next_multiple_of(nr) * d]
        .chunks_exact_mut(nr * d)
        .enumerate()
    {
        let j0 = jc + s * nr;
        let live = nr.min(jc + ncur - j0);
        let rows = &mut copy[..live * kcur];
        match p.b_layout {
            BLayout::Nk => {
                for (j, row) in rows.chunks_exact_mut(kcur).enumerate() {
                    let at = (j0 + j) * p.k + pc;
                    super::fp8_bf16::widen(format, &b[at..at + kcur], row);
                }
            }
            BLayout::Kn => {
                for (q, row) in rows.chunks_exact_mut(live).enumerate() {
                    let at = (pc + q) * p.n + j0;
                    super::fp8_bf16::widen(format, &b[at..at + live], row);
                }
            }
        }
        // The sliver as the whole B of a `live`-column, `kcur`-deep problem.
        let view = GemmProblem {
            n: live,
            k: kcur,
            ..*p
        };
        super::dpbf16::pack_b(&view, rows, 0, kcur, 0, live, nr, d, sliver);
    }
}

/// Packs `mcur` rows × `kcur` values of A into `mr`-row slivers of `[k block][mr][32 values]`,
/// zero past the rows and depth; `row(at, dst)` fills `dst` with A's values from index `at`.
#[allow(clippy::too_many_arguments)]
fn pack_a(
    p: &GemmProblem,
    ic: usize,
    mcur: usize,
    pc: usize,
    kcur: usize,
    mr: usize,
    dst: &mut [u32],
    copy_row: impl Fn(usize, &mut [bf16]),
) {
    let d = depth(kcur);
    let block = 2 * BLOCK_PAIRS;
    for (s, sliver) in dst[..mcur.next_multiple_of(mr) * d]
        .chunks_exact_mut(mr * d)
        .enumerate()
    {
        let r0 = ic + s * mr;
        let live = mr.min(ic + mcur - r0);
        // A pair word holds the even k in its low half: on a little-endian host that is the
        // two bf16 values in k order, so rows copy as they are.
        // SAFETY: bf16 is two bytes with alignment 2; the words are valid bf16 bits either way.
        let values = unsafe {
            std::slice::from_raw_parts_mut(sliver.as_mut_ptr().cast::<bf16>(), 2 * sliver.len())
        };
        for (kb, rows) in values.chunks_exact_mut(mr * block).enumerate() {
            let k0 = kb * block;
            let n = block.min(kcur - k0);
            for (i, row) in rows.chunks_exact_mut(block).enumerate() {
                if i < live {
                    copy_row((r0 + i) * p.k + pc + k0, &mut row[..n]);
                    row[n..].fill(bf16::ZERO);
                } else {
                    row.fill(bf16::ZERO);
                }
            }
        }
    }
}

/// `(tiles, d, a, b, c, ldc, rows, cols, accumulate)`: C[rows × cols] (+)= A · B over `d` pair
/// rows.
type Ukr<T> = unsafe fn(&mut T, usize, *const u32, *const u32, *mut f32, usize, usize, usize, bool);

/// `MT × NT` accumulator tiles: `16·MT` rows × `16·NT` columns.
///
/// Full corners load and store C through the tiles at C's stride; edge corners accumulate in
/// zeroed tiles, stored to a local block and added to the live part of C.
///
/// # Safety
/// `a` holds `d · 16·MT` and `b` `d · 16·NT` pair words in the module's layouts, `d` a multiple
/// of 16; C is writable for `rows` rows of `cols` columns at `ldc` apart; `T` runs on this host
/// and is configured for `MT × NT` ([`TileConfig::full`], held by a [`Configured`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn ukr<T: Tiles, const MT: usize, const NT: usize>(
    tiles: &mut T,
    d: usize,
    a: *const u32,
    b: *const u32,
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    accumulate: bool,
) {
    let (mr, nr) = (ROWS * MT, ROWS * NT);
    let full = rows == mr && cols == nr;
    // SAFETY: the caller's contract; every tile is 16 rows of 64 bytes, and full corners have
    // 16·MT rows of 16·NT columns of C.
    unsafe {
        let corner = |i: usize, j: usize| c.add(i * ROWS * ldc + j * ROWS);
        for i in 0..MT {
            for j in 0..NT {
                if full && accumulate {
                    tiles.load(c_tile(i, j), corner(i, j).cast(), 4 * ldc);
                } else {
                    tiles.zero(c_tile(i, j));
                }
            }
        }
        for kb in 0..d / BLOCK_PAIRS {
            let a = a.add(kb * mr * BLOCK_PAIRS);
            let b = b.add(kb * BLOCK_PAIRS * nr);
            block::<T, MT, NT>(tiles, a, BLOCK_PAIRS, b, nr);
        }
        if full {
            for i in 0..MT {
                for j in 0..NT {
                    tiles.store(c_tile(i, j), corner(i, j).cast(), 4 * ldc);
                }
            }
        } else {
            let mut block = [0f32; 4 * ROWS * ROWS];
            for i in 0..MT {
                for j in 0..NT {
                    let at = block.as_mut_ptr().add(i * ROWS * nr + j * ROWS);
                    tiles.store(c_tile(i, j), at.cast(), 4 * nr);
                }
            }
            for r in 0..rows {
                let dst = std::slice::from_raw_parts_mut(c.add(r * ldc), cols);
                for (o, v) in dst.iter_mut().zip(&block[r * nr..r * nr + cols]) {
                    *o = if accumulate { *o + v } else { *v };
                }
            }
        }
    }
}

/// One k block (32 values) of a `16·MT × 16·NT` tile product: `16·MT` rows of A tiles at `a`,
/// `lda` words apart, against `16·NT` columns of B pairs at `b`, `ldb` words a pair row.
///
/// Each operand is loaded just before its first multiply rather than all of them first, as
/// oneDNN's AMX kernels order them: 1-3% faster on the Xeon it was measured on (warm, two
/// threads, M = 512, N = 7168, K = 8192 on amx-direct: 38.7-39.2 ms against 39.6-40.5).
///
/// # Safety
/// The tiles are configured for `MT × NT`; A has `16·MT` rows of 64 bytes at `a`, B 16 pair
/// rows of `16·NT` words at `b`.
#[inline(always)]
pub(super) unsafe fn block<T: Tiles, const MT: usize, const NT: usize>(
    tiles: &mut T,
    a: *const u32,
    lda: usize,
    b: *const u32,
    ldb: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        for i in 0..MT {
            tiles.load(A_TILE + i, a.add(i * ROWS * lda).cast(), 4 * lda);
            for j in 0..NT {
                if i == 0 {
                    tiles.load(B_TILE + j, b.add(j * ROWS).cast(), 4 * ldb);
                }
                tiles.dot(c_tile(i, j), A_TILE + i, B_TILE + j);
            }
        }
    }
}

/// `(tiles, d, live, w, rsa, x, tile, accumulate)`: [`ukr_rows`] for one shape.
pub(super) type UkrRows<T> =
    unsafe fn(&mut T, usize, usize, *const u32, usize, *const u32, *mut f32, bool);

/// The [`ukr_rows`] of an AMX shape (`mr` weight rows × `nr` tokens).
pub(super) fn ukr_rows_for<T: Tiles>(mr: usize, nr: usize) -> Option<UkrRows<T>> {
    match (mr, nr) {
        (32, 32) => Some(ukr_rows::<T, 2, 2>),
        (16, 32) => Some(ukr_rows::<T, 1, 2>),
        (32, 16) => Some(ukr_rows::<T, 2, 1>),
        _ => None,
    }
}

/// One `16·MT × 16·NT` tile of `Cᵀ` for [`super::amx_direct`]: `16·MT` weight rows where they
/// lie (`rsa` words apart, `live` words of each in this slice) as A tiles, against a packed
/// sliver of `16·NT` tokens (`d` pair rows, [`super::dpbf16::pack_b`]'s layout) as B tiles;
/// the tile is written to `tile`, `16·NT` wide, or added to what it holds when `accumulate`.
///
/// Whole k blocks load straight from the rows. A block that runs past `live` is copied to the
/// stack first, zero after the live words, so no load reads past a row's slice (the last row
/// of the matrix ends there) and the zero pairs of the packed sliver meet zeros, never
/// whatever followed.
///
/// # Safety
/// Each of the `16·MT` rows at `w` holds `live` readable words; `x` holds `d · 16·NT` words, `d`
/// a multiple of 16 and at least `live`; `tile` is writable (readable too when accumulating)
/// for `16·MT · 16·NT` values; `T` runs on this host and is configured for `MT × NT`
/// ([`TileConfig::full`], held by a [`Configured`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn ukr_rows<T: Tiles, const MT: usize, const NT: usize>(
    tiles: &mut T,
    d: usize,
    live: usize,
    w: *const u32,
    rsa: usize,
    x: *const u32,
    tile: *mut f32,
    accumulate: bool,
) {
    let nr = ROWS * NT;
    let mut tail = [0u32; 2 * ROWS * BLOCK_PAIRS];
    // SAFETY: the caller's contract; every tile is 16 rows of 64 bytes.
    unsafe {
        for i in 0..MT {
            for j in 0..NT {
                if accumulate {
                    let at = tile.add(i * ROWS * nr + j * ROWS);
                    tiles.load(c_tile(i, j), at.cast(), 4 * nr);
                } else {
                    tiles.zero(c_tile(i, j));
                }
            }
        }
        for kb in 0..d / BLOCK_PAIRS {
            let k0 = kb * BLOCK_PAIRS;
            let (a, stride) = if k0 + BLOCK_PAIRS <= live {
                (w.add(k0), rsa)
            } else {
                let n = live.saturating_sub(k0);
                for (r, dst) in tail
                    .chunks_exact_mut(BLOCK_PAIRS)
                    .take(ROWS * MT)
                    .enumerate()
                {
                    let (values, padding) = dst.split_at_mut(n);
                    std::ptr::copy_nonoverlapping(
                        w.add(r * rsa + k0).cast::<u8>(),
                        values.as_mut_ptr().cast::<u8>(),
                        4 * n,
                    );
                    padding.fill(0);
                }
                (tail.as_ptr(), BLOCK_PAIRS)
            };
            block::<T, MT, NT>(tiles, a, stride, x.add(k0 * nr), nr);
        }
        for i in 0..MT {
            for j in 0..NT {
                let at = tile.add(i * ROWS * nr + j * ROWS);
                tiles.store(c_tile(i, j), at.cast(), 4 * nr);
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::config::{GemmVariant, Inner, Split};
    use crate::cpu::amx_tiles::Model;
    use crate::data::ProblemData;
    use crate::{Isa, Problem, TensorBuf};

    /// A GEMM problem, its random data and the f64 reference.
    fn generated(spec: &str, seed: u64) -> (Problem, GemmProblem, ProblemData, Vec<f64>) {
        let problem: Problem = spec.parse().unwrap();
        let Problem::Gemm(p) = problem else {
            unreachable!("{spec} is a GEMM")
        };
        let data = ProblemData::random(&problem, seed);
        let reference = data.reference();
        (problem, p, data, reference)
    }

    /// A bf16 GEMM test case: the problem, its data, the f64 reference and copies of A and B.
    pub(in crate::cpu) fn case(
        spec: &str,
        seed: u64,
    ) -> (
        Problem,
        GemmProblem,
        ProblemData,
        Vec<f64>,
        Vec<bf16>,
        Vec<bf16>,
    ) {
        let (problem, p, data, reference) = generated(spec, seed);
        let (TensorBuf::Bf16(a), TensorBuf::Bf16(b)) = (&data.inputs[0], &data.inputs[1]) else {
            unreachable!("bf16 problems have bf16 inputs")
        };
        let (a, b) = (a.to_vec(), b.to_vec());
        (problem, p, data, reference, a, b)
    }

    /// An fp8 problem's parts as [`case`] gives a bf16 one's: the format and the two inputs'
    /// bytes.
    pub(in crate::cpu) fn fp8_case(
        spec: &str,
        seed: u64,
    ) -> (
        Problem,
        GemmProblem,
        ProblemData,
        Vec<f64>,
        Fp8,
        Vec<u8>,
        Vec<u8>,
    ) {
        let (problem, p, data, reference) = generated(spec, seed);
        let (TensorBuf::Fp8(format, a), TensorBuf::Fp8(_, b)) = (&data.inputs[0], &data.inputs[1])
        else {
            unreachable!("fp8 problems have fp8 inputs")
        };
        let (format, a, b) = (*format, a.to_vec(), b.to_vec());
        (problem, p, data, reference, format, a, b)
    }

    /// The sums an fp8 kernel left in `data.out`, scaled as the caller scales them, match
    /// `reference` within the problem's tolerance.
    pub(in crate::cpu) fn assert_scaled_matches(
        problem: &Problem,
        c: &GemmConfig,
        data: &mut ProblemData,
        reference: &[f64],
    ) {
        let Problem::Gemm(p) = problem else {
            unreachable!("{problem} is a GEMM")
        };
        let scales = crate::kernel::GemmScales {
            a: &data.a_scales,
            b: &data.b_scales,
            zeros: &[],
        };
        crate::cpu::gemm::scale(p, c, scales, &mut data.out);
        let err = crate::reference::relative_error(&data.out, reference);
        assert!(
            err <= problem.tolerance(),
            "{problem} with {c:?}: relative error {err:e}"
        );
    }

    /// Every shape with blocks that cut M, N and K in awkward places, in both loop orders, on
    /// the software model of the tile operations, against the f64 reference.
    #[test]
    fn every_shape_matches_the_reference_on_the_tile_model() {
        let mut ran = 0;
        for spec in [
            "gemm:m=1,n=1,k=1,dtype=bf16,b=nk",
            "gemm:m=29,n=67,k=45,dtype=bf16,b=nk",
            "gemm:m=40,n=130,k=100,dtype=bf16,b=kn",
            "gemm:m=33,n=17,k=97,dtype=bf16,b=kn",
            "gemm:m=64,n=64,k=64,dtype=bf16,b=nk",
            "gemm:m=7,n=61,k=5,dtype=bf16,b=kn",
        ] {
            let (problem, p, mut data, reference, a, b) = case(spec, 11);
            for &(mr, nr) in AMX_SHAPES {
                // K below a block, a block and a bit, several blocks; one and two row blocks
                // and column panels; both splits over two threads.
                for (mc, kc, nc) in [(mr, 7, nr), (mr * 2, 33, nr * 2), (mr, 64, nr * 3)] {
                    let orders = [(Split::N, 1), (Split::M, 2), (Split::N, 2)]
                        .into_iter()
                        .flat_map(|st| [(st, Inner::M), (st, Inner::N)]);
                    for ((split, threads), inner) in orders {
                        let c = GemmConfig {
                            variant: GemmVariant::Amx,
                            isa: Isa::Avx512Amx,
                            mr,
                            nr,
                            mc,
                            kc,
                            nc,
                            split,
                            threads,
                            prefetch: true,
                            inner,
                        };
                        let mut scratch = vec![0f32; scratch_len(&p, &c)];
                        data.out.fill(f32::NAN);
                        let ops = Operands::Bf16(&a, &b);
                        run_on::<Model>(&p, &c, ops, &mut data.out, &mut scratch);
                        let err = crate::reference::relative_error(&data.out, &reference);
                        assert!(
                            err <= problem.tolerance(),
                            "{spec} with {c:?}: relative error {err:e}"
                        );
                        ran += 1;
                    }
                }
            }
        }
        assert_eq!(ran, 6 * AMX_SHAPES.len() * 18);
    }

    /// fp8 GEMMs of every format, both layouts, sizes that cut every block, widened as they
    /// are packed (a sliver's copy included), on the tile model, then scaled, against the f64
    /// reference.
    #[test]
    fn fp8_matches_the_reference_on_the_tile_model() {
        let mut ran = 0;
        for spec in [
            "gemm:m=1,n=1,k=1,dtype=fp8_e4m3,b=nk",
            "gemm:m=29,n=67,k=45,dtype=fp8_e4m3,b=nk",
            "gemm:m=40,n=130,k=100,dtype=fp8_e4m3fnuz,b=kn",
            "gemm:m=33,n=17,k=97,dtype=fp8_e5m2,b=nk",
            "gemm:m=7,n=61,k=5,dtype=fp8_e5m2,b=kn",
        ] {
            let (problem, p, mut data, reference, format, a, b) = fp8_case(spec, 5);
            for &(mr, nr) in AMX_SHAPES {
                for (mc, kc, nc, split, threads) in [
                    (mr, 7, nr, Split::N, 1),
                    (mr * 2, 33, nr * 2, Split::M, 2),
                    (mr, 64, nr * 3, Split::N, 2),
                ] {
                    let c = GemmConfig {
                        variant: GemmVariant::Amx,
                        isa: Isa::Avx512Amx,
                        mr,
                        nr,
                        mc,
                        kc,
                        nc,
                        split,
                        threads,
                        prefetch: true,
                        inner: Inner::M,
                    };
                    let mut scratch = vec![0f32; scratch_len(&p, &c)];
                    data.out.fill(f32::NAN);
                    let ops = Operands::Fp8(format, &a, &b);
                    run_on::<Model>(&p, &c, ops, &mut data.out, &mut scratch);
                    assert_scaled_matches(&problem, &c, &mut data, &reference);
                    ran += 1;
                }
            }
        }
        assert_eq!(ran, 5 * AMX_SHAPES.len() * 3);
    }

    /// On the hardware, both AMX GEMM kernels leave the calling thread's tiles released after
    /// a call (they configure once per task, not per tile), as a framework's own AMX kernels
    /// on that thread expect to find them, and match the reference.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn a_call_leaves_the_calling_threads_tiles_released() {
        use crate::{Backend, Config, CpuBackend, CpuInfo};
        if CpuInfo::detect().isa != Isa::Avx512Amx {
            eprintln!(
                "a_call_leaves_the_calling_threads_tiles_released did not run: this host has \
                 no AMX tiles (the kernels' work on tiles is checked on the tile model)"
            );
            return;
        }
        let spec = "gemm:m=70,n=96,k=130,dtype=bf16,b=nk";
        let (problem, _, mut data, reference, _, _) = case(spec, 3);
        for variant in [GemmVariant::Amx, GemmVariant::AmxDirect] {
            for threads in [1, 2] {
                let c = GemmConfig {
                    variant,
                    isa: Isa::Avx512Amx,
                    mr: 32,
                    nr: 32,
                    mc: 64,
                    kc: 64,
                    nc: 64,
                    split: Split::N,
                    threads,
                    prefetch: true,
                    inner: Inner::M,
                };
                let config = Config::Gemm(c);
                let mut scratch = vec![0f32; CpuBackend.scratch_len(&problem, &config)];
                data.out.fill(f32::NAN);
                CpuBackend
                    .run(&problem, &config, data.args(), &mut scratch)
                    .unwrap();
                let err = crate::reference::relative_error(&data.out, &reference);
                assert!(err <= problem.tolerance(), "{c:?}: relative error {err:e}");
                // SAFETY: the host runs AMX.
                let loaded = unsafe { crate::cpu::amx_tiles::Hardware::loaded() };
                assert_eq!(loaded, [0; 64], "{c:?} left the tiles configured");
            }
        }
    }

    #[test]
    fn depth_pads_to_whole_blocks() {
        assert_eq!(depth(1), 16);
        assert_eq!(depth(32), 16);
        assert_eq!(depth(33), 32);
        assert_eq!(depth(1024), 512);
    }
}
