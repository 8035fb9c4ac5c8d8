"""Device selection for the suite.

Tests that take the `device` fixture run once per device in TGRAD_TEST_DEVICES (comma separated;
default: DEVICE if set, else every device tgrad has). A device that cannot start is skipped with the
reason, unless TGRAD_REQUIRE_DEVICES names it (CI does): then the test fails.

A test marked `sweep` (a product of parameters, each case new kernels) runs its whole product on
SWEEP_DEVICES and a diagonal of it elsewhere: every value of every parameter once (see _on_diagonal).
A test marked `spread` (cases that differ in host-side logic, e.g. which optimizer hyperparameter changes,
while each device's kernels are the same kind in every case) runs every case on SWEEP_DEVICES and each case
on one of the other devices in turn, so every device still runs some of them (see _spread_keeps).
TGRAD_TEST_FULL_SWEEPS=1 runs the whole product on every device.
"""

import dataclasses
import gc
import os

import pytest

# Triton runs on the CPU through its interpreter when no GPU is present; this must be decided before
# anything imports triton
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
# no compile worker processes (tgrad/runtime/cpu/pool.py) beside the pytest-xdist ones: they would only
# compete for the same cores; tests/test_cpu_cache.py starts them where it tests them
os.environ.setdefault("TGRAD_COMPILE_WORKERS", "0")
# PoCL compiles every kernel twice: once for any work-group size (the binary tgrad caches) and again, at
# its first launch, for the launch's size. The suite's kernels are small, so the first is enough; then
# PoCL's own kernel cache only repeats tgrad's binaries, and looking a program up in it first runs the
# preprocessor over the OpenCL C header once more. Both cut the CL tests' compile time, running the
# same OpenCL C (bench/HISTORY.md, "A faster cold test run")
os.environ.setdefault("POCL_WORK_GROUP_SPECIALIZATION", "0")
os.environ.setdefault("POCL_KERNEL_CACHE", "0")
# import triton (torch imports it too, e.g. through torch.optim) before WEBGPU or CL load their shared
# libLLVM: importing it afterwards crashes the process
try:
    import triton  # noqa: F401
except ImportError:
    pass

from tgrad.device import DEVICES, VARIANT_OF, get_runtime
from tgrad.errors import DeviceError
from tgrad.runtime.cpu.compile import use_cpu_features

# PyTorch computes the tests' expected values on one thread: pytest-xdist runs a worker per core, and
# PyTorch's OpenMP threads spinning for work while the other worker needs the core cost a quarter of the
# suite's CPU time. tgrad's own threads (and OpenBLAS's, which its BLAS calls manage) are left as users
# have them: the tests check them
torch.set_num_threads(int(os.environ.get("TGRAD_TEST_TORCH_THREADS", "1")))

# the features CPU kernels compile for, before any test compiles a Numba function of its own: Numba makes
# its code generator once, and kernels compiled by another one are not written to the disk cache
use_cpu_features()

# every device, except those that here would only run another device's code again (CUDA and AMD are
# TRITON without a GPU, QCOM is CL without an Adreno)
ALL = ",".join(d for d in DEVICES if d not in VARIANT_OF)


def _devices() -> list[str]:
    names = os.environ.get("TGRAD_TEST_DEVICES") or os.environ.get("DEVICE") or ALL
    return [n.strip().upper() for n in names.split(",") if n.strip()]


def _required() -> set[str]:
    return {n.strip().upper() for n in os.environ.get("TGRAD_REQUIRE_DEVICES", "").split(",") if n.strip()}


_open_errors: dict[str, str] = {}


def open_or_skip(name: str) -> None:
    from tgrad.device import get_runtime

    if name not in _open_errors:
        try:
            get_runtime(name)
            _open_errors[name] = ""
        except (DeviceError, ImportError, OSError, RuntimeError) as e:
            _open_errors[name] = f"{type(e).__name__}: {e}"
    err = _open_errors[name]
    if err:
        if name in _required():
            pytest.fail(f"device {name} is required (TGRAD_REQUIRE_DEVICES) but cannot start: {err}")
        pytest.skip(f"device {name} is not available: {err}")


# where a sweep runs whole: the oracle (no compiles) and CPU, whose host paths (BLAS plans, direct and
# piecewise convolutions) depend on the shapes; the other devices' renderers see every option on the diagonal
SWEEP_DEVICES = ("NUMPY", "CPU")


def pytest_configure(config):
    # the CPU device's core cache as 1 MiB for the whole suite, whatever this machine's sysfs says: the
    # optimizer sizes copied matmul operands' pieces to it (opt/host.chunk_elems), and the tests that check
    # which plan a conv gets (pieces, shifts, direct or BLAS) were written for that size. Values are the
    # same at any size (tests/test_opt_host.py tries others); only the plans differ
    rt = get_runtime("CPU")
    rt.set_props(dataclasses.replace(rt.props, cache_bytes=1 << 20))
    config.addinivalue_line(
        "markers", "sweep: a parameter product run whole on SWEEP_DEVICES, as a diagonal on the others"
    )
    config.addinivalue_line(
        "markers", "spread: every case on SWEEP_DEVICES, each case on one of the other devices in turn"
    )
    _group_tests(config)


