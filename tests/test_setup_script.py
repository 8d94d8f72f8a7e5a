"""``scripts/setup.sh`` (the README's first step) against the torch a machine already has: below pyproject.toml's
floor it stops with a message naming the version found, instead of letting pip replace it with the newest torch (a
multi-GB CUDA build on most machines); at or above the floor it installs autoprec. A fake ``torch`` and a fake
``pip`` (first on PYTHONPATH) stand in for both, so nothing is installed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_setup(tmp_path: Path, torch_version: str | None, **versions: str) -> subprocess.CompletedProcess:
    """setup.sh with a ``torch`` of ``torch_version`` (None: one that fails to import, as if there were none) and
    other modules of the given ``versions`` (``triton="3.6.0"``); the fake pip prints its arguments and exits 0."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "raise ImportError('no torch')\n" if torch_version is None else f"__version__ = {torch_version!r}\n")
    for module, version in versions.items():
        (tmp_path / module).mkdir()
        (tmp_path / module / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (tmp_path / "pip").mkdir()
    (tmp_path / "pip" / "__init__.py").write_text("")
    (tmp_path / "pip" / "__main__.py").write_text("import sys\nprint('pip', *sys.argv[1:])\n")
    env = os.environ | {"PYTHONPATH": str(tmp_path),
                        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "scripts/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("version", ["2.10.0+cu128", "2.8.0", "1.13.1"])
def test_setup_stops_on_a_torch_below_the_floor(tmp_path, version):
    out = run_setup(tmp_path, version)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"torch {version}" in out.stderr and "needs torch 2.11 or later" in out.stderr
    assert "pip" not in out.stdout  # nothing installed, torch not replaced


@pytest.mark.parametrize("version", ["2.11.0", "2.12.0a0+git1234", "2.13.0+cpu"])
def test_setup_installs_autoprec_beside_a_torch_at_or_above_the_floor(tmp_path, version):
    out = run_setup(tmp_path, version, triton="3.9.0", numpy="2.4.6")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["pip install --quiet --root-user-action=ignore -e .[test,triton]"]


def test_setup_installs_the_cpu_torch_first_where_there_is_none(tmp_path):
    out = run_setup(tmp_path, None, triton="3.9.0", numpy="2.4.6")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["pip install --quiet --root-user-action=ignore torch==2.13.0",
                                       "pip install --quiet --root-user-action=ignore -e .[test,triton]"]


@pytest.mark.parametrize("triton,numpy,pinned", [("3.6.0", "2.4.6", True), ("3.6.0", "2.3.5", False),
                                                 ("3.7.0", "2.4.6", False), ("3.5.1", "2.5.0rc1", True)])
def test_setup_keeps_numpy_below_2_4_beside_a_triton_before_3_7(tmp_path, triton, numpy, pinned):
    """Triton's interpreter before 3.7 (torch 2.11 pins 3.6) takes an int of a 1-element array, which numpy 2.4
    refuses: every interpreted kernel with a persistent loop fails. setup.sh installs numpy<2.4 there, and says so."""
    out = run_setup(tmp_path, "2.11.0", triton=triton, numpy=numpy)
    assert out.returncode == 0, out.stderr
    pins = ["pip install --quiet --root-user-action=ignore numpy<2.4"] if pinned else []
    assert out.stdout.splitlines() == ["pip install --quiet --root-user-action=ignore -e .[test,triton]", *pins]
    assert (f"triton {triton} with numpy {numpy}: installing numpy<2.4" in out.stderr) == pinned
