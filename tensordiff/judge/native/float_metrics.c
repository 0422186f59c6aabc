/* One pass over a chunk of two float tensors: every FloatMetrics statistic at once.
 *
 * The numpy path in tensordiff/metrics.py is the reference; this kernel reproduces its float32
 * arithmetic exactly (d = |a - b|, rel, the allclose bound and the ULP quotient are float32
 * operations, built with -ffp-contract=off so no FMA changes a rounding). Sums: per block of
 * BLOCK elements in float (vectorised), then in double; the numpy path sums in double, so the
 * sums agree to ~1e-7 relative and every other statistic exactly.
 *
 * Inputs are raw storage: kind 0 = float32, kind 1 = bfloat16 bits (widened by a 16-bit shift,
 * exact). Each block of BLOCK elements runs a vectorised pass; if that pass saw any NaN/Inf,
 * its results are dropped and the scalar path, which does the NaN/Inf bookkeeping, redoes it.
 * The vectorised pass is block_avx512 (intrinsics) where the CPU has AVX-512, else block_fast
 * (the compiler's vectorisation of a portable loop): the same values, sums within their bounds.
 *
 * The ULP histogram is counted in the bins tensordiff/metrics.py reports (quarter-ULP bins below 16
 * ULP, 16 per octave above), computed from the bits of u: below 16, floor(4u); above, the octave
 * from u's exponent and the bin inside it, floor(16 log2 v) for v = 1.m (u's top 7 mantissa bits),
 * as the exponent of v^16 by four float squarings (no table, no gather: the loop stays vectorised).
 * For every key that is the bin metrics.py's key table (`_LUT`) gives, checked there at import on
 * the same float32 arithmetic and here by tests through `td_ulp_bins`; so the counts are the numpy
 * path's, exactly, and a few thousand counters stay in L1, unlike one per key. Counts of a call go to NSUB interleaved
 * 32-bit sub-histograms on the stack, added to the caller's int64 bins at the end.
 *
 * Cut mode (td_float_update_cuts): in place of the histogram, the count of pairs whose bin is below
 * each of a few edges, as u < the edge's least u (cut_bin_u; bin_of is non-decreasing in u), two
 * vector ops an edge; the scalar paths count their bins and fold them by edge. metrics.py says when.
 *
 * u = d / spacing: the spacing is a power of two, so u is d times its reciprocal, also a power
 * of two and correctly rounded alike (no division); when the spacing is subnormal its reciprocal
 * is not a float, and d is first scaled by 2^64 (exact) and then by the rest.
 *
 * I[]: 0 n, 1 finite, 2 nan_a, 3 nan_b, 4 inf_a, 5 inf_b, 6 nonfinite mismatches,
 *      7 allclose violations, 8 worst (index of the first max |a-b|, -1 none),
 *      9 first nonfinite mismatch (-1 none)
 * D[]: 0 max |a-b| over finite pairs (-1 none yet), 1 max rel, 2 sum |d|, 3 sum d^2,
 *      4 sum a^2, 5 sum b^2, 6 (unused), 7 min a, 8 max a, 9 min b, 10 max b, 11 max ULP
 */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
/* -march=native on the machine that runs the kernel (its build is keyed by the CPU's flags):
   these macros are that CPU's. Elsewhere (AVX2, ARM, ...) the generic block_fast runs, which the
   compiler vectorises for whatever the CPU has. */
#define TD_AVX512 1
#include <immintrin.h>
#else
#define TD_AVX512 0
#endif
#if TD_AVX512 && defined(__AVX512VBMI__)
#define TD_HOT 1 /* bins counted in registers (a byte shuffle: AVX512-VBMI) */
#else
#define TD_HOT 0
#endif
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 1024
#define EXP 0x7f800000u
#define LIN_BINS 64                     /* quarter-ULP bins below 16 ULP */
#define NBINS (LIN_BINS + 16 * 128)     /* tensordiff/metrics.py _NBINS */
#define E16 131                         /* biased exponent of 16.0f */
#define HSTRIDE (NBINS + 16)            /* sub-histogram stride: the sub-histograms do not alias */
#define NSUB 4                          /* interleaved sub-histograms: no store-forwarding chain on one bin */
#define HOT 8        /* bins counted in vector registers (block_avx512): two lanes of 4 byte counters */
#define MAXCUTS 8    /* td_float_update_cuts: bin edges counted at once */
#define PREFETCH 4096 /* bytes ahead of block_avx512's loads (a block's burst in run() slowed block_fast) */

typedef struct {
    float atol, rtol, floor, scale;
    int32_t fexp, sexp; /* biased exponent of `floor`; unbiased exponent of `scale` (both powers of two) */
    uint32_t *hist; /* nsub * HSTRIDE counts of this call */
    int32_t nsub;   /* NSUB, or 1 for a small call (less to clear and fold than to count) */
    double *rows; /* row maxima for rows r0.., or NULL */
    int64_t row, r0;
    int32_t hot[HOT]; /* the AVX-512 path's bins counted in vector registers (choose_hot), or -1 */
    uint8_t slot[128] __attribute__((aligned(64))); /* bin - base < 127 -> 8 j when it is hot[j], else 0xff */
    int32_t base; /* the window of bins slot[] covers */
    float cut_u[MAXCUTS]; /* td_float_update_cuts: the least u in bin >= each cut (cut_bins) */
    int64_t *below;       /* ... and where the counts of bins below each cut go, or NULL: the histogram */
    int32_t ncuts;
} params;

