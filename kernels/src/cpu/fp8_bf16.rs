//! fp8 bytes widened to bf16, so that the bf16 kernels (AMX tiles) multiply an fp8 GEMM's
//! operands as they pack them.
//!
//! A byte's f16 reading ([`crate::Fp8::half_bits`]: the value over the format's factor) has
//! at most four significant bits and an exponent within bf16's range, so it is a bf16
//! exactly, and the product of two is exact in the f32 accumulators: an fp8 GEMM on AMX
//! rounds nothing its f32 kernels do not. The factors and scales are applied to C after
//! ([`super::gemm::scale`]).

use half::{bf16, f16};

use crate::Fp8;

/// Widens `src.len()` bytes of `format` into `dst`, as bf16.
pub(super) fn widen(format: Fp8, src: &[u8], dst: &mut [bf16]) {
    debug_assert_eq!(src.len(), dst.len());
    let done = simd(format, src, dst);
    for (d, &b) in dst[done..].iter_mut().zip(&src[done..]) {
        *d = one(format, b);
    }
}

/// Byte `b`'s f16 reading as a bf16: f32's top half, exact (see the module's docs).
#[inline]
fn one(format: Fp8, b: u8) -> bf16 {
    let f = f16::from_bits(format.half_bits(b)).to_f32();
    bf16::from_bits((f.to_bits() >> 16) as u16)
}

/// The bytes widened with AVX-512 where the host has it (all of them); how many that was.
#[cfg(target_arch = "x86_64")]
fn simd(format: Fp8, src: &[u8], dst: &mut [bf16]) -> usize {
    if crate::CpuInfo::detect().isa < crate::Isa::Avx512 {
        return 0;
    }
    // SAFETY: the host has AVX-512; both slices hold src.len() elements.
    unsafe {
        match format {
            Fp8::E5m2 => avx512::<true>(src, dst),
            Fp8::E4m3 | Fp8::E4m3Fnuz => avx512::<false>(src, dst),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn simd(_: Fp8, _: &[u8], _: &mut [bf16]) -> usize {
    0
}

/// 32 bytes at a time ([`x86::bf16_bits`]), the last partial group under masks.
///
/// # Safety
/// The host has AVX-512 (F, BW); `dst` holds `src.len()` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn avx512<const E5M2: bool>(src: &[u8], dst: &mut [bf16]) -> usize {
    use std::arch::x86_64::*;
    let n = src.len();
    for at in (0..n).step_by(32) {
        let mask = if n - at >= 32 {
            !0
        } else {
            (1u32 << (n - at)) - 1
        };
        // SAFETY: the mask keeps both accesses to the slices' `n - at` elements from `at`.
        unsafe {
            let bytes = _mm256_maskz_loadu_epi8(mask, src.as_ptr().add(at).cast());
            let bits = x86::bf16_bits::<E5M2>(bytes);
            _mm512_mask_storeu_epi16(dst.as_mut_ptr().add(at).cast(), mask, bits);
        }
    }
    n
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    /// bf16 bits of E4M3 readings whose exponent field is 0: `m · 2^-17` for mantissa `m`,
    /// which bf16 holds as normal numbers (exponent 110 to 112).
    static E4M3_SMALL: [u16; 32] = {
        let mut t = [0u16; 32];
        t[1] = 0x3700;
        t[2] = 0x3780;
        t[3] = 0x37c0;
        t[4] = 0x3800;
        t[5] = 0x3820;
        t[6] = 0x3840;
        t[7] = 0x3860;
        t
    };

    /// The same for E5M2: `m · 2^-16`.
    static E5M2_SMALL: [u16; 32] = {
        let mut t = [0u16; 32];
        t[1] = 0x3780;
        t[2] = 0x3800;
        t[3] = 0x3840;
        t
    };

    /// The bf16 bits of 32 bytes' f16 readings ([`crate::Fp8::half_bits`]), one a 16-bit
    /// lane, by integer operations: a reading with a nonzero exponent field is that field
    /// rebased from f16's bias to bf16's (+112) over the same mantissa bits; one whose field is
    /// 0 (an f16 subnormal, which bf16's wider exponent holds as a normal number) comes from a
    /// table; E5M2's top field is infinity or NaN. Exact, as the f16 → f32 → bf16 conversion it
    /// replaces (four times the shuffle-port work per value), and checked against it for every
    /// byte (the tests below).
    ///
    /// # Safety
    /// The caller runs with AVX-512F and BW.
    #[inline(always)]
    pub unsafe fn bf16_bits<const E5M2: bool>(bytes: __m256i) -> __m512i {
        // SAFETY: the caller's features; the tables hold 32 values each.
        unsafe {
            let w = _mm512_cvtepu8_epi16(bytes);
            let mag = _mm512_and_si512(w, _mm512_set1_epi16(0x7f));
            let sign = _mm512_and_si512(
                _mm512_slli_epi16::<8>(w),
                _mm512_set1_epi16(0x8000u16 as i16),
            );
            let rebased = _mm512_set1_epi16(112 << 7);
            let (normal, small, table) = if E5M2 {
                let normal = _mm512_add_epi16(_mm512_slli_epi16::<5>(mag), rebased);
                (normal, 4, &E5M2_SMALL)
            } else {
                let normal = _mm512_add_epi16(_mm512_slli_epi16::<4>(mag), rebased);
                (normal, 8, &E4M3_SMALL)
            };
            let low = _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(small));
            let looked_up =
                _mm512_permutexvar_epi16(mag, _mm512_loadu_si512(table.as_ptr().cast()));
            let mut bits = _mm512_mask_mov_epi16(normal, low, looked_up);
            if E5M2 {
                let top = _mm512_cmpge_epu16_mask(mag, _mm512_set1_epi16(0x7c));
                let mantissa = _mm512_and_si512(mag, _mm512_set1_epi16(3));
                let special =
                    _mm512_or_si512(_mm512_set1_epi16(0x7f80), _mm512_slli_epi16::<5>(mantissa));
                bits = _mm512_mask_mov_epi16(bits, top, special);
            }
            _mm512_or_si512(bits, sign)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte of every format, alone and in a row long enough for the vector path, widens
    /// to the bf16 of its f16 reading exactly (which is its value over the format's factor,
    /// `dtype`'s tests show; NaN bytes read as the kernels read them).
    #[test]
    fn every_byte_widens_to_its_reading_exactly() {
        let bytes: Vec<u8> = (0..=255u8).chain(0..=255u8).chain(0..7).collect();
        for format in Fp8::ALL {
            let mut out = vec![bf16::ZERO; bytes.len()];
            widen(format, &bytes, &mut out);
            for (&b, &got) in bytes.iter().zip(&out) {
                let want = f16::from_bits(format.half_bits(b)).to_f32();
                if want.is_nan() {
                    assert!(got.is_nan(), "{format:?} {b:#04x}");
                } else {
                    assert_eq!(got.to_f32(), want, "{format:?} {b:#04x}");
                }
            }
        }
    }
}
