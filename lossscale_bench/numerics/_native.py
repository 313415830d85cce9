"""The fp8 round trip, the block-scaled round trips (MX32, E2M1, MXFP4, NVFP4), the telemetry's census and the 16x16
Hadamard transform's sums (``hadamard.py``) as small C functions, built once with the system's C compiler and
called through ctypes: the CPU emulation's cheapest path for the calls a training step makes.

Why, measured (issue 28, docs/benchmarks.md "What is left of an element row's cost"): a step of the
default study's E4M3 rows makes ~33 rounding calls, and the Inductor kernel they used cost ~195 us
a call before it touched an element: ~95 us in Dynamo's frame evaluation, AOTAutograd's runtime
wrapper and Inductor's Python ``call``, the rest in this package's flattening and dispatch. Its
loop also ran ~1.8 ns per element, 40 % of it in the bit casts, which Inductor emits as a store, a
scalar loop and a load. A C loop over the same arithmetic has none of that: ``memcpy`` bit casts
vectorise, and a ctypes call costs a few microseconds (and releases the GIL, as autograd's worker
thread wants).

The block round trips (``lsb_block_round``, issues 28 and 32) add what the torch kernels spent most on:
a channels_last gradient was copied into the blocks' logical order and back around each call. The C loop
reads it as it lies where every block stays inside one (image, channel) plane (H*W a multiple of the block:
every large activation gradient of the SSD models): a block is then one float in each of `block` rows of C
floats, so all C channels' blocks are reduced, scaled and rounded together along the unit stride (~1.5x
cheaper than the transposes, seventh session). Elsewhere (weight gradients' 3x3 planes, odd map sizes) it
transposes each image into logical order in 16x16 tiles in a per-thread buffer (one image at a time where no
block straddles two), and pads a ragged last block inside. Measured in docs/benchmarks.md.

Why it is safe to prefer it: the function is the same arithmetic as ``fp8._bits_fused`` (the
"exact fp32 split" in fp8's module doc), with integer compares for the NaN test and no
floating-point contraction or fast-math (``-ffp-contract=off``: a compiler may otherwise fuse the
multiply that builds the magic number into the addition; it would be exact here, but nothing is
left to chance); the block loops are the same arithmetic as the torch kernels of ``block_scaling`` and
``fp4``, op for op in fp32, checked the same way per configuration (``block_scaling.NativeBlock``).
``-fno-trapping-math`` only lets the compiler compute both sides of a select
(floating-point exception flags, which nothing here reads, are the only thing it may change): without
it gcc keeps the stochastic rounding's ``floorf`` and conversions behind branches and does not
vectorise that loop (``-fopt-info-vec``: "control flow in loop"). ``fp8`` runs each (format, saturate) variant on the probe values and uses it only
when it matches the eager kernel bit for bit, exactly as ``LazyCompiled`` does for Inductor's.

Why a cache keyed by the CPU: ``-march=native`` code can use instructions another machine lacks,
and a home directory may be shared by a cluster's nodes. The library's name hashes the source,
the flags, the compiler's version and the CPU's feature flags, and is written to a temporary file
and renamed into place, so trials starting together on one machine never load half a file.

When it is not used (callers fall back to the Inductor kernel, then to eager, same values):
``LSBENCH_NO_COMPILE=1`` (every compiled kernel off), ``LSBENCH_NO_NATIVE=1`` (this one only; a
benchmark compares the two that way), no C compiler, a compiler or loader error (a warning, once),
a tensor that is not on the CPU, not fp32 or not dense in memory, and a large tensor when torch
uses several threads (Inductor's kernel is parallel; this loop is not).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

from .lazy_compile import compile_disabled

#: set to 1 to use the Inductor kernel instead of the C one (same values)
NO_NATIVE_ENV = "LSBENCH_NO_NATIVE"
#: where the built library is kept (default: $XDG_CACHE_HOME or ~/.cache, then lossscale_bench/native)
CACHE_ENV = "LSBENCH_NATIVE_CACHE"

def _hadamard_chain() -> str:
    """``lsb_hadamard16``'s sums for one 16 x 16 chunk, written out with W's signs as + and -: the loops the
    compiler unrolled itself kept the sums in branches and memory, at the torch product's speed."""
    lines = ["lsb_v16 q, A0, A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13, A14, A15;",
             "q = b[0] * *(const lsb_v16 *)x + 0.0f;"]  # +0 + q: W's first column is all +
    lines += [f"A{i} = q;" for i in range(16)]
    for j in range(1, 16):
        lines.append(f"q = b[{j}] * *(const lsb_v16 *)(x + {j} * xs);")
        lines += [f"A{i} = A{i} {'-' if bin(i & j).count('1') % 2 else '+'} q;" for i in range(16)]
    lines += [f"*(lsb_v16 *)(o + {i} * os) = a[{i}] * A{i} + 0.0f;" for i in range(16)]
    return "\n".join(" " * 4 + line for line in lines)


