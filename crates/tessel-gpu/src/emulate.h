// tessel-gpu's CPU emulation of its generated CUDA kernels: correctness only, never timing.
//
// Every CUDA thread of a block is a std::thread; blocks run one after another. __syncthreads
// is a barrier of the block's threads and __syncwarp one of the warp's. Warp-collective
// operations (ldmatrix, mma.sync, the WMMA API) exchange the lanes' operands through the
// warp's slots between two warp barriers and compute what the PTX ISA says each lane gets.
// WMMA fragments are opaque in CUDA, so here every lane holds the whole tile.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(n)
#define __shared__
#define __align__(n)
#define TSL_EMULATED 1

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

// One block's dynamic shared memory (blocks run one at a time).
alignas(16) unsigned char tsl_smem[1 << 20];

inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }

struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

// 16-bit floats as bits, converted with round-to-nearest-even.
inline float tsl_emu_h2f(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return (float)h;
}
inline uint16_t tsl_emu_f2h(float f) {
  _Float16 h = (_Float16)f;
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
inline float tsl_emu_bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t tsl_emu_f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}
struct half {
  uint16_t bits;
  half() = default;
  half(float f) : bits(tsl_emu_f2h(f)) {}
};
struct __nv_bfloat16 {
  uint16_t bits;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : bits(tsl_emu_f2bf(f)) {}
};
inline float __half2float(half x) { return tsl_emu_h2f(x.bits); }
inline half __float2half_rn(float x) { return half(x); }
inline float __bfloat162float(__nv_bfloat16 x) { return tsl_emu_bf2f(x.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return __nv_bfloat16(x); }

inline double tsl_emu_val(half x) { return tsl_emu_h2f(x.bits); }
inline double tsl_emu_val(__nv_bfloat16 x) { return tsl_emu_bf2f(x.bits); }
inline double tsl_emu_val(float x) { return x; }
inline double tsl_emu_val(signed char x) { return x; }
inline double tsl_emu_val(unsigned char x) { return x; }
inline double tsl_emu_val(int x) { return x; }
template <typename T> inline T tsl_emu_from(double v) { return T((float)v); }
template <> inline signed char tsl_emu_from<signed char>(double v) { return (signed char)v; }
template <> inline unsigned char tsl_emu_from<unsigned char>(double v) { return (unsigned char)v; }
template <> inline int tsl_emu_from<int>(double v) { return (int)v; }
template <> inline float tsl_emu_from<float>(double v) { return (float)v; }

// The running block: its barriers and the warps' exchange slots.
struct TslBlock {
  std::barrier<>* all;
  std::vector<std::barrier<>*> warps;
  // Per warp, per lane: an address and up to 4 registers.
  std::vector<const void*> addr;
  std::vector<uint32_t> regs;
};
TslBlock* tsl_block;
thread_local int tsl_tid;

// Split-K stores: blocks add into the output.
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }

inline void __syncthreads() { tsl_block->all->arrive_and_wait(); }
inline int tsl_warp() { return tsl_tid / 32; }
inline int tsl_lane() { return tsl_tid % 32; }
inline void __syncwarp() { tsl_block->warps[tsl_warp()]->arrive_and_wait(); }
inline const void*& tsl_addr(int lane) { return tsl_block->addr[tsl_warp() * 32 + lane]; }
inline uint32_t* tsl_regs(int lane) { return &tsl_block->regs[(tsl_warp() * 32 + lane) * 8]; }

// ---- ldmatrix: lane l's 16-byte row address; thread t gets, of tile j, row t/4, elements
// 2(t%4) and 2(t%4)+1 (.trans: rows 2(t%4) and 2(t%4)+1, element t/4).
inline uint32_t tsl_emu_tile(int j, bool trans) {
  int t = tsl_lane();
  uint16_t e[2];
  for (int i = 0; i < 2; ++i) {
    const uint16_t* row;
    int col;
    if (trans) {
      row = (const uint16_t*)tsl_addr(j * 8 + (t % 4) * 2 + i);
      col = t / 4;
    } else {
      row = (const uint16_t*)tsl_addr(j * 8 + t / 4);
      col = (t % 4) * 2 + i;
    }
    e[i] = row[col];
  }
  return (uint32_t)e[0] | ((uint32_t)e[1] << 16);
}
inline void tsl_emu_ldsm(unsigned* r, const void* p, int tiles, bool trans) {
  tsl_addr(tsl_lane()) = p;
  __syncwarp();
  for (int j = 0; j < tiles; ++j) r[j] = tsl_emu_tile(j, trans);
  __syncwarp();
}
inline void tsl_ldsm_x4(unsigned* r, const void* p) { tsl_emu_ldsm(r, p, 4, false); }
inline void tsl_ldsm_x4_trans(unsigned* r, const void* p) { tsl_emu_ldsm(r, p, 4, true); }
inline void tsl_ldsm_x2(unsigned* r, const void* p) { tsl_emu_ldsm(r, p, 2, false); }
inline void tsl_ldsm_x2_trans(unsigned* r, const void* p) { tsl_emu_ldsm(r, p, 2, true); }

