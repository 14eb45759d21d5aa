//! The SIMD vocabulary every CPU kernel is written in, once, and its implementations per ISA.
//!
//! Kernel bodies are generic over [`Simd`] and `#[inline(always)]`; [`super::table`] instantiates
//! them inside `#[target_feature]` functions per ISA, so each body compiles to that ISA's
//! instructions and the choice is made once per call through a table of function pointers.
//! Hand-written because the crates that do this (pulp, simd abstractions in gemm crates) either
//! pin nightly features or bring far more than the dozen operations needed here.

use half::{bf16, f16};

/// One vector of f32 lanes and the operations kernels use on it.
pub trait Simd: Copy + 'static {
    type V: Copy;
    const LANES: usize;

    fn zero() -> Self::V;
    fn splat(v: f32) -> Self::V;
    /// # Safety
    /// `p` must be valid for `LANES` reads.
    unsafe fn load(p: *const f32) -> Self::V;
    /// # Safety
    /// `p` must be valid for `LANES` reads of 16-bit values.
    unsafe fn load_bf16(p: *const u16) -> Self::V;
    /// # Safety
    /// `p` must be valid for `LANES` reads of 16-bit values.
    unsafe fn load_f16(p: *const u16) -> Self::V;
    /// Fp8 bytes as the f16 values of their [`crate::Fp8::half_bits`] (E5M2's, or the E4M3
    /// formats' where `E5M2` is false).
    ///
    /// # Safety
    /// `p` must be valid for `LANES` reads of bytes.
    unsafe fn load_fp8<const E5M2: bool>(p: *const u8) -> Self::V;
    /// Value `I` (0 to 7, bits `4I..4I + 4`) of `LANES` int4 words, as 0.0 to 15.0.
    ///
    /// # Safety
    /// `p` must be valid for `LANES` reads of words.
    unsafe fn load_u4<const I: u32>(p: *const u32) -> Self::V;
    /// # Safety
    /// `p` must be valid for `LANES` writes.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a * b + c`
    fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn add(a: Self::V, b: Self::V) -> Self::V;
    fn mul(a: Self::V, b: Self::V) -> Self::V;
    fn max(a: Self::V, b: Self::V) -> Self::V;
    fn hsum(v: Self::V) -> f32;
}

/// Input element types a kernel widens to f32 as it loads.
pub trait Elem: Copy + Send + Sync + 'static {
    /// # Safety
    /// `p` must be valid for `S::LANES` reads.
    unsafe fn load<S: Simd>(p: *const Self) -> S::V;
    fn to_f32(self) -> f32;
}

