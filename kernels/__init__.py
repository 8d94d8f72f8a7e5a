"""autoprec kernels, by layer: ``core`` (quantized tensors, operands, SR bits), ``reference`` (the bit-exact
oracles), ``cpu`` (C kernels), ``cuda`` (torch's cuBLAS/CUTLASS GEMMs), ``triton`` (quantizers and GEMMs),
``dispatch`` (what runs where), then ``ops`` (the ``torch.ops.autoprec`` ops). See docs/kernels.md."""
from .core.quantized import QuantizedTensor
from .dispatch import dequantize, quantize, scaled_mm
from .reference.hadamard import rht_ref, rht_signs
from .reference.qmm import qmm_ref
from .reference.quantize import dequantize_ref, fake_quantize_ref, quantize_ref

__all__ = [
    "QuantizedTensor",
    "dequantize",
    "dequantize_ref",
    "fake_quantize_ref",
    "qmm_ref",
    "quantize",
    "quantize_ref",
    "rht_ref",
    "rht_signs",
    "scaled_mm",
]