// ---- mma.sync m16n8k16 row.col, f32 accumulators. Lane t = 4g + c holds A rows g and g+8,
// k 2c, 2c+1 (+8 in registers 2 and 3); B k 2c, 2c+1 (+8 in register 1) of column g; D rows
// g and g+8, columns 2c and 2c+1.
inline void tsl_emu_mma(float* d, const unsigned* a, const unsigned* b, bool bf16) {
  int t = tsl_lane();
  uint32_t* mine = tsl_regs(t);
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  for (int i = 0; i < 2; ++i) mine[4 + i] = b[i];
  __syncwarp();
  auto half_of = [&](int lane, int reg, int k) {
    uint16_t h = (uint16_t)(tsl_regs(lane)[reg] >> (16 * (k % 2)));
    return bf16 ? tsl_emu_bf2f(h) : tsl_emu_h2f(h);
  };
  auto A = [&](int row, int k) {
    return half_of((row % 8) * 4 + (k % 8) / 2, (row / 8) + 2 * (k / 8), k);
  };
  auto B = [&](int k, int col) { return half_of(col * 4 + (k % 8) / 2, 4 + k / 8, k); };
  float out[4];
  for (int e = 0; e < 4; ++e) {
    int row = t / 4 + (e / 2) * 8, col = (t % 4) * 2 + e % 2;
    float s = d[e];
    for (int k = 0; k < 16; ++k) s += A(row, k) * B(k, col);
    out[e] = s;
  }
  __syncwarp();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}
inline void tsl_mma_f16(float* d, const unsigned* a, const unsigned* b) { tsl_emu_mma(d, a, b, false); }
inline void tsl_mma_bf16(float* d, const unsigned* a, const unsigned* b) { tsl_emu_mma(d, a, b, true); }

// ---- WMMA: every lane holds the whole tile (the distribution over lanes is unspecified).
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K> struct dims;
template <int M, int N, int K> struct dims<matrix_a, M, N, K> {
  static const int rows = M, cols = K;
};
template <int M, int N, int K> struct dims<matrix_b, M, N, K> {
  static const int rows = K, cols = N;
};
template <int M, int N, int K> struct dims<accumulator, M, N, K> {
  static const int rows = M, cols = N;
};
template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
  static const int rows = dims<Use, M, N, K>::rows, cols = dims<Use, M, N, K>::cols;
  typedef Layout layout;
  double x[rows * cols];
};
template <typename F> inline void fill_fragment(F& f, double v) {
  for (double& e : f.x) e = v;
}
template <typename Use, int M, int N, int K, typename T, typename L, typename P>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const P* p, unsigned ldm) {
  typedef fragment<Use, M, N, K, T, L> F;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c) {
      bool row = std::is_same<L, row_major>::value;
      f.x[r * F::cols + c] = tsl_emu_val(row ? p[r * ldm + c] : p[r + c * ldm]);
    }
}
template <int M, int N, int K, typename TA, typename LA, typename TB, typename LB, typename TC>
inline void mma_sync(fragment<accumulator, M, N, K, TC>& d,
                     const fragment<matrix_a, M, N, K, TA, LA>& a,
                     const fragment<matrix_b, M, N, K, TB, LB>& b,
                     const fragment<accumulator, M, N, K, TC>& c) {
  double out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = c.x[i * N + j];
      for (int k = 0; k < K; ++k) s += a.x[i * K + k] * b.x[k * N + j];
      out[i * N + j] = s;
    }
  for (int i = 0; i < M * N; ++i) d.x[i] = out[i];
}
template <int M, int N, int K, typename TC, typename P>
inline void store_matrix_sync(P* p, const fragment<accumulator, M, N, K, TC>& f, unsigned ldm,
                              layout_t layout) {
  // Every lane writes the same values; write once, from lane 0, between warp barriers.
  __syncwarp();
  if (tsl_lane() == 0)
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j)
        p[layout == mem_row_major ? i * ldm + j : i + j * ldm] =
            tsl_emu_from<P>(f.x[i * N + j]);
  __syncwarp();
}
}  // namespace wmma
}  // namespace nvcuda

// Runs `kernel(args...)` over the grid, one block at a time, a thread per CUDA thread.
template <typename F, typename... A> void tsl_launch(dim3 grid, dim3 block, F kernel, A... args) {
  gridDim = grid;
  blockDim = block;
  int n = block.x * block.y * block.z;
  int warps = (n + 31) / 32;
  std::barrier<> all(n);
  std::vector<std::barrier<>*> wb;
  for (int w = 0; w < warps; ++w) wb.push_back(new std::barrier<>(n - w * 32 < 32 ? n - w * 32 : 32));
  TslBlock b{&all, wb, std::vector<const void*>(warps * 32), std::vector<uint32_t>(warps * 32 * 8)};
  tsl_block = &b;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::vector<std::thread> ts;
        for (int t = 0; t < n; ++t)
          ts.emplace_back([=] {
            tsl_tid = t;
            threadIdx = {(unsigned)(t % block.x), (unsigned)(t / block.x % block.y),
                         (unsigned)(t / (block.x * block.y))};
            blockIdx = {bx, by, bz};
            kernel(args...);
          });
        for (auto& t : ts) t.join();
      }
  for (auto* w : wb) delete w;
}
