/* Reductions over a tensor in any order: the largest magnitude (amax.py) and the telemetry's census
   (census.py). */
#include "lsb_bits.h"

/* max |x[i]| as fp32 bits: the max of the bit patterns without the sign (the same order as the values for
   non-negative floats; a NaN's bits are above inf's, so any NaN gives a NaN): an integer reduction. */
uint32_t lsb_max_abs_bits(const float *restrict x, int64_t n) {
    uint32_t mb = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = f2u(x[i]) & 0x7fffffffu;
        mb = a > mb ? a : mb;
    }
    return mb;
}

/* out = [non-zero, non-zero below min_normal, non-zero at or below flush, non-zero not at or below maxv]:
   census.py's expression, with C's comparisons (false for NaN, except !=), so NaN counts as past maxv. */
void lsb_census(const float *restrict x, int64_t n, float min_normal, float flush, float maxv, int64_t *out) {
    int64_t nz = 0, sub = 0, fl = 0, sat = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = u2f(f2u(x[i]) & 0x7fffffffu);
        int64_t z = a != 0.0f;
        nz += z;
        sub += z & (a < min_normal);
        fl += z & (a <= flush);
        sat += z & !(a <= maxv);
    }
    out[0] = nz; out[1] = sub; out[2] = fl; out[3] = sat;
}
