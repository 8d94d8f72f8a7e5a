#!/usr/bin/env bash
# Install autoprec with its test and Triton extras; on a machine without torch, the CPU torch 2.13.0 first. A torch
# older than pyproject.toml's floor (2.11) stops it: pip would otherwise replace it with the newest torch, on most
# machines a multi-GB CUDA build. Beside a Triton before 3.7 (torch 2.11's is 3.6), numpy goes below 2.4: those
# Triton interpreters (the CPU tests' Triton) take an int of a 1-element array, which numpy 2.4 refuses.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install --quiet --root-user-action=ignore torch==2.13.0
elif ! python -c "import sys, torch; sys.exit(tuple(map(int, torch.__version__.split('.')[:2])) < (2, 11))"; then
  echo "scripts/setup.sh: this python has torch $(python -c 'import torch; print(torch.__version__)'), and autoprec" \
    "needs torch 2.11 or later (pyproject.toml's dependencies): upgrade it (the tests use torch==2.13.0)," \
    "or run this in a fresh virtual environment" >&2
  exit 1
fi
python -m pip install --quiet --root-user-action=ignore -e ".[test,triton]"
if python -c "import sys, numpy, triton
minor = lambda m: tuple(map(int, m.__version__.split('.')[:2]))
sys.exit(not (minor(triton) < (3, 7) and minor(numpy) >= (2, 4)))" 2>/dev/null; then
  echo "scripts/setup.sh: triton $(python -c 'import triton; print(triton.__version__)') with numpy" \
    "$(python -c 'import numpy; print(numpy.__version__)'): installing numpy<2.4 (Triton's interpreter before 3.7" \
    "fails under numpy 2.4)" >&2
  python -m pip install --quiet --root-user-action=ignore "numpy<2.4"
fi