impl Elem for f32 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const f32) -> S::V {
        // SAFETY: forwarded caller contract.
        unsafe { S::load(p) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Elem for bf16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const bf16) -> S::V {
        // SAFETY: bf16 is a transparent u16; forwarded caller contract.
        unsafe { S::load_bf16(p.cast()) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

impl Elem for f16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const f16) -> S::V {
        // SAFETY: f16 is a transparent u16; forwarded caller contract.
        unsafe { S::load_f16(p.cast()) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

/// A byte of an fp8 KV cache, read as the f16 of its [`crate::Fp8::half_bits`]: E5M2 where
/// `E5M2`, else either E4M3 format (their values differ from those f16 values by a factor
/// the kernels fold into the cache's scale).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
pub struct Fp8Bits<const E5M2: bool>(pub u8);

pub type E4m3Bits = Fp8Bits<false>;
pub type E5m2Bits = Fp8Bits<true>;

// SAFETY: a transparent u8: every bit pattern is valid, zero included.
unsafe impl<const E5M2: bool> bytemuck::Zeroable for Fp8Bits<E5M2> {}
// SAFETY: as above; no padding, Copy, 'static.
unsafe impl<const E5M2: bool> bytemuck::Pod for Fp8Bits<E5M2> {}

impl<const E5M2: bool> Fp8Bits<E5M2> {
    /// The format whose [`crate::Fp8::half_bits`] these bytes are read by.
    const FORMAT: crate::Fp8 = if E5M2 {
        crate::Fp8::E5m2
    } else {
        crate::Fp8::E4m3
    };
}

impl<const E5M2: bool> Elem for Fp8Bits<E5M2> {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        // SAFETY: a transparent u8; forwarded caller contract.
        unsafe { S::load_fp8::<E5M2>(p.cast()) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::from_bits(Self::FORMAT.half_bits(self.0)).to_f32()
    }
}

/// Plain Rust over 8 lanes; the compiler vectorises it for whatever the baseline target has.
#[derive(Debug, Clone, Copy)]
pub struct Portable;

impl Simd for Portable {
    type V = [f32; 8];
    const LANES: usize = 8;

    #[inline(always)]
    fn zero() -> Self::V {
        [0.0; 8]
    }
    #[inline(always)]
    fn splat(v: f32) -> Self::V {
        [v; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: caller guarantees 8 readable values.
        unsafe { p.cast::<[f32; 8]>().read_unaligned() }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self::V {
        // SAFETY: caller guarantees 8 readable values.
        let raw = unsafe { p.cast::<[u16; 8]>().read_unaligned() };
        raw.map(|b| f32::from_bits((b as u32) << 16))
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self::V {
        // SAFETY: caller guarantees 8 readable values.
        let raw = unsafe { p.cast::<[u16; 8]>().read_unaligned() };
        raw.map(|b| f16::from_bits(b).to_f32())
    }
    #[inline(always)]
    unsafe fn load_fp8<const E5M2: bool>(p: *const u8) -> Self::V {
        // SAFETY: caller guarantees 8 readable bytes.
        let raw = unsafe { p.cast::<[u8; 8]>().read_unaligned() };
        raw.map(|b| Fp8Bits::<E5M2>(b).to_f32())
    }
    #[inline(always)]
    unsafe fn load_u4<const I: u32>(p: *const u32) -> Self::V {
        // SAFETY: caller guarantees 8 readable words.
        let raw = unsafe { p.cast::<[u32; 8]>().read_unaligned() };
        raw.map(|w| ((w >> (4 * I)) & 15) as f32)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        // SAFETY: caller guarantees 8 writable values.
        unsafe { p.cast::<[f32; 8]>().write_unaligned(v) }
    }
    #[inline(always)]
    fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] * b[i] + c[i])
    }
    #[inline(always)]
    fn add(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] + b[i])
    }
    #[inline(always)]
    fn mul(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] * b[i])
    }
    #[inline(always)]
    fn max(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i].max(b[i]))
    }
    #[inline(always)]
    fn hsum(v: Self::V) -> f32 {
        ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]))
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{fp8_half_bits_128, fp8_half_bits_256, Avx2, Avx512};

#[cfg(target_arch = "aarch64")]
pub use arm::Neon;

