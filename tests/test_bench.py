"""Smoke test of the benchmark suite (`python -m bench`): tiny sizes, no timing assertions."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.workloads import all_workloads, elementwise, matmul, select

ROOT = Path(__file__).resolve().parent.parent


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def run_bench(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--tiny", "--json", str(out), *args],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| workload" in proc.stdout
    return json.loads(out.read_text())


def test_quick_elementwise_rows(tmp_path):
    pytest.importorskip("threadpoolctl")
    extra = ["--plot", str(tmp_path / "bench.png")] if _has("matplotlib") else []
    res = run_bench(tmp_path, "--only", "elementwise", "--device", "CPU,NUMPY,NOSUCH", *extra)
    if extra:
        assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"
    rows = {r["contender"]: r for r in res["results"]}
    available = {c["contender"]: c["available"] for c in res["contenders"]}
    reasons = {c["contender"]: c.get("reason", "") for c in res["contenders"]}
    assert {r["workload"] for r in res["results"]} == {"elementwise"}
    assert available["tgrad NOSUCH"] is False
    assert "unknown device" in reasons["tgrad NOSUCH"]
    for name in ("tgrad CPU", "tgrad NUMPY", "numpy"):
        assert rows[name]["status"] == "ok", rows[name]
        assert rows[name]["ms"] > 0 and rows[name]["gbs"] > 0 and rows[name]["gflops"] > 0
    for name in ("torch", "tinygrad"):
        if available.get(name):
            assert rows[name]["status"] == "ok", rows[name]
            assert rows[name]["ms"] > 0
    assert rows["numpy"]["x_numpy"] == pytest.approx(1.0)
    assert res["machine"]["threads"] == 2
    assert res["machine"]["thread_pools"], "threadpoolctl found no BLAS/OpenMP pool to report"


def test_peak_memory_row_reports_a_number(tmp_path):
    pytest.importorskip("threadpoolctl")
    res = run_bench(tmp_path, "--only", "peak_memory", "--device", "CPU", "--baselines", "numpy")
    rows = {r["contender"]: r for r in res["results"]}
    for name in ("tgrad CPU", "numpy"):
        assert rows[name]["status"] == "ok", rows[name]
        assert rows[name]["peak_mib"] >= 0 and rows[name]["ms"] > 0
    assert rows["tgrad CPU"]["host_peak_mib"] >= 0


def test_show_prints_a_saved_table(tmp_path, capsys):
    from bench.suite import show_saved

    saved = {
        "machine": {"date": "d", "cpu": "c", "cores": 2, "threads": 2, "load_average": [0.1],
                    "thread_pools": []},
        "contenders": [{"contender": "numpy", "available": True, "version": "2"},
                       {"contender": "tgrad CL", "available": False, "reason": "no OpenCL"}],
        "workloads": [{"name": "elementwise"}],
        "results": [{"workload": "elementwise", "contender": "numpy", "status": "ok", "ms": 2.0,
                     "min_ms": 1.5, "x_numpy": 1.0}],
    }
    (tmp_path / "r.json").write_text(json.dumps(saved))
    assert show_saved(str(tmp_path / "r.json")) == 0
    out = capsys.readouterr().out
    assert "| elementwise | numpy" in out and "2.000" in out and "1.500" in out
    assert "unavailable: no OpenCL" in out
    if _has("matplotlib"):  # --show r.json --plot p.png plots the saved results
        assert show_saved(str(tmp_path / "r.json"), str(tmp_path / "p.png")) == 0
        assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_skips_say_why(tmp_path):
    pytest.importorskip("threadpoolctl")
    res = run_bench(tmp_path, "--only", "conv2d,mlp_step_jit", "--device", "NUMPY", "--baselines", "numpy")
    assert {r["workload"] for r in res["results"]} == {"conv2d_fwd_bwd", "mlp_step_jit"}
    for r in res["results"]:
        assert r["status"] in ("ok", "skipped", "n/a"), r
        if r["status"] != "ok":
            assert r["reason"]


def test_select_and_sizes():
    names = [w.name for w in select(all_workloads(), ["matmul", "reduce_axis2"])]
    assert names == ["reduce_axis2", "matmul_256", "matmul_1024", "matmul_2048"]
    assert [w.name for w in select(all_workloads(), ["peak_memory"])] == ["peak_memory"]
    assert "matmul_2048" not in [w.name for w in all_workloads(quick=True)]
    assert elementwise().arg == 1 << 22 and matmul(1024).arg == 1024
    assert matmul(1024).flops == 2 * 1024**3


def test_check_catches_a_wrong_answer():
    from bench.suite import check

    wl = matmul(256, scale=1 / 4096)
    data = wl.make()
    good = data["a"] @ data["b"]
    assert check(wl, data, good) is None
    bad = good.copy()
    bad[0, 0] += 1.0
    assert "error" in check(wl, data, bad)
    assert "shape" in check(wl, data, np.zeros(3))


def test_predict_skips_a_size_too_slow_to_run():
    from bench.suite import predict_ms

    done = {("tgrad CPU", "matmul"): (10_000.0, matmul(1024).flops)}
    assert predict_ms(done, "tgrad CPU", matmul(2048)) == pytest.approx(80_000.0)
    assert predict_ms(done, "numpy", matmul(2048)) == 0.0


def test_model_rows_agree_with_torch(tmp_path):
    """cnn_step and gpt_step at batch 2: tgrad (TinyJit) and PyTorch start from the same weights; the
    first loss matches numpy's forward pass (else the row is 'wrong') and the loss after one Adam update
    matches PyTorch's (cross_check)."""
    pytest.importorskip("threadpoolctl")
    pytest.importorskip("torch")
    res = run_bench(tmp_path, "--only", "cnn_step,gpt_step", "--device", "CPU", "--baselines", "torch",
                    "--threads", "1", "--reps", "1")
    rows = {(r["workload"], r["contender"]): r for r in res["results"]}
    for wl in ("cnn_step", "gpt_step"):
        tg, pt = rows[(wl, "tgrad CPU")], rows[(wl, "torch")]
        assert pt["status"] == "ok" and tg["status"] == "ok", (tg, pt)
        assert tg["losses"][1] < tg["losses"][0]  # the step learned something
        np.testing.assert_allclose(tg["losses"], pt["losses"], rtol=2e-3)
        assert tg["x_torch"] > 0


