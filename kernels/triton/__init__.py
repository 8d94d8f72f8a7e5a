"""Triton kernels: quantizers (rows, columns, both copies, token groups, K groups, tile transposes) and GEMMs
(decoded to bf16, in-register tensor-core, fp32, grouped). Modules here import Triton; ``dispatch`` imports them
lazily so that autoprec runs where Triton is not installed."""
