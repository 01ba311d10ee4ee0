/* gemm: C[m, n] += A[m, k] * B[k, n] over (m=64, n=64) reduce (k=64) acc f32 */
void k_amx_tdpbf16ps(void *const *args) {
    const uint16_t *restrict A = (const uint16_t *)args[0];  /* [64, 64] bf16 */
    const uint16_t *restrict B = (const uint16_t *)args[1];  /* [64, 64] bf16 */
    float *restrict C = (float *)args[2];  /* [64, 64] f32 */
    TSL_AMX_INIT();
    static uint16_t B_packed[4096] __attribute__((aligned(64)));  /* [2, 32, 32, 2] in global, input 1 repacked */
    for (long B_packed_0 = 0; B_packed_0 < 2; ++B_packed_0) {
        for (long B_packed_1 = 0; B_packed_1 < 32; ++B_packed_1) {
            for (long B_packed_2 = 0; B_packed_2 < 32; ++B_packed_2) {
                for (long B_packed_3 = 0; B_packed_3 < 2; ++B_packed_3) {
                    B_packed[B_packed_0 * 2048 + B_packed_1 * 64 + B_packed_2 * 2 + B_packed_3] = B[(B_packed_1 * 2 + B_packed_3) * 64 + B_packed_0 * 32 + B_packed_2];  /* step 4 */
                }
            }
        }
    }
    #pragma omp parallel
    {
        TSL_AMX_INIT();
        #pragma omp for schedule(static)
        for (long n_0 = 0; n_0 < 2; ++n_0) {
            float acc[2048] __attribute__((aligned(64)));  /* [2, 2, 2, 16, 16] in local, accumulator */
            for (long m_0 = 0; m_0 < 2; ++m_0) {
                #pragma GCC unroll 2
                for (long m_1 = 0; m_1 < 2; ++m_1) {
                    #pragma GCC unroll 2
                    for (long n_1 = 0; n_1 < 2; ++n_1) {
                        for (long m_2 = 0; m_2 < 16; ++m_2) {
                            for (long n_2 = 0; n_2 < 16; ++n_2) {
                                acc[m_0 * 1024 + m_1 * 512 + n_1 * 256 + m_2 * 16 + n_2] = 0;  /* step 6 */
                            }
                        }
                    }
                }
            }
            for (long k_0 = 0; k_0 < 1; ++k_0) {  /* reduction */
                for (long m_0 = 0; m_0 < 2; ++m_0) {
                    {  /* step 9: amx.tdpbf16ps register block: 4 accumulator(s) over unrolled m.1, n.1 held across `k.1` */
                        _tile_loadd(0, &acc[m_0 * 1024], 64);
                        _tile_loadd(1, &acc[m_0 * 1024 + 256], 64);
                        _tile_loadd(2, &acc[m_0 * 1024 + 512], 64);
                        _tile_loadd(3, &acc[m_0 * 1024 + 512 + 256], 64);
                        for (long k_1 = 0; k_1 < 2; ++k_1) {  /* reduction */
                            _tile_loadd(4, &A[(m_0 * 32) * 64 + k_0 * 64 + k_1 * 32], 128);
                            _tile_loadd(5, &B_packed[((n_0 * 32) / 32) * 2048 + ((k_0 * 64 + k_1 * 32) / 2) * 64 + ((n_0 * 32) % 32) * 2 + (k_0 * 64 + k_1 * 32) % 2], 128);
                            _tile_dpbf16ps(0, 4, 5);
                            _tile_loadd(6, &B_packed[((n_0 * 32 + 16) / 32) * 2048 + ((k_0 * 64 + k_1 * 32) / 2) * 64 + ((n_0 * 32 + 16) % 32) * 2 + (k_0 * 64 + k_1 * 32) % 2], 128);
                            _tile_dpbf16ps(1, 4, 6);
                            _tile_loadd(7, &A[(m_0 * 32 + 16) * 64 + k_0 * 64 + k_1 * 32], 128);
                            _tile_dpbf16ps(2, 7, 5);
                            _tile_dpbf16ps(3, 7, 6);
                        }
                        _tile_stored(0, &acc[m_0 * 1024], 64);
                        _tile_stored(1, &acc[m_0 * 1024 + 256], 64);
                        _tile_stored(2, &acc[m_0 * 1024 + 512], 64);
                        _tile_stored(3, &acc[m_0 * 1024 + 512 + 256], 64);
                    }
                }
            }
            for (long m_0 = 0; m_0 < 2; ++m_0) {
                #pragma GCC unroll 2
                for (long m_1 = 0; m_1 < 2; ++m_1) {
                    #pragma GCC unroll 2
                    for (long n_1 = 0; n_1 < 2; ++n_1) {
                        for (long m_2 = 0; m_2 < 16; ++m_2) {
                            for (long n_2 = 0; n_2 < 16; ++n_2) {
                                {  /* step 6 */
                                    float v = acc[m_0 * 1024 + m_1 * 512 + n_1 * 256 + m_2 * 16 + n_2];
                                    C[(m_0 * 32 + m_1 * 16 + m_2) * 64 + n_0 * 32 + n_1 * 16 + n_2] = v;
                                }
                            }
                        }
                    }
                }
            }
        }
        _tile_release();
    }
    _tile_release();
}
