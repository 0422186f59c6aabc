/* The bench's limit route (bench/compare_throughput.py): max |a - b| over two arrays and nothing
 * else, the least work that still reads every byte of both sides through the CPU. Kinds: 0 float32,
 * 1 bfloat16 bits, 2 int32 (|a - b| in double). Built by the bench with -O3 -march=native. */
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float ld(const void *p, int k, int64_t i) {
    if (k == 1) {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return ((const float *)p)[i];
}

#define LOOP(KA, KB)                                                                  \
    for (int64_t i = 0; i < n; i++) {                                                 \
        float d = fabsf(ld(a, KA, i) - ld(b, KB, i));                                 \
        m = d > m ? d : m;                                                            \
    }

double td_limit_maxabs(const void *a, int ka, const void *b, int kb, int64_t n) {
    if (ka == 2 || kb == 2) {
        const int32_t *x = a, *y = b;
        int64_t m = 0;
#pragma omp simd reduction(max : m)
        for (int64_t i = 0; i < n; i++) {
            int64_t d = (int64_t)x[i] - y[i];
            d = d < 0 ? -d : d;
            m = d > m ? d : m;
        }
        return (double)m;
    }
    float m = 0;
    if (ka == 0 && kb == 0) {
#pragma omp simd reduction(max : m)
        LOOP(0, 0)
    } else if (ka == 0 && kb == 1) {
#pragma omp simd reduction(max : m)
        LOOP(0, 1)
    } else if (ka == 1 && kb == 0) {
#pragma omp simd reduction(max : m)
        LOOP(1, 0)
    } else {
#pragma omp simd reduction(max : m)
        LOOP(1, 1)
    }
    return m;
}
