/* Fused CPU quantization for autoprec (loaded by kernels/cpu/fused.py through ctypes).
 *
 * Every function repeats the pure-torch reference (kernels/*_ref.py) operation for operation in fp32,
 * so the results are bit-identical. Inputs are fp32 (rows, K) views with the block axis last, contiguous
 * or (the quantizers' src_row) rows at given offsets. Stochastic rounding's bits are the hash of
 * kernels/core/random_bits.py, computed in place. Built with -ffp-contract=off: no fused multiply-add may
 * change a rounding. Loops are written so that gcc -O3 vectorizes them (flat loops over row chunks with
 * per-element factors set up first).
 */
#include "numerics.h"

void block_amax(const float *x, int64_t R, int64_t K, int64_t block, float *amax, uint8_t *bad) {
    int64_t n16 = R * K / 16;
    amax_blocks(x, n16, 16, amax, bad);
    if (block == 32)   /* pairs of 16-blocks, in place (the fixed 16-wide loop vectorizes) */
        for (int64_t i = 0; i < n16 / 2; i++) {
            float a = amax[2 * i], b = amax[2 * i + 1];
            amax[i] = a > b ? a : b;
            bad[i] = bad[2 * i] | bad[2 * i + 1];
        }
}

/* NVFP4's tensor scale from the max |v| over the finite values of v (the block amaxes, or a whole tensor):
 * S_enc = min(448*6 / amax, FLT_MAX), or 1 where amax or S_enc is 0 (nvfp4_ref.nvfp4_encode_scale);
 * out = {S_enc * fp32(1/6), 1 / S_enc}. */
void nvfp4_tensor_scale(const float *v, int64_t n, float *out) {
    const uint32_t *u = (const uint32_t *)v;
    uint32_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b = u[i] & 0x7FFFFFFFu;
        b &= -(uint32_t)(b < 0x7F800000u);
        m = b > m ? b : m;
    }
    float amax = float_of(m), s = 2688.0f / amax;
    s = s > 3.4028234663852886e38f ? 3.4028234663852886e38f : s;
    s = amax > 0.0f && s > 0.0f ? s : 1.0f;
    out[0] = s * (float)(1.0 / 6.0);
    out[1] = 1.0f / s;
}

/* nvfp4_ref.nvfp4_core's scale chain after S_enc: s_b = E4M3(amax * f) (NaN where bad) and
 * e_b = min(1/(s_b*s_dec), FLT_MAX), with f = S_enc * fp32(1/6). */
void nvfp4_scales(const float *amax, const uint8_t *bad, int64_t n, float f, float s_dec, float *s_b, float *e_b) {
    for (int64_t i = 0; i < n; i++) {
        float s = round_to_element(amax[i] * f, 3, -6, 448.0f, 0, 0);
        s = bad[i] ? float_of(0x7FC00000u) : s;
        float e = 1.0f / (s * s_dec);
        s_b[i] = s;
        e_b[i] = e > 3.4028234663852886e38f ? 3.4028234663852886e38f : e;
    }
}

/* Row r of a (R, K) input with unit stride along K: at src_row[r] elements from x (a part of a larger
 * tensor, read in place), or at r * K when src_row is NULL (contiguous). */
static inline const float *row_of(const float *x, const int64_t *src_row, int64_t r, int64_t K) {
    return x + (src_row ? src_row[r] : r * K);
}

#define CHUNK 512  /* elements per row chunk: a multiple of both block sizes, small enough for L1 */

/* The chunk's per-element block factors and (with SR) random bits: row r's columns k0 .. k0+n. */
static void chunk_setup(const float *fr, int64_t k0, int64_t n, int block, int sr, uint32_t k1, uint32_t k2,
                        uint64_t base, uint64_t inner, float *restrict f, uint32_t *restrict rnd) {
    for (int64_t b = 0; b < n / block; b++) {
        float v = fr[(k0 / block) + b];
        for (int t = 0; t < block; t++) f[b * block + t] = v;
    }
    if (sr)
        for (int64_t j = 0; j < n; j++) rnd[j] = sr_hash(k1, k2, base + (uint64_t)(k0 + j) * inner);
}

