/* gemm: C[m, n] += A[m, k] * B[k, n] over (m=5, n=20) reduce (k=6) acc i32 */
void k_avx512_vpdpbusd(void *const *args) {
    const uint8_t *restrict A = (const uint8_t *)args[0];  /* [5, 6] u8 */
    const int8_t *restrict B = (const int8_t *)args[1];  /* [6, 20] i8 */
    int32_t *restrict C = (int32_t *)args[2];  /* [5, 20] i32 */
    static int32_t acc[160] __attribute__((aligned(64)));  /* [5, 2, 1, 16] in global, accumulator */
    for (long m_0 = 0; m_0 < 5; ++m_0) {
        for (long n_0 = 0; n_0 < 2; ++n_0) {
            for (long m_1 = 0; m_1 < 1; ++m_1) {
                for (long n_1 = 0; n_1 < 16; ++n_1) {
                    acc[m_0 * 32 + n_0 * 16 + m_1 * 16 + n_1] = 0;
                }
            }
        }
    }
    for (long m_0 = 0; m_0 < 5; ++m_0) {
        for (long n_0 = 0; n_0 < 2; ++n_0) {
            for (long k_0 = 0; k_0 < 2; ++k_0) {  /* reduction */
                {  /* step 5: avx512.vpdpbusd (vpdpbusd zmm), m = m.1, n = n.1, k = k.1 */
                    uint8_t tsl_tile_A[4] __attribute__((aligned(64)));  /* A gathered into the instruction's layout */
                    for (long m_1 = 0; m_1 < 1; ++m_1)
                        for (long k_1 = 0; k_1 < 4; ++k_1)
                            tsl_tile_A[k_1] = (k_0 * 4 + k_1 < 6 ? A[(m_0 + m_1) * 6 + k_0 * 4 + k_1] : 0);
                    int8_t tsl_tile_B[64] __attribute__((aligned(64)));  /* B gathered into the instruction's layout */
                    for (long k_1 = 0; k_1 < 4; ++k_1)
                        for (long n_1 = 0; n_1 < 16; ++n_1)
                            tsl_tile_B[n_1 * 4 + k_1] = (n_0 * 16 + n_1 < 20 && k_0 * 4 + k_1 < 6 ? B[(k_0 * 4 + k_1) * 20 + n_0 * 16 + n_1] : 0);
                    int32_t tsl_tile_C[16] __attribute__((aligned(64)));  /* C gathered into the instruction's layout */
                    for (long m_1 = 0; m_1 < 1; ++m_1)
                        for (long n_1 = 0; n_1 < 16; ++n_1)
                            tsl_tile_C[n_1] = (n_0 * 16 + n_1 < 20 ? acc[m_0 * 32 + n_0 * 16 + m_1 * 16 + n_1] : 0);
                    __m512i tsl_acc = _mm512_loadu_si512(tsl_tile_C);
                    tsl_acc = _mm512_dpbusd_epi32(tsl_acc, _mm512_set1_epi32(tsl_load_i32(tsl_tile_A)), _mm512_loadu_si512(tsl_tile_B));
                    _mm512_storeu_si512(tsl_tile_C, tsl_acc);
                    for (long m_1 = 0; m_1 < 1; ++m_1)
                        for (long n_1 = 0; n_1 < 16; ++n_1)
                            if (n_0 * 16 + n_1 < 20) acc[m_0 * 32 + n_0 * 16 + m_1 * 16 + n_1] = tsl_tile_C[n_1];
                }
            }
        }
    }
    for (long m_0 = 0; m_0 < 5; ++m_0) {
        for (long n_0 = 0; n_0 < 2; ++n_0) {
            for (long m_1 = 0; m_1 < 1; ++m_1) {
                for (long n_1 = 0; n_1 < 16; ++n_1) {
                    if (n_0 * 16 + n_1 < 20) {
                        int32_t v = acc[m_0 * 32 + n_0 * 16 + m_1 * 16 + n_1];
                        C[(m_0 + m_1) * 20 + n_0 * 16 + n_1] = v;
                    }
                }
            }
        }
    }
}
