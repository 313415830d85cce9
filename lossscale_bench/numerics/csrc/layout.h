/* The 16x16 tile transposes of the channels_last block round trips (block_round.c): one image between
   channels_last and the logical (row-major) order. */
#ifndef LSB_LAYOUT_H
#define LSB_LAYOUT_H

#include <stdint.h>

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

#endif
