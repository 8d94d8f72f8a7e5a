"""Every GPU kernel compiled for sm_90 and sm_100 on this CPU machine: the tensor-core GEMM's PTX uses
tensor-core MMA, and every cubin (the decode and epilogue kernels of the decoded + cuBLAS path too) fits the
parts' registers and shared memory. The default run checks the quick report (each autotuned quantizer at its
first tile, for sm_90 alone); the slow run, the full one (every tile and launch for both). The GEMM's
bf16 decode is exact or it hands over to the fp32 kernel. (Numerics against the reference:
test_triton_scaled_mm.py.)"""
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

import ptx_report as script

from autoprec.kernels import quantize_ref
from autoprec.kernels.core.operand import as_operand
from autoprec.kernels.dispatch import dense as dispatch
from autoprec.kernels.triton import quantize_cols as qc
from autoprec.kernels.triton import quantize_dual as qd
from autoprec.kernels.triton import quantize_grouped as qg
from autoprec.kernels.triton.quantize_rows import CONFIGS as QUANT_CONFIGS
from autoprec.kernels.triton.scaled_mm_tc import exact_decode_problem

# opt-in shared memory per block: A100, H100/H200, B200, RTX 50x0 / PRO 6000
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024}


@pytest.fixture(scope="module", params=["quick", pytest.param("full", marks=pytest.mark.slow)])
def report_scope(request) -> str:
    """Which report: the quick one (each autotuned quantizer at its first tile, for sm_90 alone; the grouped GEMMs
    for sm_90 and sm_100 alone), or the full one (slow)."""
    return request.param