static void nvfp4_chunk(const float *restrict x, const float *restrict f, const uint32_t *restrict rnd, int64_t n,
                        int sr, float *restrict v, uint8_t *restrict out) {
    uint8_t c[CHUNK];
    if (sr) {
        for (int64_t j = 0; j < n; j++) {
            float t = x[j] * f[j];
            v[j] = t < -6.0f ? -6.0f : (t > 6.0f ? 6.0f : t);   /* torch.clamp: NaN stays NaN */
        }
        /* v is within ±6 already, so the element clamp is dropped (max INFINITY): same values, and the loop
         * vectorizes */
        for (int64_t j = 0; j < n; j++) v[j] = round_to_element(v[j], 1, 0, INFINITY, 1, rnd[j]);
        for (int64_t j = 0; j < n; j++) c[j] = e2m1_encode(v[j]);
    } else {   /* the clamp is implied: every |t| > 5 takes code 7 */
        for (int64_t j = 0; j < n; j++) c[j] = e2m1_rne_code(x[j] * f[j]);
    }
    for (int64_t j = 0; j < n / 2; j++) out[j] = (uint8_t)(c[2 * j] | (c[2 * j + 1] << 4));
}

/* NVFP4 elements: codes of round(clamp(x * e_b, -6, 6)) packed two per byte (even index low). */
void nvfp4_round_pack(const float *x, const int64_t *src_row, int64_t R, int64_t K, const float *e_b, int sr,
                      uint32_t k1, uint32_t k2, int64_t inner, const int64_t *row_base, uint8_t *codes) {
    float f[CHUNK], v[CHUNK];
    uint32_t rnd[CHUNK];
    for (int64_t r = 0; r < R; r++) {
        uint64_t base = (uint64_t)(row_base ? row_base[r] : (r / inner) * K * inner + r % inner);
        for (int64_t k0 = 0; k0 < K; k0 += CHUNK) {
            int64_t n = K - k0 < CHUNK ? K - k0 : CHUNK;
            chunk_setup(e_b + r * (K / 16), k0, n, 16, sr, k1, k2, base, (uint64_t)inner, f, rnd);
            nvfp4_chunk(row_of(x, src_row, r, K) + k0, f, rnd, n, sr, v, codes + (r * K + k0) / 2);
        }
    }
}

/* NVFP4 with 1x16 blocks in one call: block amaxes, the tensor scale (from the finite max of the n_whole
 * values of `whole` when given: the tensor these rows are a part of; else of the block amaxes), the E4M3
 * block scales as bytes, S_dec and the packed codes. scratch: 3 floats and bad: 1 byte per block. */
void nvfp4_quantize(const float *x, const int64_t *src_row, int64_t R, int64_t K, int64_t inner,
                    const int64_t *row_base, const float *whole, int64_t n_whole, int sr, uint32_t k1, uint32_t k2,
                    float *scratch, uint8_t *bad, uint8_t *scales, float *s_dec, uint8_t *codes) {
    int64_t nb = R * K / 16;
    float *amax = scratch, *s_b = scratch + nb, *e_b = scratch + 2 * nb, ts[2];
    for (int64_t r = 0; r < R; r++)
        amax_blocks(row_of(x, src_row, r, K), K / 16, 16, amax + r * (K / 16), bad + r * (K / 16));
    nvfp4_tensor_scale(whole ? whole : amax, whole ? n_whole : nb, ts);
    nvfp4_scales(amax, bad, nb, ts[0], ts[1], s_b, e_b);
    for (int64_t i = 0; i < nb; i++) scales[i] = fp8_encode(s_b[i], 3, 7);
    nvfp4_round_pack(x, src_row, R, K, e_b, sr, k1, k2, inner, row_base, codes);
    *s_dec = ts[1];
}

