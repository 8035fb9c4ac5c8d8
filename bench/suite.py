"""`python -m bench`: run every workload on every contender in one process and print one table.

Each cell: build (inputs converted, not timed), `warmup` runs (compiles happen here, not timed; the first
result is checked against numpy), then timed runs until `reps` runs or `budget` seconds, at least one.
The cell's number is the median. Everything runs under threadpoolctl's limit, so numpy's BLAS and
PyTorch use the same thread count as tgrad's Numba kernels.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import gpt2
from bench.contenders import Contender, NotApplicable, Skip, Unavailable, all_contenders, software_name, timed
from bench.plot import have_matplotlib, plot
from bench.workloads import Workload, all_workloads, select

TGRAD_DEVICES = ["CPU", "NUMPY", "CL", "WEBGPU", "TRITON"]
BASELINES = ["numpy", "numba", "torch", "tinygrad", "torch.compile", "jax"]
ROOT = Path(__file__).resolve().parent.parent
# the one convention of the table, the JSON (time_vs_numpy / time_vs_torch), the plot and bench/README.md
CONVENTION = ("time/numpy, time/torch, time/compile: this row's median time / numpy's, PyTorch's, "
              "torch.compile's (lower is better: 0.5 = twice as fast, 2 = twice as slow)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a short run: sizes / 8, fewer runs, no 2048 matmul")
    p.add_argument("--tiny", action="store_true", help="tiny sizes (for the smoke test); implies --quick")
    p.add_argument("--size-scale", type=float, default=None, help="multiply element counts by this")
    p.add_argument("--only", default="", help="comma-separated workload names or prefixes (matmul, reduce)")
    p.add_argument("--device", default="", help=f"tgrad devices to try (default {','.join(TGRAD_DEVICES)})")
    p.add_argument("--baselines", default=",".join(BASELINES), help="comma-separated subset of "
                   f"{','.join(BASELINES)} (empty for none)")
    p.add_argument("--beam", type=int, default=0, metavar="N", help="BEAM=N for tgrad's devices: each "
                   "kernel's opts searched by timing launches (tgrad/opt/search.py; choices cached on disk)")
    p.add_argument("--threads", type=int, default=2, help="threads for every contender (default 2)")
    p.add_argument("--reps", type=int, default=None, help="timed runs per cell (default 10, quick 3)")
    p.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 2, quick 1)")
    p.add_argument("--budget", type=float, default=None, help="seconds of timed runs per cell (default 3)")
    p.add_argument("--max-run-s", type=float, default=120, help="skip a run predicted (from the same "
                   "contender's smaller size) to take longer than this (default 120)")
    p.add_argument("--show", default=None, metavar="JSON", help="print the table of a saved --json file")
    p.add_argument("--json", dest="json_path", default=None, help="write the results here")
    p.add_argument("--plot", nargs="?", const="", default=None, metavar="PNG",
                   help="write log-scale bar charts here (PNG; no path: bench-DATE.png, or the --show file's "
                   "name with .png)")
    p.add_argument("--plot-all-ratios", action="store_true", help="keep the NUMPY reference and CPU-run GPU "
                   "APIs (PoCL, lavapipe, Triton's interpreter) on the plot's time / PyTorch panel")
    args = p.parse_args(argv)
    args.quick = args.quick or args.tiny
    if args.size_scale is None:
        args.size_scale = 1 / 512 if args.tiny else 1 / 8 if args.quick else 1.0
    args.reps = args.reps or (3 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.budget = args.budget if args.budget is not None else (0.5 if args.quick else 3.0)
    return args


def _split(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def set_threads(threads: int):
    """Limit every thread pool to `threads`; returns the threadpoolctl limiter (a context manager)."""
    os.environ.setdefault("NUMBA_NUM_THREADS", str(threads))
    os.environ.setdefault("NUM_CPU_THREADS", str(threads))
    # PyTorch first: with Numba's thread pool started before torch is imported, torch's CPU flash
    # attention ran 70x slower on 2 cores (the gpt_step row: 1.1 s instead of 15 ms)
    try:
        import torch

        torch.set_num_threads(threads)
        # torch.optim imports torch._dynamo, which imports triton (when installed); triton's bundled
        # LLVM segfaults on import once wgpu's Vulkan driver (lavapipe, its own LLVM) is loaded, so
        # import it before any tgrad device opens
        import torch._dynamo  # noqa: F401
    except ImportError:
        pass
    try:
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    except ImportError:
        pass
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads)


def machine_info(threads: int) -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from threadpoolctl import threadpool_info

    pools = [
        {k: p.get(k) for k in ("internal_api", "version", "architecture", "num_threads", "threading_layer")}
        for p in threadpool_info()
    ]
    try:
        import numba

        numba_threads = numba.get_num_threads()
    except ImportError:
        numba_threads = None
    return {
        "commit": commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "threads": threads,
        "numba_threads": numba_threads,
        "thread_pools": pools,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE"),
    }


def commit() -> str:
    """The checkout's short commit hash, '+changes' when tracked files differ from it ('?' outside git)."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return (head + ("+changes" if dirty else "")) if head else "?"


