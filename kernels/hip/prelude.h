// kerntune GPU prelude: the one place where HIP and CUDA differ, so each kernel source is
// written once for both vendors. Kernels include only this file.
//
// Configuration arrives as -D macros (KT_*), one code object per candidate: tile sizes are
// compile-time constants, so loops unroll and register tiles stay in registers.
//
// A third target, KT_HOST, is the CPU: the emulator (kernels/emulator/simt.h, included before
// this file) runs the same source with fibers for threads, so GPU configs are verified on
// machines without a GPU. It emulates one vendor's wave width and matrix instructions.
#pragma once

#if defined(__HIP__) || defined(__HIPCC__)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#define KT_HIP 1
// CDNA runs 64-wide waves, RDNA 32-wide; the compiler says which for the target.
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define KT_WAVE __AMDGCN_WAVEFRONT_SIZE
#else
#define KT_WAVE 64
#endif
#define KT_SHFL_XOR(v, m) __shfl_xor((v), (m))
#define KT_SHFL(v, src) __shfl((v), (src))
// v_mfma_f32_32x32x8 and _16x16x16 (bf16_1k for bf16) exist on CDNA2 and CDNA3 only; the
// host pass of hipcc sees no target.
#if !defined(__HIP_DEVICE_COMPILE__) || defined(__gfx90a__) || defined(__gfx940__) || \
    defined(__gfx941__) || defined(__gfx942__)
#define KT_MFMA 1
#endif
#elif defined(__CUDACC__) || defined(__CUDACC_RTC__)
// No CUDA headers: NVRTC from a wheel ships none, and the kernels need only builtins.
#define KT_CUDA 1
#define KT_WAVE 32
#define KT_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define KT_SHFL(v, src) __shfl_sync(0xffffffffu, (v), (src))
#define KT_MMA 1
// Hopper's warpgroup MMA: the arch-specific target sm_90a only (a build asks for it).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KT_WGMMA 1
#endif
#elif defined(KT_HOST)
#ifndef KT_HOST_WAVE
#error "the host emulator's simt.h must come first"
#endif
#define KT_WAVE KT_HOST_WAVE
#define KT_SHFL_XOR(v, m) kt_host::shfl_xor((v), (m))
#define KT_SHFL(v, src) kt_host::shfl((v), (src))
#if KT_HOST_MFMA
#define KT_MFMA 1
#endif
#if KT_HOST_MMA
#define KT_MMA 1
#endif
#if KT_HOST_WGMMA
#define KT_WGMMA 1
#endif
#else
#error "kerntune GPU kernels build with HIP (clang -x hip), CUDA (nvcc / NVRTC) or the host emulator"
#endif

// Dynamic shared memory (`KT_DYN_LDS` bytes, passed at launch) as a byte array `name`.
#if defined(KT_HOST)
// The block's own (the blocks of a cluster run at once), where the emulator resolves the
// shared-memory addresses of descriptors.
#define KT_DYNAMIC_SHARED(name) unsigned char* const name = kt_host::dynamic_shared(KT_DYN_LDS)
#else
#define KT_DYNAMIC_SHARED(name) extern __shared__ __attribute__((aligned(16))) unsigned char name[]
#endif

#if defined(KT_HOST)
#define KT_GLOBAL static
#define KT_DEVICE static inline
#define KT_SHARED static thread_local
#define KT_SYNC() kt_host::sync(__LINE__)
#define KT_TID kt_host::tid()
#define KT_BID_X kt_host::bid(0)
#define KT_BID_Y kt_host::bid(1)
#define KT_BID_Z kt_host::bid(2)
#define KT_LAUNCH_BOUNDS(threads)
#define KT_LAUNCH_BOUNDS_ONE(threads)
#define KT_LAUNCH_BOUNDS_WAVES(threads, waves)
#define KT_INF INFINITY
#define KT_BITS_F32(u) kt_host::bits_f32(u)
#define KT_FAST_DIV(a, b) ((a) / (b))
#else
#define KT_GLOBAL extern "C" __global__
#define KT_DEVICE __device__ __forceinline__
#define KT_SHARED __shared__
#define KT_SYNC() __syncthreads()
#define KT_TID ((int)threadIdx.x)
#define KT_BID_X ((int)blockIdx.x)
#define KT_BID_Y ((int)blockIdx.y)
#define KT_BID_Z ((int)blockIdx.z)
#define KT_LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
// A kernel whose shared memory, not its registers, limits the blocks an SM holds: told one
// block a multiprocessor is enough, ptxas gives its threads the registers they need, where
// aiming at more blocks it held the tensor-core paged attention to 48 or 64 and spilled.
// (HIP's second bound means waves per EU, not blocks: there it is the plain bound.)
#if defined(KT_CUDA)
#define KT_LAUNCH_BOUNDS_ONE(threads) __launch_bounds__(threads, 1)
#else
#define KT_LAUNCH_BOUNDS_ONE(threads) __launch_bounds__(threads)
#endif
// A kernel whose waves should share a SIMD `waves` at a time (on AMD, at most 512 / waves
// registers a lane): one whose loads go straight to registers hides their latency behind
// other waves, where the compiler, left alone, hoisted loads into 430-odd registers and one
// wave a SIMD. NVIDIA's bound is the plain one.
#if defined(KT_HIP)
#define KT_LAUNCH_BOUNDS_WAVES(threads, waves) \
    __launch_bounds__(threads) __attribute__((amdgpu_waves_per_eu(waves)))
#else
#define KT_LAUNCH_BOUNDS_WAVES(threads, waves) __launch_bounds__(threads)
#endif
// Positive infinity without <math.h>, which NVRTC does not provide.
#define KT_INF __int_as_float(0x7f800000)
#define KT_BITS_F32(u) __uint_as_float(u)
// A quotient within 2 ulp by reciprocal and multiply (0 where b is past 2^126), without the
// IEEE division's slow path and its registers.
#define KT_FAST_DIV(a, b) __fdividef(a, b)
#endif