static inline float f_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t u_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* d / spacing(x) without a division (see the top) */
static inline __attribute__((always_inline)) float ulps(float d, float x, int32_t fexp, int32_t sexp) {
    int32_t xe = (int32_t)((u_of(x) & EXP) >> 23);
    int32_t se = (xe > fexp ? xe : fexp) + sexp; /* the spacing's biased exponent */
    int32_t sub = se <= 0;                                /* a subnormal spacing */
    float f1 = sub ? 0x1p64f : 1.0f;
    float f2 = f_of((uint32_t)(254 - se - (sub ? 64 : 0)) << 23);
    return (d * f1) * f2;
}

/* the histogram bin of u >= 0 (tensordiff/metrics.py `_LUT` of u's key) */
static inline __attribute__((always_inline)) uint16_t bin_of(float u) {
    uint32_t b = u_of(u);
    int32_t e = (int32_t)(b >> 23);
    int32_t lin = (int32_t)((u < 16.0f ? u : 0.0f) * 4.0f);
    float v = f_of((b & 0x007f0000u) | 0x3f800000u); /* 1.m, exact */
    v *= v; /* exact */
    v *= v;
    v *= v;
    v *= v;
    int32_t lg = LIN_BINS + (e - E16) * 16 + ((int32_t)(u_of(v) >> 23) - 127);
    return (uint16_t)(u < 16.0f ? lin : (e >= 255 ? NBINS - 1 : lg));
}

static inline __attribute__((always_inline)) float load(const void *p, int kind, int64_t i) {
    if (kind == 1) return f_of((uint32_t)((const uint16_t *)p)[i] << 16);
    return ((const float *)p)[i];
}

static inline void row_max(const params *P, int64_t g, int64_t r, double v) {
    (void)g;
    double *slot = P->rows + (r - P->r0);
    if (v > *slot) *slot = v;
}

/* What every accepted block records from its per-element d = |a-b| and bins: the first
   element at the block's max d when that beats the running max, the histogram counts (NSUB
   interleaved sub-histograms: no store-forwarding chain on one bin) and the row maxima. */
static inline __attribute__((always_inline)) void
record(const params *P, int64_t *I, double *D, const float *d, const uint32_t *key, int64_t nk, int64_t n, int64_t g,
       float mx) {
    /* key: nk bins to count (the block's, or those the caller did not count itself) */
    if (mx > D[0] || I[8] < 0) {
        for (int64_t i = 0; i < n; i++)
            if (d[i] == mx) {
                D[0] = mx;
                I[8] = g + i;
                break;
            }
    }
    uint32_t *h = P->hist;
    int64_t i = 0;
    for (; P->nsub == NSUB && i + NSUB <= nk; i += NSUB)
        for (int k = 0; k < NSUB; k++) h[k * HSTRIDE + key[i + k]]++;
    for (; i < nk; i++) h[key[i]]++;
    if (P->rows && g / P->row == (g + n - 1) / P->row) { /* inside one row (rows >= BLOCK): its max is mx */
        row_max(P, g, g / P->row, mx);
    } else if (P->rows) {
        for (int64_t j = 0; j < n;) {
            int64_t r = (g + j) / P->row;
            int64_t end = (r + 1) * P->row - g;
            if (end > n) end = n;
            float m = 0;
#pragma omp simd reduction(max : m)
            for (int64_t k = j; k < end; k++) m = d[k] > m ? d[k] : m;
            row_max(P, g + j, r, m);
            j = end;
        }
    }
}

/* Returns 0, or 1 when the block holds a NaN/Inf or a float sum overflowed, in which case nothing
   was recorded and the caller runs block_slow on the block instead. */
