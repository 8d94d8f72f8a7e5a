#!/usr/bin/env bash
# Install autoprec with its test and Triton extras; on a machine without torch, the CPU torch 2.13.0 first.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install --quiet --root-user-action=ignore torch==2.13.0
fi
python -m pip install --quiet --root-user-action=ignore -e ".[test,triton]"