// Input element type: 0 = f32, 1 = f16, 2 = bf16, and for GEMMs 3 = fp8 E4M3 (either format)
// and 4 = fp8 E5M2. Half types travel as raw 16-bit words and widen to f32 on load:
// accumulation is f32, as in the CPU kernels and the reference. An fp8 byte is read as the f16
// whose bits are its sign, exponent and mantissa moved into place (kt_fp8_bits): exact for
// every value, the format's value times 2^-8 (E4M3), 2^-7 (E4M3 FNUZ, whose bias is one more)
// or 1 (E5M2); the product of two such factors joins the scales where C is stored
// (kt_scaled). The matrix cores take those readings as f16 (KT_CORE_BF16 0).
#ifndef KT_DTYPE
#error "KT_DTYPE (0 f32, 1 f16, 2 bf16, 3 fp8 E4M3, 4 fp8 E5M2) must be defined"
#endif
#define KT_FP8_IN (KT_DTYPE == 3 || KT_DTYPE == 4)
#define KT_CORE_BF16 (KT_DTYPE == 2)
// The f16 bits of fp8 bytes held in the low bytes of a word's 16-bit halves (two at once):
// E5M2 is an f16's top byte; E4M3's four exponent bits become the low four of f16's five.
KT_DEVICE unsigned kt_fp8_bits(unsigned b, bool e5m2) {
    return e5m2 ? b << 8 : ((b & 0x007f007fu) << 7) | ((b & 0x00800080u) << 8);
}
// IEEE half bits as f32, whatever the input type (fp8 caches widen through it).
#if defined(KT_HIP)
KT_DEVICE float kt_f16_f32(unsigned short x) { return __half2float(__ushort_as_half(x)); }
#elif defined(KT_HOST)
KT_DEVICE float kt_f16_f32(unsigned short x) { return kt_host::f16_f32(x); }
#else
KT_DEVICE float kt_f16_f32(unsigned short x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}
#endif
#if KT_DTYPE == 0
typedef float kt_in;
KT_DEVICE float kt_widen(kt_in x) { return x; }
#elif KT_DTYPE == 1
typedef unsigned short kt_in;
KT_DEVICE float kt_widen(kt_in x) { return kt_f16_f32(x); }
#elif KT_DTYPE == 2
typedef unsigned short kt_in;
KT_DEVICE float kt_widen(kt_in x) { return KT_BITS_F32(((unsigned)x) << 16); }
#elif KT_FP8_IN
typedef unsigned char kt_in;
// An input as the matrix cores take it: a 16-bit value itself, an fp8 byte its f16 reading.
KT_DEVICE unsigned short kt_core_bits(kt_in x) {
    return (unsigned short)kt_fp8_bits(x, KT_DTYPE == 4);
}
KT_DEVICE float kt_widen(kt_in x) { return kt_f16_f32(kt_core_bits(x)); }
#else
#error "KT_DTYPE must be 0, 1, 2, 3 or 4"
#endif
#if KT_DTYPE == 1 || KT_DTYPE == 2
KT_DEVICE unsigned short kt_core_bits(kt_in x) { return x; }
#endif

KT_DEVICE float kt_load(const kt_in* p, long i) { return kt_widen(p[i]); }

// Sixteen bytes of a row in one load (global_load_dwordx4 on AMD, ld.global.v4 on NVIDIA):
// KT_VEC input values, widened after the load so the raw words can be in flight first. The
// address must be 16-byte aligned, as on the device (the emulator fails otherwise).
#if KT_DTYPE == 0
#define KT_VEC 4
#elif KT_FP8_IN
#define KT_VEC 16
#else
#define KT_VEC 8
#endif
#if defined(KT_HOST)
struct __attribute__((aligned(16))) kt_u32x4 {
    unsigned x, y, z, w;
};
KT_DEVICE kt_u32x4 kt_load16(const void* p) { return kt_host::load16<kt_u32x4>(p); }
#else
typedef uint4 kt_u32x4;
KT_DEVICE kt_u32x4 kt_load16(const void* p) { return *reinterpret_cast<const kt_u32x4*>(p); }
#endif
// Two floats in one 8-byte store (st.global.v2); the address 8-byte aligned.
#if defined(KT_HOST)
KT_DEVICE void kt_store8(float* p, float x, float y) { kt_host::store8(p, x, y); }
#else
KT_DEVICE void kt_store8(float* p, float x, float y) {
    float2 v;
    v.x = x;
    v.y = y;
    *reinterpret_cast<float2*>(p) = v;
}
#endif
KT_DEVICE void kt_widen16(const kt_u32x4& v, float (&x)[KT_VEC]) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#if KT_DTYPE == 0
        x[i] = KT_BITS_F32(w[i]);
#elif KT_FP8_IN
        // Bytes 0 and 2, then 1 and 3, of the word, each pair in the low bytes of a word's
        // halves.
        const unsigned even = kt_fp8_bits(w[i] & 0x00ff00ffu, KT_DTYPE == 4);
        const unsigned odd = kt_fp8_bits((w[i] >> 8) & 0x00ff00ffu, KT_DTYPE == 4);
        x[4 * i] = kt_f16_f32((unsigned short)(even & 0xffffu));
        x[4 * i + 1] = kt_f16_f32((unsigned short)(odd & 0xffffu));
        x[4 * i + 2] = kt_f16_f32((unsigned short)(even >> 16));
        x[4 * i + 3] = kt_f16_f32((unsigned short)(odd >> 16));
#else
        // Little-endian: the lower half of each word is the earlier element.
        x[2 * i] = kt_widen((kt_in)(w[i] & 0xffffu));
        x[2 * i + 1] = kt_widen((kt_in)(w[i] >> 16));
#endif
    }
}

