#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;

__device__ __forceinline__ float tsl_f(half x) { return __half2float(x); }
__device__ __forceinline__ float tsl_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float tsl_f(float x) { return x; }
__device__ __forceinline__ int tsl_i(signed char x) { return x; }
__device__ __forceinline__ int tsl_i(unsigned char x) { return x; }
__device__ __forceinline__ int tsl_i(int x) { return x; }
template <typename T> __device__ __forceinline__ T tsl_to(float x);
template <> __device__ __forceinline__ float tsl_to<float>(float x) { return x; }
template <> __device__ __forceinline__ half tsl_to<half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 tsl_to<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <typename T> __device__ __forceinline__ T tsl_to_i(int x);
template <> __device__ __forceinline__ int tsl_to_i<int>(int x) { return x; }
template <> __device__ __forceinline__ signed char tsl_to_i<signed char>(int x) { return (signed char)max(-128, min(127, x)); }
template <> __device__ __forceinline__ unsigned char tsl_to_i<unsigned char>(int x) { return (unsigned char)max(0, min(255, x)); }

// 16-byte asynchronous copy global -> shared (sm_80+); src_bytes = 0 fills zeros.
__device__ __forceinline__ void tsl_cp_async16(void* dst, const void* src, int src_bytes) {
#if __CUDA_ARCH__ >= 800
  unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(src), "r"(src_bytes));
#else
  if (src_bytes) *(uint4*)dst = *(const uint4*)src; else *(uint4*)dst = make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void tsl_cp_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void tsl_cp_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
#endif
}
