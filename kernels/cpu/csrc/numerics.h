/* Element arithmetic shared by the fused CPU kernels (quantize_cpu.c: rows, quantize_cols.c: columns).
 * Each function repeats a pure-torch reference (kernels/*_ref.py) operation for operation in fp32. */
#ifndef AUTOPREC_NUMERICS_H
#define AUTOPREC_NUMERICS_H
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
 * inner the size of the dims after the block axis; or, where a row subset is quantized (row_base not NULL,
 * inner 1), idx = row_base[r] + k. */
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

/* The E2M1 code of clamp(t, -6, 6) rounded to nearest, ties to even: round_to_element then e2m1_encode,
 * computed by comparing |t| with the midpoints between E2M1 magnitudes (0 0.5 1 1.5 2 3 4 6), strictly
 * where the tie goes down to an even code, inclusively where it goes up. NaN gives code 0; a value that
 * rounds to zero keeps its sign (code 8 for negative), as -0.0 does. */
INLINE uint8_t e2m1_rne_code(float t) {
    uint32_t b = bits_of(t);
    float a = float_of(b & 0x7FFFFFFFu);
    uint32_t mag = (uint32_t)(a > 0.25f) + (uint32_t)(a >= 0.75f) + (uint32_t)(a > 1.25f) + (uint32_t)(a >= 1.75f) +
                   (uint32_t)(a > 2.5f) + (uint32_t)(a >= 3.5f) + (uint32_t)(a > 5.0f);
    return (uint8_t)((mag | ((b >> 28) & 0x8)) & -(uint32_t)(t == t));
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

/* mxfp8_ref's E8M0 exponents from block amaxes: RCEIL clamp(ceil(log2(amax / max)), -127, 127) from the bits
 * of the fp32 quotient, or FLOOR floor(log2 amax) - emax; the scale byte (255 where bad) and 2**-e. */
INLINE void mx_scales(const float *amax, const uint8_t *bad, int64_t n, float maxv, int32_t emax, int floor_mode,
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

/* fp8_encode(round_to_element(t, mbits, 1 - bias, maxv, RNE)) from the bits: |t| clamped to maxv, then
 * normal values round their fp32 mantissa to mbits bits (ties to even; a carry moves to the next
 * exponent) and rebase the exponent, and values below 2**emin round onto the subnormal grid by adding
 * 2**(emin - mbits + 23), whose fp32 spacing is that grid's. NaN gives 0x7F. */
INLINE uint8_t fp8_rne_code(float t, int32_t mbits, int32_t bias, float maxv) {
    uint32_t b = bits_of(t), shift = 23 - (uint32_t)mbits;
    float a = float_of(b & 0x7FFFFFFFu);
    a = a > maxv ? maxv : a;                      /* torch.clamp(max=): NaN stays NaN */
    uint32_t ab = bits_of(a);
    uint32_t rounded = (ab + (1u << (shift - 1)) - 1 + ((ab >> shift) & 1)) >> shift;
    uint32_t normal = rounded - ((uint32_t)(127 - bias) << mbits);
    float magic = pow2(1 - bias - mbits + 23);
    uint32_t sub = bits_of(a + magic) - bits_of(magic);
    uint32_t out = ((b >> 24) & 0x80) | (a < pow2(1 - bias) ? sub : normal);
    return (uint8_t)(t != t ? 0x7F : out);
}

void nvfp4_scales(const float *amax, const uint8_t *bad, int64_t n, float f, float s_dec, float *s_b, float *e_b);

#endif