_HADAMARD_CHAIN = _hadamard_chain()

_SOURCE = r"""
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

/* y[i] = x[i] rounded (round_bits), the input's sign copied last. */
void lsb_round_fp8(const float *restrict x, float *restrict y, int64_t n, int32_t mbits, int32_t emin,
                   int32_t emax, float maxv, uint32_t over_bits, uint32_t nan_bits) {
    const uint32_t lo = (uint32_t)(emin + 127) << 23, hi = (uint32_t)(emax + 127) << 23;
    const float k = (float)(1u << (23 - mbits));
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = f2u(x[i]);
        y[i] = u2f(round_bits(u & 0x7fffffffu, lo, hi, k, maxv, over_bits, nan_bits) | (u & 0x80000000u));
    }
}

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

/* 2^e for e in [-127, 127], exactly (2^-127 is an fp32 subnormal): block_scaling._exp2i */
static inline float exp2i(int32_t e) { return e == -127 ? 0x1p-127f : u2f((uint32_t)(e + 127) << 23); }

/* block_scaling.mx_exponent: mode 0 floor, 1 ceil, 2 even, 3 rceil; from amax's fp32 bits */
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

/* The counts of one element (input v, output o): finite non-zero input, of those one that came out 0, past maxv
   in the scaled domain (kind 0: inf too; kinds 1 and 2: where the block's sat says so). */
#define COUNT_ELEM(V, O, ENC, SAT) do { \
        const float v_ = (V); \
        const float a_ = u2f(f2u(v_) & 0x7fffffffu); \
        const int32_t z_ = (a_ != 0.0f) & (a_ <= 0x1.fffffep127f); \
        bnz += z_; \
        bfl += z_ & ((O) == 0.0f); \
        const float sa_ = kind == 0 ? a_ : u2f(f2u(v_ * (ENC)) & 0x7fffffffu); \
        bsat += kind == 0 ? ((sa_ > maxv) & (v_ == v_)) : ((sa_ > maxv) & (SAT)); \
    } while (0)

/* One pass of lsb_block_round (below) over n elements in whole blocks (kind 0: any n), the first of which
   has the flat index i0; kind, stochastic, counting and (16 or 32) block fixed: always inlined with constant
   arguments, so each combination gets its own branch-free, vectorisable loops. Adds its counts to acc.
   Kinds 1 and 2 take up to 64 blocks at a time, each step one loop over them (their maxima; their scales,
   vectorised across blocks; their elements), rather than a block's scalar scale between short loops. */
static inline __attribute__((always_inline)) void block_pass(
        const float *restrict x, float *restrict y, int64_t n, const int64_t block, const int kind, int32_t mode,
        int32_t mbits, int32_t emin, int32_t emax, float maxv, uint32_t max_bits, uint32_t nan_bits,
        const int stochastic, uint32_t khi, uint32_t klo, uint32_t i0, float s_enc, int tensor_ok,
        const int counting, int64_t *restrict acc) {
    const uint32_t lo = (uint32_t)(emin + 127) << 23, hi = (uint32_t)(emax + 127) << 23;
    const float k = (float)(1u << (23 - mbits));
    if (kind == 0) {  /* no scale: chunks only for the counters; NaN stays per element */
        for (int64_t b0 = 0; b0 < n; b0 += 4096) {
            const float *restrict xb = x + b0;
            float *restrict yb = y + b0;
            const int32_t len = (int32_t)(n - b0 < 4096 ? n - b0 : 4096);
            for (int32_t j = 0; j < len; j++)
                yb[j] = block_elem(xb[j], 1.0f, 1.0f, 1, kind, stochastic, i0 + (uint32_t)b0 + (uint32_t)j, khi, klo,
                                   lo, hi, k, maxv, max_bits, nan_bits, s_enc);
            if (counting) {  /* in a loop of their own: one loop doing both does not vectorise */
                int32_t bnz = 0, bfl = 0, bsat = 0;
                for (int32_t j = 0; j < len; j++) COUNT_ELEM(xb[j], yb[j], 1.0f, 1);
                acc[0] += bnz; acc[1] += bfl; acc[2] += bsat;
            }
        }
        return;
    }
    uint32_t mb[64];
    float enc[64], dec[64];
    int32_t ok[64], sat[64];
    for (int64_t g0 = 0; g0 < n; g0 += 64 * block) {
        const float *restrict xg = x + g0;
        float *restrict yg = y + g0;
        const int64_t nb = (n - g0) / block < 64 ? (n - g0) / block : 64;
        for (int64_t g = 0; g < nb; g++) {
            /* the max of |x| as the max of its bit patterns (the same order for non-negative floats, NaN's
               above inf's): an integer reduction, which vectorises */
            uint32_t m = 0;
            for (int64_t j = 0; j < block; j++) {
                uint32_t a = f2u(xg[g * block + j]) & 0x7fffffffu;
                m = a > m ? a : m;
            }
            mb[g] = m;
        }
        block_scales(mb, nb, kind, mode, mbits, emax, maxv, s_enc, tensor_ok, enc, dec, ok, sat);
        for (int64_t g = 0; g < nb; g++)
            for (int64_t j = 0; j < block; j++)
                yg[g * block + j] = block_elem(xg[g * block + j], enc[g], dec[g], ok[g], kind, stochastic,
                                               i0 + (uint32_t)(g0 + g * block + j), khi, klo, lo, hi, k, maxv,
                                               max_bits, nan_bits, s_enc);
        if (counting) {
            int32_t bnz = 0, bfl = 0, bsat = 0;
            for (int64_t g = 0; g < nb; g++)
                for (int64_t j = 0; j < block; j++) COUNT_ELEM(xg[g * block + j], yg[g * block + j], enc[g], sat[g]);
            acc[0] += bnz; acc[1] += bfl; acc[2] += bsat;
        }
    }
}

/* The channels_last pass of lsb_block_round (kinds 1 and 2) where no block leaves its (image, channel) plane:
   H*W a multiple of block. The block of logical elements (n, c, p0 .. p0 + block - 1), p = h*W + w, is one
   float in each of `block` memory rows of C floats, so the blocks of all C channels are reduced, scaled and
   rounded together, row by row along the unit stride: no transposes. Scratch: 5 arrays of C. Same arithmetic,
   element for element, as block_pass on the logical order (the stochastic index is the logical one). */
static inline __attribute__((always_inline)) void column_pass(
        const float *restrict x, float *restrict y, int64_t N, int64_t C, int64_t HW, int64_t block,
        const int kind, int32_t mode, int32_t mbits, int32_t emin, int32_t emax, float maxv, uint32_t max_bits,
        uint32_t nan_bits, const int stochastic, uint32_t khi, uint32_t klo, float s_enc, int tensor_ok,
        const int counting, int64_t *restrict acc, uint32_t *restrict mb, float *restrict enc,
        float *restrict dec, int32_t *restrict ok, int32_t *restrict sat) {
    const uint32_t lo = (uint32_t)(emin + 127) << 23, hi = (uint32_t)(emax + 127) << 23;
    const float k = (float)(1u << (23 - mbits));
    for (int64_t n = 0; n < N; n++) {
        for (int64_t p0 = 0; p0 < HW; p0 += block) {
            const float *restrict xr = x + (n * HW + p0) * C;
            float *restrict yr = y + (n * HW + p0) * C;
            for (int64_t c = 0; c < C; c++) mb[c] = 0;
            for (int64_t j = 0; j < block; j++)
                for (int64_t c = 0; c < C; c++) {
                    uint32_t a = f2u(xr[j * C + c]) & 0x7fffffffu;
                    mb[c] = a > mb[c] ? a : mb[c];
                }
            block_scales(mb, C, kind, mode, mbits, emax, maxv, s_enc, tensor_ok, enc, dec, ok, sat);
            const uint32_t base = (uint32_t)(n * C * HW + p0);
            for (int64_t j = 0; j < block; j++)
                for (int64_t c = 0; c < C; c++)
                    yr[j * C + c] = block_elem(xr[j * C + c], enc[c], dec[c], ok[c], kind, stochastic,
                                               base + (uint32_t)(c * HW) + (uint32_t)j, khi, klo, lo, hi, k, maxv,
                                               max_bits, nan_bits, s_enc);
            if (counting) {
                int32_t bnz = 0, bfl = 0, bsat = 0;
                for (int64_t j = 0; j < block; j++)
                    for (int64_t c = 0; c < C; c++) COUNT_ELEM(xr[j * C + c], yr[j * C + c], enc[c], sat[c]);
                acc[0] += bnz; acc[1] += bfl; acc[2] += bsat;
            }
        }
    }
}
#undef COUNT_ELEM

/* One tile of copy_tiles (below): in the tile's p range of in and c range of jn, read along the source's unit
   stride and write along the destination's; inlined with constant counts for full tiles, so those unroll. */
static inline __attribute__((always_inline)) void one_tile(const float *restrict src, float *restrict dst,
                                                         int64_t sc, int64_t sp, int64_t dc, int64_t dp,
                                                         int64_t c0, int64_t p0, int64_t in, int64_t jn) {
    float tile[16][16];
    if (sc == 1) {
        for (int64_t i = 0; i < in; i++)
            for (int64_t j = 0; j < jn; j++) tile[j][i] = src[(c0 + j) + (p0 + i) * sp];
    } else {
        for (int64_t j = 0; j < jn; j++)
            for (int64_t i = 0; i < in; i++) tile[j][i] = src[(c0 + j) * sc + (p0 + i) * sp];
    }
    if (dp == 1) {
        for (int64_t j = 0; j < jn; j++)
            for (int64_t i = 0; i < in; i++) dst[(c0 + j) * dc + (p0 + i)] = tile[j][i];
    } else {
        for (int64_t i = 0; i < in; i++)
            for (int64_t j = 0; j < jn; j++) dst[(c0 + j) * dc + (p0 + i) * dp] = tile[j][i];
    }
}

/* dst[c * dc + p * dp] = src[c * sc + p * sp] for c < C, p < HW, in 16x16 tiles (each tile reads 16 runs of 16
   floats and writes 16 runs of 16 floats): one image between channels_last (c stride 1, p stride C) and logical
   order (c stride HW, p stride 1). Always inlined with its strides' two patterns, so each is its own loop. */
static inline __attribute__((always_inline)) void copy_tiles(const float *restrict src, float *restrict dst,
                                                           int64_t C, int64_t HW, int64_t sc, int64_t sp,
                                                           int64_t dc, int64_t dp) {
    if (HW < 16) {  /* a plane smaller than a tile (a 3x3 weight gradient's): one pass, channels innermost */
        for (int64_t p = 0; p < HW; p++)
            for (int64_t c = 0; c < C; c++) dst[c * dc + p * dp] = src[c * sc + p * sp];
        return;
    }
    for (int64_t p0 = 0; p0 < HW; p0 += 16) {
        const int64_t pn = HW - p0 < 16 ? HW - p0 : 16;
        for (int64_t c0 = 0; c0 < C; c0 += 16) {
            const int64_t cn = C - c0 < 16 ? C - c0 : 16;
            if (pn == 16 && cn == 16) one_tile(src, dst, sc, sp, dc, dp, c0, p0, 16, 16);
            else one_tile(src, dst, sc, sp, dc, dp, c0, p0, pn, cn);
        }
    }
}

static void to_logical(const float *restrict src, float *restrict dst, int64_t C, int64_t HW) {
    copy_tiles(src, dst, C, HW, 1, C, HW, 1);
}

static void from_logical(const float *restrict src, float *restrict dst, int64_t C, int64_t HW) {
    copy_tiles(src, dst, C, HW, HW, 1, 1, C);
}

/* the per-thread buffer of the channels_last path, grown as needed and kept (a trial's largest gradient) */
static __thread float *buf = 0;
static __thread int64_t buf_cap = 0;

static int grow(int64_t n) {
    if (n <= buf_cap) return 1;
    float *b = (float *)realloc(buf, (size_t)n * sizeof(float));
    if (!b) return 0;
    buf = b;
    buf_cap = n;
    return 1;
}

/* Block-scaled round trips, element for element the torch kernels of block_scaling._mx_core (kind 1: a
   power-of-two scale per block, mx_exp's mode) and fp4._nvfp4_core (kind 2: an fp32 scale per tensor and an
   E4M3 one per block), or fp4._e2m1_core (kind 0: no scale, memory order). Elements: the saturating
   round_bits format, or stochastic E2M1 (fp4.py) with the 64-bit key. Blocks take consecutive elements of
   the tensor's logical (row-major) order, zero-padded at the end, as the torch kernels' flattening does:
   for a channels_last [n, c, h, w] tensor (cl, kinds 1 and 2) the loop gathers them from memory and
   scatters the results back, so no layout copy is made. x and y: numel elements, dense. counts (may be
   NULL): [finite non-zero inputs, of those the ones that came out 0, elements past maxv in the scaled
   domain of a finite block (kind 2: whose E4M3 scale did not underflow; kind 0: inf too)]. Returns 0, or 1
   when the channels_last path's buffer could not be had. */
int32_t lsb_block_round(const float *restrict x, float *restrict y, int64_t numel, int32_t cl, int64_t C, int64_t H,
                     int64_t W, int64_t block, int32_t kind, int32_t mode, int32_t mbits, int32_t emin,
                     int32_t emax, float maxv, uint32_t max_bits, uint32_t nan_bits, int32_t stochastic,
                     uint64_t key, int64_t *counts) {
    const uint32_t khi = (uint32_t)(key >> 32), klo = (uint32_t)key;
    float s_enc = 1.0f;
    int tensor_ok = 1;
    int64_t acc[3] = {0, 0, 0};
    if (kind == 2) {  /* the tensor scale, from the max over memory (order does not matter) */
        uint32_t mb = 0;
        for (int64_t i = 0; i < numel; i++) {
            uint32_t a = f2u(x[i]) & 0x7fffffffu;
            mb = a > mb ? a : mb;
        }
        tensor_ok = mb < 0x7f800000u;
        float amax = u2f(mb);
        if (amax != 0.0f) {
            s_enc = 2688.0f / amax;
            s_enc = s_enc > 0x1.fffffep127f ? 0x1.fffffep127f : s_enc;
        }
    }
#define PASS_B(X, Y, N, I0, K, S, Q, B) block_pass(X, Y, N, B, K, mode, mbits, emin, emax, maxv, max_bits, \
                                                   nan_bits, S, khi, klo, I0, s_enc, tensor_ok, Q, acc)
#define PASS(X, Y, N, I0, K, S, Q) do { if (K != 0 && block == 16) PASS_B(X, Y, N, I0, K, S, Q, 16); \
                                        else if (K != 0 && block == 32) PASS_B(X, Y, N, I0, K, S, Q, 32); \
                                        else PASS_B(X, Y, N, I0, K, S, Q, block); } while (0)
#define BY_COUNT(X, Y, N, I0, K, S) do { if (counts) PASS(X, Y, N, I0, K, S, 1); else PASS(X, Y, N, I0, K, S, 0); } while (0)
#define BY_ROUNDING(X, Y, N, I0, K) do { if (stochastic) BY_COUNT(X, Y, N, I0, K, 1); else BY_COUNT(X, Y, N, I0, K, 0); } while (0)
#define RUN(X, Y, N, I0) do { if (kind == 0) BY_ROUNDING(X, Y, N, I0, 0); else if (kind == 1) BY_ROUNDING(X, Y, N, I0, 1); \
                              else BY_ROUNDING(X, Y, N, I0, 2); } while (0)
    if (kind == 0) block = 1;
    const int64_t padded = (numel + block - 1) / block * block;
    if (!cl || kind == 0) {
        const int64_t whole = numel / block * block;
        RUN(x, y, whole, 0u);
        if (whole < numel) {  /* the ragged last block, zero-padded */
            float bx[256] = {0}, by[256];
            for (int64_t i = whole; i < numel; i++) bx[i - whole] = x[i];
            RUN(bx, by, block, (uint32_t)whole);
            for (int64_t i = whole; i < numel; i++) y[i] = by[i - whole];
        }
    } else if (cl >= 2) {
        /* NVFP4's weight tiles (block 256): the weight as its [O, K] matrix, K = C*H*W in logical order
           (cl 2: stored contiguous; cl 3: a channels_last [O, C, H, W], column c*HW + p at p*C + c), cut into
           16x16 tiles zero-padded at the edges, the tiles one after another in row-major tile order (fp4.py's
           _flatten with weight=True): gathered into the per-thread buffer, rounded there, scattered back. */
        const int64_t HW = H * W, K = C * HW, O = numel / K, TR = (O + 15) / 16, TC = (K + 15) / 16;
        const int64_t total = TR * TC * 256;
        if (!grow(2 * total)) return 1;
        float *t = buf, *u = buf + total;
        for (int64_t pass = 0; pass < 2; pass++) {
            if (pass == 1) RUN(t, u, total, 0u);
            for (int64_t tc = 0; tc < TC; tc++) {
                int64_t off[16];  /* the memory offset of each of the tile column's 16 columns within a row */
                const int64_t bn = K - tc * 16 < 16 ? K - tc * 16 : 16;
                for (int64_t b = 0; b < bn; b++) {
                    const int64_t col = tc * 16 + b;
                    off[b] = cl == 2 ? col : (col % HW) * C + col / HW;
                }
                for (int64_t tr = 0; tr < TR; tr++) {
                    float *restrict tt = (pass == 0 ? t : u) + (tr * TC + tc) * 256;
                    for (int64_t a = 0; a < 16; a++) {
                        const int64_t row = tr * 16 + a;
                        if (row >= O) {
                            if (pass == 0) for (int64_t b = 0; b < 16; b++) tt[a * 16 + b] = 0.0f;
                            continue;
                        }
                        if (pass == 0) {
                            for (int64_t b = 0; b < bn; b++) tt[a * 16 + b] = x[row * K + off[b]];
                            for (int64_t b = bn; b < 16; b++) tt[a * 16 + b] = 0.0f;
                        } else {
                            for (int64_t b = 0; b < bn; b++) y[row * K + off[b]] = tt[a * 16 + b];
                        }
                    }
                }
            }
        }
    } else if ((H * W) % block == 0) {  /* channels_last, every block inside one (image, channel) plane */
        const int64_t N = numel / (C * H * W);
        char *scratch = (char *)malloc((size_t)C * 20);
        if (!scratch) return 1;
        uint32_t *mb = (uint32_t *)scratch;
        float *enc = (float *)(scratch + 4 * C), *dec = (float *)(scratch + 8 * C);
        int32_t *okv = (int32_t *)(scratch + 12 * C), *satv = (int32_t *)(scratch + 16 * C);
#define COL_AT(K, S, Q, CC, BB) column_pass(x, y, N, CC, H * W, BB, K, mode, mbits, emin, emax, maxv, max_bits, \
                                           nan_bits, S, khi, klo, s_enc, tensor_ok, Q, acc, mb, enc, dec, okv, satv)
/* the model's usual channel counts and the two block sizes as constants: the loops over a row of C floats and
   over a block then unroll and vectorise without remainders (same arithmetic, element for element) */
#define COL(K, S, Q) do { if (block == 16 && C == 16) COL_AT(K, S, Q, 16, 16); \
                          else if (block == 16 && C == 32) COL_AT(K, S, Q, 32, 16); \
                          else if (block == 16 && C == 64) COL_AT(K, S, Q, 64, 16); \
                          else if (block == 32 && C == 16) COL_AT(K, S, Q, 16, 32); \
                          else if (block == 32 && C == 32) COL_AT(K, S, Q, 32, 32); \
                          else if (block == 32 && C == 64) COL_AT(K, S, Q, 64, 32); \
                          else COL_AT(K, S, Q, C, block); } while (0)
#define COL_BY_COUNT(K, S) do { if (counts) COL_AT(K, S, 1, C, block); else COL(K, S, 0); } while (0)
#define COL_BY_ROUNDING(K) do { if (stochastic) COL_BY_COUNT(K, 1); else COL_BY_COUNT(K, 0); } while (0)
        if (kind == 1) COL_BY_ROUNDING(1); else COL_BY_ROUNDING(2);
#undef COL_BY_ROUNDING
#undef COL_BY_COUNT
#undef COL
#undef COL_AT
        free(scratch);
    } else {
        /* channels_last [N, C, H, W]: logical index ((n*C + c)*H*W + p) sits at (n*H*W + p)*C + c in memory.
           Transposed into logical order in 16x16 tiles (to_logical), rounded there, and transposed back, in a
           per-thread buffer kept between calls. */
        const int64_t HW = H * W, CHW = C * HW, N = numel / CHW;
        /* one image at a time where no block straddles two (the buffer then stays in cache), else all */
        const int64_t per = CHW % block == 0 ? CHW : padded, groups = CHW % block == 0 ? N : 1;
        if (!grow(2 * per)) return 1;  /* out of memory: the caller raises */
        float *t = buf, *u = buf + per;
        for (int64_t g = 0; g < groups; g++) {
            const int64_t n0 = groups == 1 ? 0 : g, n1 = groups == 1 ? N : g + 1;
            for (int64_t n = n0; n < n1; n++) to_logical(x + n * CHW, t + (n - n0) * CHW, C, HW);
            for (int64_t i = (n1 - n0) * CHW; i < per; i++) t[i] = 0.0f;  /* the padding of the last block */
            RUN(t, u, per, (uint32_t)(n0 * CHW));
            for (int64_t n = n0; n < n1; n++) from_logical(u + (n - n0) * CHW, y + n * CHW, C, HW);
        }
    }
#undef RUN
#undef BY_ROUNDING
#undef BY_COUNT
#undef PASS
#undef PASS_B
    if (counts) { counts[0] = acc[0]; counts[1] = acc[1]; counts[2] = acc[2]; }
    return 0;
}

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

/* out = H x over each group of 16 consecutive rows of the row-major [rows, c] matrix x: every output element
   the sum, from +0 and in the order j = 0..15, of the fp32 products h[i][j] x[j] (hadamard.py's definition,
   which its torch code computes the same way and checks this function against before use). Rows of the
   ragged last group past `rows` read as +0 (the zero padding); out has `out_rows` rows (`rows` rounded up to
   16 for the transform, `rows` for the inverse, which drops the padding).

   Where h = diag(a) W diag(b) / 4 (W the 16x16 Sylvester-Hadamard matrix, a and b signs: the random Hadamard
   transform and its transpose both are), every 16 x 16 chunk (a ragged one through a zero-padded tile) takes a
   path with the same values and no multiply a term: fl(h x) = a W fl(b x / 4) (a sign flip is exact and
   rounding to nearest is symmetric), so
   each sum is a times the sum of +-q_j, q_j = fl((b_j / 4) x_j), computed once a row, with W's signs written
   into the code (additions and subtractions, the 16 sums in registers); + 0.0f turns the -0 that a = -1 can
   give into the +0 of the sum from +0, which never yields -0. */
typedef float lsb_v16 __attribute__((vector_size(64), aligned(4)));
#define LSB_W(i, j) (__builtin_popcount((unsigned)((i) & (j))) & 1)

/* the fast path on one 16 x 16 chunk: rows of x and o `xs` and `os` floats apart */
static inline void hadamard_chunk(const float *restrict x, int64_t xs, float *restrict o, int64_t os,
                                  const float *a, const float *b) {
""" + _HADAMARD_CHAIN + r"""
}

void lsb_hadamard16(const float *restrict x, float *restrict out, int64_t rows, int64_t out_rows, int64_t c,
                    const float *restrict h) {
    float a[16], b[16], tin[256], tout[256];
    int fast = 1;
    for (int j = 0; j < 16; j++) b[j] = h[j] < 0.0f ? -0.25f : 0.25f;
    for (int i = 0; i < 16; i++) a[i] = (h[16 * i] < 0.0f) == (b[0] < 0.0f) ? 1.0f : -1.0f;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            fast &= h[16 * i + j] == a[i] * (LSB_W(i, j) ? -b[j] : b[j]);
    const int64_t groups = (out_rows + 15) / 16;
    for (int64_t g = 0; g < groups; g++) {
        const int64_t r0 = g * 16, have = rows - r0 < 16 ? rows - r0 : 16, emit = out_rows - r0 < 16 ? out_rows - r0 : 16;
        const float *xg = x + r0 * c;
        float *og = out + r0 * c;
        for (int64_t cc = 0; cc < c; cc += 16) {
            const int64_t w = c - cc < 16 ? c - cc : 16;
            if (!fast) {  /* any other h: element by element, the definition as written */
                for (int64_t i = 0; i < emit; i++)
                    for (int64_t k = cc; k < cc + w; k++) {
                        float s = 0.0f;
                        for (int64_t j = 0; j < 16; j++) s = s + h[16 * i + j] * (j < have ? xg[j * c + k] : 0.0f);
                        og[i * c + k] = s;
                    }
            } else if (have == 16 && emit == 16 && w == 16) {
                hadamard_chunk(xg + cc, c, og + cc, c, a, b);
            } else {  /* a ragged group or the last columns: through a zero-padded tile */
                for (int64_t j = 0; j < 16; j++)
                    for (int64_t l = 0; l < 16; l++) tin[16 * j + l] = j < have && l < w ? xg[j * c + cc + l] : 0.0f;
                hadamard_chunk(tin, 16, tout, 16, a, b);
                for (int64_t i = 0; i < emit; i++)
                    for (int64_t l = 0; l < w; l++) og[i * c + cc + l] = tout[16 * i + l];
            }
        }
    }
}
#undef LSB_W

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
"""
_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math", "-std=c99", "-fPIC",
          "-shared")

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_failed: str | None = None