def mode(args: dict) -> str:
    """How the sizes were chosen, for headers and the plot's title: '--quick (element counts x 1/8)'."""
    scale = args.get("size_scale") or 1.0
    flag = "--tiny" if args.get("tiny") else "--quick" if args.get("quick") else "full sizes"
    beam = f", BEAM={args['beam']}" if args.get("beam") else ""
    if scale == 1.0:
        return flag + beam
    frac = f"1/{round(1 / scale)}" if scale < 1 and abs(1 / scale - round(1 / scale)) < 1e-9 else f"{scale:g}"
    return (f"{flag} (element counts x {frac})" if flag != "full sizes" else f"--size-scale {frac}") + beam


def check(wl: Workload, data: dict, got: np.ndarray) -> str | None:
    """None if the contender's answer matches numpy's, else what differs."""
    if wl.expected is None:
        return None
    want = np.asarray(wl.expected(data), dtype=np.float64)
    got = np.asarray(got, dtype=np.float64).reshape(want.shape) if np.size(got) == want.size else got
    if np.shape(got) != want.shape:
        return f"shape {np.shape(got)} != {want.shape}"
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    scale = float(np.max(np.abs(want))) if want.size else 1.0
    if not err <= wl.rtol * max(scale, 1e-6):
        return f"max abs error {err:.3g} (values up to {scale:.3g})"
    return None


def measure(c: Contender, wl: Workload, data: dict, args) -> dict:
    row = {"workload": wl.name, "contender": c.name, "status": "ok"}
    try:
        if wl.kind == "compile":
            cache = args.compile_dirs.setdefault(c.name, Path(tempfile.mkdtemp(prefix="tgrad-bench-cache-")))
            row["times_ms"] = [c.compile_probe(wl.arg, cache)]
        else:
            predicted = predict_ms(args.done, c.name, wl)
            if predicted > args.max_run_s * 1e3:
                raise Skip(f"predicted {predicted / 1e3:.0f} s per run from the smaller size "
                           f"(over --max-run-s {args.max_run_s:g})")
            run = c.build(wl, data)
            first = None
            # a training row always runs two steps untimed: the second's loss (after one update) is
            # compared across contenders by cross_check
            for i in range(max(args.warmup, 2 if wl.training else 1)):
                ms, result = timed(run)
                if wl.training and i < 2:
                    row.setdefault("losses", []).append(float(np.asarray(c.host(result)).reshape(-1)[0]))
                if i == 0:
                    row["first_ms"] = ms
                    first = c.host(result)
                elif ms > args.budget * 1e3 and not (wl.training and i < 1):
                    break  # a second warm-up of a run this long teaches nothing
            c.settle(run)  # (background compiles done: the timed runs use what they made)
            wrong = check(wl, data, first)
            if wrong:
                row["status"], row["reason"] = "wrong", wrong
            times: list[float] = []
            t_end = time.perf_counter() + args.budget
            while len(times) < args.reps and (not times or time.perf_counter() < t_end):
                times.append(timed(run)[0])
            row["times_ms"] = times
            if wl.kind == "peak_memory":
                row.update(c.peak(run))
            elif wl.kind.startswith("gpt2"):
                row.update(gpt2.peak_rss(c.name, wl.kind, data))
    except NotApplicable as e:
        return dict(row, status="n/a", reason=str(e))
    except Skip as e:
        return dict(row, status="skipped", reason=str(e).splitlines()[0])
    except Exception as e:  # a contender's failure is a result to report, not a reason to stop
        return dict(row, status="error", reason=f"{type(e).__name__}: {e}".splitlines()[0][:300])
    row["ms"] = statistics.median(row["times_ms"])
    row["min_ms"] = min(row["times_ms"])
    if wl.flops:
        args.done[(c.name, wl.kind)] = (row["ms"], wl.flops)
    if wl.flops:
        row["gflops"] = wl.flops / row["ms"] / 1e6
    if wl.nbytes:
        row["gbs"] = wl.nbytes / row["ms"] / 1e6
    return row


