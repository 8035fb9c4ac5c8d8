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


def run_bench(tmp_path: Path, *args: str, cwd: Path = ROOT, stdout: list | None = None) -> dict:
    out = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--tiny", "--json", str(out), *args],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| workload" in proc.stdout
    if stdout is not None:
        stdout.append(proc.stdout)
    return json.loads(out.read_text())


def test_quick_elementwise_rows(tmp_path):
    pytest.importorskip("threadpoolctl")
    extra = ["--plot"] if _has("matplotlib") else []  # a bare --plot picks a file name and says which
    printed = []
    res = run_bench(tmp_path, "--only", "elementwise", "--device", "CPU,NUMPY,NOSUCH", *extra, cwd=tmp_path,
                    stdout=printed)
    if extra:
        written = [line.split("wrote plot to ", 1)[1] for line in printed[0].splitlines()
                   if line.startswith("wrote plot to ")]
        assert len(written) == 1 and written[0].startswith("bench-") and written[0].endswith(".png"), printed
        assert (tmp_path / written[0]).read_bytes()[:4] == b"\x89PNG"
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
    assert rows["numpy"]["time_vs_numpy"] == pytest.approx(1.0)
    # one convention: time / numpy's (PyTorch's) time, lower is better, in the JSON and the table header
    cpu = rows["tgrad CPU"]
    assert cpu["time_vs_numpy"] == pytest.approx(cpu["ms"] / rows["numpy"]["ms"])
    if available.get("torch"):
        assert cpu["time_vs_torch"] == pytest.approx(cpu["ms"] / rows["torch"]["ms"])
    assert not any("x_numpy" in r or "x_torch" in r for r in res["results"])
    assert "lower is better" in res["convention"]["time_vs_torch"]
    header = next(line for line in printed[0].splitlines() if line.startswith("| workload"))
    assert "time/numpy" in header and "time/torch" in header and "x torch" not in header
    assert "lower is better" in printed[0].split("| workload")[0].splitlines()[-1]
    # --tiny runs 2**22 / 512 elements under the full-size name: the size column and the JSON say so
    assert res["workloads"][0]["size"] == "8K"
    assert any(line.startswith("| elementwise | 8K ") for line in printed[0].splitlines()), printed
    assert "--tiny" in printed[0].splitlines()[0]
    # the NUMPY reference interpreter is marked software (left off the plot's ratio panel)
    status = {c["contender"]: c for c in res["contenders"]}
    assert status["tgrad NUMPY"]["software"] is True and not status["tgrad CPU"].get("software")
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
                     "min_ms": 1.5, "x_numpy": 1.0},
                    # a file saved before the convention changed: x_torch was PyTorch's time / this row's
                    {"workload": "elementwise", "contender": "tgrad CPU", "status": "ok", "ms": 1.0,
                     "min_ms": 0.9, "x_torch": 4.0}],
    }
    (tmp_path / "r.json").write_text(json.dumps(saved))
    assert show_saved(str(tmp_path / "r.json")) == 0
    out = capsys.readouterr().out
    assert "| elementwise |      | numpy" in out and "2.000" in out and "1.500" in out
    assert "unavailable: no OpenCL" in out
    cpu_row = next(line for line in out.splitlines() if "| tgrad CPU" in line)
    assert [c.strip() for c in cpu_row.split("|")][6:8] == ["", "0.25"]  # time/numpy, time/torch
    if _has("matplotlib"):  # --show r.json --plot (no path) plots the saved results to r.png
        from bench.suite import main

        assert main(["--show", str(tmp_path / "r.json"), "--plot"]) == 0
        assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
        assert f"wrote plot to {tmp_path / 'r.png'}" in capsys.readouterr().out


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
    # --quick keeps the full-size names; the size says what runs: 1024**3 / 8 multiply-adds is 512x512
    quick = {w.name: w for w in all_workloads(1 / 8, quick=True)}
    assert quick["matmul_1024"].size == "512x512" and quick["matmul_1024"].arg == 512
    assert quick["eager_mlp_step"].size == "batch 16" and all_workloads()[0].size == "4M"


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
        assert tg["time_vs_torch"] == pytest.approx(tg["ms"] / pt["ms"])


def test_compiled_peers_agree_with_torch(tmp_path):
    """torch.compile (the MLP step) and JAX (jax.jit of the whole step with Adam written out: MLP, CNN,
    GPT) start from the same weights: the first loss matches numpy's forward pass and the loss after one
    update PyTorch's eager step (cross_check marks a mismatch 'wrong')."""
    pytest.importorskip("threadpoolctl")
    pytest.importorskip("torch")
    baselines = ["torch", "torch.compile"] + (["jax"] if _has("jax") else [])
    only = "eager_mlp_step,mlp_step_jit" + (",cnn_step,gpt_step" if _has("jax") else "")
    res = run_bench(tmp_path, "--only", only, "--device", "NUMPY", "--baselines", ",".join(baselines),
                    "--threads", "1", "--reps", "1")
    rows = {(r["workload"], r["contender"]): r for r in res["results"]}
    checked = [("mlp_step_jit", "torch.compile")]
    if _has("jax"):
        checked += [(wl, "jax") for wl in ("mlp_step_jit", "cnn_step", "gpt_step")]
    for wl, contender in checked:
        r = rows[(wl, contender)]
        want = rows[("eager_mlp_step" if wl == "mlp_step_jit" else wl, "torch")]
        assert r["status"] == "ok", r
        np.testing.assert_allclose(r["losses"], want["losses"], rtol=2e-3)
        assert r["losses"][1] < r["losses"][0]
    # what a compiled peer does not run says why
    assert rows[("eager_mlp_step", "torch.compile")]["status"] == "n/a"