def disabled() -> bool:
    """Whether the environment turns the C kernel off (read on every call, like ``compile_disabled``)."""
    return compile_disabled() or os.environ.get(NO_NATIVE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def failure() -> str | None:
    """Why the library could not be built or loaded (None while it works or was never tried)."""
    return _failed


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc and shutil.which(cc):
        return shutil.which(cc)
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_flags() -> str:
    """The CPU's feature flags (Linux), else the processor's name: part of the cache key."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lossscale_bench" / "native"


def _build(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256("\0".join([_SOURCE, " ".join(_FLAGS), version, _cpu_flags(), platform.machine()])
                         .encode()).hexdigest()[:20]
    name = f"lsb_round_{key}.so"
    for folder in (_cache_dir(), Path(tempfile.gettempdir()) / "lossscale_bench_native"):
        if (folder / name).is_file():
            return folder / name
        try:  # a home that cannot be written (a locked-down CI runner): the system's temporary folder
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK):
                break
        except OSError:
            continue
    out = folder / name
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "lsb_round.c"
        src.write_text(_SOURCE)
        lib = Path(tmp) / "lsb_round.so"
        done = subprocess.run([cc, *_FLAGS, str(src), "-o", str(lib)], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise RuntimeError(f"{Path(cc).name} failed (exit {done.returncode}){': ' + said[0] if said else ''}")
        os.replace(lib, out)  # atomic: a trial loading it meanwhile sees the whole file or none
    return out


def library() -> ctypes.CDLL | None:
    """The loaded library, built on first use; None when it cannot be had (``failure()`` says why,
    and a warning said it once)."""
    global _lib, _failed
    if _lib is not None or _failed is not None:
        return _lib
    with _lock:
        if _lib is None and _failed is None:
            try:
                cc = _compiler()
                if cc is None:
                    raise RuntimeError("no C compiler (cc, gcc or clang, or $CC) on the PATH")
                lib = ctypes.CDLL(str(_build(cc)))
                f = lib.lsb_round_fp8
                f.restype = None
                f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32,
                              ctypes.c_int32, ctypes.c_float, ctypes.c_uint32, ctypes.c_uint32]
                b = lib.lsb_block_round
                b.restype = ctypes.c_int32
                b.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int64,
                              ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32,
                              ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_float, ctypes.c_uint32,
                              ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_void_p]
                m = lib.lsb_max_abs_bits
                m.restype = ctypes.c_uint32
                m.argtypes = [ctypes.c_void_p, ctypes.c_int64]
                hd = lib.lsb_hadamard16
                hd.restype = None
                hd.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                               ctypes.c_void_p]
                c = lib.lsb_census
                c.restype = None
                c.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_float, ctypes.c_float,
                              ctypes.c_void_p]
                _lib = lib
            except Exception as exc:  # noqa: BLE001 - any failure means: use the Inductor kernel
                _failed = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"lossscale_bench.numerics: the C rounding kernel is not available ({_failed}); "
                              "using the compiled torch kernel (same results)", RuntimeWarning, stacklevel=3)
    return _lib


class ProbeChecked:
    """A C function of the library that is used only once it matched its eager torch kernel on the probe
    values (``fp8.NativeKernel``, ``block_scaling.NativeBlock``): built, loaded and checked on the first
    ``ready()``, and never again after a failure (``broken`` says why; a warning said it once)."""

    #: the library's function
    function = ""

    def __init__(self) -> None:
        self._fn = None
        #: why the C function is not used (no library, or it differed on the probe); None while it works or untried
        self.broken: str | None = None

    def describe(self) -> str:
        """What the warning calls it."""
        return self.function

    def matches_probe(self) -> bool:
        """Run ``self._fn`` on the probe values and compare with the eager kernel, bit for bit."""
        raise NotImplementedError

    def ready(self) -> bool:
        if self._fn is not None:
            return True
        if self.broken is not None:
            return False
        lib = library()
        if lib is None:
            self.broken = failure()
            return False
        self._fn = getattr(lib, self.function)
        if not self.matches_probe():
            self._fn = None
            self.broken = "differs from the eager kernel on the probe values"
            warnings.warn(f"lossscale_bench.numerics: the C {self.describe()} {self.broken}; using the compiled "
                          "torch kernel (same results)", RuntimeWarning, stacklevel=3)
            return False
        return True
