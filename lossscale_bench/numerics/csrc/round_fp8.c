/* The fp8 round trip of one tensor (fp8.NativeKernel): the same arithmetic as fp8._bits_fused. */
#include "lsb_bits.h"

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
