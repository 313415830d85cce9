/* The block-scaled round trips (block_scaling.NativeBlock): MX32, E2M1, MXFP4 and NVFP4, with their counts,
   over a tensor as it lies in memory (row-major or channels_last). */
#include "lsb_bits.h"
#include "block_elem.h"
#include "layout.h"

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