// What paged attention's KV caches hold: kt_in, or in KT_KV_FP8 builds one byte a value (1:
// E4M3, either format; 2: E5M2) under a 16-bit query. A byte is read as the f16 whose bits are
// its sign, exponent and mantissa moved into place (E5M2 is an f16's top byte; E4M3's four
// exponent bits become the low four of f16's five): exact for every value, subnormals
// included, and the factor from that f16 to the format's value (2^8, or 2^7 for the fnuz
// bias) joins the cache's scale on the host. Pieces of a row are KT_VEC values, 8 bytes.
#ifndef KT_KV_FP8
#define KT_KV_FP8 0
#endif
#if KT_KV_FP8
#if KT_DTYPE == 0 || KT_FP8_IN
#error "fp8 caches (KT_KV_FP8) go with an f16 or bf16 query"
#endif
typedef unsigned char kt_cache;
KT_DEVICE unsigned kt_fp8_half_bits(unsigned b) { return kt_fp8_bits(b, KT_KV_FP8 == 2); }
KT_DEVICE float kt_load_cache(const kt_cache* p, long i) {
    return kt_f16_f32((unsigned short)kt_fp8_half_bits(p[i]));
}
#if defined(KT_HOST)
struct __attribute__((aligned(8))) kt_cache_piece {
    unsigned x, y;
};
KT_DEVICE kt_cache_piece kt_load_piece(const kt_cache* p) {
    return kt_host::load8<kt_cache_piece>(p);
}
#else
typedef uint2 kt_cache_piece;
KT_DEVICE kt_cache_piece kt_load_piece(const kt_cache* p) {
    return *reinterpret_cast<const kt_cache_piece*>(p);
}
#endif
KT_DEVICE void kt_widen_piece(const kt_cache_piece& v, float (&x)[KT_VEC]) {
    const unsigned w[2] = {v.x, v.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        // Little-endian: bytes 0 and 1 of the word, then 2 and 3, each pair spread into the
        // low bytes of a word's halves.
        const unsigned lo = kt_fp8_half_bits((w[i] & 0xffu) | ((w[i] & 0xff00u) << 8));
        const unsigned hi = kt_fp8_half_bits(((w[i] >> 16) & 0xffu) | ((w[i] >> 8) & 0xff0000u));
        x[4 * i] = kt_f16_f32((unsigned short)(lo & 0xffffu));
        x[4 * i + 1] = kt_f16_f32((unsigned short)(lo >> 16));
        x[4 * i + 2] = kt_f16_f32((unsigned short)(hi & 0xffffu));
        x[4 * i + 3] = kt_f16_f32((unsigned short)(hi >> 16));
    }
}
#else
typedef kt_in kt_cache;
KT_DEVICE float kt_load_cache(const kt_cache* p, long i) { return kt_load(p, i); }
typedef kt_u32x4 kt_cache_piece;
KT_DEVICE kt_cache_piece kt_load_piece(const kt_cache* p) { return kt_load16(p); }
KT_DEVICE void kt_widen_piece(const kt_cache_piece& v, float (&x)[KT_VEC]) { kt_widen16(v, x); }
#endif

// Reductions across one wave/warp by butterfly shuffles.
KT_DEVICE float kt_wave_max(float v) {
#pragma unroll
    for (int m = KT_WAVE / 2; m > 0; m /= 2) v = fmaxf(v, KT_SHFL_XOR(v, m));
    return v;
}
KT_DEVICE float kt_wave_sum(float v) {
#pragma unroll
    for (int m = KT_WAVE / 2; m > 0; m /= 2) v += KT_SHFL_XOR(v, m);
    return v;
}

// Attention with sinks (KT_SINKS builds, gpt-oss): head h's learned logit joins its softmax as
// a key whose value is zero, adding 2^(sink · log2 e − m) to a sum whose maximum is m (base 2,
// as the kernels' scores are). Builds without sinks add nothing and never read `sinks`.
#ifndef KT_SINKS
#define KT_SINKS 0
#endif
KT_DEVICE float kt_sink_weight(const float* sinks, int h, float m) {
    return KT_SINKS ? exp2f(sinks[h] * 1.4426950408889634f - m) : 0.0f;
}

// Soft-capped scores (KT_SOFTCAP builds, Gemma 2): a score x held in units where the cap is
// `unit` becomes unit · tanh(x / unit), before any mask (a masked score stays -inf). Builds
// without a cap hold none of it. tanh(y) as 1 - 2 / (1 + e^2y): off by about an ulp of 1
// (which the cap scales to a few millionths of a logit) and a handful of instructions, where
// the library's tanhf made ptxas spill the warp-specialized 128 by 128 wgmma tiles.
#ifndef KT_SOFTCAP
#define KT_SOFTCAP 0
#endif
KT_DEVICE float kt_softcap(float x, float unit) {
    if (!KT_SOFTCAP) return x;
    const float e = exp2f(2.8853900817779268f * KT_FAST_DIV(x, unit));  // e^(2y), y = x / unit
    return unit - KT_FAST_DIV(2.0f * unit, 1.0f + e);
}

// ALiBi (KT_ALIBI builds: Bloom, MPT, Baichuan 13B, Falcon-RW, JAIS): head h's slope m_h biases
// the score of key j for the query at position pos by m_h · (j - pos), after the cap and
// before the mask. kt_alibi_unit gives m_h in the units the kernel holds its scores in (`per`:
// the factor from the scaled scores to those); kt_alibi the bias, the distance an exact
// whole number in f32 (positions stay below 2^24; two products subtracted would lose it at
// long contexts). Builds without ALiBi add nothing and never read `slopes`.
#ifndef KT_ALIBI
#define KT_ALIBI 0
#endif
KT_DEVICE float kt_alibi_unit(const float* slopes, int h, float per) {
    return KT_ALIBI ? slopes[h] * per : 0.0f;
}
KT_DEVICE float kt_alibi(float unit, int j, int pos) {
    return KT_ALIBI ? unit * (float)(j - pos) : 0.0f;
}

// Matrix-core steps, per vendor (the GEMM's MFMA and mma variants), for 16-bit inputs.
#if defined(KT_MFMA) && KT_DTYPE != 0
// v_mfma_f32_32x32x8: four consecutive 16-bit values of an A row or a B column per lane, 16
// f32 accumulators per lane.
// v_mfma_f32_16x16x16: the same fragments, lane l's A row and B column l % 16 at k =
// 4·(l / 16) to 4·(l / 16) + 3; accumulator element e of lane l is row 4·(l / 16) + e, column
// l % 16.
#if defined(KT_HOST)
typedef kt_host::f32x16 kt_f32x16;
typedef kt_host::f32x4 kt_f32x4;
typedef kt_host::frag4 kt_frag;
KT_DEVICE kt_f32x16 kt_mfma(kt_frag x, kt_frag y, kt_f32x16 acc) {
    return kt_host::mfma_32x32x8(x, y, acc);
}
KT_DEVICE kt_f32x4 kt_mfma16(kt_frag x, kt_frag y, kt_f32x4 acc) {
    return kt_host::mfma_16x16x16(x, y, acc);
}
#else
typedef float kt_f32x16 __attribute__((ext_vector_type(16)));
typedef float kt_f32x4 __attribute__((ext_vector_type(4)));
#if !KT_CORE_BF16
typedef _Float16 kt_frag __attribute__((ext_vector_type(4)));
#else
typedef short kt_frag __attribute__((ext_vector_type(4)));
#endif
KT_DEVICE kt_f32x16 kt_mfma(kt_frag x, kt_frag y, kt_f32x16 acc) {
#if !KT_CORE_BF16
    return __builtin_amdgcn_mfma_f32_32x32x8f16(x, y, acc, 0, 0, 0);
#else
    return __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(x, y, acc, 0, 0, 0);
#endif
}
KT_DEVICE kt_f32x4 kt_mfma16(kt_frag x, kt_frag y, kt_f32x4 acc) {
#if !KT_CORE_BF16
    return __builtin_amdgcn_mfma_f32_16x16x16f16(x, y, acc, 0, 0, 0);
#else
    return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(x, y, acc, 0, 0, 0);
#endif
}
#endif