def cross_check(wl: Workload, rows: list[dict], tol: float | None = None) -> None:
    """Training rows: each contender's loss after one update (its second step's loss) must match
    PyTorch's, from this workload's torch row or from the torch row of `wl.reference` (same model,
    weights and batch). A mismatch marks the row 'wrong'. No PyTorch row: nothing to compare with."""
    if not wl.training:
        return
    names = (wl.name, wl.reference)
    ref = next((r for n in names for r in rows
                if r["workload"] == n and r["contender"] == "torch" and len(r.get("losses", ())) >= 2), None)
    if ref is None:
        return
    want = ref["losses"][1]
    # Adam's first update is ~lr * sign(grad): a near-zero gradient whose sign differs between libraries by
    # rounding moves that weight by 2 lr. Measured: tgrad within ~1e-6 relative of PyTorch everywhere;
    # tinygrad's CNN at batch 16 3.3e-3 (one of 25600 conv2 weight gradients flipped sign; its gradients
    # agree with PyTorch's within 2e-4), at batch 128 5e-5. A step changes these losses by 2-50%.
    tol = tol if tol is not None else 5e-3
    for r in rows:
        if r["workload"] != wl.name or r is ref or len(r.get("losses", ())) < 2 or r["status"] != "ok":
            continue
        r["loss_vs_torch"] = r["losses"][1] - want
        if not abs(r["losses"][1] - want) <= tol * max(abs(want), 1.0):
            r["status"] = "wrong"
            r["reason"] = f"loss after one step {r['losses'][1]:.6g}, PyTorch's {want:.6g}"


def predict_ms(done: dict, contender: str, wl: Workload) -> float:
    """Time of one run scaled from this contender's last finished run of the same kind (0 if none)."""
    prev = done.get((contender, wl.kind))
    if prev is None or not wl.flops:
        return 0.0
    ms, flops = prev
    return ms * wl.flops / flops


def add_ratios(rows: list[dict], references: dict[str, str] | None = None) -> None:
    """time_vs_numpy / time_vs_torch / time_vs_compile: this row's median ms / numpy's, PyTorch's,
    torch.compile's (0.5 = half the time; lower is better, see CONVENTION). A workload PyTorch has no row
    for (mlp_step_jit: no TinyJit) is compared with PyTorch's row of its reference workload (`references`:
    name -> reference name), marked by `torch_ref`."""
    by = {(r["workload"], r["contender"]): r for r in rows}
    references = references or {}
    for r in rows:
        for base, key in (("numpy", "time_vs_numpy"), ("torch", "time_vs_torch"),
                          ("torch.compile", "time_vs_compile")):
            ref = by.get((r["workload"], base))
            if base == "torch" and not (ref and ref.get("ms")) and references.get(r["workload"]):
                ref = by.get((references[r["workload"]], base))
                if ref and ref.get("ms") and r.get("ms"):
                    r["torch_ref"] = references[r["workload"]]
            if r.get("ms") and ref and ref.get("ms"):
                r[key] = r["ms"] / ref["ms"]


def upgrade(rows: list[dict]) -> None:
    """Results saved before the convention changed (x_numpy / x_torch were speed-ups, numpy's or PyTorch's
    time / this row's): the same numbers as time_vs_numpy / time_vs_torch."""
    for r in rows:
        for old, new in (("x_numpy", "time_vs_numpy"), ("x_torch", "time_vs_torch")):
            if r.get(old) and new not in r:
                r[new] = 1 / r.pop(old)


def _fmt(v, spec: str) -> str:
    return "" if v is None else format(v, spec)


def _ratio(v) -> str:
    """Two decimals, or two significant digits below 0.1 (a tiny row 300x faster than PyTorch's is 0.0033)."""
    return "" if v is None else format(v, ".2f" if v >= 0.1 else ".2g")


