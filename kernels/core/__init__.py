"""What every kernel layer shares: quantized tensors and their copies' settings, GEMM operands, the SR bit hash,
the kernel-mode switch and host-side launch arithmetic. Imports nothing else from ``autoprec.kernels``."""
