"""The tinygrad import shim (tests/tinygrad_shim): it re-exports tgrad and adds no Tensor op; the runner's
case listing and internals rule. With TGRAD_TINYGRAD_TESTS pointing at tinygrad's test/backend/test_ops.py
or TGRAD_TINYGRAD_REPO at a tinygrad checkout, a few of their cases run here too (the full runs,
`python tests/tinygrad_shim/run.py <test_ops.py>` or `--tinygrad <repo>`, take minutes: not part of CI)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SHIM = Path(__file__).parent / "tinygrad_shim"
REPO = SHIM.parent.parent


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


@pytest.mark.skipif(
    not os.environ.get("TGRAD_TINYGRAD_TESTS"), reason="set TGRAD_TINYGRAD_TESTS to tinygrad's test_ops.py"
)
def test_a_few_tinygrad_cases_pass():
    run = [sys.executable, str(SHIM / "run.py"), os.environ["TGRAD_TINYGRAD_TESTS"], "-k", "test_einsum"]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert " 0 fail, 0 error" in out, out


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
