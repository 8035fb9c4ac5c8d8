"""The tinygrad import shim (tests/tinygrad_shim): it re-exports tgrad and adds no Tensor op; the runner's
case listing and internals rule; and tinygrad's test_ops (vendored at a9069c17) through the shim on every
device: a fixed subset of its cases (SUBSET), each failure one that is listed and explained here
(EVERYWHERE, CANNOT), at least as many passing as measured. The full runs (`python tests/tinygrad_shim/run.py
tests/tinygrad_shim/vendor/tinygrad_test_ops.py --device D`, or `--tinygrad <repo>`) take minutes a device:
not part of CI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SHIM = Path(__file__).parent / "tinygrad_shim"
REPO = SHIM.parent.parent
TEST_OPS = SHIM / "vendor" / "tinygrad_test_ops.py"

# test_ops cases that fail on every device, and why (tinygrad_shim/README.md: "What still fails")
EVERYWHERE = {
    "test_cmp_ne_backwards": "backward() with no requires_grad leaf: AutogradError, as PyTorch",
    "test_cmp_lt_backwards": "backward() with no requires_grad leaf: AutogradError, as PyTorch",
    "test_sum_dtype_arg": "sum(dtype='') raises DTypeError (a TypeError); tinygrad's, AttributeError",
    "test_prod_dtype_arg": "prod(dtype='') raises DTypeError (a TypeError); tinygrad's, AttributeError",
    "test_sigmoid_alt_extreme": "exp(300) overflows and the formula's gradient is nan; tinygrad rewrites it",
}
# what a device cannot do, each raising a DTypeError that names the dtype or the values: WGSL has no 64-bit
# integers (uint64 tensors are refused; int64 is held as int32, so values past it are refused); METAL,
# untested here, holds no uint16/32/64
CANNOT = {
    "WEBGPU": {"test_div_int": "a uint64 tensor", "test_and": "a uint64 tensor",
               "test_arange": "arange(2**31, 2**31 + 3): int64 values past int32"},
    "METAL": {"test_div_int": "a uint64 tensor", "test_and": "a uint64 tensor", "test_lshift": "uint32",
              "test_rshift": "uint32"},
}

# the cases CI runs per device (-k substrings, 44 cases): those that differed between devices (comparisons
# and minimum on bools, var/std over 0 or 1 elements, unsigned and 64-bit integers, a division of
# constants), the failures above, and one case of each kind of kernel (sum, matmul, cumsum, gather, softmax,
# pow, exp2, casts, where, mod). The whole file takes 5 to 25 minutes a device on two cores: not in CI
SUBSET = (
    "test_cmp_", "test_minimum", "test_maximum", "test_var_zero", "test_var_one", "test_std_zero",
    "test_std_one", "test_std_mean_loaded_nan", "test_arange", "test_div_int", "test_and", "test_lshift",
    "test_rshift", "test_int_or", "test_idiv_shift", "test_sum_dtype_arg", "test_prod_dtype_arg",
    "test_sigmoid_alt_extreme", "test_sum_simple", "test_matmul_simple", "test_cumsum", "test_gather",
    "test_softmax_argmax", "test_pow_full", "test_exp2", "test_cast", "test_where", "test_abs_exact",
    "test_mod",
)
# passing cases of SUBSET (1 more is skipped by the file on WEBGPU), measured per device (WEBGPU over Vulkan
# and OpenGL alike; tinygrad_shim/README.md); a device may only do better. METAL: not measured here
MIN_PASS = {"NUMPY": 39, "CPU": 39, "CL": 39, "TRITON": 39, "WEBGPU": 35, "METAL": 0}


def test_shim_reexports_tgrad_and_adds_no_ops():
    code = (
        "import sys; sys.path[:0] = sys.argv[1:3]; import tgrad; before = set(dir(tgrad.Tensor)); "
        "import tinygrad, tinygrad.tensor, tinygrad.helpers, tinygrad.nn.optim, tinygrad.nn.state; "
        "assert tinygrad.__file__.startswith(sys.argv[1]), tinygrad.__file__; "
        "assert tinygrad.Tensor is tgrad.Tensor and tinygrad.tensor.Tensor is tgrad.Tensor; "
        "assert tinygrad.dtypes is tgrad.dtypes and tinygrad.TinyJit is tgrad.TinyJit; "
        "assert set(dir(tgrad.Tensor)) == before, 'the shim changed Tensor'"
    )
    subprocess.run([sys.executable, "-c", code, str(SHIM), str(REPO)], check=True, cwd=REPO)


def test_a_few_tinygrad_cases_pass():
    run = [sys.executable, str(SHIM / "run.py"), str(TEST_OPS), "-k", "test_einsum"]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert " 0 fail, 0 error" in out, out


def test_tinygrad_op_tests_on_each_device(device, tmp_path):
    """SUBSET of tinygrad's test_ops through the shim on `device`: every failure listed and explained
    (EVERYWHERE, CANNOT[device]), and at least MIN_PASS[device] passing."""
    results = tmp_path / "results.json"
    run = [sys.executable, str(SHIM / "run.py"), str(TEST_OPS), "--device", device, "--jobs", "1",
           "--json", str(results), *(a for k in SUBSET for a in ("-k", k))]
    proc = subprocess.run(run, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    cases = {r["name"].split("::")[-1]: r for r in json.loads(results.read_text())}  # Class.test_name
    explained = {**EVERYWHERE, **CANNOT.get(device, {})}
    unexplained = {n: r["text"][-800:] for n, r in cases.items() if r["kind"] in ("fail", "error")
                   and n.split(".")[-1] not in explained}
    assert not unexplained, unexplained
    passed = sum(r["kind"] in ("pass", "pass_int64") for r in cases.values())
    assert passed >= MIN_PASS[device], proc.stdout[-3000:]


def test_runner_lists_cases_and_excludes_internals(tmp_path):
    """run.py's listing: test_* methods of TestCase classes, inherited ones included, and a case whose
    source (or a same-file helper it calls) names a tinygrad internal marked with that name."""
    sys.path.insert(0, str(SHIM))
    try:
        import run  # noqa: PLC0415 - the runner script, importable only from its folder
    finally:
        sys.path.remove(str(SHIM))
    src = (
        "import unittest\n"
        "def helper(t):\n  return t.uop.base\n"
        "class Base(unittest.TestCase):\n"
        "  def test_a(self): pass\n"
        "  def test_b(self):\n    if DEBUG >= 2: print(x.uop)\n"
        "class Child(Base):\n"
        "  def test_c(self): helper(1)\n"
        "  def test_d(self): GlobalCounters.reset()\n"
        "class NotATest:\n  def test_e(self): pass\n"
    )
    (tmp_path / "test_x.py").write_text(src)
    cases = dict(run.test_cases(tmp_path / "test_x.py"))
    assert cases == {"Base.test_a": None, "Base.test_b": None, "Child.test_a": None, "Child.test_b": None,
                     "Child.test_c": ".uop", "Child.test_d": "GlobalCounters"}


@pytest.mark.skipif(not os.environ.get("TGRAD_TINYGRAD_REPO"), reason="needs TGRAD_TINYGRAD_REPO")
def test_tinygrad_rearrange_cases_pass():
    repo = os.environ["TGRAD_TINYGRAD_REPO"]
    run = [sys.executable, str(SHIM / "run.py"), "--tinygrad", repo, "-k", "rearrange"]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert " 0 fail, 0 error" in out, out
