/* Fused CPU quantization for autoprec (loaded by kernels/cpu_fused.py through ctypes).
 *
 * Every function repeats the pure-torch reference (kernels/*_ref.py) operation for operation in fp32,
 * so the results are bit-identical; only NVFP4's tensor scale S_enc is left to the reference's torch
 * code. Inputs are contiguous fp32 (rows, K) views with the block axis last. Stochastic rounding's bits
 * are the hash of kernels/random_bits.py, computed in place. Built with -ffp-contract=off: no fused
 * multiply-add may change a rounding. Loops are written so that gcc -O3 vectorizes them (flat loops
 * over row chunks with per-element factors set up first).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

INLINE uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
INLINE float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
INLINE float pow2(int32_t e) { return float_of((uint32_t)(e + 127) << 23); }
INLINE int32_t floor_log2(float a) { return (int32_t)((bits_of(a) >> 23) & 0xFF) - 127; }

INLINE uint32_t mix32(uint32_t x) {
    x ^= x >> 16; x *= 0x21F0AAADu; x ^= x >> 15; x *= 0x735A2D97u; return x ^ (x >> 15);
}

/* The 24 SR bits of the element whose index in the original layout is idx. The element at (row r,
 * column k) of the moved (rows, K) view has idx = (r / inner) * K * inner + r % inner + k * inner, with
 * inner the size of the dims after the block axis. */
INLINE uint32_t sr_hash(uint32_t k1, uint32_t k2, uint64_t idx) {
    return mix32(mix32((uint32_t)idx ^ k1) ^ k2 ^ (uint32_t)(idx >> 32)) >> 8;
}

/* rounding_ref.round_to_element: fp32 onto the grid (mbits, emin, max), RNE or SR; canonical NaN. */
INLINE float round_to_element(float x, int32_t mbits, int32_t emin, float maxv, int sr, uint32_t rand) {
    uint32_t xb = bits_of(x);
    float a = float_of(xb & 0x7FFFFFFFu);
    a = a > maxv ? maxv : a;                      /* torch.clamp(max=): NaN stays NaN */
    int32_t e = floor_log2(a);
    e = (e < emin ? emin : e) - mbits;
    float s = a * pow2(-e);
    float r;
    if (sr) {
        float lo = (float)(int32_t)s;   /* floor: 0 <= s < 2**23 (NaN is replaced below) */
        float u = (float)(int32_t)(rand & 0xFFFFFFu) * 0x1p-24f;   /* exact: < 2**24 */
        r = lo + (float)(u < (s - lo));
    } else {
        r = (s + 8388608.0f) - 8388608.0f;
    }
    float mag = r * pow2(e);
    float out = float_of(bits_of(mag) | (xb & 0x80000000u));
    return x != x ? float_of(0x7FC00000u) : out;
}

INLINE uint8_t e2m1_encode(float v) {
    uint32_t b = bits_of(v);
    float a = float_of(b & 0x7FFFFFFFu);
    int32_t exp_field = (int32_t)((b >> 23) & 0xFF);
    int32_t mag = a >= 1.0f ? (((exp_field - 126) << 1) | (int32_t)((b >> 22) & 1)) : (int32_t)(a * 2.0f);
    return (uint8_t)(v != v ? 0 : (uint32_t)mag | ((b >> 28) & 0x8));
}

/* Per block of `block` values along K: max |x| over the finite values, and whether any is NaN/Inf.
 * Non-negative floats order as their bits, so the max runs on integers (and vectorizes). */
INLINE void amax_blocks(const float *x, int64_t nblocks, int block, float *amax, uint8_t *bad) {
    const uint32_t *u = (const uint32_t *)x;
    for (int64_t i = 0; i < nblocks; i++) {
        uint32_t m = 0, nf = 0;
        for (int j = 0; j < block; j++) {
            uint32_t b = u[i * block + j] & 0x7FFFFFFFu;
            uint32_t inf_or_nan = b >= 0x7F800000u;
            nf |= inf_or_nan;
            b = inf_or_nan ? 0 : b;
            m = b > m ? b : m;
        }
        amax[i] = float_of(m);
        bad[i] = (uint8_t)nf;
    }
}

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