static inline __attribute__((always_inline)) int64_t
block_fast(const void *a, int ka, const void *b, int kb, int64_t off, int64_t n, int64_t start,
           const params *P, int64_t *I, double *D) {
    float d[BLOCK];
    uint32_t key[BLOCK];
    /* float partial sums over one block (each SIMD lane adds at most BLOCK/16 terms, ~1e-7
       relative), added to the double totals per block */
    float s_abs = 0, s_err = 0, s_aa = 0, s_bb = 0;
    float mx = 0, mrel = 0, mu = 0, mina = INFINITY, maxa = -INFINITY, minb = INFINITY, maxb = -INFINITY;
    int32_t viol = 0, bad; /* per block: fits, and packs 16 lanes per vector */
    const float atol = P->atol, rtol = P->rtol;
    const int32_t fexp = P->fexp, sexp = P->sexp;
#pragma omp simd reduction(+ : s_abs, s_err, s_aa, s_bb, viol) reduction(max : mx, mrel, mu, maxa, maxb) \
    reduction(min : mina, minb)
    for (int64_t i = 0; i < n; i++) {
        float x = load(a, ka, off + i), y = load(b, kb, off + i);
        float di = fabsf(x - y);
        d[i] = di;
        s_abs += di;
        s_err += di * di;
        s_aa += x * x;
        s_bb += y * y;
        mx = di > mx ? di : mx;
        float ax = fabsf(x);
        float den = ax > FLT_MIN ? ax : FLT_MIN;
        float r = di / den;
        mrel = r > mrel ? r : mrel;
        float tol = atol + rtol * ax;
        viol += di > tol;
        mina = x < mina ? x : mina;
        maxa = x > maxa ? x : maxa;
        minb = y < minb ? y : minb;
        maxb = y > maxb ? y : maxb;
        float u = ulps(di, x, fexp, sexp);
        mu = u > mu ? u : mu;
        key[i] = bin_of(u);
    }
    /* A NaN or Inf on either side makes its sum of squares NaN or Inf (x*x is never -Inf), so the
       sums detect it without a test per element; a finite |x| > ~1.8e19 (or a difference above it)
       overflows a float sum too, and the slow path, which sums in double as numpy does, then takes
       the block. */
    bad = !(isfinite(s_aa + s_bb) && isfinite(s_err)); /* |x|, |y| < 1.8e19 can still give d^2 > FLT_MAX */
    if (bad) return bad; /* the partial results above are garbage or overflowed: drop them */
    I[1] += n;
    I[7] += viol;
    D[2] += s_abs;
    D[3] += s_err;
    D[4] += s_aa;
    D[5] += s_bb;
    if (mrel > D[1]) D[1] = mrel;
    if (mina < D[7]) D[7] = mina;
    if (maxa > D[8]) D[8] = maxa;
    if (minb < D[9]) D[9] = minb;
    if (maxb > D[10]) D[10] = maxb;
    if (mu > D[11]) D[11] = mu;
    record(P, I, D, d, key, n, n, start + off, mx);
    return 0;
}

#if TD_AVX512
/* The same block with AVX-512 intrinsics, 16 lanes (the compiler's version of block_fast spills
   its ~20 accumulators and constants and packed 16-bit keys with permutes: ~1.5x slower in cache,
   2x from DRAM). Every per-element value is block_fast's float32 operation, in the same order and
   rounding: d, the quotient d / max(|a|, FLT_MIN), the bound atol + rtol*|a| (a multiply, then
   an add: no FMA), min/max, and u = d * 2^(127 - s) as one correctly rounded vscalefps (ulps()
   gets the same value from two exact power-of-two products, the second one rounded). The bins
   are bin_of's, from the same bits (test: every key through td_ulp_bins_vec).

   Sums: the four sums (|d|, d^2, a^2, b^2) add non-negative terms. Each lane adds G1 = 8 terms
   with FMA (the product itself is not rounded, only each sum) into a level-1 float accumulator
   started at 0, which is then added to a level-2 float accumulator (G2 = BLOCK / (16 G1) = 8 of
   them a block, the first addition to 0 exact). A term is thus rounded at most G1 times in level
   1 (its own FMA and the later ones) and G2 - 1 times in level 2: 15 roundings, so a block's
   float sum is within (1 + 2^-24)^15 - 1 ~ 15 * 2^-24 ~ 9e-7 of the exact sum, relative (all
   terms have one sign). The 16 lanes are widened to double (exact) and added there, one double
   rounding per block and lane sum (~1e-9 over 10^10 elements). The generic path's bound, with
   64-term lanes and rounded products, is ~2x larger. Test: test_native's bound test. */
#define G1 8
static inline __attribute__((always_inline)) __m512 ld16(const void *p, int kind, int64_t i) {
    if (kind == 1)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i))), 16));
    return _mm512_loadu_ps((const float *)p + i);
}

static inline __attribute__((always_inline)) double sum_pd(__m512 s) {
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(s));
    __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
    return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}

#ifdef __AVX512VBMI__
/* floor(16 log2 v) for v = 1.m, m = u's top 7 mantissa bits: bin_of's value (the exponent of v^16
   by four float squarings), tabulated once at load for a byte shuffle (vpermi2b) */
static uint8_t log_tab[128] __attribute__((aligned(64)));
__attribute__((constructor)) static void init_log_tab(void) {
    for (uint32_t m = 0; m < 128; m++) {
        float v = f_of(0x3f800000u | m << 16);
        v *= v;
        v *= v;
        v *= v;
        v *= v;
        log_tab[m] = (uint8_t)((u_of(v) >> 23) - 127);
    }
}
#endif

/* bin_of for 16 u >= 0 at once, as min(lin, lg) (unsigned) with no compare: lin = floor(4u) is
   the bin below 16 and lg = 64 + 16 (e - 131) + floor(16 log2 1.m) above, with e clamped to >= 128,
   so that lg > lin for u < 16 (lg >= 16 > lin below 4; above, 16 log2 v + 16 k >= 2^k 4 (v - 1)
   ...: checked for every key by the tests) and lg <= lin from 16 on (4u grows faster than its log;
   cvtt of a u >= 2^29 gives 0x80000000, above every lg). u = Inf (or a NaN pattern, which the
   kernel never makes) gives lg in [INF_BIN, INF_BIN + 16), which no finite u reaches (e <= 254
   gives lg <= 2047); td_float_update moves those counts to bin_of's NBINS - 1 (inf_bin). */