// Two words of 16-bit values (the first holding elements 0 and 1, low half first) as one
// fragment.
KT_DEVICE kt_frag kt_frag_of(unsigned lo, unsigned hi) {
    const unsigned w[2] = {lo, hi};
    kt_frag f;
    __builtin_memcpy(&f, w, sizeof f);
    return f;
}

// Four consecutive 16-bit values as one fragment.
KT_DEVICE kt_frag kt_frag_at(const unsigned short* p) {
    kt_frag f;
    __builtin_memcpy(&f, p, sizeof f);
    return f;
}

#if KT_FP8_IN && KT_STAGES > 1
// acc += A·B for one v_mfma_f32_32x32x16_fp8_fp8 step on fp8 bytes themselves (gfx940 and
// later, whose fp8 is E4M3 FNUZ): a lane's eight bytes sit where 32x32x8's four 16-bit values
// do, so the 16-bit tiles' loads and fragments serve unchanged, two bytes to a word.
KT_DEVICE kt_f32x16 kt_mfma_fp8(kt_frag x, kt_frag y, kt_f32x16 acc) {
#if defined(KT_HOST)
    return kt_host::mfma_32x32x16_fp8(x, y, acc);
#elif __has_builtin(__builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8)
    return __builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8(__builtin_bit_cast(long, x),
                                                      __builtin_bit_cast(long, y), acc, 0, 0, 0);
#elif defined(__HIP_DEVICE_COMPILE__)
#error "this compiler has no fp8 MFMA (v_mfma_f32_32x32x16_fp8_fp8): clang 19 or ROCm 6 has"
#else
    // The host pass of a whole HIP compile, which runs no device code.
    return acc;
#endif
}
#endif

// Four f32 values rounded to the input type (to nearest even) as one fragment: probabilities
// entering the P·V product.
#if defined(KT_HOST)
KT_DEVICE kt_frag kt_pack4(float a, float b, float c, float d) {
    return kt_host::pack4(a, b, c, d);
}
#elif !KT_CORE_BF16
KT_DEVICE kt_frag kt_pack4(float a, float b, float c, float d) {
    const kt_frag f = {(_Float16)a, (_Float16)b, (_Float16)c, (_Float16)d};
    return f;
}
#else
// CDNA2 has no f32-to-bf16 instruction: round in integer arithmetic, NaN kept a NaN.
KT_DEVICE short kt_bf16(float x) {
    unsigned u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (short)(u >> 16);
}
KT_DEVICE kt_frag kt_pack4(float a, float b, float c, float d) {
    const kt_frag f = {kt_bf16(a), kt_bf16(b), kt_bf16(c), kt_bf16(d)};
    return f;
}
#endif
#endif

#if defined(KT_MMA) && KT_DTYPE != 0
// Two consecutive 16-bit values (k and k + 1) as one fragment register, the first in the low
// half.
KT_DEVICE unsigned kt_pair(const unsigned short* p) {
    return *reinterpret_cast<const unsigned*>(p);
}

// Two f32 values rounded to the input type (to nearest even) as one fragment register, `lo`
// in the low half: probabilities entering the P·V product.
KT_DEVICE unsigned kt_pack2(float lo, float hi) {
#if defined(KT_HOST)
    return kt_host::pack2(lo, hi);
#else
    unsigned r;
#if !KT_CORE_BF16
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
#endif
}

// 2^x by the special function unit's approximation, subnormal results flushed to zero (as
// CUDA's fast math has it): the flash softmax's exponent, whose arguments are at most 0 and
// whose results round to 16 bits before use. exp2f checks for subnormals around the same
// instruction.
KT_DEVICE float kt_exp2(float x) {
#if defined(KT_HOST)
    return exp2f(x);
#else
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#endif
}

// sm_80's asynchronous copies, 16 bytes from global to shared memory: `bytes` (0 or 16) read
// from `src`, the rest zero-filled; a thread's copies complete by commit group. And ldmatrix:
// four 8×8 matrices of 16-bit values whose rows lanes 8q .. 8q + 7 address; register q of lane
// l holds elements 2·(l % 4) and + 1 of row l / 4 of matrix q (`_trans`: of column l / 4).
// The emulator delays each copy to the wait and poisons its destination meanwhile, so a read
// before the wait, or a copy into a stage still being read, shows in the output.
// kt_ldmatrix_x4_at and kt_cp_async16_at take the 32-bit shared address (kt_smem) instead of
// a pointer: a hot loop computes each lane's once and adds constants, which ptxas folds into
// the instruction. Through a pointer, every use converts a 64-bit generic address: in the
// flash mma tile of 128 by 128 keys, two 64-bit adds an ldmatrix, 370 of the key loop's 1,700
// instructions.
#if defined(KT_HOST)
KT_DEVICE void kt_cp_async16(void* dst, const void* src, int bytes) {
    kt_host::cp_async(dst, src, bytes);
}
KT_DEVICE void kt_cp_async_commit() { kt_host::cp_commit(); }
template <int N>
KT_DEVICE void kt_cp_async_wait() {
    kt_host::cp_wait(N);
}
KT_DEVICE unsigned kt_smem(const void* p) { return kt_host::smem_offset(p); }
KT_DEVICE void kt_cp_async16_at(unsigned at, const void* src, int bytes) {
    kt_host::cp_async(const_cast<void*>(kt_host::smem_at(at)), src, bytes);
}
KT_DEVICE void kt_ldmatrix_x4(unsigned (&r)[4], const unsigned short* p) {
    kt_host::ldmatrix_x4(r, p, false);
}
KT_DEVICE void kt_ldmatrix_x4_trans(unsigned (&r)[4], const unsigned short* p) {
    kt_host::ldmatrix_x4(r, p, true);
}
KT_DEVICE void kt_ldmatrix_x4_at(unsigned (&r)[4], unsigned at) {
    kt_host::ldmatrix_x4(r, static_cast<const unsigned short*>(kt_host::smem_at(at)), false);
}
KT_DEVICE void kt_ldmatrix_x4_trans_at(unsigned (&r)[4], unsigned at) {
    kt_host::ldmatrix_x4(r, static_cast<const unsigned short*>(kt_host::smem_at(at)), true);
}
#else
// A shared-memory address as the 32-bit offset the instructions take (what CUDA's
// __cvta_generic_to_shared returns, in PTX so NVRTC needs no headers).
KT_DEVICE unsigned kt_smem(const void* p) {
    unsigned r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}