#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::*;

    use half::f16;

    use super::Simd;

    /// AArch64 Advanced SIMD, 4 lanes. Its own table, not the portable kernels vectorised by
    /// LLVM: those keep a multiply and an add apart (Rust does not contract `a * b + c`), so
    /// every multiply-add of their microkernels was two instructions where `fmla` is one.
    #[derive(Debug, Clone, Copy)]
    pub struct Neon;

    // SAFETY (whole impl): Advanced SIMD is part of every AArch64 target Rust builds for, and
    // these bodies run inside functions compiled with `target_feature(enable = "neon")`.
    impl Simd for Neon {
        type V = float32x4_t;
        const LANES: usize = 4;

        #[inline(always)]
        fn zero() -> float32x4_t {
            unsafe { vdupq_n_f32(0.0) }
        }
        #[inline(always)]
        fn splat(v: f32) -> float32x4_t {
            unsafe { vdupq_n_f32(v) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> float32x4_t {
            unsafe { vld1q_f32(p) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> float32x4_t {
            unsafe { vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p))) }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> float32x4_t {
            // `vcvt_f32_f16` needs Rust's unstable f16 vector type; half converts per value.
            let raw = unsafe { p.cast::<[u16; 4]>().read_unaligned() };
            let wide = raw.map(|b| f16::from_bits(b).to_f32());
            unsafe { vld1q_f32(wide.as_ptr()) }
        }
        #[inline(always)]
        unsafe fn load_fp8<const E5M2: bool>(p: *const u8) -> float32x4_t {
            use super::Elem;
            let raw = unsafe { p.cast::<[u8; 4]>().read_unaligned() };
            let wide = raw.map(|b| super::Fp8Bits::<E5M2>(b).to_f32());
            unsafe { vld1q_f32(wide.as_ptr()) }
        }
        #[inline(always)]
        unsafe fn load_u4<const I: u32>(p: *const u32) -> float32x4_t {
            unsafe {
                let shifted = vshlq_u32(vld1q_u32(p), vdupq_n_s32(-4 * I as i32));
                vcvtq_f32_u32(vandq_u32(shifted, vdupq_n_u32(15)))
            }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: float32x4_t) {
            unsafe { vst1q_f32(p, v) }
        }
        #[inline(always)]
        fn fma(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
            unsafe { vfmaq_f32(c, a, b) }
        }
        #[inline(always)]
        fn add(a: float32x4_t, b: float32x4_t) -> float32x4_t {
            unsafe { vaddq_f32(a, b) }
        }
        #[inline(always)]
        fn mul(a: float32x4_t, b: float32x4_t) -> float32x4_t {
            unsafe { vmulq_f32(a, b) }
        }
        /// IEEE maxNum, as the portable kernels' `f32::max`: a NaN lane takes the other value.
        #[inline(always)]
        fn max(a: float32x4_t, b: float32x4_t) -> float32x4_t {
            unsafe { vmaxnmq_f32(a, b) }
        }
        #[inline(always)]
        fn hsum(v: float32x4_t) -> f32 {
            unsafe { vaddvq_f32(v) }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::Simd;

    /// [`crate::Fp8::half_bits`] of eight bytes held in 16-bit lanes.
    ///
    /// # Safety
    /// The CPU has SSE2.
    #[inline(always)]
    pub unsafe fn fp8_half_bits_128<const E5M2: bool>(w: __m128i) -> __m128i {
        unsafe {
            let top = _mm_slli_epi16::<8>(w);
            if E5M2 {
                top
            } else {
                // As in `fp8_half_bits_256`.
                let spread = _mm_srai_epi16::<1>(top);
                _mm_and_si128(spread, _mm_set1_epi16(0xbfffu16 as i16))
            }
        }
    }

    /// [`crate::Fp8::half_bits`] of sixteen bytes held in 16-bit lanes.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline(always)]
    pub unsafe fn fp8_half_bits_256<const E5M2: bool>(w: __m256i) -> __m256i {
        unsafe {
            let top = _mm256_slli_epi16::<8>(w);
            if E5M2 {
                top
            } else {
                // The byte at the top, shifted down one with its sign copied: the sign stays
                // at bit 15 and its copy at bit 14 (f16's top exponent bit) is cleared.
                let spread = _mm256_srai_epi16::<1>(top);
                _mm256_and_si256(spread, _mm256_set1_epi16(0xbfffu16 as i16))
            }
        }
    }

    /// AVX2 + FMA + F16C, 8 lanes.
    #[derive(Debug, Clone, Copy)]
    pub struct Avx2;

    // SAFETY (whole impl): these bodies only run inside functions compiled with
    // `target_feature(enable = "avx2,fma,f16c")`, entered after run-time detection.
    impl Simd for Avx2 {
        type V = __m256;
        const LANES: usize = 8;

        #[inline(always)]
        fn zero() -> __m256 {
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        fn splat(v: f32) -> __m256 {
            unsafe { _mm256_set1_ps(v) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> __m256 {
            unsafe {
                let h = _mm_loadu_si128(p.cast());
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
            }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> __m256 {
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
        }
        #[inline(always)]
        unsafe fn load_fp8<const E5M2: bool>(p: *const u8) -> __m256 {
            unsafe {
                let w = _mm_cvtepu8_epi16(_mm_loadl_epi64(p.cast()));
                _mm256_cvtph_ps(fp8_half_bits_128::<E5M2>(w))
            }
        }
        #[inline(always)]
        unsafe fn load_u4<const I: u32>(p: *const u32) -> __m256 {
            unsafe {
                let w = _mm256_loadu_si256(p.cast());
                let shifted = _mm256_srl_epi32(w, _mm_cvtsi32_si128(4 * I as i32));
                _mm256_cvtepi32_ps(_mm256_and_si256(shifted, _mm256_set1_epi32(15)))
            }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        fn add(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        fn mul(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_mul_ps(a, b) }
        }
        #[inline(always)]
        fn max(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_max_ps(a, b) }
        }
        #[inline(always)]
        fn hsum(v: __m256) -> f32 {
            unsafe {
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
                _mm_cvtss_f32(s)
            }
        }
    }

    /// AVX-512 F/BW/VL/DQ, 16 lanes.
    #[derive(Debug, Clone, Copy)]
    pub struct Avx512;

    // SAFETY (whole impl): these bodies only run inside functions compiled with
    // `target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")`, entered after
    // run-time detection.
    impl Simd for Avx512 {
        type V = __m512;
        const LANES: usize = 16;

        #[inline(always)]
        fn zero() -> __m512 {
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        fn splat(v: f32) -> __m512 {
            unsafe { _mm512_set1_ps(v) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> __m512 {
            unsafe {
                let h = _mm256_loadu_si256(p.cast());
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
            }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> __m512 {
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
        }
        #[inline(always)]
        unsafe fn load_fp8<const E5M2: bool>(p: *const u8) -> __m512 {
            unsafe {
                let w = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast()));
                _mm512_cvtph_ps(fp8_half_bits_256::<E5M2>(w))
            }
        }
        #[inline(always)]
        unsafe fn load_u4<const I: u32>(p: *const u32) -> __m512 {
            unsafe {
                let w = _mm512_loadu_si512(p.cast());
                // Shifts by immediates (one micro-op; by a register, two); then the value's
                // float looked up by
                // `vpermps`, which reads the low four bits of each lane and ignores the rest:
                // one instruction in place of a mask and a conversion, both on port 0 where
                // the shifts are (int4 decode, 8192 x 1280 on two Xeon threads: 405 us
                // against 236 by a mask, a conversion and a shift by register).
                let shifted = match I {
                    0 => w,
                    1 => _mm512_srli_epi32::<4>(w),
                    2 => _mm512_srli_epi32::<8>(w),
                    3 => _mm512_srli_epi32::<12>(w),
                    4 => _mm512_srli_epi32::<16>(w),
                    5 => _mm512_srli_epi32::<20>(w),
                    6 => _mm512_srli_epi32::<24>(w),
                    _ => _mm512_srli_epi32::<28>(w),
                };
                let values = _mm512_setr_ps(
                    0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                    15.0,
                );
                _mm512_permutexvar_ps(shifted, values)
            }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        fn add(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        fn mul(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_mul_ps(a, b) }
        }
        #[inline(always)]
        fn max(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_max_ps(a, b) }
        }
        #[inline(always)]
        fn hsum(v: __m512) -> f32 {
            unsafe { _mm512_reduce_add_ps(v) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte of each fp8 reading, loaded a vector at a time at each level the host
    /// runs, is the scalar reading of it, which `Fp8::half_bits`' own test ties to the formats'
    /// values.
    #[test]
    fn fp8_vector_loads_read_every_byte_as_the_scalar_path() {
        fn check<S: Simd, const E5M2: bool>(name: &str) {
            let bytes: Vec<u8> = (0..=255).collect();
            let mut out = vec![0f32; 256];
            for (i, chunk) in bytes.chunks_exact(S::LANES).enumerate() {
                // SAFETY: each chunk holds LANES bytes; out holds LANES floats from there.
                unsafe {
                    S::store(
                        out.as_mut_ptr().add(i * S::LANES),
                        S::load_fp8::<E5M2>(chunk.as_ptr()),
                    )
                };
            }
            for (b, got) in out.iter().enumerate() {
                let want = Fp8Bits::<E5M2>(b as u8).to_f32();
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{name} E5M2={E5M2} byte {b:#04x}: {got} against {want}"
                );
            }
        }
        check::<Portable, false>("portable");
        check::<Portable, true>("portable");
        #[cfg(target_arch = "x86_64")]
        {
            let host = crate::CpuInfo::detect();
            if host.isa >= crate::Isa::Avx2Fma {
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn avx2() {
                    check::<Avx2, false>("avx2");
                    check::<Avx2, true>("avx2");
                }
                // SAFETY: the host has AVX2, FMA and F16C.
                unsafe { avx2() };
            }
            if host.isa >= crate::Isa::Avx512 {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
                unsafe fn avx512() {
                    check::<Avx512, false>("avx512");
                    check::<Avx512, true>("avx512");
                }
                // SAFETY: the host has AVX-512F/BW/VL/DQ.
                unsafe { avx512() };
            }
        }
    }
}