static void mx_chunk(const float *restrict x, const float *restrict f, const uint32_t *restrict rnd, int64_t n,
                     int32_t mbits, int32_t bias, float maxv, int sr, uint8_t *restrict out) {
    if (sr) {
        for (int64_t j = 0; j < n; j++)
            out[j] = fp8_encode(round_to_element(x[j] * f[j], mbits, 1 - bias, maxv, 1, rnd[j]), mbits, bias);
    } else {
        for (int64_t j = 0; j < n; j++) out[j] = fp8_rne_code(x[j] * f[j], mbits, bias, maxv);
    }
}

/* MXFP8 in one pass over x: per row chunk (in L1) the block amaxes, the E8M0 scales and the elements. */
void mx_quantize(const float *x, const int64_t *src_row, int64_t R, int64_t K, int32_t mbits, int32_t bias, float maxv,
                 int32_t emax, int floor_mode, int sr, uint32_t k1, uint32_t k2, int64_t inner, const int64_t *row_base,
                 uint8_t *out, uint8_t *scales) {
    float f[CHUNK], amax[CHUNK / 16], factor[CHUNK / 32];
    uint8_t bad[CHUNK / 16];
    uint32_t rnd[CHUNK];
    for (int64_t r = 0; r < R; r++) {
        uint64_t base = (uint64_t)(row_base ? row_base[r] : (r / inner) * K * inner + r % inner);
        for (int64_t k0 = 0; k0 < K; k0 += CHUNK) {
            int64_t n = K - k0 < CHUNK ? K - k0 : CHUNK;
            const float *xc = row_of(x, src_row, r, K) + k0;
            block_amax(xc, 1, n, 32, amax, bad);
            mx_scales(amax, bad, n / 32, maxv, emax, floor_mode, scales + (r * K + k0) / 32, factor);
            chunk_setup(factor, 0, n, 32, sr, k1, k2, base + (uint64_t)k0 * (uint64_t)inner, (uint64_t)inner, f, rnd);
            mx_chunk(xc, f, rnd, n, mbits, bias, maxv, sr, out + r * K + k0);
        }
    }
}

/* NVFP4 values: e2m1(code) * s_b * s_dec, in that order (s_b: the E4M3 scale byte's value in lut). The
 * E2M1 value comes from the code's bits (exponent field e, mantissa bit m: m / 2 for e = 0, else
 * 2**(e-1) * (1 + m/2)) with masks, not branches or table lookups, so the loop vectorizes. */
INLINE float e2m1_value(uint32_t code) {
    uint32_t e = (code >> 1) & 3, m = code & 1;
    uint32_t normal = ((e + 126) << 23) | (m << 22), half = m ? 0x3F000000u : 0;   /* 0.5 or 0 */
    uint32_t is_normal = -(uint32_t)(e != 0);
    return float_of((normal & is_normal) | (half & ~is_normal) | ((code & 8) << 28));
}

void nvfp4_dequantize(const uint8_t *codes, int64_t R, int64_t K, const uint8_t *scale, const float *lut, float s_dec,
                      float *out) {
    uint8_t nib[CHUNK];
    float f[CHUNK];
    for (int64_t k0 = 0; k0 < R * K; k0 += CHUNK) {   /* R * K is a multiple of 16 */
        int64_t n = R * K - k0 < CHUNK ? R * K - k0 : CHUNK;
        for (int64_t i = 0; i < n / 2; i++) {
            uint8_t byte = codes[k0 / 2 + i];
            nib[2 * i] = byte & 0xF;
            nib[2 * i + 1] = byte >> 4;
        }
        for (int64_t b = 0; b < n / 16; b++)
            for (int t = 0; t < 16; t++) f[b * 16 + t] = lut[scale[k0 / 16 + b]];
        for (int64_t j = 0; j < n; j++) out[k0 + j] = e2m1_value(nib[j]) * f[j] * s_dec;
    }
}

/* rounding_ref.e8m0_decode: 2**(code - 127), 2**-127 (an fp32 subnormal) for code 0, NaN for 255. */
INLINE float e8m0_value(uint8_t code) {
    return float_of(code == 255 ? 0x7FC00000u : (code ? (uint32_t)code << 23 : 0x00400000u));
}

