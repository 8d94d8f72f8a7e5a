"""autoprec kernels: bit-exact pure-torch references, their Triton versions, and the dispatch between them."""
from autoprec.kernels.dispatch import dequantize, quantize, scaled_mm
from autoprec.kernels.hadamard_ref import rht_ref, rht_signs
from autoprec.kernels.qmm_ref import qmm_ref
from autoprec.kernels.quantize_ref import dequantize_ref, fake_quantize_ref, quantize_ref
from autoprec.kernels.quantized import QuantizedTensor

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