#define INF_BIN (LIN_BINS + (255 - E16) * 16)
static inline int inf_bin(int b) { return b >= INF_BIN && b < INF_BIN + 16; }
static inline __attribute__((always_inline)) __m512i bins16(__m512 u) {
    __m512i ub = _mm512_castps_si512(u);
    __m512i e = _mm512_max_epu32(_mm512_srli_epi32(ub, 23), _mm512_set1_epi32(128));
    __m512i lin = _mm512_cvttps_epi32(_mm512_mul_ps(u, _mm512_set1_ps(4.0f)));
#ifdef __AVX512VBMI__
    /* byte 0 of each lane: bits 16..23 of u, of which the shuffle reads the low 7 (the mantissa's
       top bits); the other bytes are zeroed */
    __m512i t = _mm512_maskz_permutex2var_epi8(0x1111111111111111ULL, _mm512_load_si512(log_tab), _mm512_srli_epi32(ub, 16),
                                               _mm512_load_si512(log_tab + 64));
    __m512i lg = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(e, 4), t), _mm512_set1_epi32(LIN_BINS - E16 * 16));
#else
    __m512 v = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(ub, _mm512_set1_epi32(0x007f0000),
                                                             _mm512_set1_epi32(0x3f800000), 0xEA)); /* (ub & m) | one */
    v = _mm512_mul_ps(v, v);
    v = _mm512_mul_ps(v, v);
    v = _mm512_mul_ps(v, v);
    v = _mm512_mul_ps(v, v);
    __m512i lg = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(e, 4), _mm512_srli_epi32(_mm512_castps_si512(v), 23)),
                                  _mm512_set1_epi32(LIN_BINS - E16 * 16 - 127));
#endif
    return _mm512_min_epu32(lin, lg);
}

/* ulps() for 16 lanes: the spacing's biased exponent s = max(exponent(a), fexp) + sexp, and
   u = d * 2^(127 - s) (kbase = 127 - sexp) */
static inline __attribute__((always_inline)) __m512 ulps16(__m512 di, __m512 ax, __m512i kbase, __m512i fexp) {
    __m512i k = _mm512_sub_epi32(kbase, _mm512_max_epi32(_mm512_srli_epi32(_mm512_castps_si512(ax), 23), fexp));
    return _mm512_scalef_ps(di, _mm512_cvtepi32_ps(k));
}

/* n: a multiple of 16, <= BLOCK. Returns as block_fast does. hot (a constant at each call): the
   call's HOT commonest bins (choose_hot) are counted in vector registers, byte counters in two
   accumulators (a byte shuffle gives each lane its bin's counter shift, a variable shift and an
   add count it: ~6 ops for 16 elements), and only the other elements' bins go to the scalar
   increments after the loop (~1.3 cycles each: half the loop's time when every element took one).
   Nothing is counted before the block is known to be finite: a NaN/Inf block leaves no trace. */
