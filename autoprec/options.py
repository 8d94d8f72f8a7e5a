"""Backend options (``torch.compile(..., options={...})``), validated into a frozen dataclass."""
from __future__ import annotations

from dataclasses import dataclass, fields

from autoprec.formats import closest

RECIPES = ("bf16", "mxfp8", "nvfp4")
INNER = ("aot_eager", "inductor")
SCALE_MODES = ("rceil", "floor")


@dataclass(frozen=True)
class CompileOptions:
    """What the autoprec backend was asked to do.

    recipe: fixed preset for every matmul (``bf16``, ``mxfp8``, ``nvfp4``: RTN, 1x16 scales).
    inner: how the rewritten forward/backward graphs run: ``aot_eager`` (GraphModules) or ``inductor``.
    seed: base seed of the stochastic-rounding bits and of the RHT signs.
    mx_scale: E8M0 scale rule for MXFP8 operands, ``rceil`` or ``floor``.
    """

    recipe: str = "mxfp8"
    inner: str = "aot_eager"
    seed: int = 0
    mx_scale: str = "rceil"

    def __post_init__(self) -> None:
        for name, valid in (("recipe", RECIPES), ("inner", INNER), ("mx_scale", SCALE_MODES)):
            value = getattr(self, name)
            if value not in valid:
                raise ValueError(
                    f"autoprec option {name}={value!r} is not valid; choose from {', '.join(valid)}"
                )
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise TypeError(f"autoprec option seed must be an int, got {type(self.seed).__name__}")


def parse_options(options: dict | CompileOptions | None) -> CompileOptions:
    """Options from the user's dict; an unknown key raises ValueError naming the valid ones."""
    if options is None:
        return CompileOptions()
    if isinstance(options, CompileOptions):
        return options
    if not isinstance(options, dict):
        raise TypeError(f"autoprec options must be a dict, got {type(options).__name__}")
    valid = [f.name for f in fields(CompileOptions)]
    for key in options:
        if key not in valid:
            raise ValueError(
                f"unknown autoprec option {key!r}; closest: {closest(str(key), valid)} "
                f"(valid options: {', '.join(valid)})"
            )
    return CompileOptions(**options)