def table(rows: list[dict], workloads: list[str], sizes: dict[str, str] | None = None) -> str:
    """The results as a markdown table; `sizes`: workload -> what ran (the size column)."""
    sizes = sizes or {}
    head = ["workload", "size", "contender", "median ms", "min ms", "time/numpy", "time/torch",
            "time/compile", "GFLOP/s", "GB/s", "note"]
    lines = [head]
    for name in workloads:
        for r in (r for r in rows if r["workload"] == name and r["status"] != "n/a"):
            note = r.get("reason", "") if r["status"] != "ok" else ""
            if r["status"] in ("wrong", "error"):
                note = r["status"].upper() + ": " + note
            if r["status"] == "ok" and r.get("first_ms") is not None and r["first_ms"] > 3 * r["ms"] + 50:
                note = f"first run {r['first_ms']:.0f} ms"
            if r.get("torch_ref"):
                note = f"time/torch: vs PyTorch's {r['torch_ref']}" + (f"; {note}" if note else "")
            if r.get("peak_mib") is not None:
                peak = f"peak {r['peak_mib']:.1f} MiB"
                if r.get("host_peak_mib") is not None:
                    peak += f" device, {r['host_peak_mib']:.1f} MiB host"
                note = peak + (f"; {note}" if note else "")
            if r.get("peak_rss_mib") is not None:
                rss = (f"peak RSS {r['peak_rss_mib']:.0f} MiB ({r['model_rss_mib']:.0f} after loading, "
                       f"the run +{r.get('run_peak_mib', float('nan')):.0f})")
                note = rss + (f"; {note}" if note else "")
            lines.append([
                name, sizes.get(name, ""), r["contender"], _fmt(r.get("ms"), ".3f"),
                _fmt(r.get("min_ms"), ".3f"), _ratio(r.get("time_vs_numpy")),
                _ratio(r.get("time_vs_torch")), _ratio(r.get("time_vs_compile")),
                _fmt(r.get("gflops"), ".2f"), _fmt(r.get("gbs"), ".2f"), note,
            ])
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head) - 1)]
    out = []
    for i, line in enumerate(lines):
        cells = [str(c).ljust(w) if j < 3 else str(c).rjust(w) for j, (c, w) in enumerate(zip(line, widths))]
        out.append("| " + " | ".join(cells + [line[-1]]) + " |")
        if i == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|---|")
    return "\n".join(out)


def software_of(status: list[dict]) -> dict[str, str]:
    """Contender -> what runs it, for those whose times are not a device's speed (Contender.hardware)."""
    out = {}
    for c in status:
        what = c.get("hardware", "")
        if c.get("software") or software_name(what):
            out[c["contender"]] = what
        elif "software" not in c and c["contender"] == "tgrad NUMPY":  # (a file saved before the field)
            out[c["contender"]] = "the reference interpreter"
    return out


def plot_path(args: argparse.Namespace) -> str | None:
    """--plot PATH, or for a bare --plot: the --show file's name with .png, else bench-DATE-TIME.png."""
    if args.plot is None or args.plot:
        return args.plot
    if args.show:
        return str(Path(args.show).with_suffix(".png"))
    return datetime.datetime.now(datetime.timezone.utc).strftime("bench-%Y%m%d-%H%M%S.png")


def print_contender(c: dict) -> None:
    what = c["version"] if c["available"] else "unavailable: " + c["reason"]
    where = f" on {c['hardware']}" if c.get("hardware") else ""
    soft = " (software: not a device's speed)" if c.get("software") else ""
    print(f"  {c['contender']:14s} {what}{where}{soft}")