/* mxfp8_ref's E8M0 exponents from block amaxes: RCEIL clamp(ceil(log2(amax / max)), -127, 127) from the bits
 * of the fp32 quotient, or FLOOR floor(log2 amax) - emax; the scale byte (255 where bad) and 2**-e. */
static void mx_scales(const float *amax, const uint8_t *bad, int64_t n, float maxv, int32_t emax, int floor_mode,
                      uint8_t *scales, float *factor) {
    for (int64_t i = 0; i < n; i++) {
        int32_t e;
        if (floor_mode) {
            e = amax[i] > 0.0f ? floor_log2(amax[i]) - emax : -127;
        } else {
            float q = amax[i] / maxv;
            int32_t normal = floor_log2(q) + (int32_t)((bits_of(q) & 0x7FFFFF) != 0);
            int32_t tiny = q > 0x1p-127f ? -126 : -127;
            e = q >= 0x1p-126f ? normal : tiny;
        }
        e = e < -127 ? -127 : (e > 127 ? 127 : e);
        scales[i] = bad[i] ? 255 : (uint8_t)(e + 127);
        factor[i] = pow2(-e);
    }
}

/* An fp32 value on an FP8 grid (E4M3FN: bias 7; E5M2: bias 15; NaN 0x7F) as its byte. */
INLINE uint8_t fp8_encode(float v, int32_t mbits, int32_t bias) {
    uint32_t b = bits_of(v);
    uint32_t sign = (b >> 24) & 0x80;
    float a = float_of(b & 0x7FFFFFFFu);
    int32_t emin = 1 - bias;
    int32_t e = floor_log2(a);
    uint32_t sub = (uint32_t)(int32_t)(a * pow2(mbits - emin));            /* a / 2**(emin - mbits) */
    uint32_t normal = ((uint32_t)(e + bias) << mbits) | ((b >> (23 - mbits)) & ((1u << mbits) - 1));
    uint32_t out = sign | (e < emin ? sub : normal);
    return (uint8_t)(v != v ? 0x7F : out);
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
    for (int64_t j = 0; j < n; j++) {
        float t = x[j] * f[j];
        v[j] = t < -6.0f ? -6.0f : (t > 6.0f ? 6.0f : t);   /* torch.clamp: NaN stays NaN */
    }
    /* v is within ±6 already, so the element clamp is dropped (max INFINITY): same values, and the SR loop
     * then vectorizes */
    if (sr)
        for (int64_t j = 0; j < n; j++) v[j] = round_to_element(v[j], 1, 0, INFINITY, 1, rnd[j]);
    else
        for (int64_t j = 0; j < n; j++) v[j] = round_to_element(v[j], 1, 0, INFINITY, 0, 0);
    for (int64_t j = 0; j < n / 2; j++) out[j] = (uint8_t)(e2m1_encode(v[2 * j]) | (e2m1_encode(v[2 * j + 1]) << 4));
}

/* NVFP4 elements: codes of round(clamp(x * e_b, -6, 6)) packed two per byte (even index low). */
void nvfp4_round_pack(const float *x, int64_t R, int64_t K, const float *e_b, int sr, uint32_t k1, uint32_t k2,
                      int64_t inner, uint8_t *codes) {
    float f[CHUNK], v[CHUNK];
    uint32_t rnd[CHUNK];
    for (int64_t r = 0; r < R; r++) {
        uint64_t base = (uint64_t)((r / inner) * K * inner + r % inner);
        for (int64_t k0 = 0; k0 < K; k0 += CHUNK) {
            int64_t n = K - k0 < CHUNK ? K - k0 : CHUNK;
            chunk_setup(e_b + r * (K / 16), k0, n, 16, sr, k1, k2, base, (uint64_t)inner, f, rnd);
            nvfp4_chunk(x + r * K + k0, f, rnd, n, sr, v, codes + (r * K + k0) / 2);
        }
    }
}

