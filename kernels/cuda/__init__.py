"""GEMMs that torch's CUDA libraries run (cuBLAS's block-scaled GEMM, CUTLASS's grouped GEMMs), with the scale
layouts and argument checks they need. Importable without a GPU."""
