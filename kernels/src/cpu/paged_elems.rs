//! How each cache element type is read and multiplied by the paged-attention tiles
//! ([`super::paged_tiles`]): f32 values, bf16 pairs for `vdpbf16ps`, and 16-bit formats
//! widened to f32 (f16, and bf16 where the CPU lacks AVX-512-BF16, the head dimension is
//! odd or the config says `widen`), and fp8 bytes read as f16 bits and widened the same way.
//! Every type works in 32-bit words: one value, or a pair of bf16 values.

use std::arch::x86_64::*;

use super::leaf::prefetch;
use super::paged_tiles::TILE;

/// A cache element type the tiles handle, computed on in 32-bit words: f32 values, bf16
/// pairs, or f16 values widened to f32.
pub trait TileElem {
    /// Head-dim values per 32-bit word.
    const PER_WORD: usize;
    /// Bytes of one cached value.
    const VALUE_BYTES: usize;
    /// Bytes of one query value: a cached value's, but for fp8 caches (16-bit queries).
    const QUERY_BYTES: usize = Self::VALUE_BYTES;
    /// Tokens per `P·V` step.
    const STEP: usize = Self::PER_WORD;
    /// Word `i` of a query row.
    ///
    /// # Safety
    /// `row` is readable for word `i` (2-byte aligned at least).
    #[inline(always)]
    unsafe fn query_word(row: *const u8, i: usize) -> u32 {
        // SAFETY: the caller's contract.
        unsafe { row.add(4 * i).cast::<u32>().read_unaligned() }
    }
    /// Makes the `live` key rows `rows` readable as words (f16 rows are widened to f32 rows
    /// of `d` values in `staging`, and `rows` pointed there), prefetching the `ahead` rows;
    /// returns whether it prefetched them.
    ///
    /// # Safety
    /// As [`Self::madd`]; each row readable for `d` values; `staging` holds `TILE · d` f32.
    #[inline(always)]
    unsafe fn stage_keys(
        _rows: &mut [*const u8; TILE],
        _live: usize,
        _d: usize,
        _staging: *mut f32,
        _ahead: &[*const u8],
    ) -> bool {
        false
    }
    /// `acc + a · b` lane by lane, each lane's word holding one value (f32) or a pair (bf16).
    ///
    /// # Safety
    /// The CPU has AVX-512F (and AVX-512-BF16 for bf16 pairs).
    unsafe fn madd(acc: __m512, a: __m512i, b: __m512i) -> __m512;
    /// Rewrites `rows` rows of `n` f32 weights (`ld` apart) as the words [`Self::madd`]
    /// takes, word `i` of a row standing for its tokens `STEP · i ..`; tokens past `n`
    /// that share a word weigh 0.
    ///
    /// # Safety
    /// As [`Self::madd`]; `p` holds the rows.
    unsafe fn pack_weights(p: *mut f32, rows: usize, ld: usize, n: usize);
    /// The value words of one `P·V` step: `STEP` tokens' `xl <= 32` values from `at`
    /// bytes into their rows `v`, as two vectors in the lane order of [`Self::lanes`].
    ///
    /// # Safety
    /// As [`Self::madd`]; each row readable for `xl` values from `at`.
    unsafe fn values(v: &[*const u8], at: usize, xl: usize) -> [__m512i; 2];
    /// The head-dim value each lane of the two step vectors holds: lane `j` of vector `h`
    /// holds value `lanes()[16 · h + j]` of the 32.
    fn lanes() -> [u32; 32];
}

/// f32 caches: one value per word, multiplied with FMAs.
pub struct F32Words;

impl TileElem for F32Words {
    const PER_WORD: usize = 1;
    const VALUE_BYTES: usize = 4;
    #[inline(always)]
    unsafe fn madd(acc: __m512, a: __m512i, b: __m512i) -> __m512 {
        // SAFETY: the caller's contract on the CPU.
        unsafe { _mm512_fmadd_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), acc) }
    }
    #[inline(always)]
    unsafe fn pack_weights(_: *mut f32, _: usize, _: usize, _: usize) {}
    #[inline(always)]
    unsafe fn values(v: &[*const u8], at: usize, xl: usize) -> [__m512i; 2] {
        let row = v[0].wrapping_add(at).cast::<i32>();
        // SAFETY: masked loads read only the `xl` values the caller vouches for.
        unsafe {
            [
                _mm512_maskz_loadu_epi32(lanes16(xl), row),
                _mm512_maskz_loadu_epi32(lanes16(xl.saturating_sub(16)), row.wrapping_add(16)),
            ]
        }
    }
    fn lanes() -> [u32; 32] {
        std::array::from_fn(|x| x as u32)
    }
}

