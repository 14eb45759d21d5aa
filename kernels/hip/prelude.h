// kerntune GPU prelude: the one place where HIP and CUDA differ, so each kernel source is
// written once for both vendors. Kernels include only this file.
//
// Configuration arrives as -D macros (KT_*), one code object per candidate: tile sizes are
// compile-time constants, so loops unroll and register tiles stay in registers.
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
#elif defined(__CUDACC__) || defined(__CUDACC_RTC__)
// No CUDA headers: NVRTC from a wheel ships none, and the kernels need only builtins.
#define KT_CUDA 1
#define KT_WAVE 32
#define KT_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#else
#error "kerntune GPU kernels build with HIP (clang -x hip) or CUDA (nvcc / NVRTC)"
#endif

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
#else
KT_DEVICE float kt_widen(kt_in x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}
#endif
#elif KT_DTYPE == 2
typedef unsigned short kt_in;
KT_DEVICE float kt_widen(kt_in x) { return __uint_as_float(((unsigned)x) << 16); }
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