KT_DEVICE void kt_ldmatrix_x4_at(unsigned (&r)[4], unsigned at) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}
KT_DEVICE void kt_ldmatrix_x4_trans_at(unsigned (&r)[4], unsigned at) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}
KT_DEVICE void kt_cp_async16_at(unsigned at, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(at), "l"(src), "r"(bytes)
                 : "memory");
}
KT_DEVICE void kt_cp_async16(void* dst, const void* src, int bytes) {
    kt_cp_async16_at(kt_smem(dst), src, bytes);
}
KT_DEVICE void kt_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
KT_DEVICE void kt_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
KT_DEVICE void kt_ldmatrix_x4(unsigned (&r)[4], const unsigned short* p) {
    kt_ldmatrix_x4_at(r, kt_smem(p));
}
KT_DEVICE void kt_ldmatrix_x4_trans(unsigned (&r)[4], const unsigned short* p) {
    kt_ldmatrix_x4_trans_at(r, kt_smem(p));
}
#endif

// d += a · b for one mma.sync.aligned.m16n8k16 step; a: 4 registers of two 16-bit values,
// b: 2. Inline PTX, so NVRTC needs no headers.
KT_DEVICE void kt_mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#if defined(KT_HOST)
    kt_host::mma_16x8x16(d, a, b);
#else
#if !KT_CORE_BF16
#define KT_MMA_IN "f16"
#else
#define KT_MMA_IN "bf16"
#endif
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32." KT_MMA_IN "." KT_MMA_IN ".f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

#if KT_FP8_IN && KT_STAGES > 1
// d += a · b for one mma.sync.aligned.m16n8k32 step on fp8 bytes themselves (sm_89 and
// later; OCP E4M3 or E5M2): a: 4 registers of four bytes, b: 2. A lane's bytes sit where
// m16n8k16's 16-bit values do, two to a value (bytes 4t to 4t + 3 of its rows or column,
// then 16 further), so the 16-bit tiles' copies and ldmatrix fragments serve unchanged.
KT_DEVICE void kt_mma_k32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#if defined(KT_HOST)
    kt_host::mma_16x8x32_fp8(d, a, b);
#else
#if KT_DTYPE == 4
#define KT_MMA_FP8 "e5m2"
#else
#define KT_MMA_FP8 "e4m3"
#endif
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32." KT_MMA_FP8 "." KT_MMA_FP8 ".f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
#endif
#endif