static void mx_chunk(const float *restrict x, const float *restrict f, const uint32_t *restrict rnd, int64_t n,
                     int32_t mbits, int32_t bias, float maxv, int sr, uint8_t *restrict out) {
    if (sr) {
        for (int64_t j = 0; j < n; j++)
            out[j] = fp8_encode(round_to_element(x[j] * f[j], mbits, 1 - bias, maxv, 1, rnd[j]), mbits, bias);
    } else {
        for (int64_t j = 0; j < n; j++)
            out[j] = fp8_encode(round_to_element(x[j] * f[j], mbits, 1 - bias, maxv, 0, 0), mbits, bias);
    }
}

/* MXFP8 in one pass over x: per row chunk (in L1) the block amaxes, the E8M0 scales and the elements. */
void mx_quantize(const float *x, int64_t R, int64_t K, int32_t mbits, int32_t bias, float maxv, int32_t emax,
                 int floor_mode, int sr, uint32_t k1, uint32_t k2, int64_t inner, uint8_t *out, uint8_t *scales) {
    float f[CHUNK], amax[CHUNK / 16], factor[CHUNK / 32];
    uint8_t bad[CHUNK / 16];
    uint32_t rnd[CHUNK];
    for (int64_t r = 0; r < R; r++) {
        uint64_t base = (uint64_t)((r / inner) * K * inner + r % inner);
        for (int64_t k0 = 0; k0 < K; k0 += CHUNK) {
            int64_t n = K - k0 < CHUNK ? K - k0 : CHUNK;
            const float *xc = x + r * K + k0;
            block_amax(xc, 1, n, 32, amax, bad);
            mx_scales(amax, bad, n / 32, maxv, emax, floor_mode, scales + (r * K + k0) / 32, factor);
            chunk_setup(factor, 0, n, 32, sr, k1, k2, base + (uint64_t)k0 * (uint64_t)inner, (uint64_t)inner, f, rnd);
            mx_chunk(xc, f, rnd, n, mbits, bias, maxv, sr, out + r * K + k0);
        }
    }
}

/* NVFP4 values: lut[code] * s_b * s_dec, in that order (lut: the 16 E2M1 values). */
void nvfp4_dequantize(const uint8_t *codes, int64_t R, int64_t K, const float *lut, const float *scale, float s_dec,
                      float *out) {
    for (int64_t i = 0; i < R * K / 2; i++) {
        float s = scale[i >> 3];
        out[2 * i] = lut[codes[i] & 0xF] * s * s_dec;
        out[2 * i + 1] = lut[codes[i] >> 4] * s * s_dec;
    }
}

/* MXFP8 values: lut[code] * 2**(scale - 127) (lut: torch's fp32 value of every FP8 byte). */
void mx_dequantize(const uint8_t *codes, int64_t R, int64_t K, const float *lut, const float *scale, float *out) {
    for (int64_t i = 0; i < R * K; i++) {
        float v = lut[codes[i]], s = scale[i >> 5];
        out[i] = s != s ? s : v * s;   /* as the reference's product: a NaN scale's NaN wins */
    }
}

/* The RHT along K in tiles of 16: y_i = (sum_j x_j * coef_t[j][i], in order j = 0..15) * 1/4. The 16 sums
 * run side by side (vectorized over i), each still adding its terms in order j = 0..15. */
void rht16(const float *x, int64_t R, int64_t K, const float *coef_t, float *y) {
    for (int64_t t = 0; t < R * K; t += 16) {
        float acc[16] = {0};
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) {
            float pj = x[t + j];
            for (int i = 0; i < 16; i++) acc[i] = acc[i] + pj * coef_t[j * 16 + i];
        }
        for (int i = 0; i < 16; i++) y[t + i] = acc[i] * 0.25f;
    }
}