def test_beam_flag_searches_and_says_so(tmp_path, monkeypatch):
    """--beam 2: tgrad's kernels are searched (BEAM=2 reaches tgrad's optimizer: its choices land in the
    kernel cache's beam/), the values stay right and the header and the JSON's args say so."""
    monkeypatch.setenv("TGRAD_CACHE", str(tmp_path / "cache"))
    out: list = []
    res = run_bench(tmp_path, "--only", "softmax", "--device", "CPU", "--baselines", "numpy", "--beam", "2",
                    "--reps", "1", stdout=out)
    assert "BEAM=2" in out[0].splitlines()[0]
    assert res["args"]["beam"] == 2
    row = next(r for r in res["results"] if r["contender"] == "tgrad CPU")
    assert row["status"] == "ok", row
    assert list((tmp_path / "cache").rglob("beam/*.json")), "no kernel was searched"


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
    # a kind names every row of it; a row's name only that row (cnn_step is not cnn_b32_step's prefix)
    models = [w.name for w in select(all_workloads(), ["cnn", "gpt"])]
    assert models == ["cnn_step", "cnn_b32_step", "gpt_step", "gpt_4x128_step", "gpt_w256_step",
                      "gpt2_decode", "gpt2_prefill"]
    assert [w.name for w in select(all_workloads(), ["cnn_step", "gpt_step"])] == ["cnn_step", "gpt_step"]
    assert [w.name for w in select(all_workloads(), ["gpt_step", "gpt2_p"])] == ["gpt_step", "gpt2_prefill"]


def test_second_model_shapes():
    """Issue 42's rows at shapes nobody tuned for: the CNN at batch 32, a 4-layer width-128 GPT at context
    128 (4 heads); the numpy reference loss follows the shape (heads from the workload)."""
    from bench.workloads import cnn, gpt

    c = cnn(1.0, 32, "cnn_b32_step")
    assert c.arg == 32 and c.make()["x"].shape == (32, 1, 28, 28)
    g = gpt(1.0, "gpt_4x128_step")
    assert g.arg == (8, 128, 4)
    d = g.make()
    assert d["x"].shape == (8, 128) and d["wte"].shape[1] == 128
    assert sum(k.endswith(".ln1w") for k in d) == 4
    w = gpt(1.0, "gpt_w256_step")  # the wide one: 8 heads of 32
    assert w.arg == (16, 64, 8) and w.make()["wte"].shape[1] == 256


def test_plot_ratios_or_skip(tmp_path, monkeypatch, capsys):
    from bench.plot import plot
    from bench.suite import add_ratios
    from bench.workloads import mlp

    rows = [{"workload": "eager_mlp_step", "contender": "torch", "status": "ok", "ms": 2.0},
            {"workload": "eager_mlp_step", "contender": "tgrad CPU", "status": "ok", "ms": 4.0},
            {"workload": "mlp_step_jit", "contender": "tgrad CPU", "status": "ok", "ms": 1.0}]
    add_ratios(rows, {"mlp_step_jit": "eager_mlp_step"})
    # time / PyTorch's time: twice PyTorch's time is 2, half of it 0.5
    assert rows[1]["time_vs_torch"] == pytest.approx(2.0) and rows[2]["time_vs_torch"] == pytest.approx(0.5)
    assert rows[2]["torch_ref"] == "eager_mlp_step"
    out = tmp_path / "p.png"
    if _has("matplotlib"):
        assert plot(rows, [mlp(False), mlp(True)], str(out))
        assert out.read_bytes()[:4] == b"\x89PNG"
        assert f"wrote plot to {out}" in capsys.readouterr().out
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    assert plot(rows, [mlp(False), mlp(True)], str(tmp_path / "q.png")) is False
    assert "matplotlib is not installed" in capsys.readouterr().err