#if defined(KT_WGMMA) && KT_DTYPE != 0
// Hopper's warpgroup MMA (wgmma.mma_async.m64nNk16, f32 accumulation; m64nNk32 on fp8
// bytes, whose 32 of k take the bytes of 16-bit's 16): the 128 threads of a
// warpgroup compute a 64×N tile of D += A·Bᵀ, A (64×16) and B (N×16) read from shared memory
// through descriptors, asynchronously: issued after a wgmma.fence, completed by commit group
// (kt_wgmma_wait<n> leaves the newest n groups in flight). Thread (warp w of the warpgroup,
// lane 4g + t) holds in d[4j + e] row 16w + g + 8·(e / 2), column 8j + 2t + e % 2.
//
// Operands are k-major. Layout 0, no swizzling: 8×8 core matrices of 128 contiguous bytes
// (8 rows of 16), `lbo` bytes between core matrices adjacent in k, `sbo` between those
// adjacent in rows. Layouts 1, 2, 3 (128-, 64-, 32-byte swizzling): rows of that many bytes
// of k, 8 of them then the next 8 `sbo` on (`lbo` unused), each 16-byte piece at its
// address XORed with address bits 7 up (see the GEMM's kt_swizzled). The emulator computes
// each operation at the wait that covers it, from shared memory as it is then, so a copy
// into a tile still being read shows.
KT_DEVICE unsigned long long kt_wgmma_desc(const void* p, unsigned lbo, unsigned sbo,
                                           unsigned layout) {
    return (unsigned long long)((kt_smem(p) >> 4) & 0x3fffu) |
           ((unsigned long long)((lbo >> 4) & 0x3fffu) << 16) |
           ((unsigned long long)((sbo >> 4) & 0x3fffu) << 32) |
           ((unsigned long long)(layout & 3u) << 62);
}
#if defined(KT_HOST)
KT_DEVICE void kt_wgmma_fence() { kt_host::wgmma_fence(); }
KT_DEVICE void kt_wgmma_commit() { kt_host::wgmma_commit(); }
template <int N>
KT_DEVICE void kt_wgmma_wait() {
    kt_host::wgmma_wait(N);
}
// Shared memory written by the generic proxy (plain stores, cp.async) made visible to the
// async proxy that wgmma reads through; the emulator has one proxy.
KT_DEVICE void kt_fence_async_shared() {}
template <int N>
KT_DEVICE void kt_wgmma_fence_operand(float (&)[N]) {}
template <int N>
KT_DEVICE void kt_wgmma(float (&d)[N], unsigned long long a, unsigned long long b) {
    kt_host::wgmma(d, 2 * N, a, b);
}
template <int TRANS_B, int N>
KT_DEVICE void kt_wgmma_rs(float (&d)[N], const unsigned (&a)[4], unsigned long long b) {
    kt_host::wgmma_rs(d, 2 * N, a, b, TRANS_B);
}
template <int N>
KT_DEVICE void kt_setmaxnreg_dec() {}
template <int N>
KT_DEVICE void kt_setmaxnreg_inc() {}
#else
// Warp specialization's register split: the executing warpgroup's threads give registers
// back to the block's pool down to N each, or take them from it up to N each (every thread
// of the warpgroup, at the same point). ptxas compiles the code after each for its N, where
// the launch bounds alone would hold every thread to the same share.
template <int N>
KT_DEVICE void kt_setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
KT_DEVICE void kt_setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
KT_DEVICE void kt_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
KT_DEVICE void kt_wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
KT_DEVICE void kt_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
KT_DEVICE void kt_fence_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Pins the accumulators at this point of the program: the wgmma writes them asynchronously,
// so the compiler must not read or move them across the wait (or the fence) on its own.
template <int N>
KT_DEVICE void kt_wgmma_fence_operand(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// fp8 (OCP E4M3 or E5M2; the space refuses FNUZ): m64nNk32 on the bytes themselves, a k step
// of 32 bytes as the 16-bit one's, and no transpose immediates (fp8 operands are k-major).
#if KT_FP8_IN
#define KT_WGMMA_STEP(in) "k32.f32." in "." in
#define KT_WGMMA_TAIL ", p, 1, 1; }"
#if KT_DTYPE == 4
#define KT_WGMMA_IN "e5m2"
#else
#define KT_WGMMA_IN "e4m3"
#endif
#else
#define KT_WGMMA_STEP(in) "k16.f32." in "." in
#define KT_WGMMA_TAIL ", p, 1, 1, 0, 0; }"
#if !KT_CORE_BF16
#define KT_WGMMA_IN "f16"
#else
#define KT_WGMMA_IN "bf16"
#endif
#endif
// Inline PTX names every accumulator register (N/2 of them), so each N (the multiples of 32
// from 64 to 256) has its own operand list, spelled by these macros rather than by hand:
// KT_WG_OP(x, y) is operand xy's "%xy, " and KT_WG_ACC(x, y) its constraint on d[xy]; the
// group of 10 takes x0 .. x9 (x empty: 0 .. 9), those of 2 to 8 the first ones of theirs.
#define KT_WG_OP(x, y) "%" #x #y ", "
#define KT_WG_ACC(x, y) "+f"(d[x##y])
#define KT_WG_OP10(x)                                                                           \
    KT_WG_OP(x, 0) KT_WG_OP(x, 1) KT_WG_OP(x, 2) KT_WG_OP(x, 3) KT_WG_OP(x, 4) KT_WG_OP(x, 5) \
        KT_WG_OP(x, 6) KT_WG_OP(x, 7) KT_WG_OP(x, 8) KT_WG_OP(x, 9)
#define KT_WG_ACC10(x)                                                                     \
    KT_WG_ACC(x, 0), KT_WG_ACC(x, 1), KT_WG_ACC(x, 2), KT_WG_ACC(x, 3), KT_WG_ACC(x, 4),     \
        KT_WG_ACC(x, 5), KT_WG_ACC(x, 6), KT_WG_ACC(x, 7), KT_WG_ACC(x, 8), KT_WG_ACC(x, 9)
#define KT_WG_OP2(x) KT_WG_OP(x, 0) KT_WG_OP(x, 1)
#define KT_WG_ACC2(x) KT_WG_ACC(x, 0), KT_WG_ACC(x, 1)
#define KT_WG_OP4(x) KT_WG_OP2(x) KT_WG_OP(x, 2) KT_WG_OP(x, 3)
#define KT_WG_ACC4(x) KT_WG_ACC2(x), KT_WG_ACC(x, 2), KT_WG_ACC(x, 3)
#define KT_WG_OP6(x) KT_WG_OP4(x) KT_WG_OP(x, 4) KT_WG_OP(x, 5)
#define KT_WG_ACC6(x) KT_WG_ACC4(x), KT_WG_ACC(x, 4), KT_WG_ACC(x, 5)
#define KT_WG_OP8(x) KT_WG_OP6(x) KT_WG_OP(x, 6) KT_WG_OP(x, 7)
#define KT_WG_ACC8(x) KT_WG_ACC6(x), KT_WG_ACC(x, 6), KT_WG_ACC(x, 7)
// D (N/2 accumulators: operands 0 .. N/2 - 1), then A's descriptor DA, B's DB, and the
// predicate P; the accumulators' constraints last (their commas would split a macro argument).
#define KT_WGMMA_N(N, DA, DB, P, OPS, ...)                                                     \
    KT_DEVICE void kt_wgmma(float (&d)[N / 2], unsigned long long a, unsigned long long b) {   \
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %" #P ", 0; "                            \
                     "wgmma.mma_async.sync.aligned.m64n" #N KT_WGMMA_STEP(KT_WGMMA_IN)         \
                     " {" OPS "}, %" #DA ", %" #DB KT_WGMMA_TAIL                               \
                     : __VA_ARGS__                                                             \
                     : "l"(a), "l"(b), "r"(1));                                                \
    }
// Each list spells its last two operands itself, the last without the comma.
#define KT_WG_OPS_64 KT_WG_OP10() KT_WG_OP10(1) KT_WG_OP10(2) "%30, %31"
#define KT_WG_ACCS_64 KT_WG_ACC10(), KT_WG_ACC10(1), KT_WG_ACC10(2), KT_WG_ACC2(3)
#define KT_WG_OPS_96 KT_WG_OP10() KT_WG_OP10(1) KT_WG_OP10(2) KT_WG_OP10(3) KT_WG_OP6(4) \
    "%46, %47"
#define KT_WG_ACCS_96 KT_WG_ACC10(), KT_WG_ACC10(1), KT_WG_ACC10(2), KT_WG_ACC10(3), \
    KT_WG_ACC8(4)
#define KT_WG_OPS_128 KT_WG_OP10() KT_WG_OP10(1) KT_WG_OP10(2) KT_WG_OP10(3) KT_WG_OP10(4) \
    KT_WG_OP10(5) KT_WG_OP2(6) "%62, %63"
#define KT_WG_ACCS_128 KT_WG_ACC10(), KT_WG_ACC10(1), KT_WG_ACC10(2), KT_WG_ACC10(3), \
    KT_WG_ACC10(4), KT_WG_ACC10(5), KT_WG_ACC4(6)
#define KT_WG_OPS_160 KT_WG_OP10() KT_WG_OP10(1) KT_WG_OP10(2) KT_WG_OP10(3) KT_WG_OP10(4) \
    KT_WG_OP10(5) KT_WG_OP10(6) KT_WG_OP8(7) "%78, %79"
#define KT_WG_ACCS_160 KT_WG_ACC10(), KT_WG_ACC10(1), KT_WG_ACC10(2), KT_WG_ACC10(3), \
    KT_WG_ACC10(4), KT_WG_ACC10(5), KT_WG_ACC10(6), KT_WG_ACC10(7)
#define KT_WG_OPS_192 KT_WG_OP10() KT_WG_OP10(1) KT_WG_OP10(2) KT_WG_OP10(3) KT_WG_OP10(4) \
    KT_WG_OP10(5) KT_WG_OP10(6) KT_WG_OP10(7) KT_WG_OP10(8) KT_WG_OP4(9) "%94, %95"
#define KT_WG_ACCS_192 KT_WG_ACC10(), KT_WG_ACC10(1), KT_WG_ACC10(2), KT_WG_ACC10(3), \
    KT_WG_ACC10(4), KT_WG_ACC10(5), KT_WG_ACC10(6), KT_WG_ACC10(7), KT_WG_ACC10(8),   \
    KT_WG_ACC6(9)
#define KT_WG_OPS_224 KT_WG_OP10() KT_WG_OP10(1) KT_WG_OP10(2) KT_WG_OP10(3) KT_WG_OP10(4) \
    KT_WG_OP10(5) KT_WG_OP10(6) KT_WG_OP10(7) KT_WG_OP10(8) KT_WG_OP10(9) KT_WG_OP10(10)   \
    "%110, %111"
#define KT_WG_ACCS_224 KT_WG_ACC10(), KT_WG_ACC10(1), KT_WG_ACC10(2), KT_WG_ACC10(3), \
    KT_WG_ACC10(4), KT_WG_ACC10(5), KT_WG_ACC10(6), KT_WG_ACC10(7), KT_WG_ACC10(8),   \
    KT_WG_ACC10(9), KT_WG_ACC10(10), KT_WG_ACC2(11)
#define KT_WG_OPS_256 KT_WG_OP10() KT_WG_OP10(1) KT_WG_OP10(2) KT_WG_OP10(3) KT_WG_OP10(4) \
    KT_WG_OP10(5) KT_WG_OP10(6) KT_WG_OP10(7) KT_WG_OP10(8) KT_WG_OP10(9) KT_WG_OP10(10)   \
    KT_WG_OP10(11) KT_WG_OP6(12) "%126, %127"
#define KT_WG_ACCS_256 KT_WG_ACC10(), KT_WG_ACC10(1), KT_WG_ACC10(2), KT_WG_ACC10(3), \
    KT_WG_ACC10(4), KT_WG_ACC10(5), KT_WG_ACC10(6), KT_WG_ACC10(7), KT_WG_ACC10(8),   \
    KT_WG_ACC10(9), KT_WG_ACC10(10), KT_WG_ACC10(11), KT_WG_ACC8(12)
KT_WGMMA_N(64, 32, 33, 34, KT_WG_OPS_64, KT_WG_ACCS_64)
KT_WGMMA_N(96, 48, 49, 50, KT_WG_OPS_96, KT_WG_ACCS_96)
KT_WGMMA_N(128, 64, 65, 66, KT_WG_OPS_128, KT_WG_ACCS_128)
KT_WGMMA_N(160, 80, 81, 82, KT_WG_OPS_160, KT_WG_ACCS_160)
KT_WGMMA_N(192, 96, 97, 98, KT_WG_OPS_192, KT_WG_ACCS_192)
KT_WGMMA_N(224, 112, 113, 114, KT_WG_OPS_224, KT_WG_ACCS_224)
KT_WGMMA_N(256, 128, 129, 130, KT_WG_OPS_256, KT_WG_ACCS_256)
#if !KT_FP8_IN
// A from registers (four of two 16-bit values a thread, the m16n8k16 A fragment of its
// warp's 16 rows), B from shared memory, k-major (TRANS_B 0) or n-major (1: B's rows of k
// hold N contiguous values, the descriptor's leading offset between swizzle atoms along N,
// its stride offset between groups of 8 rows of k). Operands: D, the four of A, B's
// descriptor, the predicate's source, and the transpose immediate.
#define KT_WGMMA_RS_N(N, AOPS, DB, P, TR, OPS, ...)                                             \
    template <int TRANS_B>                                                                     \
    KT_DEVICE void kt_wgmma_rs(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long b) { \
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %" #P ", 0; "                            \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." KT_WGMMA_IN             \
                     "." KT_WGMMA_IN " {" OPS "}, {" AOPS "}, %" #DB ", p, 1, 1, %" #TR "; }"   \
                     : __VA_ARGS__                                                             \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1),             \
                       "n"(TRANS_B));                                                          \
    }