def _group_tests(config) -> None:
    """pytest-xdist's `-n N` deals tests out one by one (`--dist load`); here it keeps the tests marked
    `xdist_group` on one worker (`loadgroup`, which is `load` for every other test): the 2 GB tensors of
    test_big_tensors.py then share one worker, which makes each tensor once and runs its tests one after
    another, instead of both workers taking turns on a lock and waiting for it. An explicit --dist stays.
    A worker learns it from the controller (pytest_configure_node): it marks its items' ids with the group."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        if workerinput.get("tgrad_loadgroup"):
            config.option.loadgroup = True
    elif config.pluginmanager.hasplugin("xdist") and config.getoption("dist", "no") == "load":
        config.option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["tgrad_loadgroup"] = node.config.getoption("dist") == "loadgroup"


def _on_diagonal(indices: dict[int, int], sizes: dict[int, int]) -> bool:
    """Whether a case is one of the diagonal's: (k % n1, k % n2, ...) for k below the largest n, so each
    value of each parameter appears in max(n) cases instead of n1 * n2 * ..."""
    longest = max(sizes.values(), default=1)
    return any(all(k % sizes[p] == i for p, i in indices.items()) for k in range(longest))


def _cases(item) -> tuple[dict[int, int], dict[int, int]]:
    """Which case of each of its parametrize marks an item runs, and how many cases each mark has."""
    indices, sizes = {}, {}
    for m, mark in enumerate(item.iter_markers("parametrize")):
        names, values = mark.args[0], mark.args[1]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        mine = [item.callspec.params[n] for n in names]
        for i, value in enumerate(values):
            value = value.values if hasattr(value, "values") and hasattr(value, "marks") else value
            value = list(value) if len(names) > 1 else [value]
            if all(a is b for a, b in zip(value, mine)):
                indices[m], sizes[m] = i, len(values)
                break
    return indices, sizes


def _flat_case(indices: dict[int, int], sizes: dict[int, int]) -> int:
    """The position of a case in its parameter product (mixed radix over its parametrize marks)."""
    flat = 0
    for m in sorted(sizes):
        flat = flat * sizes[m] + indices[m]
    return flat


def _spread_keeps(case: int, device: str, devices: list[str]) -> bool:
    """Whether a `spread` test's case runs on a device: always on SWEEP_DEVICES; on the others, case k runs
    on the (k mod n)-th of the n other devices being tested, so each case runs on one of them and, given at
    least n cases, each of them runs some."""
    others = [d for d in devices if d not in SWEEP_DEVICES]
    return device in SWEEP_DEVICES or device not in others or case % len(others) == others.index(device)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TGRAD_TEST_FULL_SWEEPS") == "1":
        return
    dropped = set()
    devices = _devices()
    for it in items:
        device = it.callspec.params.get("device", "CPU") if hasattr(it, "callspec") else "CPU"
        if it.get_closest_marker("sweep") and device not in SWEEP_DEVICES:
            if not _on_diagonal(*_cases(it)):
                dropped.add(it)
        if it.get_closest_marker("spread") and not _spread_keeps(_flat_case(*_cases(it)), device, devices):
            dropped.add(it)
    if dropped:
        config.hook.pytest_deselected(items=[it for it in items if it in dropped])
        items[:] = [it for it in items if it not in dropped]


# Objects that outlive a test (imports, compiled kernels, caches: ~800k after a few thousand tests) are frozen
# out of the garbage collector before each test, after collecting what the last test left (a collection
# walks only objects not frozen: the last test's), and all are collected together every FREEZE_EVERY tests.
# Without it each full collection, the automatic ones and the gc.collect() of the memory tests, walked
# every one of them (~0.5 s each). No test starts with another's cyclic garbage alive (a lazy tensor of an
# earlier test still alive changes what a realize computes: tgrad tracks live lazy tensors)
FREEZE_EVERY = 500
_since_collect = [0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _since_collect[0] += 1
    if _since_collect[0] >= FREEZE_EVERY:
        _since_collect[0] = 0
        gc.unfreeze()
    gc.collect()
    gc.freeze()


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", _devices(), indirect=True)


@pytest.fixture
def device(request, monkeypatch):
    name = request.param
    open_or_skip(name)
    monkeypatch.setenv("DEVICE", name)
    return name


@pytest.fixture
def lazy_backward(monkeypatch):
    """backward() leaves the gradients lazy (TGRAD_BACKWARD_REPLAY=0), for tests that read the gradient
    graph (its kernels, its schedule) instead of its values."""
    monkeypatch.setenv("TGRAD_BACKWARD_REPLAY", "0")


@pytest.fixture
def cpu_tuning():
    """cpu_tuning(pair_min_result=1 << 16, ...): the CPU device's HostTuning (opt/host.py) with these
    fields for one test (Runtime.set_props), and its properties (`native_pieces=...`, `cache_bytes=...`)
    the same way; the device's own properties come back after it."""
    rt = get_runtime("CPU")
    old = rt.props

    def tune(**fields) -> None:
        own = {f.name for f in dataclasses.fields(rt.props)}
        props = {k: v for k, v in fields.items() if k in own and v is not None}
        host = {k: v for k, v in fields.items() if k not in own}
        rt.set_props(dataclasses.replace(rt.props, host=dataclasses.replace(rt.props.host, **host), **props))

    yield tune
    rt.set_props(old)
