/* Fused CPU quantization down the columns: for operands whose blocks run across memory rows, as a
 * wgrad operand's blocks run along the tokens of a (tokens, features) activation or gradient.
 *
 * src is a contiguous (B, K, R) array: the moved (R, K) view of each batch is its transpose, with the
 * blocks along K. The loops read strips of `block` memory rows (vectorized across the R columns), write
 * the codes of a strip into a small tile, and copy the tile out in the (B, R, K) storage layout the
 * quantized tensor keeps, so no transposed fp32 copy of the input is made. Same per-element arithmetic
 * as the row kernels (numerics.h), so the codes are bit-identical. The SR bits of element (b, r, k) are
 * those of index b*R*K + r*rstride + k*kstride of the logical tensor.
 */
#include "numerics.h"

#define COLS 256  /* columns per tile */

/* Per column: max |x| over the finite values of `block` rows from s (row stride R), and whether any is
 * NaN/Inf. */
static void col_amax(const float *s, int64_t R, int64_t nc, int block, float *amax, uint8_t *bad) {
    uint32_t m[COLS] = {0}, nf[COLS] = {0};
    for (int kk = 0; kk < block; kk++) {
        const uint32_t *u = (const uint32_t *)(s + kk * R);
        for (int64_t c = 0; c < nc; c++) {
            uint32_t b = u[c] & 0x7FFFFFFFu, finite = -(uint32_t)(b < 0x7F800000u);
            nf[c] |= ~finite & 1;
            b &= finite;
            m[c] = b > m[c] ? b : m[c];
        }
    }
    for (int64_t c = 0; c < nc; c++) {
        amax[c] = float_of(m[c]);
        bad[c] = (uint8_t)nf[c];
    }
}

/* Copy the n_out x n_in bytes tile[k][c] (row stride COLS) to out[c * stride + k]: 8x8 blocks transposed in
 * 64-bit registers (three rounds of swapping halves), the ragged columns byte by byte. n_out: a multiple of 8. */
static void store_transposed(const uint8_t *tile, int64_t n_out, int64_t n_in, uint8_t *out, int64_t stride) {
    int64_t c = 0;
    for (; c + 8 <= n_in; c += 8)
        for (int64_t k = 0; k < n_out; k += 8) {
            uint64_t x[8], t;
            for (int i = 0; i < 8; i++) memcpy(&x[i], tile + (k + i) * COLS + c, 8);
            for (int i = 0; i < 4; i++) {
                t = ((x[i] >> 32) ^ x[i + 4]) & 0x00000000FFFFFFFFull; x[i] ^= t << 32; x[i + 4] ^= t;
            }
            for (int i = 0; i < 8; i += (i % 2 ? 3 : 1)) {   /* rows 0 1 4 5 with 2 3 6 7 */
                t = ((x[i] >> 16) ^ x[i + 2]) & 0x0000FFFF0000FFFFull; x[i] ^= t << 16; x[i + 2] ^= t;
            }
            for (int i = 0; i < 8; i += 2) {
                t = ((x[i] >> 8) ^ x[i + 1]) & 0x00FF00FF00FF00FFull; x[i] ^= t << 8; x[i + 1] ^= t;
            }
            for (int i = 0; i < 8; i++) memcpy(out + (c + i) * stride + k, &x[i], 8);
        }
    for (; c < n_in; c++)
        for (int64_t k = 0; k < n_out; k++) out[c * stride + k] = tile[k * COLS + c];
}

static void col_bits(uint32_t k1, uint32_t k2, uint64_t base, int64_t rstride, int64_t nc, uint32_t *rnd) {
    for (int64_t c = 0; c < nc; c++) rnd[c] = sr_hash(k1, k2, base + (uint64_t)(c * rstride));
}

/* MXFP8 down the columns: per strip of 32 rows the column amaxes, E8M0 scales and elements. */
void mx_quantize_cols(const float *src, int64_t B, int64_t K, int64_t R, int32_t mbits, int32_t bias, float maxv,
                      int32_t emax, int floor_mode, int sr, uint32_t k1, uint32_t k2, int64_t rstride,
                      int64_t kstride, uint8_t *out, uint8_t *scales) {
    float amax[COLS], factor[COLS];
    uint8_t bad[COLS], sbyte[COLS], tile[32][COLS];
    uint32_t rnd[COLS];
    for (int64_t b = 0; b < B; b++)
        for (int64_t k0 = 0; k0 < K; k0 += 32)
            for (int64_t c0 = 0; c0 < R; c0 += COLS) {
                int64_t nc = R - c0 < COLS ? R - c0 : COLS;
                const float *s = src + (b * K + k0) * R + c0;
                col_amax(s, R, nc, 32, amax, bad);
                mx_scales(amax, bad, nc, maxv, emax, floor_mode, sbyte, factor);
                for (int64_t c = 0; c < nc; c++) scales[(b * R + c0 + c) * (K / 32) + k0 / 32] = sbyte[c];
                for (int kk = 0; kk < 32; kk++) {
                    const float *row = s + kk * R;
                    if (sr) {
                        col_bits(k1, k2, (uint64_t)(b * R * K + c0 * rstride + (k0 + kk) * kstride), rstride, nc, rnd);
                        for (int64_t c = 0; c < nc; c++)
                            tile[kk][c] = fp8_encode(round_to_element(row[c] * factor[c], mbits, 1 - bias, maxv, 1,
                                                                      rnd[c]), mbits, bias);
                    } else {
                        for (int64_t c = 0; c < nc; c++)
                            tile[kk][c] = fp8_rne_code(row[c] * factor[c], mbits, bias, maxv);
                    }
                }
                store_transposed(&tile[0][0], 32, nc, out + (b * R + c0) * K + k0, K);
            }
}