@pytest.fixture(scope="module")
def ptx_report(report_scope) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the real compiler, not the interpreter
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    path = Path(__file__).with_name("ptx_report.py")
    flags = ["--quick"] if report_scope == "quick" else []
    out = subprocess.run([sys.executable, str(path), *flags], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def gemms(report: list[dict], cap: int) -> list[dict]:
    return [r for r in report if r["cap"] == cap and r["kernel"].startswith("tensor_core_gemm")]


def test_ptx_sm90_uses_wgmma(ptx_report):
    assert len(gemms(ptx_report, 90)) == 2 and all(r["wgmma"] for r in gemms(ptx_report, 90))


def test_ptx_sm100_uses_tcgen05(ptx_report):
    assert len(gemms(ptx_report, 100)) == 2 and all(r["tcgen05"] for r in gemms(ptx_report, 100))


def test_ptx_sm90_and_sm100_triton_gemm_over_decoded_operands_uses_tensor_cores(ptx_report):
    """The GEMM over operands decoded to bf16 in memory (``scaled_mm_decoded_triton``), compiled as a launch
    specializes it: wgmma on sm_90, tcgen05 on sm_100, pipelined through shared memory (96 KiB: three stages of
    two 128x64 bf16 tiles) without spilling (the cubin test below)."""
    decoded = {(r["kernel"], r["cap"]): r for r in ptx_report if r["kernel"].startswith("decoded_triton_gemm")}
    assert sorted(decoded) == [(f"decoded_triton_gemm_{f}", cap) for f in ("mxfp8", "nvfp4") for cap in (90, 100)]
    for (_, cap), r in decoded.items():
        assert r["wgmma" if cap == 90 else "tcgen05"] and r["shared"] >= 3 * 2 * 128 * 64 * 2, r


def test_ptx_sm90_and_sm100_tma_gemm_over_decoded_operands_copies_tiles_with_the_tma(ptx_report):
    """The same GEMM reading its tiles through tensor descriptors (``decoded_gemm_tma``, the benchmark's candidate):
    bulk tensor copies (``cp.async.bulk.tensor``) feeding wgmma on sm_90 and tcgen05 on sm_100, its 256x128x64 tile
    pipelined in three stages (144 KiB of shared memory) without spilling; the pointer-loading GEMM copies none."""
    tma = {(r["kernel"], r["cap"]): r for r in ptx_report if r["kernel"].startswith("decoded_tma_gemm")}
    assert sorted(tma) == [(f"decoded_tma_gemm_{f}", cap) for f in ("mxfp8", "nvfp4") for cap in (90, 100)]
    for (_, cap), r in tma.items():
        assert r["tma"] and r["wgmma" if cap == 90 else "tcgen05"] and r["shared"] >= 3 * 2 * (128 + 256) * 64, r
    assert not any(r["tma"] for r in ptx_report if r["kernel"].startswith("decoded_triton_gemm"))


def test_ptx_sm90_and_sm100_grouped_gemms_use_tensor_cores(ptx_report):
    """The experts' one-launch GEMMs (2d x 3d, and the wgrad's 2d x 2d): wgmma on sm_90 and tcgen05 on sm_100 for
    in-register NVFP4 and MXFP8 tiles and for pre-decoded bf16 tiles (the fp32 recompute has no tensor-core dot);
    the 2d x 3d kernel's equal groups (batched products) and the bf16 wgrad reading its operands in place likewise."""
    for cap, mma in ((90, "wgmma"), (100, "tcgen05")):
        grouped = {r["kernel"]: r[mma] for r in ptx_report if r["cap"] == cap and "_grouped_" in r["kernel"]}
        assert grouped == {f"{kind}_grouped_{layout}_{fmt}": kind == "tensor_core"
                           for layout in ("gemm", "wgrad")
                           for kind, fmt in (("tensor_core", "nvfp4"), ("tensor_core", "mxfp8"),
                                             ("tensor_core", "bf16"), ("fp32", "mxfp8"))} | {
            "tensor_core_grouped_batched_bf16": True, "fp32_grouped_batched_mxfp8": False,
            "tensor_core_grouped_wgrad_inplace_bf16": True}


@pytest.mark.slow
@pytest.mark.parametrize("report_scope", ["full"], indirect=True)  # the quick report compiles sm_90 and sm_100 alone
@pytest.mark.parametrize("cap", [80, 120])
def test_ptx_sm80_and_sm120_grouped_gemms_use_tensor_cores(ptx_report, cap):
    """sm_80 runs the experts' one-launch GEMMs for bf16 experts (torch's grouped GEMM loops on the host there), sm_120
    for quantized ones too (torch's block-scaled grouped GEMM refuses it): they compile for both with the warp-level
    tensor-core MMA (mma.sync), the fp32 recompute without. The full report's alone."""
    grouped = {r["kernel"]: r["mma_sync"] for r in ptx_report if r["cap"] == cap}
    assert grouped == {f"{kind}_grouped_{layout}_{fmt}": kind == "tensor_core" for layout in ("gemm", "wgrad")
                       for kind, fmt in (("tensor_core", "nvfp4"), ("tensor_core", "mxfp8"), ("tensor_core", "bf16"),
                                         ("fp32", "mxfp8"))} | {"tensor_core_grouped_batched_bf16": True,
                                                                "fp32_grouped_batched_mxfp8": False,
                                                                "tensor_core_grouped_wgrad_inplace_bf16": True}


def measured_caps(report_scope: str) -> tuple[int, ...]:
    """The targets the report compiles the quantizers for (the quick one: sm_90 alone)."""
    return (90, 100) if report_scope == "full" else (90,)


def test_ptx_sm90_and_sm100_quantizers_hash_their_sr_bits(ptx_report, report_scope):
    """Every quantizer compiled with SR hashes its bits in the kernel (but the ones given loaded bits), at each
    autotuned tile (the quick report: the first)."""
    def tiles(configs) -> int:
        return len(script.tiles(configs, report_scope == "full"))

    def on_sm90(*prefixes: str, hashed=lambda name: True) -> int:
        """How many of the kernels named ``prefixes...`` are compiled for sm_90, checking each one's SR hash."""
        found = [r for r in ptx_report if r["kernel"].startswith(prefixes)]
        assert found and all(r["sr_hash"] == hashed(r["kernel"]) for r in found), found
        return sum(r["cap"] == 90 for r in found)

    # SR bits loaded or hashed, and the six launch-specialized row kernels (round to nearest)
    assert on_sm90("quantize_nvfp4", "quantize_mxfp8", hashed=lambda name: "_hashed" in name) == 10 + 2 * (
        tiles(QUANT_CONFIGS) - 1)
    assert on_sm90("quantize_dual_nvfp4", "quantize_dual_mxfp8", "dual_launch") == (
        2 if report_scope == "full" else 1) * (tiles(qd.NVFP4_CONFIGS) + tiles(qd.MXFP8_CONFIGS))
    assert on_sm90("grouped_quantize_nvfp4", "grouped_quantize_mxfp8") == 2 * (tiles(qg.NVFP4_CONFIGS) + 1)
    assert on_sm90("batch_quantize_nvfp4", "batch_quantize_mxfp8") == 2 * tiles(qg.NVFP4_CONFIGS)
    assert on_sm90("k_groups_quantize_nvfp4", "k_groups_quantize_mxfp8") == tiles(qg.NVFP4_CONFIGS) + tiles(
        qg.MXFP8_CONFIGS)
    assert on_sm90("k_groups_cols_quantize_nvfp4", "k_groups_cols_quantize_mxfp8") == tiles(
        qc.NVFP4_CONFIGS) + tiles(qc.MXFP8_CONFIGS)


def test_ptx_sm90_and_sm100_row_quantizers_vectorize_loads_as_launched(ptx_report, report_scope):
    """Compiled as Triton specializes a launch on a row-major bf16 tensor (aligned, unit stride), the row
    quantizers read 16 bytes per load."""
    launched = [r for r in ptx_report if "_rows_launch" in r["kernel"] and r["cap"] == 90]
    # 2 tiles + integer RNE, 2 formats; FP8-block's rows
    assert len(launched) == 7 and all(r["vector_loads"] for r in launched)


def test_ptx_sm90_and_sm100_quantizers_round_to_nearest_with_the_hardware_conversions(ptx_report, report_scope):
    """Quantizers rounding to nearest convert with the GPU's saturating conversion where their launches take it
    (``launch.hardware_fp8``: MXFP8 from sm_89, ``round_and_encode_fp8``; ``launch.nvfp4_hardware``: NVFP4's E4M3
    block scales from sm_89, ``nvfp4_block_scales``, with SR too, and its E2M1 elements from sm_100, ``e2m1_pair``):
    the row quantizers as launched and a weight's column copy (dgrad's, in slices). At 32 elements per thread a
    row quantizer then takes fewer SASS instructions per element than the same kernel rounding in integer
    arithmetic, the interpreter's path: MXFP8 on sm_90 at most 0.85x (752 against 984 with Triton 3.9, 736 against
    880 with 3.6, the floor), NVFP4 on sm_100 at most 0.8x (640 against 960), NVFP4 on sm_90, whose elements have
    no conversion there, at most 0.95x (912 against 976). No kernel converts its elements with SR (the hardware's
    SR is not the reference's)."""
    fp8 = {"quantize_mxfp8_rows_launch", "quantize_mxfp8_rows_launch_br64_bk64", "cols_quantize_mxfp8_rne_launch",
           "quantize_fp8_block_rows_launch", "quantize_fp8_block_tiles_launch"}
    fp4 = {"quantize_nvfp4_rows_launch", "quantize_nvfp4_rows_launch_br64_bk64", "cols_quantize_nvfp4_rne_launch"}
    for cap in measured_caps(report_scope):
        rows = {r["kernel"]: r for r in ptx_report if r["cap"] == cap}
        nvfp4 = {name for name in rows if "nvfp4" in name and "quantize" in name or name == "rows_sr_launch_nvfp4"
                 or name.startswith("dual_launch_nvfp4")} - {"quantize_nvfp4_rows_launch_br64_bk64_integer"}
        # (every NVFP4 quantizer, for its block scales)
        assert nvfp4 and {name for name, r in rows.items() if r["fp8_cvt"]} == fp8 | nvfp4
        for fmt, bound in (("mxfp8", 0.85), ("nvfp4", 0.95)):
            hardware, integer = (rows[f"quantize_{fmt}_rows_launch_br64_bk64{tag}"] for tag in ("", "_integer"))
            assert per_element(hardware) <= bound * per_element(integer), (hardware, integer)
    converted = {(r["kernel"], r["cap"]) for r in ptx_report if r["fp4_cvt"]}
    assert converted == {(name, 100) for name in (fp4 if report_scope == "full" else fp4 & set(script.BLACKWELL_QUICK))}
    rows = {r["kernel"]: r for r in ptx_report if r["cap"] == 100}
    hardware, integer = (rows[f"quantize_nvfp4_rows_launch_br64_bk64{tag}"] for tag in ("", "_integer"))
    assert per_element(hardware) <= 0.8 * per_element(integer), (hardware, integer)


def test_ptx_sm90_and_sm100_column_copies_quantize_in_slices(ptx_report, report_scope):
    """Column copies as a launch compiles them (a row-major bf16 tensor blocked down its rows, the wgrad operands:
    NVFP4 with SR and RHT, MXFP8 with SR), and expert weights (E, K, N) as they lie (SR): the slice kernels, at
    every tile they tune over (the quick report: the first), take at most half the SASS instructions per element
    of the tile kernel on the same launch for MXFP8 and at most 0.6 for NVFP4, whose tile kernel loses least (on
    sm_90 column copies 76.5 against 146 since the tile kernel's RHT also runs on slices; expert weights, no RHT,
    72 against 127), and hash their SR bits; their RHT amax pass takes under half the tile amax pass's."""
    for cap in measured_caps(report_scope):
        rows = {r["kernel"]: r for r in ptx_report if r["cap"] == cap}
        for fmt, configs in (("nvfp4", qc.NVFP4_CONFIGS), ("mxfp8", qc.MXFP8_CONFIGS)):
            for kind, slices in (("cols", "cols"), ("batch", "batch_cols")):
                tile = rows[f"tile_{kind}_quantize_{fmt}_launch"]
                for cfg in script.tiles(configs, report_scope == "full"):
                    sliced = rows[f"{slices}_quantize_{fmt}_{script.tile_tag(cfg)}"]
                    bound = 0.6 if fmt == "nvfp4" else 0.5
                    assert sliced["sr_hash"] and per_element(sliced) <= bound * per_element(tile), (sliced, tile)
        amax, tile_amax = rows["cols_quantize_amax_rht"], rows["tile_cols_quantize_amax_rht_launch"]
        assert per_element(amax) <= per_element(tile_amax) / 2, (amax, tile_amax)
        # a pair's two amaxes from one read cost no more instructions than the two passes they replace
        both, plain = rows["cols_quantize_amax_rht_and_plain"], rows["quantize_amax"]
        assert per_element(both) <= per_element(amax) + per_element(plain), (both, amax, plain)


def test_ptx_sm90_and_sm100_one_read_quantizer_costs_no_more_than_the_two_kernels_it_replaces(ptx_report,
                                                                                              report_scope):
    """The one-read kernel on a row-major bf16 gradient (SR both ways, RHT on NVFP4's columnwise copy), as a launch
    compiles it: at every tile it tunes over (the quick report: the first), both copies take at most the SASS
    instructions per element of the rowwise kernel and the column slice kernel together, so the read it saves
    is not paid for in instructions."""
    for cap in measured_caps(report_scope):
        rows = {r["kernel"]: r for r in ptx_report if r["cap"] == cap}
        for fmt, configs, cols in (("nvfp4", qd.NVFP4_CONFIGS, qc.NVFP4_CONFIGS),
                                   ("mxfp8", qd.MXFP8_CONFIGS, qc.MXFP8_CONFIGS)):
            column = rows[f"cols_quantize_{fmt}_{script.tile_tag(cols[0])}"]
            two = per_element(rows[f"rows_sr_launch_{fmt}"]) + per_element(column)
            for cfg in script.tiles(configs, report_scope == "full"):
                one = rows[f"dual_launch_{fmt}_{script.tile_tag(cfg)}"]
                assert one["vector_loads"] and per_element(one) <= two, (one, two)


def test_ptx_sm90_and_sm100_mxfp8_decode_converts_in_hardware(ptx_report):
    """The decoded path's MXFP8 decode (sm_90's GEMMs decode each operand to bf16 before cuBLAS's GEMM), as a launch
    compiles it, reads its E4M3 codes through the GPU's exact fp8 conversion (``decode_fp8``: sm_89 on) and takes at
    most 0.6x the SASS instructions per element of the same kernel decoding in integer arithmetic (544 against 1008
    on sm_90: 17 per element, where an H200's HBM moves the byte in and the bf16 out in the time of about 20)."""
    for cap in (90, 100):
        rows = {r["kernel"]: r for r in ptx_report if r["cap"] == cap}
        hardware, integer = rows["decode_mxfp8_launch"], rows["decode_mxfp8_launch_integer"]
        assert hardware["fp8_decode"] and not integer["fp8_decode"] and hardware["vector_loads"]
        assert per_element(hardware) <= 0.6 * per_element(integer), (hardware, integer)


def test_ptx_sm90_and_sm100_decode_pair_keeps_one_operands_registers(ptx_report):
    """The decode launch of both operands (``decode_pair``) runs one body, its pointers and sizes selected per
    program, where the two operands' formats agree: then it needs no more registers than a decode of one operand
    did (32 on sm_90, 34 on sm_100 as a launch compiles the MXFP8 one; a branch per operand took 54 and 52). Formats
    apart (hybrid MXFP8's E5M2 and E4M3), a branch each, still in hardware and without spilling."""
    for cap in (90, 100):
        rows = {r["kernel"]: r for r in ptx_report if r["cap"] == cap}
        assert rows["decode_mxfp8_launch"]["regs"] <= 40, rows["decode_mxfp8_launch"]
        hybrid = rows["decode_mxfp8_hybrid_launch"]
        assert hybrid["fp8_decode"] and hybrid["stack"] == 0 and hybrid["regs"] <= 96, hybrid


def test_ptx_sm90_and_sm100_quantizers_fuse_only_exact_products(ptx_report):
    """The bit-exact kernels (those tiled BR x BK: quantizers, amax passes, decodes; not the GEMMs and their
    epilogue, whose tolerance is the accumulation order's) round like the references under FP fusion (Triton
    3.9's default): every fp32 FMA in their PTX comes from a source line marked ``FMA-safe``, whose product is
    exact (x·2**k, ±x), so its one rounding equals the multiply's and the add's."""
    kernels_dir = Path(qc.__file__).parent
    exact = [r for r in ptx_report if "per_thread" in r]
    assert len(exact) >= 20 and any(r["fma_lines"] for r in exact)
    for r in exact:
        for where in r["fma_lines"]:
            file, line = where.split(":")
            source = (kernels_dir / file).read_text().splitlines()[int(line) - 1] if file.endswith(".py") else ""
            assert "# FMA-safe" in source, (r["kernel"], r["cap"], where, source)


def test_ptx_sm90_fp8_block_quantizer_rounds_by_the_hardware_and_fuses_nothing(ptx_report):
    """Hopper's FP8-block quantizer as launched (1x128 rows, 128x128 tiles at its warps): E4M3 by the saturating
    conversion, no fp32 FMA (its scaling is one exact product), no register spills."""
    rows = {r["kernel"]: r for r in ptx_report if r["cap"] == 90 and r["kernel"].startswith("quantize_fp8_block")}
    assert len(rows) == 2
    for r in rows.values():
        assert r["fp8_cvt"] and not r["fma_lines"] and r["stack"] == 0, r


def per_element(report: dict) -> float:
    return report["instructions"] / report["per_thread"]


def test_ptx_cubin_fits_registers_and_shared_memory(ptx_report):
    assert {r["kernel"] for r in ptx_report} >= {"fp32_gemm_nvfp4", "decode_nvfp4", "decode_mxfp8", "epilogue",
                                                 "quantize_nvfp4", "quantize_mxfp8", "quantize_amax",
                                                 "quantize_nvfp4_hashed", "quantize_mxfp8_hashed",
                                                 "grouped_quantize_amax", "k_groups_quantize_amax"}
    for r in ptx_report:
        assert r["regs"] <= 255 and r["stack"] <= 64, r  # no real register spills
        assert r["shared"] <= SHARED_LIMIT[r["cap"]], r


def test_ptx_report_compiles_every_kernel_autoprec_launches():
    """Each Triton kernel a module of autoprec.kernels launches (``name[grid](...)`` in its source) is one
    ``ptx_report`` compiles for sm_90 and for sm_100 (the quick report: for sm_90), so a new kernel cannot miss the
    tests above."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import KernelInterface

    import autoprec.kernels

    def unwrapped(kernel):
        return kernel.fn if isinstance(kernel, Autotuner) else kernel

    def compiled(full: bool) -> set[tuple[int, int]]:
        return {(id(unwrapped(kernel)), cap) for (_, kernel, *_), cap in script.jobs(full)}

    launched = {}
    root = Path(autoprec.kernels.__file__).parent
    for path in sorted(root.rglob("*.py")):
        dotted = ".".join(path.relative_to(root).with_suffix("").parts)
        module = importlib.import_module(f"autoprec.kernels.{dotted}")
        for name in set(re.findall(r"\b(\w+)\[", path.read_text())):
            if isinstance(getattr(module, name, None), KernelInterface):
                launched[f"{dotted}.{name}"] = id(unwrapped(getattr(module, name)))
    assert len(launched) >= 20, launched
    full, quick = compiled(True), compiled(False)
    assert [(name, cap) for name, kernel in launched.items() for cap in (90, 100) if (kernel, cap) not in full] == []
    assert [name for name, kernel in launched.items() if (kernel, 90) not in quick] == []


def mx_operand(fmt: str, exponent: int):
    """An MXFP8 operand whose every block scale is 2**exponent."""
    q = quantize_ref(torch.ones(4, 32), fmt, 1)
    scales = torch.full_like(q.scales, exponent + 127)
    return as_operand(type(q)(q.fmt, q.codes, scales, None, q.axis, q.shape), 1, "a")


def test_sm90_exact_decode_range():
    assert exact_decode_problem(mx_operand("mxfp8", -117)) is None
    assert "leave bf16's exact range -117..119" in exact_decode_problem(mx_operand("mxfp8", -118))
    assert exact_decode_problem(mx_operand("mxfp8", 119)) is None
    assert exact_decode_problem(mx_operand("mxfp8", 120))
    assert exact_decode_problem(mx_operand("mxfp8_e5m2", 112)) is None
    assert exact_decode_problem(mx_operand("mxfp8_e5m2", 113))
    assert exact_decode_problem(as_operand(quantize_ref(torch.randn(4, 32), "nvfp4", 1), 1, "a")) is None


def test_sm90_dispatch_falls_back_where_bf16_is_not_exact(monkeypatch):
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    a = torch.randn(8, 64) * 2.0**-125  # scale exponents near -133: below bf16's normal range
    qa, qb = quantize_ref(a, "mxfp8", 1), quantize_ref(torch.randn(64, 16), "mxfp8", 0)
    oa, ob = as_operand(qa, 1, "a"), as_operand(qb, 0, "b")
    assert exact_decode_problem(oa)
    for capability in (None, (9, 0)):
        path, why = dispatch.gemm_path(capability, oa, ob)
        assert path == "fp32" and "bf16's exact range" in why
    monkeypatch.setenv("AUTOPREC_KERNELS", "ref")
    want = dispatch.scaled_mm(qa, qb)
    monkeypatch.setenv("AUTOPREC_KERNELS", "triton")
    got = dispatch.scaled_mm(qa, qb)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