/// bf16 caches: pairs of values per word, multiplied with `vdpbf16ps`. In `P·V` the pairs
/// are two tokens' values of one head-dim position, against the two tokens' weights rounded
/// to bf16, as GPU flash-attention kernels round `P` for their second matrix product.
pub struct Bf16Pairs;

impl TileElem for Bf16Pairs {
    const PER_WORD: usize = 2;
    const VALUE_BYTES: usize = 2;
    #[inline(always)]
    unsafe fn madd(acc: __m512, a: __m512i, b: __m512i) -> __m512 {
        // SAFETY: the caller's contract on the CPU.
        unsafe { _mm512_dpbf16_ps(acc, bh(a), bh(b)) }
    }
    #[inline(always)]
    unsafe fn pack_weights(p: *mut f32, rows: usize, ld: usize, n: usize) {
        for r in 0..rows {
            // SAFETY: each step loads 32 weights (masked to the row's `n`) before storing
            // their 64 bytes of bf16 at or before the bytes it read: rewriting in place
            // never overwrites a weight not yet read. The masked-out weight after an odd `n`
            // loads as 0 and is stored with its pair.
            unsafe {
                let row = p.add(r * ld);
                for c in (0..n).step_by(32) {
                    let a = _mm512_maskz_loadu_ps(lanes16(n - c), row.add(c));
                    let b =
                        _mm512_maskz_loadu_ps(lanes16((n - c).saturating_sub(16)), row.add(c + 16));
                    let packed: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
                    let keep = lanes32((n - c).next_multiple_of(2));
                    _mm512_mask_storeu_epi16(row.cast::<u16>().add(c).cast(), keep, packed);
                }
            }
        }
    }
    #[inline(always)]
    unsafe fn values(v: &[*const u8], at: usize, xl: usize) -> [__m512i; 2] {
        let m = lanes32(xl);
        // SAFETY: the masked loads read only the `xl` values the caller vouches for.
        unsafe {
            let a = _mm512_maskz_loadu_epi16(m, v[0].add(at).cast());
            let b = _mm512_maskz_loadu_epi16(m, v[1].add(at).cast());
            [_mm512_unpacklo_epi16(a, b), _mm512_unpackhi_epi16(a, b)]
        }
    }
    fn lanes() -> [u32; 32] {
        // Interleaving works within 128-bit lanes of 8 values: the low half of each lane's
        // values goes to the first vector, the high half to the second.
        std::array::from_fn(|i| {
            let (h, j) = (i / 16, i % 16);
            (8 * (j / 4) + 4 * h + j % 4) as u32
        })
    }
}

/// A 16-bit float format whose values are widened to f32 as they are read.
pub trait Half {
    /// `bits` as f32.
    fn to_f32(bits: u16) -> f32;
    /// Sixteen values as f32.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    unsafe fn widen(h: __m256i) -> __m512;
}

/// IEEE half precision: converted by `vcvtph2ps` (this CPU family has no f16 arithmetic).
pub struct F16Bits;

impl Half for F16Bits {
    fn to_f32(bits: u16) -> f32 {
        half::f16::from_bits(bits).to_f32()
    }
    #[inline(always)]
    unsafe fn widen(h: __m256i) -> __m512 {
        // SAFETY: the caller's contract on the CPU.
        unsafe { _mm512_cvtph_ps(h) }
    }
}

/// bfloat16 where the CPU lacks AVX-512-BF16 (or the head dimension is odd, or the config
/// widens): the top half of an f32, widened by a shift.
pub struct Bf16Bits;

impl Half for Bf16Bits {
    fn to_f32(bits: u16) -> f32 {
        f32::from_bits(u32::from(bits) << 16)
    }
    #[inline(always)]
    unsafe fn widen(h: __m256i) -> __m512 {
        // SAFETY: the caller's contract on the CPU.
        unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h))) }
    }
}

/// A cache format narrower than f32 that the tiles widen as they read it, under queries of a
/// 16-bit format.
pub trait Narrow {
    /// Bytes of one cached value.
    const BYTES: usize;
    /// The queries' format.
    type Query: Half;
    /// `n` values from `p` (all 16 when `n >= 16`) as f32, the rest 0.
    ///
    /// # Safety
    /// The CPU has AVX-512F/BW/VL and AVX2; `p` is readable for `min(n, 16)` values.
    unsafe fn load(p: *const u8, n: usize) -> __m512;
}