static inline __attribute__((always_inline)) int64_t
block_avx512(const void *a, int ka, const void *b, int kb, int64_t off, int64_t n, int64_t start,
             const params *P, int64_t *I, double *D, int hot) {
    float d[BLOCK] __attribute__((aligned(64)));
    uint32_t key[BLOCK + 16] __attribute__((aligned(64))); /* the bins to increment, packed */
    int64_t nk = 0;
    /* a hot bin's lane gets 1 << (8 j) (byte j of a 32-bit lane counts bin hot[j], at most 64 a
       block); the others 0, and go to key[] */
#if TD_HOT
    const __m512i s0 = _mm512_load_si512(P->slot), s1 = _mm512_load_si512(P->slot + 64),
                  base = _mm512_set1_epi32(P->base); /* below it, bin - base wraps to above 127 */
#endif
    __m512i hc = _mm512_setzero_si512(), hc2 = hc; /* bins hot[0..3], hot[4..7] */
    /* cut mode (hot == 3): per cut, a lane's count of u below the cut's least u (bin_of is
       non-decreasing in u, so u < cut_u[k] is bin_of(u) < cut k) */
    __m512i nb[MAXCUTS];
    __m512 cu[MAXCUTS];
    for (int k = 0; k < MAXCUTS; k++) nb[k] = hc, cu[k] = _mm512_set1_ps(k < P->ncuts ? P->cut_u[k] : 0.0f);
    const __m512 atol = _mm512_set1_ps(P->atol), rtol = _mm512_set1_ps(P->rtol), fmin = _mm512_set1_ps(FLT_MIN);
    const __m512i fexp = _mm512_set1_epi32(P->fexp), kbase = _mm512_set1_epi32(127 - P->sexp);
    const __m512 zero = _mm512_setzero_ps(), pinf = _mm512_set1_ps(INFINITY), ninf = _mm512_set1_ps(-INFINITY);
    __m512 s_abs = zero, s_err = zero, s_aa = zero, s_bb = zero;
    __m512 mx = zero, mrel = zero, mu = zero, mina = pinf, maxa = ninf, minb = pinf, maxb = ninf;
    __m512i viol = _mm512_setzero_si512();
    for (int64_t g = 0; g < n; g += 16 * G1) {
        int64_t ge = g + 16 * G1 < n ? g + 16 * G1 : n;
        __m512 t_abs = zero, t_err = zero, t_aa = zero, t_bb = zero;
        for (int64_t i = g; i < ge; i += 16) {
            /* PREFETCH bytes ahead: the loop is compute-bound (~40 cycles a vector), too slow for
               the hardware prefetchers to keep DRAM ahead of it; without this the thread stalls
               on memory for about as long again (measured: 1.34 -> 0.66 ns of CPU an element) */
            _mm_prefetch((const char *)a + (off + i) * (ka ? 2 : 4) + PREFETCH, _MM_HINT_T0);
            _mm_prefetch((const char *)b + (off + i) * (kb ? 2 : 4) + PREFETCH, _MM_HINT_T0);
            __m512 x = ld16(a, ka, off + i), y = ld16(b, kb, off + i);
            __m512 di = _mm512_abs_ps(_mm512_sub_ps(x, y));
            _mm512_store_ps(d + i, di);
            t_abs = _mm512_add_ps(t_abs, di);
            t_err = _mm512_fmadd_ps(di, di, t_err);
            t_aa = _mm512_fmadd_ps(x, x, t_aa);
            t_bb = _mm512_fmadd_ps(y, y, t_bb);
            mx = _mm512_max_ps(di, mx);
            __m512 ax = _mm512_abs_ps(x);
            mrel = _mm512_max_ps(_mm512_div_ps(di, _mm512_max_ps(ax, fmin)), mrel);
            __m512 tol = _mm512_add_ps(atol, _mm512_mul_ps(rtol, ax));
            viol = _mm512_mask_sub_epi32(viol, _mm512_cmp_ps_mask(di, tol, _CMP_GT_OQ), viol, _mm512_set1_epi32(-1));
            mina = _mm512_min_ps(x, mina);
            maxa = _mm512_max_ps(x, maxa);
            minb = _mm512_min_ps(y, minb);
            maxb = _mm512_max_ps(y, maxb);
            __m512 u = ulps16(di, ax, kbase, fexp);
            mu = _mm512_max_ps(u, mu);
            if (hot == 2) continue; /* td_set_no_hist: the ULP histogram not counted (benchmark only) */
            if (hot == 3) { /* two ops a cut: no bins, no scalar increments */
                for (int k = 0; k < MAXCUTS; k++)
                    if (k < P->ncuts)
                        nb[k] = _mm512_mask_sub_epi32(nb[k], _mm512_cmp_ps_mask(u, cu[k], _CMP_LT_OQ), nb[k],
                                                      _mm512_set1_epi32(-1));
                continue;
            }
            __m512i bin = bins16(u);
            if (TD_HOT && hot) {
#if TD_HOT
                __m512i sh = _mm512_maskz_permutex2var_epi8(0x1111111111111111ULL, s0,
                                                            _mm512_min_epu32(_mm512_sub_epi32(bin, base), _mm512_set1_epi32(127)), s1);
                __m512i one = _mm512_sllv_epi32(_mm512_set1_epi32(1), sh);
                __m512i one2 = _mm512_sllv_epi32(_mm512_set1_epi32(1), _mm512_sub_epi32(sh, _mm512_set1_epi32(32)));
                hc = _mm512_add_epi32(hc, one);
                hc2 = _mm512_add_epi32(hc2, one2);
                __mmask16 rest = _mm512_testn_epi32_mask(_mm512_or_si512(one, one2), _mm512_set1_epi32(-1));
                _mm512_storeu_si512(key + nk, _mm512_maskz_compress_epi32(rest, bin));
                nk += __builtin_popcount(rest);
#endif
            } else {
                _mm512_store_si512(key + i, bin);
            }
        }
        s_abs = _mm512_add_ps(s_abs, t_abs);
        s_err = _mm512_add_ps(s_err, t_err);
        s_aa = _mm512_add_ps(s_aa, t_aa);
        s_bb = _mm512_add_ps(s_bb, t_bb);
    }
    double e_aa = sum_pd(s_aa), e_bb = sum_pd(s_bb), e_err = sum_pd(s_err);
    if (!(isfinite(e_aa + e_bb) && isfinite(e_err))) return 1; /* NaN/Inf or a float overflow: block_slow */
    if (hot == 2) {
        nk = 0;
    } else if (hot == 3) {
        nk = 0;
        for (int k = 0; k < P->ncuts; k++) P->below[k] += _mm512_reduce_add_epi32(nb[k]);
    } else if (hot) {
        for (int j = 0; j < HOT; j++)
            if (P->hot[j] >= 0)
                P->hist[P->hot[j]] += (uint32_t)_mm512_reduce_add_epi32(
                    _mm512_and_si512(_mm512_srli_epi32(j < 4 ? hc : hc2, 8 * (j % 4)), _mm512_set1_epi32(0xff)));
    } else {
        nk = n;
    }
    I[1] += n;
    I[7] += _mm512_reduce_add_epi32(viol);
    D[2] += sum_pd(s_abs);
    D[3] += e_err;
    D[4] += e_aa;
    D[5] += e_bb;
    float m;
    float dmax = _mm512_reduce_max_ps(mx);
    if ((m = _mm512_reduce_max_ps(mrel)) > D[1]) D[1] = m;
    if ((m = _mm512_reduce_min_ps(mina)) < D[7]) D[7] = m;
    if ((m = _mm512_reduce_max_ps(maxa)) > D[8]) D[8] = m;
    if ((m = _mm512_reduce_min_ps(minb)) < D[9]) D[9] = m;
    if ((m = _mm512_reduce_max_ps(maxb)) > D[10]) D[10] = m;
    if ((m = _mm512_reduce_max_ps(mu)) > D[11]) D[11] = m;
    record(P, I, D, d, key, nk, n, start + off, dmax);
    return 0;
}
#endif

