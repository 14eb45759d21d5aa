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
// v_mfma_f32_32x32x8 exists on CDNA2 and CDNA3 only; the host pass of hipcc sees no target.
#if !defined(__HIP_DEVICE_COMPILE__) || defined(__gfx90a__) || defined(__gfx940__) || \
    defined(__gfx941__) || defined(__gfx942__)
#define KT_MFMA 1
#endif
#elif defined(__CUDACC__) || defined(__CUDACC_RTC__)
// No CUDA headers: NVRTC from a wheel ships none, and the kernels need only builtins.
#define KT_CUDA 1
#define KT_WAVE 32
#define KT_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define KT_MMA 1
#elif defined(KT_HOST)
#ifndef KT_HOST_WAVE
#error "the host emulator's simt.h must come first"
#endif
#define KT_WAVE KT_HOST_WAVE
#define KT_SHFL_XOR(v, m) kt_host::shfl_xor((v), (m))
#if KT_HOST_MFMA
#define KT_MFMA 1
#endif
#if KT_HOST_MMA
#define KT_MMA 1
#endif
#else
#error "kerntune GPU kernels build with HIP (clang -x hip), CUDA (nvcc / NVRTC) or the host emulator"
#endif

// Dynamic shared memory (`KT_DYN_LDS` bytes, passed at launch) as a byte array `name`.
#if defined(KT_HOST)
#define KT_DYNAMIC_SHARED(name) \
    static thread_local __attribute__((aligned(16))) unsigned char name[KT_DYN_LDS]
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
#define KT_INF INFINITY
#define KT_BITS_F32(u) kt_host::bits_f32(u)
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
// Positive infinity without <math.h>, which NVRTC does not provide.
#define KT_INF __int_as_float(0x7f800000)
#define KT_BITS_F32(u) __uint_as_float(u)
#endif

// Input element type: 0 = f32, 1 = f16, 2 = bf16. Half types travel as raw 16-bit words and
// widen to f32 on load: accumulation is f32, as in the CPU kernels and the reference.
#ifndef KT_DTYPE
#error "KT_DTYPE (0 f32, 1 f16, 2 bf16) must be defined"
#endif
#if KT_DTYPE == 0
typedef float kt_in;
KT_DEVICE float kt_widen(kt_in x) { return x; }
#elif KT_DTYPE == 1
typedef unsigned short kt_in;
#if defined(KT_HIP)
KT_DEVICE float kt_widen(kt_in x) { return __half2float(__ushort_as_half(x)); }
#elif defined(KT_HOST)
KT_DEVICE float kt_widen(kt_in x) { return kt_host::f16_f32(x); }
#else
KT_DEVICE float kt_widen(kt_in x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}
#endif
#elif KT_DTYPE == 2
typedef unsigned short kt_in;
KT_DEVICE float kt_widen(kt_in x) { return KT_BITS_F32(((unsigned)x) << 16); }
#else
#error "KT_DTYPE must be 0, 1 or 2"
#endif

KT_DEVICE float kt_load(const kt_in* p, long i) { return kt_widen(p[i]); }

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

// Matrix-core steps, per vendor (the GEMM's MFMA and mma variants), for 16-bit inputs.
#if defined(KT_MFMA) && KT_DTYPE != 0
// v_mfma_f32_32x32x8: four consecutive 16-bit values of an A row or a B column per lane, 16
// f32 accumulators per lane.
#if defined(KT_HOST)
typedef kt_host::f32x16 kt_f32x16;
typedef kt_host::frag4 kt_frag;
KT_DEVICE kt_f32x16 kt_mfma(kt_frag x, kt_frag y, kt_f32x16 acc) {
    return kt_host::mfma_32x32x8(x, y, acc);
}
#else
typedef float kt_f32x16 __attribute__((ext_vector_type(16)));
#if KT_DTYPE == 1
typedef _Float16 kt_frag __attribute__((ext_vector_type(4)));
#else
typedef short kt_frag __attribute__((ext_vector_type(4)));
#endif
KT_DEVICE kt_f32x16 kt_mfma(kt_frag x, kt_frag y, kt_f32x16 acc) {
#if KT_DTYPE == 1
    return __builtin_amdgcn_mfma_f32_32x32x8f16(x, y, acc, 0, 0, 0);
#else
    return __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(x, y, acc, 0, 0, 0);
#endif
}
#endif

// Four consecutive 16-bit values as one fragment.
KT_DEVICE kt_frag kt_frag_at(const unsigned short* p) {
    kt_frag f;
    __builtin_memcpy(&f, p, sizeof f);
    return f;
}

// Four f32 values rounded to the input type (to nearest even) as one fragment: probabilities
// entering the P·V product.
#if defined(KT_HOST)
KT_DEVICE kt_frag kt_pack4(float a, float b, float c, float d) {
    return kt_host::pack4(a, b, c, d);
}
#elif KT_DTYPE == 1
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
#if KT_DTYPE == 1
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
#endif
}

// sm_80's asynchronous copies, 16 bytes from global to shared memory: `bytes` (0 or 16) read
// from `src`, the rest zero-filled; a thread's copies complete by commit group. And ldmatrix:
// four 8×8 matrices of 16-bit values whose rows lanes 8q .. 8q + 7 address; register q of lane
// l holds elements 2·(l % 4) and + 1 of row l / 4 of matrix q (`_trans`: of column l / 4).
// The emulator delays each copy to the wait and poisons its destination meanwhile, so a read
// before the wait, or a copy into a stage still being read, shows in the output.
#if defined(KT_HOST)
KT_DEVICE void kt_cp_async16(void* dst, const void* src, int bytes) {
    kt_host::cp_async(dst, src, bytes);
}
KT_DEVICE void kt_cp_async_commit() { kt_host::cp_commit(); }
template <int N>
KT_DEVICE void kt_cp_async_wait() {
    kt_host::cp_wait(N);
}
KT_DEVICE void kt_ldmatrix_x4(unsigned (&r)[4], const unsigned short* p) {
    kt_host::ldmatrix_x4(r, p, false);
}
KT_DEVICE void kt_ldmatrix_x4_trans(unsigned (&r)[4], const unsigned short* p) {
    kt_host::ldmatrix_x4(r, p, true);
}
#else
// A shared-memory address as the 32-bit offset the instructions take (what CUDA's
// __cvta_generic_to_shared returns, in PTX so NVRTC needs no headers).
KT_DEVICE unsigned kt_smem(const void* p) {
    unsigned r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}
KT_DEVICE void kt_cp_async16(void* dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(kt_smem(dst)), "l"(src),
                 "r"(bytes)
                 : "memory");
}
KT_DEVICE void kt_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
KT_DEVICE void kt_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
KT_DEVICE void kt_ldmatrix_x4(unsigned (&r)[4], const unsigned short* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(kt_smem(p)));
}
KT_DEVICE void kt_ldmatrix_x4_trans(unsigned (&r)[4], const unsigned short* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(kt_smem(p)));
}
#endif

// d += a · b for one mma.sync.aligned.m16n8k16 step; a: 4 registers of two 16-bit values,
// b: 2. Inline PTX, so NVRTC needs no headers.
KT_DEVICE void kt_mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#if defined(KT_HOST)
    kt_host::mma_16x8x16(d, a, b);
#else
#if KT_DTYPE == 1
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
#endif