KT_WGMMA_RS_N(64, "%32, %33, %34, %35", 36, 37, 38, KT_WG_OPS_64, KT_WG_ACCS_64)
KT_WGMMA_RS_N(128, "%64, %65, %66, %67", 68, 69, 70, KT_WG_OPS_128, KT_WG_ACCS_128)
#endif
#endif

// mbarriers (8 bytes of shared memory each), for warpgroups that hand tiles to each other
// without block-wide barriers: init with the arrivals a phase expects; arrive; the cp.async
// arrive, one of the expected arrivals once every cp.async the thread issued has landed (the
// `.noinc` form); wait for the phase of a parity to complete (the current phase's parity is
// the phases completed so far, mod 2: a fresh mbarrier's wait on parity 1 returns at once).
// The emulator parks a waiting thread until the phase completes and names a wait that never
// can; it lands a thread's copies at its cp.async arrive.
#if defined(KT_HOST)
KT_DEVICE void kt_mbar_init(unsigned long long* bar, int count) { kt_host::mbar_init(bar, count); }
KT_DEVICE void kt_fence_mbar_init() {}
KT_DEVICE void kt_mbar_arrive(unsigned long long* bar) { kt_host::mbar_arrive(bar); }
KT_DEVICE void kt_mbar_arrive_if(unsigned long long* bar, bool arrive) {
    if (arrive) kt_host::mbar_arrive(bar);
}
KT_DEVICE void kt_cp_async_mbar_arrive(unsigned long long* bar) { kt_host::cp_mbar_arrive(bar); }
KT_DEVICE void kt_mbar_wait(unsigned long long* bar, int parity) { kt_host::mbar_wait(bar, parity); }
KT_DEVICE void kt_cp_async_wait_all() {
    kt_host::cp_commit();
    kt_host::cp_wait(0);
}
#endif

