/* What one core can do on f32 with AVX2, measured rather than assumed: the FMA peak (10
 * independent chains of vfmadd231ps on registers, the loop within one 64-byte line) and the
 * GotoBLAS/BLIS 6x16 register block (12 ymm accumulators; per k two loads of packed B, six
 * broadcasts of packed A) on panels that stay in L1 (kc = 256: 6 KiB of A, 16 KiB of B),
 * compiled by this gcc from intrinsics as tessel's kernels are. A gemm cannot beat the
 * register block that runs it with its operands already in L1: that rate bounds any ratio
 * against a library.
 *
 *   gcc -O3 -march=znver3 ceiling.c -o ceiling && taskset -c 1 ./ceiling
 *
 * Prints one JSON line: the best and the median GFLOP/s of 40 runs of ~50 ms each. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define KC 256
static float Ap[6 * KC] __attribute__((aligned(64)));
static float Bp[16 * KC] __attribute__((aligned(64)));
static float Cc[6 * 16] __attribute__((aligned(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* FLOPs done. Without the empty asm statements gcc may drop a chain whose result is unused
 * (tessel's own peak kernel lost one of twelve that way) or fold the constant product. */
__attribute__((noinline)) static double fma_chains(long iters) {
    __m256 c[12];
    for (int i = 0; i < 12; i++) c[i] = _mm256_set1_ps((float)i);
    __m256 a = _mm256_set1_ps(1e-9f), b = _mm256_set1_ps(0.5f);
    __asm__ volatile("" : "+x"(a), "+x"(b));
    for (long it = 0; it < iters; it++) {
        #pragma GCC unroll 12
        for (int i = 0; i < 12; i++) c[i] = _mm256_fmadd_ps(a, b, c[i]);
    }
    for (int i = 0; i < 12; i++) __asm__ volatile("" : : "x"(c[i]));
    return (double)iters * 12 * 8 * 2;
}

__attribute__((noinline)) static void block_6x16(const float *restrict a, const float *restrict b,
                                                 float *restrict c, long kc) {
    __m256 c00 = _mm256_loadu_ps(c), c01 = _mm256_loadu_ps(c + 8);
    __m256 c10 = _mm256_loadu_ps(c + 16), c11 = _mm256_loadu_ps(c + 24);
    __m256 c20 = _mm256_loadu_ps(c + 32), c21 = _mm256_loadu_ps(c + 40);
    __m256 c30 = _mm256_loadu_ps(c + 48), c31 = _mm256_loadu_ps(c + 56);
    __m256 c40 = _mm256_loadu_ps(c + 64), c41 = _mm256_loadu_ps(c + 72);
    __m256 c50 = _mm256_loadu_ps(c + 80), c51 = _mm256_loadu_ps(c + 88);
    for (long k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(b + 16 * k), b1 = _mm256_loadu_ps(b + 16 * k + 8), x;
        x = _mm256_set1_ps(a[6 * k + 0]); c00 = _mm256_fmadd_ps(x, b0, c00); c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_set1_ps(a[6 * k + 1]); c10 = _mm256_fmadd_ps(x, b0, c10); c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_set1_ps(a[6 * k + 2]); c20 = _mm256_fmadd_ps(x, b0, c20); c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_set1_ps(a[6 * k + 3]); c30 = _mm256_fmadd_ps(x, b0, c30); c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_set1_ps(a[6 * k + 4]); c40 = _mm256_fmadd_ps(x, b0, c40); c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_set1_ps(a[6 * k + 5]); c50 = _mm256_fmadd_ps(x, b0, c50); c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    _mm256_storeu_ps(c, c00); _mm256_storeu_ps(c + 8, c01);
    _mm256_storeu_ps(c + 16, c10); _mm256_storeu_ps(c + 24, c11);
    _mm256_storeu_ps(c + 32, c20); _mm256_storeu_ps(c + 40, c21);
    _mm256_storeu_ps(c + 48, c30); _mm256_storeu_ps(c + 56, c31);
    _mm256_storeu_ps(c + 64, c40); _mm256_storeu_ps(c + 72, c41);
    _mm256_storeu_ps(c + 80, c50); _mm256_storeu_ps(c + 88, c51);
}

static double register_block(long calls) {
    for (long i = 0; i < calls; i++) block_6x16(Ap, Bp, Cc, KC);
    return (double)calls * 6 * 16 * KC * 2;
}

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Best and median GFLOP/s of 40 runs of `f(n)`, n calibrated to ~50 ms a run. */
static void measure(const char *name, double (*f)(long), int last) {
    long n = 1000;
    for (;;) {
        double t = now();
        f(n);
        if (now() - t > 0.05) break;
        n *= 2;
    }
    double r[40];
    for (int i = 0; i < 40; i++) {
        double t = now();
        double flop = f(n);
        r[i] = flop / (now() - t) * 1e-9;
    }
    qsort(r, 40, sizeof r[0], cmp);
    printf("\"%s\": {\"best\": %.2f, \"median\": %.2f}%s", name, r[39], r[20], last ? "" : ", ");
}

int main(void) {
    for (int i = 0; i < 6 * KC; i++) Ap[i] = 1e-3f * (i % 7);
    for (int i = 0; i < 16 * KC; i++) Bp[i] = 1e-3f * (i % 5);
    printf("{");
    measure("fma_peak", fma_chains, 0);
    measure("register_block_6x16_l1", register_block, 1);
    printf("}\n");
    return Cc[0] == 12345.0f;
}
