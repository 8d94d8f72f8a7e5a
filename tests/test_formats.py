import pytest

from autoprec.formats import BF16, E2M1, E4M3, E5M2, MXFP8, MXFP8_E5M2, NVFP4, get_format


def test_bits_per_value_include_block_scales():
    assert NVFP4.bits_per_value == 4.5
    assert MXFP8.bits_per_value == 8.25
    assert MXFP8_E5M2.bits_per_value == 8.25
    assert BF16.bits_per_value == 16


def test_element_types():
    assert (E2M1.max, E2M1.emin, E2M1.emax, E2M1.bits) == (6.0, 0, 2, 4)
    assert (E4M3.max, E4M3.emin, E4M3.emax, E4M3.bits) == (448.0, -6, 8, 8)
    assert (E5M2.max, E5M2.emin, E5M2.emax, E5M2.bits) == (57344.0, -14, 15, 8)


def test_block_formats():
    assert (NVFP4.block_size, NVFP4.elem, NVFP4.scale.name, NVFP4.tensor_scale_bits) == (16, E2M1, "e4m3", 32)
    assert (MXFP8.block_size, MXFP8.elem, MXFP8.scale.name) == (32, E4M3, "e8m0")
    assert MXFP8_E5M2.elem is E5M2 and MXFP8.max_value == 448.0 and not BF16.quantized


def test_formats_are_frozen():
    with pytest.raises(AttributeError):
        NVFP4.block_size = 32


def test_get_format():
    assert get_format("NVFP4") is NVFP4 and get_format(MXFP8) is MXFP8
    with pytest.raises(ValueError, match="unknown format 'nvfp8'.*nvfp4"):
        get_format("nvfp8")
    with pytest.raises(TypeError):
        get_format(4)


def test_quant_spec_is_one_checked_value_per_operand():
    """One operand's quantization as one frozen value: names normalized to enums, wrong values named with the
    valid ones, and the kernels' keyword arguments from it."""
    from autoprec.quant_spec import QuantSpec, Rounding, ScaleRule

    spec = QuantSpec("NVFP4", 1, "sr", rht=True)
    assert spec.fmt == "nvfp4" and spec.rounding is Rounding.SR and spec.scale_rule is ScaleRule.RCEIL
    assert spec == QuantSpec("nvfp4", 1, Rounding.SR, True) and spec.rounding == "sr"
    assert spec.kwargs() == {"rounding": "sr", "tile2d": False, "scale_mode": "rceil", "rht": True}
    with pytest.raises(ValueError, match=r"unknown rounding 'sr2'; valid: sr"):
        QuantSpec("nvfp4", 1, "sr2")
    with pytest.raises(ValueError, match=r"unknown MX scale rule 'ceil'; valid: rceil"):
        QuantSpec("mxfp8", 0, scale_rule="ceil")
    with pytest.raises(ValueError, match="unknown format 'nvfp5'"):
        QuantSpec("nvfp5", 0)
