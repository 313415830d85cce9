/* The arithmetic of the block-scaled round trips (block_round.c), one block's scale and one element at a time:
   op for op the torch kernels of block_scaling.py and fp4.py, in fp32. */
#ifndef LSB_BLOCK_ELEM_H
#define LSB_BLOCK_ELEM_H

#include "lsb_bits.h"

/* Chris Wellons' lowbias32 (fp4.py's _mix) */
static inline uint32_t mix32(uint32_t h) {
    h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
    return h;
}

/* fp4.py's _e2m1_stochastic for the element of flat index i: q is E2M1's spacing around |v| (its
   exponent clamped to [0, 2], times 2^(1 - 23)), so |v| / q, its floor and the fraction are exact. q is 0.5, 1
   or 2, so |v| / q is computed as |v| times 1/q (exact, from the exponent's bits): the same correctly rounded
   value as the division, without a divide per element. */
static inline float e2m1_stochastic(float v, uint32_t i, uint32_t khi, uint32_t klo) {
    uint32_t h = mix32((i ^ khi) + klo);
    float u = (float)(int32_t)(h >> 8) * 0x1p-24f;  /* < 2^24: a signed conversion, which vectorises */
    float a = u2f(f2u(v) & 0x7fffffffu);
    uint32_t e = f2u(a) & 0x7f800000u;
    e = e < (127u << 23) ? (127u << 23) : e;
    e = e > (129u << 23) ? (129u << 23) : e;
    float q = (u2f(e) * 0x1p22f) * 0x1p-23f;
    float t = a * u2f((255u << 23) - e);  /* a / q: 1/q = 2 / 2^(e's exponent) */
    float f = floorf(t);
    float r = (f + (float)((t - f) > u)) * q;
    r = r > 6.0f ? 6.0f : r;
    return copysignf(r, v);
}

/* 2^e for e in [-127, 127], exactly (2^-127 is an fp32 subnormal): block_scales.exp2i */
static inline float exp2i(int32_t e) { return e == -127 ? 0x1p-127f : u2f((uint32_t)(e + 127) << 23); }

/* block_scales.mx_exponent: mode 0 floor, 1 ceil, 2 even, 3 rceil; from amax's fp32 bits */
static inline int32_t mx_exp(float amax, int32_t mode, int32_t mbits, int32_t emax, float maxv) {
    int32_t e;
    if (mode == 3) {
        uint32_t d = f2u(amax / maxv);
        uint32_t field = (d >> 23) & 0xffu, mant = d & 0x7fffffu;
        int32_t up = field == 0 ? mant > 0x400000u : mant != 0;
        e = (int32_t)field - 127 + up;
    } else {
        int32_t bits = (int32_t)f2u(amax);
        if (mode == 2) bits = (bits > 0x7f800000 ? 0x7f800000 : bits) + (1 << (22 - mbits));
        e = ((bits >> 23) & 0xff) - 127 - emax;
        if (mode == 1) e += (bits & 0x7fffff) != 0;
    }
    return e < -127 ? -127 : (e > 127 ? 127 : e);
}

/* The scale of one block (kinds 1 and 2) whose largest |x| has the bit pattern mb: enc takes its elements into the
   element format's range, dec brings them back; ok: the block (kind 2: the tensor) is finite, else every output
   is NaN; sat: whether its elements past maxv count as saturated (kind 2: not where the E4M3 scale underflowed). */
typedef struct { float enc, dec; int32_t ok, sat; } bscale;

static inline __attribute__((always_inline)) bscale block_scale(uint32_t mb, const int kind, int32_t mode,
                                                              int32_t mbits, int32_t emax, float maxv, float s_enc,
                                                              int tensor_ok) {
    const float fmax = 0x1.fffffep127f;
    bscale b = {1.0f, 1.0f, 1, 1};
    const float amax = u2f(mb);
    if (kind == 1) {
        int32_t e = mx_exp(amax, mode, mbits, emax, maxv);
        b.ok = b.sat = (int32_t)(mb < 0x7f800000u);
        b.enc = exp2i(-e);
        b.dec = exp2i(e);
    } else if (kind == 2) {
        float d = (amax / 6.0f) * s_enc;
        d = d > fmax ? fmax : d;
        b.dec = u2f(round_bits(f2u(d) & 0x7fffffffu, 121u << 23, 135u << 23, (float)(1u << 20), 448.0f,
                               0x43e00000u, 0x7fffffffu));  /* E4M3, saturating */
        b.enc = s_enc / b.dec;
        b.enc = b.enc > fmax ? fmax : b.enc;
        b.ok = tensor_ok;
        b.sat = tensor_ok & (int32_t)(b.dec > 0.0f);  /* no &&: branch-free, so the loops over blocks vectorise */
    }
    return b;
}

/* block_scale of nb blocks, whose maxima are mb, into arrays: one loop over the blocks, which vectorises. */
static inline __attribute__((always_inline)) void block_scales(
        const uint32_t *restrict mb, int64_t nb, const int kind, int32_t mode, int32_t mbits, int32_t emax, float maxv,
        float s_enc, int tensor_ok, float *restrict enc, float *restrict dec, int32_t *restrict ok,
        int32_t *restrict sat) {
    for (int64_t g = 0; g < nb; g++) {
        bscale bs = block_scale(mb[g], kind, mode, mbits, emax, maxv, s_enc, tensor_ok);
        enc[g] = bs.enc; dec[g] = bs.dec; ok[g] = bs.ok; sat[g] = bs.sat;
    }
}

/* One element of a block round trip: v scaled by enc (kinds 1, 2), rounded (round_bits, or stochastic E2M1 with
   the element's flat logical index i), brought back by dec (and the tensor scale s_enc, kind 2); NaN where the
   block is not ok. */
static inline __attribute__((always_inline)) float block_elem(
        float v, float enc, float dec, int32_t ok, const int kind, const int stochastic, uint32_t i, uint32_t khi,
        uint32_t klo, uint32_t lo, uint32_t hi, float k, float maxv, uint32_t max_bits, uint32_t nan_bits,
        float s_enc) {
    const float fmax = 0x1.fffffep127f;
    float s = kind == 0 ? v : v * enc;
    float r;
    if (stochastic) {
        r = e2m1_stochastic(s, i, khi, klo);
    } else {
        uint32_t u = f2u(s);
        r = u2f(round_bits(u & 0x7fffffffu, lo, hi, k, maxv, max_bits, nan_bits) | (u & 0x80000000u));
    }
    float o;
    if (kind == 1) {
        o = r * dec;
        o = o > fmax ? fmax : (o < -fmax ? -fmax : o);
    } else if (kind == 2) {
        o = (r * dec) / s_enc;
    } else {
        o = r;
    }
    if (kind != 0) o = ok ? o : NAN;  /* a block (kind 2: tensor) holding NaN or inf: all NaN */
    return o;
}

#endif
