/* tessel CPU kernels: shared prelude.
 *
 * Kernels take `void *const *args`: the operator's inputs, its epilogue biases, then the output.
 * bf16 is held as uint16_t bits, f16 as _Float16. Index arithmetic is 64-bit.
 *
 * With TESSEL_EMULATE defined, the AMX, AVX-512 and AVX2 intrinsics the kernels use are
 * replaced by scalar C that follows Intel's pseudo-code, so that kernels for instructions this
 * CPU lacks can still be checked for correctness (never timed as if they were real).
 */
#include <stdint.h>
#include <string.h>
#include <math.h>

#ifndef TESSEL_EMULATE
#include <immintrin.h>
#endif

static inline long tsl_floordiv(long a, long c) { long q = a / c; return (a % c != 0 && ((a < 0) != (c < 0))) ? q - 1 : q; }
static inline long tsl_floormod(long a, long c) { long r = a % c; return r < 0 ? r + c : r; }

static inline float tsl_bf16_to_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
/* Round to nearest even, as the hardware's vcvtneps2bf16 does (NaN kept quiet). */
static inline uint16_t tsl_f32_to_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline int8_t tsl_sat_i8(float v) { v = roundf(v); return (int8_t)(v < -128.0f ? -128.0f : v > 127.0f ? 127.0f : v); }
static inline uint8_t tsl_sat_u8(float v) { v = roundf(v); return (uint8_t)(v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v); }
static inline int8_t tsl_sat_i8_i32(int32_t v) { return (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v); }
static inline uint8_t tsl_sat_u8_i32(int32_t v) { return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); }
static inline int16_t tsl_sat_i16(float v) { v = roundf(v); return (int16_t)(v < -32768.0f ? -32768.0f : v > 32767.0f ? 32767.0f : v); }
static inline int16_t tsl_sat_i16_i32(int32_t v) { return (int16_t)(v < -32768 ? -32768 : v > 32767 ? 32767 : v); }
/* Two's-complement wrapping, as the i32 accumulators of the hardware behave. */
static inline int32_t tsl_add_i32(int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }
static inline int32_t tsl_mul_i32(int32_t a, int32_t b) { return (int32_t)((uint32_t)a * (uint32_t)b); }
static inline int32_t tsl_load_i32(const void *p) { int32_t x; memcpy(&x, p, 4); return x; }

/* AMX: palette 1, all eight tiles 16 rows x 64 bytes. The configuration lives in static storage:
 * gcc 12 may drop stores to a stack struct before _tile_loadconfig reads it. */
typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tsl_tilecfg;
static const tsl_tilecfg tsl_amx_cfg __attribute__((aligned(64), used)) = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

#ifdef TESSEL_EMULATE
typedef struct { float f[16]; } __m512;
typedef struct { int32_t i[16]; } __m512i;
typedef struct { uint16_t h[32]; } __m512bh;
typedef struct { float f[8]; } __m256;
typedef struct { int32_t i[8]; } __m256i;

static inline __m512 _mm512_loadu_ps(const void *p) { __m512 r; memcpy(&r, p, 64); return r; }
static inline void _mm512_storeu_ps(void *p, __m512 a) { memcpy(p, &a, 64); }
static inline __m512 _mm512_set1_ps(float x) { __m512 r; for (int i = 0; i < 16; i++) r.f[i] = x; return r; }
static inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) { for (int i = 0; i < 16; i++) c.f[i] = fmaf(a.f[i], b.f[i], c.f[i]); return c; }
static inline __m512i _mm512_loadu_si512(const void *p) { __m512i r; memcpy(&r, p, 64); return r; }
static inline void _mm512_storeu_si512(void *p, __m512i a) { memcpy(p, &a, 64); }
static inline __m512i _mm512_set1_epi32(int32_t x) { __m512i r; for (int i = 0; i < 16; i++) r.i[i] = x; return r; }
/* vpdpbusd (zmm, and AVX-VNNI's ymm): each i32 lane adds four u8 x s8 products. */
static inline void tsl_emu_dpbusd(int32_t *acc, const void *a, const void *b, int lanes) {
    const uint8_t *ua = (const uint8_t *)a; const int8_t *sb = (const int8_t *)b;
    for (int i = 0; i < lanes; i++) {
        int32_t s = acc[i];
        for (int j = 0; j < 4; j++) s = tsl_add_i32(s, (int32_t)ua[4 * i + j] * (int32_t)sb[4 * i + j]);
        acc[i] = s;
    }
}
static inline __m512i _mm512_dpbusd_epi32(__m512i src, __m512i a, __m512i b) { tsl_emu_dpbusd(src.i, &a, &b, 16); return src; }
/* vdpbf16ps: each lane adds two bf16 products in f32. */
static inline __m512 _mm512_dpbf16_ps(__m512 src, __m512bh a, __m512bh b) {
    for (int i = 0; i < 16; i++) {
        float s = src.f[i];
        s = s + tsl_bf16_to_f32(a.h[2 * i]) * tsl_bf16_to_f32(b.h[2 * i]);
        s = s + tsl_bf16_to_f32(a.h[2 * i + 1]) * tsl_bf16_to_f32(b.h[2 * i + 1]);
        src.f[i] = s;
    }
    return src;
}
static inline __m256 _mm256_loadu_ps(const float *p) { __m256 r; memcpy(&r, p, 32); return r; }
static inline void _mm256_storeu_ps(float *p, __m256 a) { memcpy(p, &a, 32); }
static inline __m256 _mm256_set1_ps(float x) { __m256 r; for (int i = 0; i < 8; i++) r.f[i] = x; return r; }
static inline __m256 _mm256_fmadd_ps(__m256 a, __m256 b, __m256 c) { for (int i = 0; i < 8; i++) c.f[i] = fmaf(a.f[i], b.f[i], c.f[i]); return c; }
static inline __m256i _mm256_loadu_si256(const __m256i *p) { __m256i r; memcpy(&r, p, 32); return r; }
static inline void _mm256_storeu_si256(__m256i *p, __m256i a) { memcpy(p, &a, 32); }
static inline __m256i _mm256_set1_epi32(int32_t x) { __m256i r; for (int i = 0; i < 8; i++) r.i[i] = x; return r; }
static inline __m256i _mm256_add_epi32(__m256i a, __m256i b) { for (int i = 0; i < 8; i++) a.i[i] = tsl_add_i32(a.i[i], b.i[i]); return a; }
/* vpmaddwd: each i32 lane is the sum of two i16 x i16 products (wrapping, as the hardware's
 * one overflowing case, -32768 * -32768 * 2, does). */