/* MXFP8 values: fp8(code) * 2**(scale - 127) (a NaN scale's NaN wins, as in the reference's product).
 * Finite codes decode from their bits; a block holding an Inf/NaN code (exponent field all ones: E5M2
 * 0x7C.., E4M3FN 0x7F) takes those from lut (torch's fp32 value of every FP8 byte). */
void mx_dequantize(const uint8_t *codes, int64_t R, int64_t K, const float *lut, const uint8_t *scale, int32_t mbits,
                   int32_t bias, float *out) {
    uint32_t mmask = (1u << mbits) - 1, special_min = mbits == 3 ? 0x7F : 0x7C;
    float sub_unit = pow2(1 - bias - mbits);
    for (int64_t b = 0; b < R * K / 32; b++) {
        const uint8_t *c = codes + b * 32;
        float *o = out + b * 32;
        float s = e8m0_value(scale[b]);
        if (s != s) {
            for (int j = 0; j < 32; j++) o[j] = s;
            continue;
        }
        uint32_t special = 0;
        for (int j = 0; j < 32; j++) {
            uint32_t code = c[j], c7 = code & 0x7F, e = c7 >> mbits, m = c7 & mmask;
            uint32_t normal = ((e + 127 - (uint32_t)bias) << 23) | (m << (23 - mbits));
            uint32_t sub = bits_of((float)(int32_t)m * sub_unit), is_normal = -(uint32_t)(e != 0);
            special |= c7 >= special_min;
            o[j] = float_of((normal & is_normal) | (sub & ~is_normal) | ((code & 0x80) << 24)) * s;
        }
        if (special)
            for (int j = 0; j < 32; j++) o[j] = lut[c[j]] * s;
    }
}

/* The RHT along K in tiles of 16, in hadamard_ref's order: u_j = x_j * s_j + 0 (no -0), the four butterfly
 * stages (pairs i, i + h for h = 1, 2, 4, 8: a + b, a - b), then y_i = u_i * 1/4. A tile is one 16-float vector:
 * at stage h each lane i adds its partner i ^ h (a shuffle), its own value negated where i & h (u_{i-h} - u_i is
 * p + (-v): the same rounding). */
typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
#ifdef __clang__
#define PARTNERS(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#else
#define PARTNERS(v, ...) __builtin_shuffle(v, (i32x16){__VA_ARGS__})
#endif

INLINE void rht_tile(const float *x, f32x16 signs, float *y) {
    const f32x16 g1 = {1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1};
    const f32x16 g2 = {1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1};
    const f32x16 g4 = {1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1};
    const f32x16 g8 = {1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1};
    f32x16 v;
    memcpy(&v, x, sizeof v);
    v = v * signs + 0.0f;
    v = v * g1 + PARTNERS(v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    v = v * g2 + PARTNERS(v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    v = v * g4 + PARTNERS(v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    v = v * g8 + PARTNERS(v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    v = v * 0.25f;
    memcpy(y, &v, sizeof v);
}

INLINE f32x16 sign_vector(const float *signs) {
    f32x16 s;
    memcpy(&s, signs, sizeof s);
    return s;
}

void rht16(const float *x, int64_t R, int64_t K, const float *signs, float *y) {
    f32x16 s = sign_vector(signs);
    for (int64_t t = 0; t < R * K; t += 16) rht_tile(x + t, s, y + t);
}

/* The max |y| over the finite values of rht16's output y, without writing y (the tensor scale of a
 * transformed tensor when only a part of it is quantized). */
void rht16_amax(const float *x, int64_t R, int64_t K, const float *signs, float *amax) {
    uint32_t m = 0;
    f32x16 s = sign_vector(signs);
    for (int64_t t = 0; t < R * K; t += 16) {
        float y[16];
        rht_tile(x + t, s, y);
        for (int i = 0; i < 16; i++) {
            uint32_t b = bits_of(y[i]) & 0x7FFFFFFFu;
            b &= -(uint32_t)(b < 0x7F800000u);
            m = b > m ? b : m;
        }
    }
    *amax = float_of(m);
}
