"""A pytest plugin that records where a run's time goes: each test's duration and each kernel compile
(device, seconds) attributed to the test that triggered it, a JSON line per test in a file per xdist worker
(written as the run goes: a run stopped early still reports what it ran).

    TGRAD_COMPILE_LOG=/tmp/me/log python -m pytest -p tests.compile_stats -n 2 tests
    python -m tests.compile_stats /tmp/me/log      # tables per device and per file

Compiles counted: CPU Numba builds (compile_native), CL program builds, WEBGPU pipelines, Triton module
loads. Loaded only when named with -p; the suite itself does not use it.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import pytest

_current = ["<collect>"]
_compiles: list[tuple[str, float]] = []  # (device, seconds) of the current test


def _timed(owner, attr: str, device: str) -> None:
    inner = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            _compiles.append((device, time.perf_counter() - start))

    # the wrapper's frame counts as tgrad's own (errors.user_frame names the first frame outside tgrad as
    # the user's line: a kernel's build error named this file instead of the test)
    wrapper.__code__ = wrapper.__code__.replace(co_filename=inner.__code__.co_filename)
    setattr(owner, attr, wrapper)


def pytest_configure(config) -> None:
    if not os.environ.get("TGRAD_COMPILE_LOG"):
        return
    from tgrad.runtime.cpu import runtime as cpu

    _timed(cpu, "compile_native", "CPU")
    for module, cls, attr, device in (("opencl", "CLRuntime", "_compile", "CL"),
                                      ("webgpu", "WebGPURuntime", "build", "WEBGPU")):
        try:
            mod = __import__(f"tgrad.runtime.{module}", fromlist=[cls])
            _timed(getattr(mod, cls), attr, device)
        except (ImportError, AttributeError):
            pass
    try:
        from tgrad.runtime import triton

        _timed(triton, "load_source", "TRITON")
    except (ImportError, AttributeError):
        pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Around each test where it runs (a pytest-xdist worker, not the controller that reports it)."""
    folder = os.environ.get("TGRAD_COMPILE_LOG")
    _current[0] = item.nodeid
    _compiles.clear()
    start = time.perf_counter()
    yield
    if folder:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(folder).mkdir(parents=True, exist_ok=True)
        seconds = time.perf_counter() - start
        line = json.dumps({"test": item.nodeid, "seconds": seconds, "compiles": _compiles})
        with open(Path(folder) / f"{worker}.jsonl", "a") as f:
            f.write(line + "\n")


def _device(nodeid: str) -> str:
    param = nodeid.rsplit("[", 1)[1].rstrip("]") if nodeid.endswith("]") else ""
    for name in ("CPU", "CL", "WEBGPU", "TRITON", "NUMPY", "METAL"):
        if name in param.split("-"):
            return name
    return "-"


def report(folder: str, top: int = 40) -> None:
    compiles, durations = [], {}
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            durations[row["test"]] = row["seconds"]
            compiles += [(row["test"], dev, s) for dev, s in row["compiles"]]
    print(f"{len(durations)} tests, {sum(durations.values()):.0f} s of test time\n")
    print("| device | compiles | median ms | total s | test time s |\n| --- | --- | --- | --- | --- |")
    by_dev = collections.defaultdict(list)
    for _, dev, s in compiles:
        by_dev[dev].append(s)
    time_dev = collections.defaultdict(float)
    for nodeid, s in durations.items():
        time_dev[_device(nodeid)] += s
    for dev in sorted(set(by_dev) | set(time_dev)):
        xs = by_dev.get(dev, [])
        med = statistics.median(xs) * 1000 if xs else 0
        print(f"| {dev} | {len(xs)} | {med:.0f} | {sum(xs):.0f} | {time_dev.get(dev, 0):.0f} |")
    files = collections.defaultdict(lambda: [0.0, collections.Counter(), 0.0])
    for nodeid, s in durations.items():
        files[nodeid.split("::")[0]][0] += s
    for nodeid, dev, s in compiles:
        f = files[nodeid.split("::")[0]]
        f[1][dev] += 1
        f[2] += s
    print("\n| file | test time s | compile s | compiles per device |\n| --- | --- | --- | --- |")
    for name, (t, counts, cs) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {name} | {t:.0f} | {cs:.0f} | {' '.join(f'{d}:{n}' for d, n in sorted(counts.items()))} |")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # (piped into head: stop quietly)
    report(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40)