def show_saved(path: str, plot_to: str | None = None, all_ratios: bool = False) -> int:
    """Print the table of a results file written by --json (and plot it to plot_to)."""
    saved = json.loads(Path(path).read_text())
    m = saved["machine"]
    how = mode(saved.get("args", {}))
    print(f"tgrad bench {m['date']} ({how}, tgrad {m.get('commit', '?')}): {m['cpu']}, {m['cores']} cores, "
          f"{m['threads']} threads; load average {m['load_average'][0]} at start, "
          f"{m.get('load_average_end', ['?'])[0]} at end")
    for pool in m["thread_pools"]:
        print(f"  thread pool {pool['internal_api']} {pool['version']} kernel={pool['architecture']} "
              f"threads={pool['num_threads']}")
    for c in saved["contenders"]:
        print_contender(c)
    upgrade(saved["results"])
    print(CONVENTION)
    print(table(saved["results"], [w["name"] for w in saved["workloads"]],
                {w["name"]: w.get("size", "") for w in saved["workloads"]}))
    if plot_to:
        from types import SimpleNamespace

        plot(saved["results"], [SimpleNamespace(**w) for w in saved["workloads"]], plot_to, m, how,
             software_of(saved["contenders"]), all_ratios)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.plot = plot_path(args)
    if args.plot is not None and not have_matplotlib():
        return 2  # said before minutes of runs, not after
    if args.show:
        return show_saved(args.show, args.plot, args.plot_all_ratios)
    limiter = set_threads(args.threads)
    if args.beam:  # (tgrad reads it when it optimizes each kernel: tgrad/config.py)
        os.environ["BEAM"] = str(args.beam)
    devices = [d.upper() for d in _split(args.device)] or TGRAD_DEVICES
    baselines = _split(args.baselines)
    unknown = set(baselines) - set(BASELINES)
    if unknown:
        print(f"unknown baselines {sorted(unknown)}; choose from {BASELINES}", file=sys.stderr)
        return 2
    workloads = select(all_workloads(args.size_scale, args.quick), _split(args.only))
    if args.quick and not args.only:
        # the model steps cost minutes of first-run compiles on the default devices (CL ~40 s per model,
        # tinygrad ~20 s): --quick leaves them out unless --only names them
        workloads = [w for w in workloads if w.kind not in ("cnn", "gpt") and not w.kind.startswith("gpt2")]
        print("--quick: cnn_step, gpt_step and the gpt2 rows left out (--only cnn_step,gpt runs them)",
              file=sys.stderr)
    if not workloads:
        print(f"--only {args.only!r} matches no workload", file=sys.stderr)
        return 2
    args.compile_dirs, args.done = {}, {}
    contenders, status = [], []
    with limiter:
        for c in all_contenders(devices, baselines, args.threads):
            try:
                c.open()
                status.append({"contender": c.name, "available": True, "version": c.version(),
                               **c.hardware()})
                contenders.append(c)
            except Unavailable as e:
                status.append({"contender": c.name, "available": False, "reason": str(e).splitlines()[0]})
        info = machine_info(args.threads)
        print(f"tgrad bench {info['date']} ({mode(vars(args))}, tgrad {info['commit']}): {info['cpu']}, "
              f"{info['cores']} cores, {args.threads} threads for every contender "
              f"(numba {info['numba_threads']})")
        for pool in info["thread_pools"]:
            print(f"  thread pool {pool['internal_api']} {pool['version']} kernel={pool['architecture']} "
                  f"threads={pool['num_threads']}")
        load = info["load_average"][0]
        if load > 0.5:
            print(f"  warning: load average {load:.1f} before starting: other processes share these "
                  f"{info['cores']} cores, so timings (thread pools above all) are noisy")
        if info["OPENBLAS_CORETYPE"]:
            print(f"  OPENBLAS_CORETYPE={info['OPENBLAS_CORETYPE']} is set: numpy's BLAS runs that kernel")
        for s in status:
            print_contender(s)
        rows = []
        for wl in workloads:
            data = wl.make()
            print(f"{wl.name} ({wl.size}): {wl.description}", file=sys.stderr, flush=True)
            for c in contenders:
                rows.append(measure(c, wl, data, args))
            cross_check(wl, rows)
            for r in (r for r in rows if r["workload"] == wl.name):
                losses = r.get("losses", ())
                loss = f" losses {losses[0]:.6f} {losses[1]:.6f}" if len(losses) > 1 else ""
                print(f"  {r['contender']:14s} {r.get('ms', 0):10.3f} ms {r['status']} "
                      f"{r.get('reason', '')}{loss}", file=sys.stderr, flush=True)
            del data
    for folder in args.compile_dirs.values():
        shutil.rmtree(folder, ignore_errors=True)
    info["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    add_ratios(rows, {w.name: w.reference for w in workloads if w.reference})
    print(f"{CONVENTION}; medians of timed runs after warm-up; size: what ran ({mode(vars(args))})")
    print(table(rows, [w.name for w in workloads], {w.name: w.size for w in workloads}))
    if args.json_path:
        out = {"convention": {"time_vs_numpy": "this row's median ms / numpy's (lower is better)",
                              "time_vs_torch": "this row's median ms / PyTorch's (lower is better)",
                              "time_vs_compile": "this row's median ms / torch.compile's (lower is better)"},
               "machine": info, "contenders": status, "args": {k: v for k, v in vars(args).items()
                                                              if k not in ("compile_dirs", "done")},
               "workloads": [{"name": w.name, "size": w.size, "description": w.description, "flops": w.flops,
                              "bytes": w.nbytes} for w in workloads],
               "results": rows}
        Path(args.json_path).write_text(json.dumps(out, indent=1))
    if args.plot:
        plot(rows, workloads, args.plot, info, mode(vars(args)), software_of(status), args.plot_all_ratios)
    return 0
