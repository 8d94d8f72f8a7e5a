/* FP8 block scaling on the CPU (reference/fp8_block.py, operation for operation in fp32): E4M3 elements and one
 * fp32 power-of-two decode scale per 128 values along K, shared by `tile` rows (1, or 128 for a weight's tiles).
 * Inputs are fp32 (rows, K) with the block axis last, contiguous. */
#include "numerics.h"

#define FP8_BLOCK 128
#define FP8_BLOCK_E4M3_MAX 448.0f
#define CANONICAL_NAN 0x7FC00000u

/* The encode exponent e (2**e: fp32(448 / amax) with its mantissa cleared, FLT_MAX where the quotient overflows,
 * 0 for amax 0) and the stored scale 2**-e (NaN for a block holding NaN/Inf). */
static void fp8_block_scale(float amax, uint8_t bad, int32_t *e, float *scale) {
    int32_t ex = 0;
    if (amax > 0.0f) {
        float q = FP8_BLOCK_E4M3_MAX / amax;
        q = q > 0x1.fffffep127f ? 0x1.fffffep127f : q;
        ex = floor_log2(q);
    }
    float dec = pow2(-(ex > 126 ? 126 : ex));
    *e = ex;
    *scale = bad ? float_of(CANONICAL_NAN) : (ex >= 127 ? dec * 0.5f : dec);   /* 2**-127: an fp32 subnormal */
}

/* Codes and scales of R rows of K. SR (sr = 1) takes the bits of the element's index in the original layout:
 * row r, column k of the moved view is (r / inner) * K * inner + r % inner + k * inner. */
void fp8_block_quantize(const float *x, int64_t R, int64_t K, int64_t tile, int sr, uint32_t k1, uint32_t k2,
                        int64_t inner, uint8_t *out, float *scales) {
    int64_t nb = K / FP8_BLOCK;
    for (int64_t r0 = 0; r0 < R; r0 += tile)
        for (int64_t b = 0; b < nb; b++) {
            float amax = 0.0f;
            uint8_t bad = 0;
            for (int64_t r = r0; r < r0 + tile; r++) {
                float a;
                uint8_t nf;
                amax_blocks(x + r * K + b * FP8_BLOCK, 1, FP8_BLOCK, &a, &nf);
                amax = a > amax ? a : amax;
                bad |= nf;
            }
            int32_t e;
            fp8_block_scale(amax, bad, &e, &scales[(r0 / tile) * nb + b]);
            float f = pow2(e);
            for (int64_t r = r0; r < r0 + tile; r++) {
                const float *xr = x + r * K + b * FP8_BLOCK;
                uint8_t *o = out + r * K + b * FP8_BLOCK;
                if (sr) {
                    uint64_t base = (uint64_t)((r / inner) * K * inner + r % inner);
                    for (int64_t j = 0; j < FP8_BLOCK; j++) {
                        uint32_t rnd = sr_hash(k1, k2, base + (uint64_t)(b * FP8_BLOCK + j) * (uint64_t)inner);
                        o[j] = fp8_encode(round_to_element(xr[j] * f, 3, -6, FP8_BLOCK_E4M3_MAX, 1, rnd), 3, 7);
                    }
                } else {
                    for (int64_t j = 0; j < FP8_BLOCK; j++) o[j] = fp8_rne_code(xr[j] * f, 3, 7, FP8_BLOCK_E4M3_MAX);
                }
            }
        }
}

/* Values code * scale (lut: torch's fp32 value of each E4M3 byte; a NaN scale's NaN wins, as in the reference). */
void fp8_block_dequantize(const uint8_t *codes, int64_t R, int64_t K, int64_t tile, const float *lut,
                          const float *scales, float *out) {
    int64_t nb = K / FP8_BLOCK;
    for (int64_t r = 0; r < R; r++)
        for (int64_t b = 0; b < nb; b++) {
            float s = scales[(r / tile) * nb + b];
            const uint8_t *c = codes + r * K + b * FP8_BLOCK;
            float *o = out + r * K + b * FP8_BLOCK;
            for (int64_t j = 0; j < FP8_BLOCK; j++) o[j] = lut[c[j]] * s;
        }
}