def test_plot_title_panels_and_notes():
    """The title says where and how it ran; the software contenders stay off the ratio panel unless asked;
    a row without a PyTorch counterpart says so; every value label stays inside its panel."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from bench.plot import figure
    from bench.suite import add_ratios
    from bench.workloads import all_workloads, select

    wls = select(all_workloads(1 / 8, quick=True), ["matmul_1024", "compile_cold"])
    rows = [{"workload": "matmul_1024", "contender": c, "status": "ok", "ms": ms}
            for c, ms in (("torch", 2.0), ("tgrad CPU", 1.0), ("tgrad NUMPY", 900.0),
                          ("tgrad WEBGPU", 0.004))]
    rows.append({"workload": "compile_cold", "contender": "tgrad CPU", "status": "ok", "ms": 2000.0})
    add_ratios(rows)
    machine = {"date": "2026-12-06 20:00 UTC", "cpu": "Some CPU v2", "cores": 2, "threads": 2,
               "commit": "abc1234"}
    software = {"tgrad NUMPY": "the reference interpreter", "tgrad WEBGPU": "llvmpipe (Vulkan)"}
    fig = figure(rows, wls, machine, "--quick (element counts x 1/8)", software)
    try:
        top, ratio = fig.axes[:2]
        title = fig._suptitle.get_text()
        for part in ("2026-12-06 20:00 UTC", "Some CPU v2", "2 cores", "--quick", "abc1234"):
            assert part in title, title
        assert {b.get_label() for b in ratio.containers} == {"torch", "tgrad CPU"}
        everyone = {"torch", "tgrad CPU", "tgrad NUMPY", "tgrad WEBGPU"}
        assert {b.get_label() for b in top.containers} == everyone
        ticks = [t.get_text() for t in ratio.get_xticklabels()]
        assert ticks == ["matmul_1024\n512x512", "compile_cold\nbatch 128"]
        assert "no PyTorch row" in [t.get_text() for t in ratio.texts]
        assert "compile_cold" in ratio.get_xlabel() and "tgrad NUMPY" in ratio.get_xlabel()
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        frame = ratio.get_window_extent(renderer)
        labels = [t for t in ratio.texts if t.get_text() in ("0.5", "1")]
        assert len(labels) == 2
        for t in ratio.texts:
            box = t.get_window_extent(renderer)
            assert frame.y0 <= box.y0 and box.y1 <= frame.y1 and frame.x0 <= box.x0 and box.x1 <= frame.x1, t
    finally:
        plt.close(fig)
    fig = figure(rows, wls, machine, "--quick", software, all_ratios=True)
    try:
        assert {b.get_label() for b in fig.axes[1].containers} == everyone
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        frame = fig.axes[1].get_window_extent(renderer)
        for t in fig.axes[1].texts:  # 450 and 0.002 on one log axis: the labels still fit
            box = t.get_window_extent(renderer)
            assert frame.y0 <= box.y0 and box.y1 <= frame.y1, t
    finally:
        plt.close(fig)


def test_missing_matplotlib_is_said_before_the_run(tmp_path, monkeypatch, capsys):
    from bench.suite import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    argv = ["--tiny", "--only", "elementwise", "--baselines", "", "--plot", str(tmp_path / "x.png")]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert "matplotlib is not installed" in out.err and "pip install matplotlib" in out.err
    assert "| workload" not in out.out and "elementwise" not in out.err  # nothing ran
    assert not (tmp_path / "x.png").exists()


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
    # the same convention as the suite: time / PyTorch's time (tgrad ms / torch ms), lower is better
    assert "time/torch" in proc.stdout.splitlines()[1] and "lower is better" in proc.stdout.splitlines()[1]
    for line in proc.stdout.splitlines()[2:7]:
        cells = line.split()
        ours, theirs, ratio = float(cells[-5]), float(cells[-2]), float(cells[-1])
        # (each ms is printed to 0.001 ms: the ratio lies within what the rounded values allow)
        low, high = (ours - 5e-4) / (theirs + 5e-4), (ours + 5e-4) / max(theirs - 5e-4, 1e-9)
        assert low - 0.005 <= ratio <= high + 0.005, line


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


def test_kernel_capture_records_programs_and_compares(monkeypatch, capsys):
    """bench.kernel_capture records each compiled CPU program (a matmul's BLAS plan among them, its value
    as numpy's) and --compare counts the records only one side has."""
    from bench import kernel_capture

    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 256)).astype(np.float32)
    b = rng.standard_normal((256, 64)).astype(np.float32)
    got = []

    def one_matmul():
        from tgrad import Tensor

        got.append((Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy())

    monkeypatch.setattr(kernel_capture, "_workloads", one_matmul)
    from tgrad.device import get_runtime

    rt = get_runtime("CPU")
    rt.set_props(rt.props)  # (forgets the kernels compiled so far: an earlier test may have made this one)
    found = kernel_capture.record()
    np.testing.assert_allclose(got[0], a @ b, rtol=1e-4, atol=1e-4)
    assert any(r[0] == "kernel" and r[3].startswith("BlasPlan(") for r in found), found
    records = json.loads(json.dumps(found))
    assert kernel_capture.compare(records, records) == 0
    changed = [records[0][:2] + ["another digest"] + records[0][3:], *records[1:]]
    assert kernel_capture.compare(records, changed) == 2
    assert "1 only before, 1 only after" in capsys.readouterr().out
