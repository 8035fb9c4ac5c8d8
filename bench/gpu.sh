#!/usr/bin/env bash
# On a machine with an NVIDIA or AMD GPU (under 5 minutes): the op suite and the Triton tests on the GPU,
# then timings next to PyTorch. Needs `pip install -e .[test,triton]` with a CUDA (or ROCm) build of torch.
set -euo pipefail
cd "$(dirname "$0")/.."
unset TRITON_INTERPRET
DEV="${DEV:-$(python -c 'import torch; print("AMD" if torch.version.hip else "CUDA")')}"
export TGRAD_CACHE="${TGRAD_CACHE:-$PWD/.tgrad-cache}"
nvidia-smi -L 2>/dev/null || rocm-smi --showproductname 2>/dev/null || true
TGRAD_TEST_DEVICES="$DEV" TGRAD_REQUIRE_DEVICES="$DEV" timeout 240 \
    python -m pytest -n 4 -p no:cacheprovider tests/test_ops.py tests/test_smoke.py tests/test_memory.py
timeout 60 python -m pytest -p no:cacheprovider tests/test_triton.py
timeout 120 python bench/gpu.py --device "$DEV"