static void block_slow(const void *a, int ka, const void *b, int kb, int64_t off, int64_t n, int64_t start,
                       const params *P, int64_t *I, double *D) {
    for (int64_t i = 0; i < n; i++) {
        int64_t g = start + off + i;
        float x = load(a, ka, off + i), y = load(b, kb, off + i);
        int fa = isfinite(x), fb = isfinite(y);
        if (!(fa && fb)) {
            int na = isnan(x) != 0, nb = isnan(y) != 0, ia = isinf(x) != 0, ib = isinf(y) != 0; /* isinf may give -1 */
            I[2] += na;
            I[3] += nb;
            I[4] += ia;
            I[5] += ib;
            int same = (na && nb) || (ia && ib && (signbit(x) != 0) == (signbit(y) != 0));
            if (!same) {
                I[6]++;
                if (I[9] < 0) I[9] = g;
            }
            continue;
        }
        float di = fabsf(x - y);
        double dd = di, xd = x, yd = y;
        I[1]++;
        D[2] += dd;
        D[3] += dd * dd;
        D[4] += xd * xd;
        D[5] += yd * yd;
        if (di > D[0] || I[8] < 0) {
            D[0] = di;
            I[8] = g;
        }
        float ax = fabsf(x);
        float r = di / (ax > FLT_MIN ? ax : FLT_MIN);
        if (r > D[1]) D[1] = r;
        float tol = P->atol + P->rtol * ax;
        I[7] += di > tol;
        if (x < D[7]) D[7] = x;
        if (x > D[8]) D[8] = x;
        if (y < D[9]) D[9] = y;
        if (y > D[10]) D[10] = y;
        float u = ulps(di, x, P->fexp, P->sexp);
        if (u > D[11]) D[11] = u;
        P->hist[bin_of(u)]++;
        if (P->rows) row_max(P, g, g / P->row, di);
    }
}

static int generic_only; /* td_set_generic(1): the AVX-512 path off (tests compare the two) */
/* td_set_no_hist(1): the AVX-512 blocks count no ULP histogram, every other statistic as always.
   Benchmark only (bench/compare_throughput.py's kernel_nohist route): what the histogram costs. */
static int no_hist;

/* The HOT bins counted most so far (after a call's first block), among the 127 bins of a window
   [base, base + 127) around the commonest one: a tensor's ULP distances keep their distribution
   from block to block, so these take most of the rest of the call's elements. Returns 0 (no bins
   counted in registers) when they took under a quarter of the block. */
static uint32_t seen_bin(const params *P, int k) {
    uint32_t c = 0;
    for (int j = 0; j < P->nsub; j++) c += P->hist[j * HSTRIDE + k];
    return c;
}

static int choose_hot(params *P, int64_t seen) {
    uint32_t top[HOT] = {0}, sum = 0, best = 0;
    int mode = 0;
    for (int k = 0; k < NBINS; k++) {
        uint32_t c = seen_bin(P, k);
        if (c > best) best = c, mode = k;
    }
    P->base = mode < 63 ? 0 : (mode + 64 > NBINS ? NBINS - 127 : mode - 63);
    for (int j = 0; j < HOT; j++) P->hot[j] = -1;
    for (int k = P->base; k < P->base + 127; k++) {
        uint32_t c = seen_bin(P, k);
        for (int j = 0; j < HOT; j++)
            if (c > top[j]) { /* insert, shifting the smaller ones down */
                for (int i = HOT - 1; i > j; i--) top[i] = top[i - 1], P->hot[i] = P->hot[i - 1];
                top[j] = c, P->hot[j] = k;
                break;
            }
    }
    memset(P->slot, 0xff, sizeof P->slot);
    for (int j = 0; j < HOT; j++) {
        sum += top[j];
        if (P->hot[j] >= 0) P->slot[P->hot[j] - P->base] = (uint8_t)(8 * j);
    }
    return 4 * (int64_t)sum >= seen;
}

