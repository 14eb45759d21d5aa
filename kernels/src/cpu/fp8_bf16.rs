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

/// The whole groups of 16 widened with AVX-512 where the host has it; how many bytes that was.
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

/// 16 bytes at a time: their f16 bits ([`super::simd`]'s placing), converted to f32, whose top
/// halves are the bf16 values.
///
/// # Safety
/// The host has AVX-512 (F, BW, VL); `dst` holds `src.len()` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn avx512<const E5M2: bool>(src: &[u8], dst: &mut [bf16]) -> usize {
    use std::arch::x86_64::*;
    let groups = src.len() / 16;
    for g in 0..groups {
        // SAFETY: group g's 16 bytes and 16 values are inside both slices.
        unsafe {
            let bytes = _mm_loadu_si128(src.as_ptr().add(16 * g).cast());
            let half = super::simd::x86::fp8_half_bits_256::<E5M2>(_mm256_cvtepu8_epi16(bytes));
            let f = _mm512_castps_si512(_mm512_cvtph_ps(half));
            let top = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(f));
            _mm256_storeu_si256(dst.as_mut_ptr().add(16 * g).cast(), top);
        }
    }
    16 * groups
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