/* NVFP4 down the columns (f = S_enc * fp32(1/6), s_dec = 1/S_enc from the whole tensor's amax): per strip
 * of 16 rows the column amaxes, the E4M3 block scales (s_b, written as fp32) and the E2M1 codes, packed
 * two per byte along K (even index low). */
void nvfp4_quantize_cols(const float *src, int64_t B, int64_t K, int64_t R, float f, float s_dec, int sr,
                         uint32_t k1, uint32_t k2, int64_t rstride, int64_t kstride, uint8_t *codes, float *s_b) {
    float amax[COLS], sb[COLS], eb[COLS];
    uint8_t bad[COLS], tile[16][COLS];
    uint32_t rnd[COLS];
    for (int64_t b = 0; b < B; b++)
        for (int64_t k0 = 0; k0 < K; k0 += 16)
            for (int64_t c0 = 0; c0 < R; c0 += COLS) {
                int64_t nc = R - c0 < COLS ? R - c0 : COLS;
                const float *s = src + (b * K + k0) * R + c0;
                col_amax(s, R, nc, 16, amax, bad);
                nvfp4_scales(amax, bad, nc, f, s_dec, sb, eb);
                for (int64_t c = 0; c < nc; c++) s_b[(b * R + c0 + c) * (K / 16) + k0 / 16] = sb[c];
                for (int kk = 0; kk < 16; kk++) {
                    const float *row = s + kk * R;
                    float v[COLS];
                    for (int64_t c = 0; c < nc; c++) {
                        float t = row[c] * eb[c];
                        v[c] = t < -6.0f ? -6.0f : (t > 6.0f ? 6.0f : t);   /* torch.clamp: NaN stays NaN */
                    }
                    if (sr) {
                        col_bits(k1, k2, (uint64_t)(b * R * K + c0 * rstride + (k0 + kk) * kstride), rstride, nc, rnd);
                        for (int64_t c = 0; c < nc; c++) v[c] = round_to_element(v[c], 1, 0, INFINITY, 1, rnd[c]);
                        for (int64_t c = 0; c < nc; c++) tile[kk][c] = e2m1_encode(v[c]);
                    } else {
                        for (int64_t c = 0; c < nc; c++) tile[kk][c] = e2m1_rne_code(v[c]);
                    }
                }
                for (int kk = 0; kk < 8; kk++)   /* two codes per byte, even index low */
                    for (int64_t c = 0; c < nc; c++)
                        tile[kk][c] = (uint8_t)(tile[2 * kk][c] | (tile[2 * kk + 1][c] << 4));
                store_transposed(&tile[0][0], 8, nc, codes + (b * R + c0) * (K / 2) + k0 / 2, K / 2);
            }
}

/* The RHT down the columns, in tiles of 16 rows, in rht16's order (hadamard_ref's): row j of a tile times s_j
 * (+ 0: no -0), the four butterfly stages between rows i and i + h (h = 1, 2, 4, 8), then the rows times 1/4;
 * vectorized along the rows. */
void rht16_cols(const float *x, int64_t B, int64_t K, int64_t R, const float *signs, float *y) {
    for (int64_t t = 0; t < B * K; t += 16) {
        const float *s = x + t * R;
        float *o = y + t * R;
        for (int j = 0; j < 16; j++)
            for (int64_t c = 0; c < R; c++) o[j * R + c] = s[j * R + c] * signs[j] + 0.0f;
        for (int h = 1; h < 16; h *= 2)
            for (int i = 0; i < 16; i++)
                if (!(i & h)) {
                    float *p = o + i * R, *q = o + (i + h) * R;
                    for (int64_t c = 0; c < R; c++) {
                        float a = p[c], b = q[c];
                        p[c] = a + b;
                        q[c] = a - b;
                    }
                }
        for (int64_t c = 0; c < 16 * R; c++) o[c] = o[c] * 0.25f;
    }
}
