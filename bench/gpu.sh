#!/usr/bin/env bash
# On a machine with an NVIDIA or AMD GPU (about 5 minutes on 16 cores): every device-parametrized test file
# on the GPU, the Triton tests, then timings next to PyTorch on the same GPU (bench/gpu.py). Needs
# `pip install -e .[test,triton]` with a CUDA (or ROCm) build of torch. LOGS=dir keeps each part's output.
set -uo pipefail
cd "$(dirname "$0")/.."
unset TRITON_INTERPRET
PY="${PYTHON:-python}"
DEV="${DEV:-$($PY -c 'import torch; print("AMD" if torch.version.hip else "CUDA")')}"
JOBS="${JOBS:-$(( $(nproc) < 16 ? $(nproc) : 16 ))}"
LOGS="${LOGS:-/tmp/tgrad-gpu-logs}"
mkdir -p "$LOGS"
export TGRAD_CACHE="${TGRAD_CACHE:-$PWD/.tgrad-cache}" PYTHONUNBUFFERED=1
nvidia-smi -L 2>/dev/null || rocm-smi --showproductname 2>/dev/null || true
$PY -c 'import torch, triton, numpy; print("torch", torch.__version__, "triton", triton.__version__, "numpy", numpy.__version__)'
FILES="tests/test_ops.py tests/test_ops_more.py tests/test_smoke.py tests/test_memory.py tests/test_numerics.py
  tests/test_extremes.py tests/test_conv_grad.py tests/test_autodiff.py tests/test_nn.py tests/test_optim.py
  tests/test_jit.py tests/test_fusion.py tests/test_bfloat16.py tests/test_edge_values.py tests/test_jit_footguns.py
  tests/test_row_groups.py tests/test_to_device.py tests/test_bounds.py tests/test_host_take.py"
rc=0
# shellcheck disable=SC2086
TGRAD_TEST_DEVICES="$DEV" TGRAD_REQUIRE_DEVICES="$DEV" timeout "${TEST_TIMEOUT:-300}" \
    $PY -m pytest -n "$JOBS" -p no:cacheprovider -v --tb=short -rfE --timeout 60 $FILES 2>&1 | tee "$LOGS/tests.log" || rc=1
timeout 90 $PY -m pytest -n 4 -p no:cacheprovider -q -rfE tests/test_triton.py 2>&1 | tee "$LOGS/triton.log" || rc=1
timeout "${BENCH_TIMEOUT:-150}" $PY bench/gpu.py --device "$DEV" --profile 2>&1 | tee "$LOGS/bench.log" || rc=1
# every implicit-GEMM conv kernel against the same kernel as a plain reduction (TGRAD_TRITON_IMPLICIT_GEMM=0)
timeout 120 $PY bench/gpu_dot_check.py 2>&1 | tee "$LOGS/dot_check.log" || rc=1
exit $rc