def test_cross_check_catches_a_wrong_step():
    from bench.suite import cross_check
    from bench.workloads import gpt, mlp

    wl = gpt(scale=1 / 512)
    rows = [{"workload": wl.name, "contender": "torch", "status": "ok", "losses": [4.5, 4.1]},
            {"workload": wl.name, "contender": "tgrad CPU", "status": "ok", "losses": [4.5, 4.1001]},
            {"workload": wl.name, "contender": "tinygrad", "status": "ok", "losses": [4.5, 4.2]}]
    cross_check(wl, rows)
    assert rows[1]["status"] == "ok" and rows[2]["status"] == "wrong", rows
    assert "PyTorch's 4.1" in rows[2]["reason"]
    # mlp_step_jit has no PyTorch row: it is checked against PyTorch's eager_mlp_step
    jit = mlp(True)
    rows = [{"workload": "eager_mlp_step", "contender": "torch", "status": "ok", "losses": [2.4, 1.6]},
            {"workload": jit.name, "contender": "tgrad CPU", "status": "ok", "losses": [2.4, 1.7]}]
    cross_check(jit, rows)
    assert rows[1]["status"] == "wrong"


def test_old_row_names_still_select():
    names = [w.name for w in select(all_workloads(), ["mlp_step", "conv2d_fwd_bwd"])]
    assert names == ["conv2d_fwd_bwd", "eager_mlp_step", "mlp_step_jit"]
    assert [w.name for w in select(all_workloads(), ["cnn", "gpt"])] == ["cnn_step", "gpt_step"]


def test_plot_ratios_or_skip(tmp_path, monkeypatch, capsys):
    from bench.suite import add_ratios, plot
    from bench.workloads import mlp

    rows = [{"workload": "eager_mlp_step", "contender": "torch", "status": "ok", "ms": 2.0},
            {"workload": "eager_mlp_step", "contender": "tgrad CPU", "status": "ok", "ms": 4.0},
            {"workload": "mlp_step_jit", "contender": "tgrad CPU", "status": "ok", "ms": 1.0}]
    add_ratios(rows, {"mlp_step_jit": "eager_mlp_step"})
    assert rows[1]["x_torch"] == pytest.approx(0.5) and rows[2]["x_torch"] == pytest.approx(2.0)
    assert rows[2]["torch_ref"] == "eager_mlp_step"
    out = tmp_path / "p.png"
    if _has("matplotlib"):
        assert plot(rows, [mlp(False), mlp(True)], str(out))
        assert out.read_bytes()[:4] == b"\x89PNG"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    assert plot(rows, [mlp(False), mlp(True)], str(tmp_path / "q.png")) is False
    assert "matplotlib is not installed" in capsys.readouterr().err


def test_gpu_script_smoke_run_in_the_interpreter():
    """bench/gpu.py (what bench/gpu.sh times on a GPU) with tiny sizes on Triton's interpreter."""
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "bench/gpu.py", "--device", "TRITON", "--small"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split()[0] for line in proc.stdout.splitlines()[2:7]]
    assert rows == ["add", "(a*b+c).relu().sum()", "sum", "softmax", "matmul"], proc.stdout


def test_gpu_kernel_profile_names_each_kernel(capsys):
    pytest.importorskip("torch")
    from bench.gpu import kernel_profile
    from tgrad import Tensor

    a = Tensor(np.ones((64, 64), np.float32)).realize()
    kernel_profile(lambda: (a @ a).relu().sum().realize(), lambda: None, steps=2)
    out = capsys.readouterr().out
    assert "2 kernels per step" in out and "r_64_64_64" in out and "r_64_64" in out


def test_op_overhead_script_prints_every_row():
    """bench/op_overhead.py (the per-op Python overhead table of bench/HISTORY.md) runs and times each op."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "bench/op_overhead.py", "--calls", "3", "--repeat", "1"],
                          capture_output=True, text=True, cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| `")]
    assert len(rows) == 11 and all(float(r.split("|")[2]) > 0 for r in rows), proc.stdout


def test_tgrad_contender_settles_background_compiles_before_timing():
    """After the warm-up runs the suite calls settle(): with compile workers live, tgrad's contender waits
    for their jobs (the direct convolutions compile in the background meanwhile running BLAS) and runs once
    more, so that the timed runs use what they compiled; without workers it does nothing."""
    from bench.contenders import TgradContender

    class Pool:
        live = 1

    class Dev:
        pool = Pool()
        waited = 0

        def wait_for_compiles(self, timeout=120.0):
            self.waited += 1
            return True

    c = TgradContender("CPU", 2)
    c.dev = Dev()
    runs = []
    c.settle(lambda: runs.append(1))
    assert c.dev.waited == 1 and runs == [1]
    c.dev.pool.live = 0
    c.settle(lambda: runs.append(1))
    assert c.dev.waited == 1 and runs == [1]
