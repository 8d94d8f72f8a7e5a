"""autoprec: per-GEMM precision planning (NVFP4 / MXFP8 / BF16) for torch.compile."""
from autoprec.api import annotate, front, load_state_dict, plan, refresh_weights, state_dict
from autoprec.backend import autoprec_backend
from autoprec.export import export
from autoprec.formats import BF16, MXFP8, MXFP8_E5M2, NVFP4, Format, get_format
from autoprec.planner.plan import Decision, Plan
from autoprec.roles import MatmulRole

__version__ = "0.1.0"

__all__ = [
    "BF16", "MXFP8", "MXFP8_E5M2", "NVFP4", "Decision", "Format", "MatmulRole", "Plan",
    "annotate", "autoprec_backend", "export", "front", "get_format", "load_state_dict", "plan", "refresh_weights",
    "state_dict",
]