static inline __attribute__((always_inline)) void
run(const void *a, int ka, const void *b, int kb, int64_t n, int64_t start, params *P, int64_t *I, double *D) {
    int wide = TD_AVX512 && !generic_only, hot = 0;
    (void)hot; /* no TD_HOT: always 0 */
    for (int64_t off = 0; off < n; off += BLOCK) {
        int64_t m = n - off < BLOCK ? n - off : BLOCK;
        int64_t mv = wide ? m & ~(int64_t)15 : 0; /* the AVX-512 path takes whole vectors, block_fast the rest */
#if TD_AVX512
        if (mv && (no_hist    ? block_avx512(a, ka, b, kb, off, mv, start, P, I, D, 2)
                   : P->below ? block_avx512(a, ka, b, kb, off, mv, start, P, I, D, 3)
                   : hot      ? block_avx512(a, ka, b, kb, off, mv, start, P, I, D, 1)
                           : block_avx512(a, ka, b, kb, off, mv, start, P, I, D, 0)))
            block_slow(a, ka, b, kb, off, mv, start, P, I, D);
#endif
        if (m > mv && block_fast(a, ka, b, kb, off + mv, m - mv, start, P, I, D))
            block_slow(a, ka, b, kb, off + mv, m - mv, start, P, I, D);
        if (TD_HOT && wide && off == 0 && P->nsub == NSUB && !P->below) /* a large call: worth choosing (a small one is not) */
            hot = choose_hot(P, m);
    }
}

/* 1: no ULP histogram in the AVX-512 blocks (benchmark only); returns whether that path runs */
int td_set_no_hist(int on) {
    no_hist = on != 0;
    return TD_AVX512 && !generic_only && no_hist;
}

/* 1: the generic path only; returns which path runs now (1 AVX-512, 0 generic) */
int td_set_generic(int on) {
    generic_only = on != 0;
    return TD_AVX512 && !generic_only;
}

/* the bins of n ULP distances u >= 0 (tests check the bin formula for every key through this) */
void td_ulp_bins(const float *u, int64_t n, uint16_t *out) {
    for (int64_t i = 0; i < n; i++) out[i] = bin_of(u[i]);
}

/* the same through the vector path (bins16); returns 0 where there is none (no AVX-512) */
int td_ulp_bins_vec(const float *u, int64_t n, uint16_t *out) {
#if TD_AVX512
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(out + i), _mm512_cvtepi32_epi16(bins16(_mm512_loadu_ps(u + i))));
    for (; i < n; i++) out[i] = bin_of(u[i]);
    for (i = 0; i < n; i++) /* as td_float_update folds it */
        if (inf_bin(out[i])) out[i] = NBINS - 1;
    return 1;
#else
    (void)u, (void)n, (void)out;
    return 0;
#endif
}

/* The least u >= 0 (a float, +Inf included) whose bin is at least `cut` (1 <= cut < NBINS): bin_of
   is non-decreasing in u, and so in u's bits, so a bisection over the bits finds it (u = Inf is
   the last bin's). */
static float cut_bin_u(int32_t cut) {
    uint32_t lo = 0, hi = 0x7f800000u; /* bin_of(f_of(hi)) = NBINS - 1 >= cut */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (bin_of(f_of(mid)) >= cut) hi = mid;
        else lo = mid + 1;
    }
    return f_of(lo);
}

/* hist: the caller's NBINS int64 bin counts (tensordiff/metrics.py); or, in cut mode (below set),
   below[k] += the count of finite pairs whose bin is below cuts[k] (hist unused) */
static int update(const void *a, int ka, const void *b, int kb, int64_t n, int64_t start, float atol, float rtol,
                  float floor_, float scale, int64_t *hist, int64_t nbins, double *rows, int64_t row, int64_t r0,
                  int64_t *I, double *D, const int32_t *cuts, int64_t ncuts, int64_t *below) {
    if (nbins != NBINS) return -2; /* tensordiff/metrics.py bins the same way */
    if (below && (ncuts < 1 || ncuts > MAXCUTS)) return -5;
    for (int64_t k = 0; below && k < ncuts; k++)
        if (cuts[k] < 1 || cuts[k] >= NBINS) return -5;
    if (ka < 0 || ka > 1 || kb < 0 || kb > 1) return -1;
    if (n > 0x7fffffffLL) return -3; /* 32-bit counts per call */
    uint32_t sub[NSUB * HSTRIDE];
    /* a few thousand elements (a small tensor): one sub-histogram; clearing and folding NSUB of
       them would cost more than the counting they speed up */
    int32_t nsub = n >= 16 * NBINS ? NSUB : 1;
    memset(sub, 0, sizeof(uint32_t) * HSTRIDE * nsub);
    params P = {atol, rtol, floor_, scale, (int32_t)(u_of(floor_) >> 23), (int32_t)(u_of(scale) >> 23) - 127,
                sub, nsub, rows, row, r0, {0}, {0}, 0, {0}, below, below ? (int32_t)ncuts : 0};
    for (int32_t k = 0; k < P.ncuts; k++) P.cut_u[k] = cut_bin_u(cuts[k]);
    I[0] += n;
    /* constant kinds: each call below is its own specialised, vectorised loop */
    if (ka == 0 && kb == 0) run(a, 0, b, 0, n, start, &P, I, D);
    else if (ka == 0 && kb == 1) run(a, 0, b, 1, n, start, &P, I, D);
    else if (ka == 1 && kb == 0) run(a, 1, b, 0, n, start, &P, I, D);
    else run(a, 1, b, 1, n, start, &P, I, D);
    for (int j = 1; j < nsub; j++) /* bins16 counts u = Inf in INF_BIN, bin_of in NBINS - 1 */
        for (int k = 0; k < NBINS; k++) sub[k] += sub[j * HSTRIDE + k];
#if TD_AVX512
    for (int k = INF_BIN; k < INF_BIN + 16; k++) sub[NBINS - 1] += sub[k], sub[k] = 0;
#endif
    if (below) { /* what the scalar paths counted (tails, NaN/Inf blocks, the generic path), by cut */
        for (int64_t k = 0; k < ncuts; k++)
            for (int j = 0; j < cuts[k]; j++) below[k] += sub[j];
        return 0;
    }
    for (int k = 0; k < NBINS; k++) hist[k] += sub[k];
    return 0;
}