static inline __m256i _mm256_madd_epi16(__m256i a, __m256i b) {
    const int16_t *x = (const int16_t *)&a, *y = (const int16_t *)&b; __m256i r;
    for (int i = 0; i < 8; i++) r.i[i] = tsl_add_i32((int32_t)x[2 * i] * y[2 * i], (int32_t)x[2 * i + 1] * y[2 * i + 1]);
    return r;
}
static inline __m256i _mm256_set1_epi16(int16_t x) { __m256i r; int16_t *h = (int16_t *)&r; for (int i = 0; i < 16; i++) h[i] = x; return r; }
/* vpmaddubsw: each i16 lane is the *saturated* sum of two u8 x s8 products. */
static inline __m256i _mm256_maddubs_epi16(__m256i a, __m256i b) {
    const uint8_t *ua = (const uint8_t *)&a; const int8_t *sb = (const int8_t *)&b; __m256i r; int16_t *h = (int16_t *)&r;
    for (int i = 0; i < 16; i++) {
        int32_t s = (int32_t)ua[2 * i] * sb[2 * i] + (int32_t)ua[2 * i + 1] * sb[2 * i + 1];
        h[i] = (int16_t)(s < -32768 ? -32768 : s > 32767 ? 32767 : s);
    }
    return r;
}
static inline __m256i _mm256_dpbusd_avx_epi32(__m256i src, __m256i a, __m256i b) { tsl_emu_dpbusd(src.i, &a, &b, 8); return src; }
static inline __m512bh tsl_bcast_bf16x2(const void *p) { __m512bh r; for (int i = 0; i < 16; i++) memcpy(&r.h[2 * i], p, 4); return r; }
static inline __m512bh tsl_load_bf16x32(const void *p) { __m512bh r; memcpy(&r, p, 64); return r; }

