"""autoprec: per-GEMM precision planning (NVFP4 / MXFP8 / BF16) for torch.compile."""
from autoprec.formats import BF16, MXFP8, MXFP8_E5M2, NVFP4, Format, get_format

__version__ = "0.1.0"

__all__ = ["BF16", "MXFP8", "MXFP8_E5M2", "NVFP4", "Format", "get_format"]
