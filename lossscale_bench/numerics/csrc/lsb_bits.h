/* The bit casts and the rounding of one element that every C loop of the package shares (numerics/native.py
   builds the loops into one library). */
#ifndef LSB_BITS_H
#define LSB_BITS_H

#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* |x| (bits a) rounded to a float with mbits significand bits and exponents [emin, emax] (lo, hi: their biased
   exponent fields; k = 2^(23 - mbits)), to nearest even, as fp32 bits without the sign; past maxv: over_bits;
   NaN: nan_bits. fp8.py's "exact fp32 split", one element. */
static inline uint32_t round_bits(uint32_t a, uint32_t lo, uint32_t hi, float k, float maxv, uint32_t over_bits,
                                  uint32_t nan_bits) {
    uint32_t e = a & 0x7f800000u;
    e = e < lo ? lo : e;
    e = e > hi ? hi : e;
    float m = u2f(e) * k;
    float r = (u2f(a) + m) - m;
    uint32_t b = r > maxv ? over_bits : f2u(r);
    return a > 0x7f800000u ? nan_bits : b;
}

#endif