// The tensor-memory copy engine (TMA): a tensor map, made on the host and passed by value
// (a __grid_constant__ parameter, whose address the copies take); a 2D box of it at (column
// x, row y) into shared memory, its bytes counted on an mbarrier whose phase expects them
// (kt_mbar_expect_tx, which is also one of its arrivals). The emulator's kt_tmap holds the
// map's description instead of the driver's encoding (gpu/launch.rs, TensorMap).
#if defined(KT_HOST)
struct kt_tmap {
    unsigned long long w[16];
};
#define KT_GRID_CONSTANT
KT_DEVICE void kt_mbar_expect_tx(unsigned long long* bar, int bytes) {
    kt_host::mbar_expect_tx(bar, bytes);
}
KT_DEVICE void kt_tma_load(void* dst, const kt_tmap* map, int x, int y, unsigned long long* bar) {
    kt_host::tma_load(dst, map->w, x, y, bar);
}
KT_DEVICE void kt_tma_load_4d(void* dst, const kt_tmap* map, int x, int y, int z, int w,
                              unsigned long long* bar) {
    kt_host::tma_load_4d(dst, map->w, x, y, z, w, bar);
}
KT_DEVICE void kt_tma_load_multicast(void* dst, const kt_tmap* map, int x, int y,
                                     unsigned long long* bar, unsigned short ranks) {
    kt_host::tma_load_multicast(dst, map->w, x, y, bar, ranks);
}
#define KT_CLUSTER_DIMS(x)
KT_DEVICE int kt_cluster_rank() { return kt_host::cluster_rank(); }
KT_DEVICE void kt_cluster_sync() { kt_host::cluster_sync(__LINE__); }
KT_DEVICE void kt_mbar_arrive_cluster(unsigned long long* bar, int rank) {
    kt_host::mbar_arrive_remote(bar, rank);
}
#else
struct alignas(128) kt_tmap {
    unsigned long long w[16];
};
#define KT_GRID_CONSTANT __grid_constant__
KT_DEVICE void kt_mbar_expect_tx(unsigned long long* bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(kt_smem(bar)),
                 "r"(bytes)
                 : "memory");
}
KT_DEVICE void kt_tma_load(void* dst, const kt_tmap* map, int x, int y, unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
        "{%2, %3}], [%4];" ::"r"(kt_smem(dst)),
        "l"(map), "r"(x), "r"(y), "r"(kt_smem(bar))
        : "memory");
}
// A box of a 4D map at coordinates x, y, z, w (innermost first).
KT_DEVICE void kt_tma_load_4d(void* dst, const kt_tmap* map, int x, int y, int z, int w,
                              unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
        "{%2, %3, %4, %5}], [%6];" ::"r"(kt_smem(dst)),
        "l"(map), "r"(x), "r"(y), "r"(z), "r"(w), "r"(kt_smem(bar))
        : "memory");
}
// Thread-block clusters (sm_90): the blocks of a cluster run at once on neighbouring SMs and
// reach each other's shared memory. The same box into the shared memory of every block of
// the cluster whose bit is set in `ranks`, at `dst`'s offset there, its bytes counted on the
// mbarrier at `bar`'s offset in each (TMA multicast: read from L2 once).
KT_DEVICE void kt_tma_load_multicast(void* dst, const kt_tmap* map, int x, int y,
                                     unsigned long long* bar, unsigned short ranks) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(kt_smem(dst)),
        "l"(map), "r"(x), "r"(y), "r"(kt_smem(bar)), "h"(ranks)
        : "memory");
}
#define KT_CLUSTER_DIMS(x) __cluster_dims__(x, 1, 1)
KT_DEVICE int kt_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return (int)r;
}
// Every thread of every block of the cluster: writes before it (shared memory, mbarrier
// initializations) seen by every thread after it, in any block of the cluster.
KT_DEVICE void kt_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
// One arrival on the mbarrier at `bar`'s offset in block `rank` of the cluster.
KT_DEVICE void kt_mbar_arrive_cluster(unsigned long long* bar, int rank) {
    asm volatile(
        "{ .reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n"
        "}" ::"r"(kt_smem(bar)),
        "r"(rank)
        : "memory");
}
#endif
#if !defined(KT_HOST)
KT_DEVICE void kt_mbar_init(unsigned long long* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(kt_smem(bar)), "r"(count)
                 : "memory");
}
// Makes the initialized mbarriers visible to the other threads (with the barrier after it).
KT_DEVICE void kt_fence_mbar_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
KT_DEVICE void kt_mbar_arrive(unsigned long long* bar) {
    asm volatile("{ .reg .b64 state; mbarrier.arrive.shared::cta.b64 state, [%0]; }" ::"r"(
                     kt_smem(bar))
                 : "memory");
}
// An arrival by the threads passing `arrive`, predicated rather than branched around: a
// branch between a wgmma's issue and its wait makes ptxas serialize the wgmma.
KT_DEVICE void kt_mbar_arrive_if(unsigned long long* bar, bool arrive) {
    asm volatile(
        "{ .reg .pred p; .reg .b64 state;\n"
        "setp.ne.u32 p, %1, 0;\n"
        "@p mbarrier.arrive.shared::cta.b64 state, [%0]; }" ::"r"(kt_smem(bar)),
        "r"((unsigned)arrive)
        : "memory");
}
KT_DEVICE void kt_cp_async_mbar_arrive(unsigned long long* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(kt_smem(bar))
                 : "memory");
}
// A wait past 1 s (the device's nanosecond timer) traps instead of hanging: a phase that
// never completes is a bug in a candidate, and the tuner records the launch's failure where
// it would otherwise wait forever (a stage's copy or products take microseconds). The timer
// is read only once the first try has failed: the waits of a pipeline that keeps up pass at
// once, several times a k tile in every thread.
KT_DEVICE void kt_mbar_wait(unsigned long long* bar, int parity) {
    asm volatile(
        "{ .reg .pred done, late;\n"
        ".reg .u64 start, now;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@done bra KT_MBAR_DONE;\n"
        "mov.u64 start, %%globaltimer;\n"
        "KT_MBAR_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@done bra KT_MBAR_DONE;\n"
        "mov.u64 now, %%globaltimer;\n"
        "sub.u64 now, now, start;\n"
        "setp.gt.u64 late, now, 1000000000;\n"
        "@late trap;\n"
        "bra KT_MBAR_WAIT;\n"
        "KT_MBAR_DONE:\n"
        "}" ::"r"(kt_smem(bar)),
        "r"(parity)
        : "memory");
}
KT_DEVICE void kt_cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
#endif
#endif