/* AMX tiles: eight per thread, 16 rows of 64 bytes, as configured. */
static __thread uint8_t tsl_emu_tiles[8][16][64];
static __thread tsl_tilecfg tsl_emu_cfg;
static inline void tsl_emu_loadconfig(const void *cfg) { memcpy(&tsl_emu_cfg, cfg, sizeof tsl_emu_cfg); memset(tsl_emu_tiles, 0, sizeof tsl_emu_tiles); }
static inline void tsl_emu_loadd(int t, const void *p, long stride) {
    for (int r = 0; r < tsl_emu_cfg.rows[t]; r++) memcpy(tsl_emu_tiles[t][r], (const char *)p + r * stride, tsl_emu_cfg.colsb[t]);
}
static inline void tsl_emu_stored(int t, void *p, long stride) {
    for (int r = 0; r < tsl_emu_cfg.rows[t]; r++) memcpy((char *)p + r * stride, tsl_emu_tiles[t][r], tsl_emu_cfg.colsb[t]);
}
static inline void tsl_emu_zero(int t) { memset(tsl_emu_tiles[t], 0, sizeof tsl_emu_tiles[t]); }
/* tdpbf16ps: C[m][n] += sum over k pairs of A[m][2k+i] * B[k][2n+i]. */
static inline void tsl_emu_dpbf16ps(int c, int a, int b) {
    for (int m = 0; m < tsl_emu_cfg.rows[c]; m++)
        for (int k = 0; k < tsl_emu_cfg.colsb[a] / 4; k++)
            for (int n = 0; n < tsl_emu_cfg.colsb[c] / 4; n++) {
                float *cv = (float *)tsl_emu_tiles[c][m] + n;
                const uint16_t *av = (const uint16_t *)tsl_emu_tiles[a][m] + 2 * k;
                const uint16_t *bv = (const uint16_t *)tsl_emu_tiles[b][k] + 2 * n;
                float s = *cv;
                s = s + tsl_bf16_to_f32(av[0]) * tsl_bf16_to_f32(bv[0]);
                s = s + tsl_bf16_to_f32(av[1]) * tsl_bf16_to_f32(bv[1]);
                *cv = s;
            }
}
/* tdpbusd / tdpbssd: C[m][n] += sum over k quads of A[m][4k+i] * B[k][4n+i]. */
static inline void tsl_emu_dpb(int c, int a, int b, int a_signed) {
    for (int m = 0; m < tsl_emu_cfg.rows[c]; m++)
        for (int k = 0; k < tsl_emu_cfg.colsb[a] / 4; k++)
            for (int n = 0; n < tsl_emu_cfg.colsb[c] / 4; n++) {
                int32_t *cv = (int32_t *)tsl_emu_tiles[c][m] + n;
                int32_t s = *cv;
                for (int i = 0; i < 4; i++) {
                    int32_t av = a_signed ? (int32_t)(int8_t)tsl_emu_tiles[a][m][4 * k + i] : (int32_t)tsl_emu_tiles[a][m][4 * k + i];
                    int32_t bv = (int32_t)(int8_t)tsl_emu_tiles[b][k][4 * n + i];
                    s = tsl_add_i32(s, av * bv);
                }
                *cv = s;
            }
}
#define _tile_loadconfig(p) tsl_emu_loadconfig(p)
#define _tile_loadd(t, p, s) tsl_emu_loadd((t), (p), (s))
#define _tile_stream_loadd(t, p, s) tsl_emu_loadd((t), (p), (s))
#define _tile_stored(t, p, s) tsl_emu_stored((t), (p), (s))
#define _tile_zero(t) tsl_emu_zero(t)
#define _tile_dpbf16ps(c, a, b) tsl_emu_dpbf16ps((c), (a), (b))
#define _tile_dpbusd(c, a, b) tsl_emu_dpb((c), (a), (b), 0)
#define _tile_dpbssd(c, a, b) tsl_emu_dpb((c), (a), (b), 1)
#define _tile_release() ((void)0)
#elif defined(__AVX512BF16__)
static inline __m512bh tsl_bcast_bf16x2(const void *p) { return (__m512bh)_mm512_set1_epi32(tsl_load_i32(p)); }
static inline __m512bh tsl_load_bf16x32(const void *p) { return (__m512bh)_mm512_loadu_si512(p); }
#endif

/* 256-bit integer vectors through untyped pointers (the kernels address bytes and i16). */
#if defined(__AVX2__) || defined(TESSEL_EMULATE)
static inline __m256i tsl_loadu_256i(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline void tsl_storeu_256i(void *p, __m256i a) { _mm256_storeu_si256((__m256i *)p, a); }
/* vpmaddwd then vpaddd: c += pairwise i16 products. Natively one asm pair with its own
 * temporary: written as intrinsics, gcc 12 hoists every product of a register block before
 * the adds, needs a temporary per accumulator and spills (16 ymm: ~70 against ~110 GOP/s). */
/* vpmaddubsw (u8 x s8 pairs into saturating i16), vpmaddwd by ones (pairs of those into i32),
 * vpaddd: c += four products per lane, exact only while each pair sum fits in i16. */
#ifdef TESSEL_EMULATE
static inline __m256i tsl_madd_add(__m256i c, __m256i a, __m256i b) { return _mm256_add_epi32(c, _mm256_madd_epi16(a, b)); }
static inline __m256i tsl_maddubs_add(__m256i c, __m256i a, __m256i b) {
    return _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
}
#else
static inline __m256i tsl_maddubs_add(__m256i c, __m256i a, __m256i b) {
    __m256i t;
    const __m256i ones = _mm256_set1_epi16(1);
    __asm__("vpmaddubsw %[b], %[a], %[t]\n\tvpmaddwd %[ones], %[t], %[t]\n\tvpaddd %[t], %[c], %[c]"
            : [c] "+x"(c), [t] "=&x"(t) : [a] "x"(a), [b] "xm"(b), [ones] "x"(ones));
    return c;
}
static inline __m256i tsl_madd_add(__m256i c, __m256i a, __m256i b) {
    __m256i t;
    __asm__("vpmaddwd %[b], %[a], %[t]\n\tvpaddd %[t], %[c], %[c]" : [c] "+x"(c), [t] "=&x"(t) : [a] "x"(a), [b] "xm"(b));
    return c;
}
#endif
#endif

/* Every thread that runs tile instructions loads the configuration first. */
#define TSL_AMX_INIT() _tile_loadconfig(&tsl_amx_cfg)
