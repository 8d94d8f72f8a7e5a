"""The bit-exact oracles in pure torch: NVFP4 and MXFP8 quantize / dequantize, rounding (RNE, SR), the random
Hadamard transform and the emulated quantized matmul. Every other implementation is tested against these."""
