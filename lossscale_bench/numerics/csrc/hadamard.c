/* The 16x16 Hadamard transform's sums (hadamard.NativeHadamard). */
#include "lsb_bits.h"

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
#include "hadamard_chunk.h"

#define LSB_W(i, j) (__builtin_popcount((unsigned)((i) & (j))) & 1)

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
