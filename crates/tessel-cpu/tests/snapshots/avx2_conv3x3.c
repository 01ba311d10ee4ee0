/* conv2d: C[n, p, q, k] += I[n, p + r - 1, q + s - 1, c] * W[k, r, s, c] over (n=1, p=5, q=5, k=8) reduce (c=4, r=3, s=3) acc f32 +bias(bias) relu */
void k_avx2_vfmadd231ps(void *const *args) {
    const float *restrict I = (const float *)args[0];  /* [1, 5, 5, 4] f32 */
    const float *restrict W = (const float *)args[1];  /* [8, 3, 3, 4] f32 */
    const float *restrict bias = (const float *)args[2];  /* [8] f32 */
    float *restrict C = (float *)args[3];  /* [1, 5, 5, 8] f32 */
    static float acc[200] __attribute__((aligned(64)));  /* [5, 5, 1, 1, 1, 8] in global, accumulator */
    for (long p = 0; p < 5; ++p) {
        for (long q = 0; q < 5; ++q) {
            for (long n_0 = 0; n_0 < 1; ++n_0) {
                for (long k_0 = 0; k_0 < 1; ++k_0) {
                    for (long n_1 = 0; n_1 < 1; ++n_1) {
                        for (long k_1 = 0; k_1 < 8; ++k_1) {
                            acc[p * 40 + q * 8 + n_0 * 8 + k_0 * 8 + n_1 * 8 + k_1] = 0;
                        }
                    }
                }
            }
        }
    }
    for (long p = 0; p < 5; ++p) {
        for (long q = 0; q < 5; ++q) {
            for (long r = 0; r < 3; ++r) {  /* reduction */
                for (long s = 0; s < 3; ++s) {  /* reduction */
                    for (long n_0 = 0; n_0 < 1; ++n_0) {
                        for (long k_0 = 0; k_0 < 1; ++k_0) {
                            for (long c_0 = 0; c_0 < 4; ++c_0) {  /* reduction */
                                {  /* step 5: avx2.vfmadd231ps (vfmadd231ps ymm), m = n.1, n = k.1, k = c.1 */
                                    float tsl_tile_A[1] __attribute__((aligned(64)));  /* A gathered into the instruction's layout */
                                    for (long n_1 = 0; n_1 < 1; ++n_1)
                                        for (long c_1 = 0; c_1 < 1; ++c_1)
                                            tsl_tile_A[c_1] = (p + r - 1 >= 0 && p + r - 1 < 5 && q + s - 1 >= 0 && q + s - 1 < 5 ? I[(n_0 + n_1) * 100 + (p + r - 1) * 20 + (q + s - 1) * 4 + c_0 + c_1] : 0);
                                    float tsl_tile_B[8] __attribute__((aligned(64)));  /* B gathered into the instruction's layout */
                                    for (long c_1 = 0; c_1 < 1; ++c_1)
                                        for (long k_1 = 0; k_1 < 8; ++k_1)
                                            tsl_tile_B[k_1 * 1 + c_1] = W[(k_0 * 8 + k_1) * 36 + r * 12 + s * 4 + c_0 + c_1];
                                    __m256 tsl_acc = _mm256_loadu_ps(&acc[p * 40 + q * 8 + n_0 * 8 + k_0 * 8]);
                                    tsl_acc = _mm256_fmadd_ps(_mm256_set1_ps(*(tsl_tile_A)), _mm256_loadu_ps(tsl_tile_B), tsl_acc);
                                    _mm256_storeu_ps(&acc[p * 40 + q * 8 + n_0 * 8 + k_0 * 8], tsl_acc);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    for (long p = 0; p < 5; ++p) {
        for (long q = 0; q < 5; ++q) {
            for (long n_0 = 0; n_0 < 1; ++n_0) {
                for (long k_0 = 0; k_0 < 1; ++k_0) {
                    for (long n_1 = 0; n_1 < 1; ++n_1) {
                        #pragma omp simd
                        for (long k_1 = 0; k_1 < 8; ++k_1) {
                            {
                                float v = acc[p * 40 + q * 8 + n_0 * 8 + k_0 * 8 + n_1 * 8 + k_1];
                                v = v + bias[k_0 * 8 + k_1];  /* bias */
                                v = v > 0 ? v : 0;  /* relu */
                                C[(n_0 + n_1) * 200 + p * 40 + q * 8 + k_0 * 8 + k_1] = v;
                            }
                        }
                    }
                }
            }
        }
    }
}
