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

typedef struct {
    float atol, rtol, floor, scale;
    int32_t fexp, sexp; /* biased exponent of `floor`; unbiased exponent of `scale` (both powers of two) */
    uint32_t *hist; /* nsub * HSTRIDE counts of this call */
    int32_t nsub;   /* NSUB, or 1 for a small call (less to clear and fold than to count) */
    double *rows; /* row maxima for rows r0.., or NULL */
    int64_t row, r0;
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

/* Returns 0, or 1 when the block holds a NaN/Inf or a float sum overflowed, in which case nothing
   was recorded and the caller runs block_slow on the block instead. */
static inline __attribute__((always_inline)) int64_t
block_fast(const void *a, int ka, const void *b, int kb, int64_t off, int64_t n, int64_t start,
           const params *P, int64_t *I, double *D) {
    float d[BLOCK];
    uint16_t key[BLOCK];
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
       sums detect it without a test per element; a finite |x| > ~1.8e19 overflows the float sum
       too, and the slow path, which sums in double as numpy does, then takes the block. */
    bad = !isfinite(s_aa + s_bb);
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
    if (mx > D[0] || I[8] < 0) {
        for (int64_t i = 0; i < n; i++)
            if (d[i] == mx) {
                D[0] = mx;
                I[8] = start + off + i;
                break;
            }
    }
    uint32_t *h = P->hist;
    int64_t i = 0;
    for (; P->nsub == NSUB && i + NSUB <= n; i += NSUB) {
        h[key[i]]++;
        h[HSTRIDE + key[i + 1]]++;
        h[2 * HSTRIDE + key[i + 2]]++;
        h[3 * HSTRIDE + key[i + 3]]++;
    }
    for (; i < n; i++) h[key[i]]++;
    if (P->rows) {
        int64_t g = start + off;
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
    return 0;
}

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

static inline __attribute__((always_inline)) void
run(const void *a, int ka, const void *b, int kb, int64_t n, int64_t start, const params *P, int64_t *I,
    double *D) {
    for (int64_t off = 0; off < n; off += BLOCK) {
        int64_t m = n - off < BLOCK ? n - off : BLOCK;
        if (block_fast(a, ka, b, kb, off, m, start, P, I, D))
            block_slow(a, ka, b, kb, off, m, start, P, I, D);
    }
}

/* the bins of n ULP distances u >= 0 (tests check the bin formula for every key through this) */
void td_ulp_bins(const float *u, int64_t n, uint16_t *out) {
    for (int64_t i = 0; i < n; i++) out[i] = bin_of(u[i]);
}

/* hist: the caller's NBINS int64 bin counts (tensordiff/metrics.py) */
int td_float_update(const void *a, int ka, const void *b, int kb, int64_t n, int64_t start, float atol, float rtol,
                    float floor_, float scale, int64_t *hist, int64_t nbins, double *rows, int64_t row, int64_t r0,
                    int64_t *I, double *D) {
    if (nbins != NBINS) return -2; /* tensordiff/metrics.py bins the same way */
    if (ka < 0 || ka > 1 || kb < 0 || kb > 1) return -1;
    if (n > 0x7fffffffLL) return -3; /* 32-bit counts per call */
    uint32_t sub[NSUB * HSTRIDE];
    /* a few thousand elements (a small tensor): one sub-histogram; clearing and folding NSUB of
       them would cost more than the counting they speed up */
    int32_t nsub = n >= 16 * NBINS ? NSUB : 1;
    memset(sub, 0, sizeof(uint32_t) * HSTRIDE * nsub);
    params P = {atol, rtol, floor_, scale, (int32_t)(u_of(floor_) >> 23), (int32_t)(u_of(scale) >> 23) - 127,
                sub, nsub, rows, row, r0};
    I[0] += n;
    /* constant kinds: each call below is its own specialised, vectorised loop */
    if (ka == 0 && kb == 0) run(a, 0, b, 0, n, start, &P, I, D);
    else if (ka == 0 && kb == 1) run(a, 0, b, 1, n, start, &P, I, D);
    else if (ka == 1 && kb == 0) run(a, 1, b, 0, n, start, &P, I, D);
    else run(a, 1, b, 1, n, start, &P, I, D);
    if (nsub == NSUB)
        for (int k = 0; k < NBINS; k++)
            hist[k] += (int64_t)sub[k] + sub[HSTRIDE + k] + sub[2 * HSTRIDE + k] + sub[3 * HSTRIDE + k];
    else
        for (int k = 0; k < NBINS; k++) hist[k] += sub[k];
    return 0;
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
        int rc = td_float_update(a, ka, b, kb, t[3], 0, (float)p[0], (float)p[1], (float)p[2], (float)p[3], hist,
                                 NBINS, t[4] ? r : NULL, t[5], 0, I, D);
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
