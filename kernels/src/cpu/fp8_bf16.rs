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
/// Hosts with VBMI (Ice Lake and later Xeons, Zen 4) look each byte up ([`vbmi`]); others
/// compute the bits ([`avx512`]).
#[cfg(target_arch = "x86_64")]
fn simd(format: Fp8, src: &[u8], dst: &mut [bf16]) -> usize {
    if crate::CpuInfo::detect().isa < crate::Isa::Avx512 {
        return 0;
    }
    if std::arch::is_x86_feature_detected!("avx512vbmi") {
        // SAFETY: the host has AVX-512 with VBMI; both slices hold src.len() elements.
        return unsafe { vbmi(x86::Split::of(format), src, dst) };
    }
    // SAFETY: the host has AVX-512; both slices hold src.len() elements.
    unsafe {
        match format {
            Fp8::E5m2 => avx512::<true>(src, dst),
            Fp8::E4m3 | Fp8::E4m3Fnuz => avx512::<false>(src, dst),
        }
    }
}

/// 64 bytes at a time, each byte's bf16 read from a 128-entry table by its low seven bits
/// (two `vpermt2b`, one for each byte of the result) with its sign bit put back: five
/// shuffles for 64 values where [`x86::bf16_bits`] spends about six ALU operations on 32.
///
/// # Safety
/// The host has AVX-512 (F, BW) and VBMI; `dst` holds `src.len()` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn vbmi(table: &x86::Split, src: &[u8], dst: &mut [bf16]) -> usize {
    use std::arch::x86_64::*;
    let n = src.len();
    // SAFETY: each table holds 128 bytes; the masks keep every access to the slices' `n -
    // at` elements from `at` (a masked-off store touches nothing, so its address may pass
    // the end).
    unsafe {
        let hi = |half: usize| _mm512_loadu_si512(table.hi[64 * half..].as_ptr().cast());
        let lo = |half: usize| _mm512_loadu_si512(table.lo[64 * half..].as_ptr().cast());
        let (hi0, hi1, lo0, lo1) = (hi(0), hi(1), lo(0), lo(1));
        // The unpacks below pair the bytes of each 128-bit lane's low (high) eight: this
        // order puts bytes 0-31 in the low halves and 32-63 in the high ones.
        let order = _mm512_set_epi64(7, 3, 6, 2, 5, 1, 4, 0);
        let sign = _mm512_set1_epi8(0x80u8 as i8);
        for at in (0..n).step_by(64) {
            let mask = if n - at >= 64 {
                !0
            } else {
                (1u64 << (n - at)) - 1
            };
            let bytes = _mm512_maskz_loadu_epi8(mask, src.as_ptr().add(at).cast());
            let bytes = _mm512_permutexvar_epi64(order, bytes);
            let high = _mm512_permutex2var_epi8(hi0, bytes, hi1);
            let low = _mm512_permutex2var_epi8(lo0, bytes, lo1);
            // high | (bytes & sign)
            let high = _mm512_ternarylogic_epi32::<0xf8>(high, bytes, sign);
            let out = dst.as_mut_ptr().add(at).cast::<i16>();
            _mm512_mask_storeu_epi16(out, mask as u32, _mm512_unpacklo_epi8(low, high));
            let out = out.wrapping_add(32);
            _mm512_mask_storeu_epi16(out, (mask >> 32) as u32, _mm512_unpackhi_epi8(low, high));
        }
    }
    n
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

    use crate::Fp8;

    /// The bf16 bits of a format's 128 magnitudes (bytes with the sign bit clear), split into
    /// their high and low bytes: [`super::vbmi`]'s tables.
    pub struct Split {
        pub hi: [u8; 128],
        pub lo: [u8; 128],
    }

    impl Split {
        /// The tables of `format` (E4M3's and fnuz's readings are the same bits).
        pub fn of(format: Fp8) -> &'static Split {
            static E4M3: Split = Split::new(Fp8::E4m3);
            static E5M2: Split = Split::new(Fp8::E5m2);
            match format {
                Fp8::E5m2 => &E5M2,
                Fp8::E4m3 | Fp8::E4m3Fnuz => &E4M3,
            }
        }

        const fn new(format: Fp8) -> Split {
            let mut split = Split {
                hi: [0; 128],
                lo: [0; 128],
            };
            let mut b = 0;
            while b < 128 {
                let bits = half_to_bf16(format.half_bits(b as u8));
                split.hi[b] = (bits >> 8) as u8;
                split.lo[b] = bits as u8;
                b += 1;
            }
            split
        }
    }

    /// The bf16 bits of the f16 whose bits are `h` (sign clear), for the readings of fp8
    /// bytes: at most four significant bits, so the mantissa shifts drop only zeros.
    const fn half_to_bf16(h: u16) -> u16 {
        let (exponent, mantissa) = (h >> 10, h & 0x3ff);
        if exponent == 0x1f {
            // Infinity or NaN (E5M2's two mantissa bits stay nonzero).
            0x7f80 | (mantissa >> 3)
        } else if exponent != 0 {
            ((exponent + 112) << 7) | (mantissa >> 3)
        } else if mantissa == 0 {
            0
        } else {
            // mantissa · 2^-24, a normal bf16: 2^(top - 24) times 1 and the bits below top.
            let top = 15 - mantissa.leading_zeros() as u16;
            let rest = mantissa ^ (1 << top);
            let fraction = if top <= 7 {
                rest << (7 - top)
            } else {
                rest >> (top - 7)
            };
            ((top + 103) << 7) | fraction
        }
    }

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
        for format in Fp8::ALL {
            check(format, "host's choice", &|src, dst| widen(format, src, dst));
        }
    }

    /// Each x86 path the host can run, whichever [`widen`] picks, with 1 to 64 bytes left
    /// for its masked last step.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn each_x86_path_widens_every_byte_exactly() {
        if crate::CpuInfo::detect().isa < crate::Isa::Avx512 {
            eprintln!("no AVX-512 on this host: only the scalar widening is checked");
            return;
        }
        for format in Fp8::ALL {
            let e5m2 = format == Fp8::E5m2;
            // SAFETY: the host has AVX-512; the closures pass equal lengths.
            check(format, "avx512", &|src, dst| unsafe {
                if e5m2 {
                    avx512::<true>(src, dst)
                } else {
                    avx512::<false>(src, dst)
                };
            });
            if std::arch::is_x86_feature_detected!("avx512vbmi") {
                // SAFETY: as above, and the host has VBMI.
                check(format, "vbmi", &|src, dst| unsafe {
                    vbmi(x86::Split::of(format), src, dst);
                });
            } else {
                eprintln!("no VBMI on this host: its table path is not checked");
            }
        }
    }

    /// Every byte, in rows whose lengths leave every remainder of 32 and 64, widened by `path`
    /// to the bf16 of its f16 reading exactly (which is its value over the format's factor,
    /// `dtype`'s tests show; NaN bytes read as the kernels read them).
    fn check(format: Fp8, path: &str, widen: &dyn Fn(&[u8], &mut [bf16])) {
        let bytes: Vec<u8> = (0..=255u8).chain(0..=255u8).chain(0..=255u8).collect();
        for len in (1..=65).chain([255, 256, 511, 768]) {
            let src = &bytes[bytes.len() - len..];
            let mut out = vec![bf16::from_bits(0x5555); len + 3];
            widen(src, &mut out[..len]);
            assert!(
                out[len..].iter().all(|v| v.to_bits() == 0x5555),
                "{path} wrote past the end"
            );
            for (&b, &got) in src.iter().zip(&out) {
                let want = f16::from_bits(format.half_bits(b)).to_f32();
                if want.is_nan() {
                    assert!(got.is_nan(), "{path} {format:?} {b:#04x}");
                } else {
                    assert_eq!(got.to_f32(), want, "{path} {format:?} {b:#04x} (len {len})");
                }
            }
        }
    }
}
