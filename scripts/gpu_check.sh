#!/usr/bin/env bash
# One pass on a CUDA machine whose python3 already has torch and triton (no network needed): the machine,
# the GPU tests (tests/test_gpu_quantize.py, tests/test_gpu_cuda.py and the Triton kernel tests, which run on
# CUDA where there is one), then benchmarks/kernels_gpu.py. Each stage has its own time limit, so one that
# fails or runs long leaves the others' numbers. Logs go to $OUT (default ./gpu_out).
#   bash scripts/gpu_check.sh            LAYERS=8 TEST_S=240 TRITON_TEST_S=120 BENCH_S=150 STEP_S=300 to size the
#                                        stages (about 780 s in all with these: a lent GPU has 900, one
#                                        command at most 600), STAGES="tests triton_tests" then
#                                        STAGES="kernels step" to run them in two commands
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
cd "$(dirname "$0")/.."

STAGES=" ${STAGES:-tests triton_tests kernels step} "

stage() {  # stage NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.txt, print its tail and time
    local name=$1 limit=$2 began=$SECONDS
    shift 2
    [[ $STAGES == *" $name "* ]] || return 0
    echo "=== $name (limit ${limit}s)"
    timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    tail -n "${TAIL:-40}" "$OUT/$name.txt"
    echo "=== $name: rc=$rc in $((SECONDS - began))s"
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used,memory.total --format=csv
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"

# autoprec without its dependencies (the machine's torch stays); a copied package tree where pip cannot
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.txt" 2>&1; then
    tail -3 "$OUT/install.txt"
    mkdir -p /tmp/site/autoprec && cp -r autoprec/. /tmp/site/autoprec/ && cp -r kernels /tmp/site/autoprec/kernels \
        && cp -r passes /tmp/site/autoprec/passes && export PYTHONPATH=/tmp/site
fi

xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
pytest_gpu=(python3 -m pytest -p no:cacheprovider -o addopts="" -q -rf -m "not slow" $xdist)
# the CUDA-only tests first (every tile forced, the paths dispatch picks, compiled steps), then the Triton
# kernel tests on the GPU (the interpreter already checks their numerics on a CPU)
TAIL=25 stage tests "${TEST_S:-240}" "${pytest_gpu[@]}" tests/test_gpu_quantize.py tests/test_gpu_cuda.py
TAIL=15 stage triton_tests "${TRITON_TEST_S:-120}" "${pytest_gpu[@]}" tests/test_triton_quantize.py \
    tests/test_triton_scaled_mm.py tests/test_grouped_quantize.py tests/test_sm90_grouped_gemm.py \
    tests/test_sm90_grouped_wgrad.py tests/test_wgrad_bf16_triton.py tests/test_gemm_choice.py
stage kernels "${BENCH_S:-150}" python3 benchmarks/kernels_gpu.py --no-step
stage step "${STEP_S:-300}" python3 benchmarks/kernels_gpu.py --step-only --profile --graphs --layers "${LAYERS:-24}"