int td_float_update(const void *a, int ka, const void *b, int kb, int64_t n, int64_t start, float atol, float rtol,
                    float floor_, float scale, int64_t *hist, int64_t nbins, double *rows, int64_t row, int64_t r0,
                    int64_t *I, double *D) {
    return update(a, ka, b, kb, n, start, atol, rtol, floor_, scale, hist, nbins, rows, row, r0, I, D, NULL, 0, NULL);
}

/* Every statistic as td_float_update, but in place of the histogram, below[k] += the number of
   finite pairs whose bin is below cuts[k] (1 <= cuts[k] < NBINS, at most MAXCUTS of them): two
   vector ops a cut instead of a bin's scalar increment an element. A large tensor's percentiles,
   once its first chunk's histogram has located them (tensordiff/metrics.py, `CUT_MIN`). */
int td_float_update_cuts(const void *a, int ka, const void *b, int kb, int64_t n, int64_t start, float atol,
                         float rtol, float floor_, float scale, int64_t nbins, double *rows, int64_t row, int64_t r0,
                         int64_t *I, double *D, const int32_t *cuts, int64_t ncuts, int64_t *below) {
    if (!cuts || !below) return -5;
    return update(a, ka, b, kb, n, start, atol, rtol, floor_, scale, NULL, nbins, rows, row, r0, I, D, cuts, ncuts,
                  below);
}

/* Many small tensors in one call (a comparison of thousands of them pays the call, its argument
 * conversion and the accumulator's setup once, not per tensor). Tensor k is described by
 * desc[6k ..]: the address of its A and B elements (raw storage), their kinds (A | B << 1, as in
 * td_float_update), its element count, its row count and row length (row maxima kept per leading
 * row, into rows[] one tensor after another; 0 rows: none); par[4k ..] are its atol, rtol, floor
 * and scale. It runs through td_float_update on its own counters and accumulators out[26k ..]
 * (I at 0, D at 10: tensordiff/metrics.py's one-buffer layout, initialised by the caller), then:
 * at 22 and 23 (as doubles) the values of A and B at its worst element (the first one-sided
 * NaN/Inf, else the first max |a-b|; widened exactly, as StoredTensor.value_at reads them; 0 when
 * none); at 24.. the bin of each of the nq (<= 2) percentiles qs[] from its histogram
 * (FloatMetrics._percentile_bins: the first bin whose cumulative count reaches ceil(q * total)),
 * or -1 where that percentile is 0 (no finite pair, or every one in bin 0). Returns 0, or the first
 * failing tensor's td_float_update code. */
#define BATCH_OUT 26
int td_float_batch(int64_t count, const int64_t *desc, const double *par, double *rows, int64_t *out,
                   const double *qs, int64_t nq) {
    int64_t hist[NBINS];
    if (nq > 2) return -4;
    double *r = rows;
    for (int64_t k = 0; k < count; k++) {
        const int64_t *t = desc + 6 * k;
        const void *a = (const void *)(intptr_t)t[0], *b = (const void *)(intptr_t)t[1];
        int ka = (int)(t[2] & 1), kb = (int)(t[2] >> 1);
        int64_t *I = out + BATCH_OUT * k;
        double *D = (double *)(I + 10);
        const double *p = par + 4 * k;
        memset(hist, 0, sizeof hist);
        int rc = update(a, ka, b, kb, t[3], 0, (float)p[0], (float)p[1], (float)p[2], (float)p[3], hist, NBINS,
                        t[4] ? r : NULL, t[5], 0, I, D, NULL, 0, NULL);
        if (rc) return rc;
        r += t[4];
        int64_t worst = I[6] ? I[9] : I[8];
        double *vals = (double *)(I + 22);
        vals[0] = worst >= 0 ? (double)load(a, ka, worst) : 0.0;
        vals[1] = worst >= 0 ? (double)load(b, kb, worst) : 0.0;
        int64_t total = 0;
        for (int i = 0; i < NBINS; i++) total += hist[i];
        for (int64_t j = 0; j < nq; j++) {
            int64_t *pct = I + 24 + j;
            if (total == 0) {
                *pct = -1;
                continue;
            }
            double target = ceil(qs[j] * (double)total);
            int64_t c = 0, bin = NBINS - 1;
            for (int i = 0; i < NBINS; i++) {
                c += hist[i];
                if ((double)c >= target) {
                    bin = i;
                    break;
                }
            }
            *pct = (bin == 0 && hist[0] == total) ? -1 : bin;
        }
    }
    return 0;
}
