"""The docs run: every Python block and shell command in README.md and docs/ is run here, or is an excerpt of an
example a test runs, or names the test or tool that runs it."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!-- excerpt of (?P<source>\S+) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)

# what a block may use without defining it: a small model, a batch, a compiled model that has run a step
PREAMBLE = """
import torch, autoprec
from gpt_model import TinyGPT, tokens
torch.manual_seed(0)
model = TinyGPT(vocab=64, d=64, layers=2, heads=2, ctx=32)
x, y = tokens(batch=8, ctx=32, vocab=64)
ckpt = {}
"""
COMPILED = "cmodel = torch.compile(model, backend='autoprec'); cmodel(x, y).backward()\n"

GPU = "needs a CUDA GPU"
COMMANDS = [  # (pattern of one command, how the suite covers it: "run", "slow", GPU, or the test that runs it)
    (r"bash scripts/setup\.sh", "tests/test_setup_script.py"),
    (r"python -m pytest\b.*", ".ci/run and this suite themselves"),
    (r"python examples/quickstart\.py", "run"),
    (r"python benchmarks/quality\.py --quick .*", "run"),
    (r"python benchmarks/damage_fit\.py --quick", "tests/test_examples.py"),
    (r"python benchmarks/kernels_gpu\.py --dry-run", "slow"),
    (r"OUT=\$OUT .*bash scripts/gpu_check\.sh", GPU),
]


def blocks(lang: str) -> list[tuple[str, str | None, str]]:
    """(page and block number, the example it is an excerpt of, body) of every ``lang`` block."""
    found = []
    for page in PAGES:
        for i, m in enumerate(m for m in BLOCK.finditer(page.read_text()) if m["lang"] == lang):
            found.append((f"{page.relative_to(ROOT)}#{i}", m["source"], m["body"]))
    return found


def commands() -> list[tuple[str, str]]:
    """(where, command) of every command in the shell blocks, ``&&`` chains split, comments dropped."""
    out = []
    for where, _, body in blocks("bash"):
        for line in body.splitlines():
            line = line.split(" # ")[0].strip()
            out += [(where, part.strip()) for part in line.split("&&") if part.strip()]
    return out


def coverage(command: str) -> str:
    cmd = command.removeprefix("OMP_NUM_THREADS=1 ")
    matches = [how for pattern, how in COMMANDS if re.fullmatch(pattern, cmd)]
    assert matches, f"no test covers the documented command {command!r}: add it to test_docs.COMMANDS"
    return matches[0]


def run_shell(command: str, tmp_path: Path) -> None:
    """``command`` as a shell runs it, ``python`` being this interpreter and ``$OUT`` a fresh folder."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OUT": str(tmp_path), "PATH": path}
    out = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, (command, out.stderr[-3000:])


def test_pages_have_blocks_and_every_command_is_covered():
    assert len(blocks("python")) >= 6 and len(commands()) >= 8
    for where, command in commands():
        how = coverage(command)
        if how.startswith("tests/"):
            assert (ROOT / how).exists(), (where, command, how)


def test_python_blocks_run(tmp_path):
    """Every Python block that is not an excerpt runs, in order, each in a fresh namespace over the preamble."""
    runnable = [(where, body) for where, source, body in blocks("python") if source is None]
    script = ["import torch._dynamo", "namespace = None"]
    for where, body in runnable:
        setup = PREAMBLE + (COMPILED if re.search(r"\bcmodel\b", body) and "cmodel =" not in body else "")
        script.append(f"torch._dynamo.reset()\nprint({where!r}, flush=True)\n"
                      f"exec(compile({setup + body!r}, {where!r}, 'exec'), {{}})")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "examples")}
    out = subprocess.run([sys.executable, "-c", "\n".join(script)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, (out.stdout[-500:], out.stderr[-3000:])
    assert [line for line in out.stdout.splitlines() if line in {w for w, _ in runnable}] == [w for w, _ in runnable]


def test_excerpts_name_an_example_a_test_runs():
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    excerpts = [(where, source) for where, source, _ in blocks("python") if source is not None]
    assert excerpts
    for where, source in excerpts:
        assert (ROOT / source).exists(), (where, source)
        assert re.search(rf"\b{Path(source).stem}\b", tests), f"{where}: no test runs {source}"


@pytest.mark.parametrize("command", sorted({c for _, c in commands() if coverage(c) == "run"}))
def test_documented_commands_run(command, tmp_path):
    run_shell(command, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted({c for _, c in commands() if coverage(c) == "slow"}))
def test_documented_long_commands_run(command, tmp_path):
    run_shell(command, tmp_path)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=GPU)
@pytest.mark.parametrize("command", sorted({c for _, c in commands() if coverage(c) == GPU}))
def test_documented_gpu_commands_run(command, tmp_path):
    run_shell(command, tmp_path)


def test_paths_named_in_the_docs_exist():
    """Every repository path the pages name in backticks (a file or folder, possibly with ``::test``) exists."""
    named = re.compile(r"`((?:kernels|passes|autoprec|examples|benchmarks|tests|scripts|docs)/[\w./-]+)(?:::\w+)?`")
    missing = [(page.name, path) for page in PAGES for path in named.findall(page.read_text())
               if not (ROOT / path).exists()]
    assert missing == []