impl<H: Half> Narrow for H {
    const BYTES: usize = 2;
    type Query = H;
    #[inline(always)]
    unsafe fn load(p: *const u8, n: usize) -> __m512 {
        // SAFETY: the masked load reads only the `n` values the caller vouches for.
        unsafe { H::widen(_mm256_maskz_loadu_epi16(lanes16(n), p.cast())) }
    }
}

/// Fp8 caches under queries of `Q`: each byte read as the f16 of its
/// [`crate::Fp8::half_bits`] (E5M2's where `E5M2`, else E4M3's), then widened. The factor
/// between those f16 values and the format's is the caller's, folded into the cache's scale.
pub struct Fp8Bytes<Q, const E5M2: bool>(std::marker::PhantomData<Q>);

impl<Q: Half, const E5M2: bool> Narrow for Fp8Bytes<Q, E5M2> {
    const BYTES: usize = 1;
    type Query = Q;
    #[inline(always)]
    unsafe fn load(p: *const u8, n: usize) -> __m512 {
        // SAFETY: the masked load reads only the `n` bytes the caller vouches for; the
        // caller's contract on the CPU.
        unsafe {
            let w = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(lanes16(n), p.cast()));
            _mm512_cvtph_ps(super::simd::fp8_half_bits_256::<E5M2>(w))
        }
    }
}

/// Caches narrower than f32 (16-bit, or fp8 bytes) widened as they are read, then multiplied
/// with FMAs as f32 caches are: key rows through a staging tile, value rows in registers.
pub struct Widened<N>(std::marker::PhantomData<N>);

impl<N: Narrow> TileElem for Widened<N> {
    const PER_WORD: usize = 1;
    const VALUE_BYTES: usize = N::BYTES;
    const QUERY_BYTES: usize = 2;
    #[inline(always)]
    unsafe fn query_word(row: *const u8, i: usize) -> u32 {
        // SAFETY: the caller's contract.
        let bits = unsafe { row.add(2 * i).cast::<u16>().read_unaligned() };
        N::Query::to_f32(bits).to_bits()
    }
    #[inline(always)]
    unsafe fn stage_keys(
        rows: &mut [*const u8; TILE],
        live: usize,
        d: usize,
        staging: *mut f32,
        ahead: &[*const u8],
    ) -> bool {
        // SAFETY: the caller's contract; the loads read only each row's `d` values.
        unsafe {
            for (t, row) in rows.iter_mut().enumerate().take(live) {
                let dst = staging.add(t * d);
                for x in (0..d).step_by(16) {
                    let v = N::load(row.add(N::BYTES * x), d - x);
                    _mm512_mask_storeu_ps(dst.add(x), lanes16(d - x), v);
                }
                if let Some(next) = ahead.get(t) {
                    prefetch::<_, true>(*next, N::BYTES * d);
                }
                *row = dst.cast();
            }
            // Rows past `live` read the first staged row, as they read the first cache row.
            for row in rows.iter_mut().skip(live) {
                *row = staging.cast();
            }
        }
        true
    }
    #[inline(always)]
    unsafe fn madd(acc: __m512, a: __m512i, b: __m512i) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { F32Words::madd(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn pack_weights(_: *mut f32, _: usize, _: usize, _: usize) {}
    #[inline(always)]
    unsafe fn values(v: &[*const u8], at: usize, xl: usize) -> [__m512i; 2] {
        let row = v[0].wrapping_add(at);
        // SAFETY: the loads read only the `xl` values the caller vouches for.
        unsafe {
            let lo = N::load(row, xl);
            let hi = N::load(row.wrapping_add(16 * N::BYTES), xl.saturating_sub(16));
            [_mm512_castps_si512(lo), _mm512_castps_si512(hi)]
        }
    }
    fn lanes() -> [u32; 32] {
        std::array::from_fn(|x| x as u32)
    }
}

pub(super) fn lanes16(n: usize) -> __mmask16 {
    if n >= 16 {
        !0
    } else {
        (1u16 << n) - 1
    }
}

pub(super) fn lanes32(n: usize) -> __mmask32 {
    if n >= 32 {
        !0
    } else {
        (1u32 << n) - 1
    }
}

#[inline(always)]
pub(super) unsafe fn bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 512 bits of plain data.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}
