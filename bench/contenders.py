"""The contenders: each tgrad device, numpy, PyTorch (CPU) and tinygrad (its CPU device).

A contender opens once (`open` raises Unavailable with the reason when it cannot run here) and then
builds, for a workload and its numpy inputs, a `run()` callable that does one complete run and forces
completion (tgrad: realize() and the device's synchronize; tinygrad: realize() and synchronize).
Converting inputs to the contender's arrays happens in `build`, outside the timing. `host(result)` turns
what run() returned into a numpy array for the correctness check.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench import gpt2
from bench.workloads import Workload

# a node-by-node interpreter above this many elements in one intermediate needs > 1 GiB per array
INTERP_MAX_ELEMS = 1 << 28


SOFTWARE_DEVICES = ("llvmpipe", "lavapipe", "swiftshader", "portable computing language", "pocl", "interpret")


def software_name(text: str) -> bool:
    """True if a device description names a CPU implementation of a GPU API (Mesa, PoCL, SwiftShader)."""
    return any(s in text.lower() for s in SOFTWARE_DEVICES)


class Unavailable(Exception):
    """The contender cannot run on this machine; the message says why."""


class Skip(Exception):
    """This contender does not run this workload; the message says why."""


class NotApplicable(Skip):
    """The workload means nothing for this contender (numpy has no autograd): left out of the table."""


class Contender:
    name = "?"
    group = "?"  # tgrad / baseline

    def open(self) -> None:
        pass

    def version(self) -> str:
        return ""

    def hardware(self) -> dict:
        """What runs the work, for the header: {"hardware": text, "software": True where a CPU stands in
        for a GPU or runs a reference interpreter}; {} when it is this machine's CPU and nothing more."""
        return {}

    def build(self, wl: Workload, data: dict[str, np.ndarray]) -> Callable[[], object]:
        method = getattr(self, f"build_{wl.kind}", None)
        if method is None:
            raise NotApplicable(f"{self.name} has no {wl.kind} workload")
        return method(wl, data)

    def host(self, result) -> np.ndarray:
        return np.asarray(result)

    def settle(self, run: Callable[[], object]) -> None:
        """After the warm-up runs: whatever the contender still compiles in the background is done, and
        the next run uses it (tgrad's CPU compiles its direct convolutions so, running BLAS meanwhile)."""

    def compile_probe(self, phase: str, cache: Path) -> float:
        raise NotApplicable(f"{self.name} has no compile step")

    def peak(self, run: Callable[[], object]) -> dict[str, float]:
        """Peak memory of one run above what was live before it: {'peak_mib': ...} (peak_memory rows)."""
        raise NotApplicable(f"{self.name} has no peak memory measurement")


def require(module: str, install: str):
    """The module, imported, or Unavailable saying how to install it (a contender's open())."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise Unavailable(f"{module.split('.')[0]} is not installed ({e}): {install}") from e


def traced_peak_mib(run: Callable[[], object]) -> float:
    """Peak bytes (MiB) that tracemalloc sees allocated during one run: numpy arrays (numpy reports its
    data buffers to tracemalloc) and Python objects; not Numba's or PyTorch's own allocators."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def run_probe(args: list[str], env_extra: dict[str, str]) -> dict:
    """Run bench/compile_probe.py in a new process and return the JSON it prints on its last line."""
    env = dict(os.environ, **env_extra)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.compile_probe", *args], capture_output=True, text=True, env=env,
        cwd=root, timeout=900,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError("compile probe failed: " + " | ".join(tail))
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------
# numpy


class NumpyContender(Contender):
    name = "numpy"
    group = "baseline"

    def version(self) -> str:
        return np.__version__

    def build_elementwise(self, wl, d):
        a, b, c = d["a"], d["b"], d["c"]
        return lambda: np.maximum(a * b + c, 0).sum()

    def build_softmax(self, wl, d):
        x = d["x"]

        def run():
            e = np.exp(x - x.max(1, keepdims=True))
            return e / e.sum(1, keepdims=True)

        return run

    def build_reduce(self, wl, d):
        x, axis = d["x"], wl.arg
        return lambda: x.sum(axis)

    def build_matmul(self, wl, d):
        a, b = d["a"], d["b"]
        return lambda: a @ b

    def build_peak_memory(self, wl, d):
        a, b = d["a"], d["b"]
        return lambda: (np.exp(a * 2 + 1) * b).sum()

    def peak(self, run):
        return {"peak_mib": traced_peak_mib(run)}

    def build_conv(self, wl, d):
        raise NotApplicable("numpy has no conv2d or autograd")

    def build_mlp(self, wl, d):
        raise NotApplicable("numpy has no autograd")

    build_mlp_jit = build_mlp


# ---------------------------------------------------------------------------------------------------
# a hand-written Numba loop: the yardstick for what tgrad's CPU emitter could reach


class NumbaHandContender(Contender):
    name = "numba (hand)"
    group = "baseline"

    def open(self) -> None:
        self.numba = require("numba", "pip install numba")

    def version(self) -> str:
        return self.numba.__version__

    def build(self, wl: Workload, data):
        if wl.kind != "elementwise":
            raise NotApplicable("hand-written only for the elementwise yardstick")
        return super().build(wl, data)

    def build_elementwise(self, wl, d):
        fn = _hand_elementwise()
        a, b, c = d["a"], d["b"], d["c"]
        return lambda: fn(a, b, c)


def _hand_elementwise():
    """(a*b+c).relu().sum(): prange over 64 chunks, a vectorizable (reassoc) partial sum in each."""
    from numba import njit, prange

    @njit(parallel=True, fastmath={"reassoc"}, error_model="numpy", cache=False)
    def fused(a, b, c):
        n = a.size
        chunks = 64
        step = (n + chunks - 1) // chunks
        part = np.zeros(chunks, np.float32)
        for ch in prange(chunks):
            acc = np.float32(0.0)
            for i in range(ch * step, min(n, ch * step + step)):
                v = a[i] * b[i] + c[i]
                acc += v if (v > 0 or v != v) else np.float32(0.0)
            part[ch] = acc
        return part.sum()

    return fused


# ---------------------------------------------------------------------------------------------------
# PyTorch


class TorchContender(Contender):
    name = "torch"
    group = "baseline"

    def open(self) -> None:
        self.torch = require("torch", "pip install -e '.[bench]'")

    def version(self) -> str:
        return self.torch.__version__

    def _t(self, d, *names, grad=False):
        return [self.torch.from_numpy(d[n].copy()).requires_grad_(grad) for n in names]

    def build_elementwise(self, wl, d):
        a, b, c = self._t(d, "a", "b", "c")
        return lambda: (a * b + c).relu().sum()

    def build_softmax(self, wl, d):
        (x,) = self._t(d, "x")
        return lambda: x.softmax(-1)

    def build_peak_memory(self, wl, d):
        raise NotApplicable("tracemalloc does not see PyTorch's allocator")

    def build_reduce(self, wl, d):
        (x,) = self._t(d, "x")
        return lambda: x.sum(wl.arg)

    def build_matmul(self, wl, d):
        a, b = self._t(d, "a", "b")
        return lambda: a @ b

    def build_conv(self, wl, d):
        f = self.torch.nn.functional
        (x,) = self._t(d, "x")
        w1, w2 = self._t(d, "w1", "w2", grad=True)

        def run():
            w1.grad = w2.grad = None
            loss = f.conv2d(f.conv2d(x, w1).relu(), w2).relu().sum()
            loss.backward()
            return loss.detach()

        return run

    def _mlp(self, d):
        torch = self.torch
        model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        with torch.no_grad():
            for p, name in zip(model.parameters(), ("w1", "b1", "w2", "b2")):
                p.copy_(torch.from_numpy(d[name]))
        return self._train(model, d["x"], d["y"])

    def _prepare(self, fn):
        """fn as the step calls it: eager PyTorch runs it as it is (torch.compile's contender compiles it)."""
        return fn

    def build_mlp(self, wl, d):
        return self._mlp(d)

    def build_mlp_jit(self, wl, d):
        raise NotApplicable("PyTorch has no TinyJit; its eager step is the eager_mlp_step row")

    def _train(self, model, x, y, device: str = "cpu"):
        """One eager training step (PyTorch has no TinyJit) of `model` (on `device`) on the batch (x, y),
        Adam."""
        torch = self.torch
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = torch.from_numpy(x.copy()).to(device), torch.from_numpy(y.copy()).to(device)
        forward, update = self._prepare(model), self._prepare(opt.step)

        def step():
            opt.zero_grad()
            logits = forward(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            update()
            return loss.detach()

        return step

    def build_cnn(self, wl, d):
        from bench.models import torch_cnn

        return self._train(torch_cnn(self.torch, d), d["x"], d["y"])

    def build_gpt(self, wl, d):
        from bench.models import torch_gpt

        return self._train(torch_gpt(self.torch, d, wl.arg[2]), d["x"], d["y"])

    def build_gpt2_decode(self, wl, d):
        return gpt2.torch_decode(d)

    def build_gpt2_prefill(self, wl, d):
        return gpt2.torch_prefill(d)

    def host(self, result) -> np.ndarray:
        return result.detach().numpy()

    def compile_probe(self, phase: str, cache: Path) -> float:
        if phase == "cold":
            return run_probe(["--framework", "torch"], {})["first3_ms"]
        raise NotApplicable("PyTorch compiles nothing: its first steps are the same from any cache")


# ---------------------------------------------------------------------------------------------------
# tinygrad


def find_clang() -> str | None:
    for name in ["clang"] + [f"clang-{v}" for v in range(21, 13, -1)]:
        if shutil.which(name):
            return name
    return None


def tinygrad_env(threads: int) -> dict[str, str]:
    """Environment tinygrad's CPU device needs here: a clang to compile with and the thread count."""
    env = {"NUM_CPU_THREADS": str(threads)}
    clang = find_clang()
    if clang and "CC" not in os.environ:
        env["CC"] = clang
    return env


class TinygradContender(Contender):
    name = "tinygrad"
    group = "baseline"
    device = "CPU"

    def __init__(self, threads: int):
        self.threads = threads

    def open(self) -> None:
        if find_clang() is None and "CC" not in os.environ:
            raise Unavailable("tinygrad's CPU device compiles C with clang: apt-get install clang")
        for key, value in tinygrad_env(self.threads).items():
            os.environ.setdefault(key, value)
        try:
            import tinygrad
            from tinygrad import Device, Tensor
        except ImportError as e:
            raise Unavailable(f"tinygrad is not installed ({e}): pip install -e '.[bench]'") from e
        self.tinygrad, self.Tensor, self.Device = tinygrad, Tensor, Device
        try:
            Tensor([1.0, 2.0], device=self.device).sum().item()
        except Exception as e:
            raise Unavailable(f"tinygrad's {self.device} device failed: {type(e).__name__}: {e}") from e

    def version(self) -> str:
        from importlib.metadata import version

        return version("tinygrad")

    def _t(self, d, *names, grad=False):
        # tinygrad 0.14 has no requires_grad: backward() fills .grad of every float tensor in the graph
        return [self.Tensor(d[n], device=self.device).realize() for n in names]

    def _sync(self, t):
        t.realize()
        self.Device[self.device].synchronize()
        return t

    def build_elementwise(self, wl, d):
        a, b, c = self._t(d, "a", "b", "c")
        return lambda: self._sync((a * b + c).relu().sum())

    def build_softmax(self, wl, d):
        (x,) = self._t(d, "x")
        return lambda: self._sync(x.softmax(-1))

    def build_reduce(self, wl, d):
        (x,) = self._t(d, "x")
        return lambda: self._sync(x.sum(wl.arg))

    def build_matmul(self, wl, d):
        a, b = self._t(d, "a", "b")
        return lambda: self._sync(a @ b)

    def build_conv(self, wl, d):
        (x,) = self._t(d, "x")
        w1, w2 = self._t(d, "w1", "w2", grad=True)

        def run():
            w1.grad = w2.grad = None
            loss = x.conv2d(w1).relu().conv2d(w2).relu().sum()
            loss.backward()
            self.Tensor.realize(loss, w1.grad, w2.grad)
            self.Device[self.device].synchronize()
            return loss

        return run

    def _mlp(self, d, jit: bool):
        from tinygrad import Context, TinyJit, nn

        Tensor = self.Tensor
        l1, l2 = nn.Linear(784, 128), nn.Linear(128, 10)
        for layer, w, b in ((l1, "w1", "b1"), (l2, "w2", "b2")):
            layer.weight = Tensor(d[w], device=self.device).realize()
            layer.bias = Tensor(d[b], device=self.device).realize()
        params = [l1.weight, l1.bias, l2.weight, l2.bias]
        opt = nn.optim.Adam(params, lr=1e-3)
        x, y = Tensor(d["x"], device=self.device).realize(), Tensor(d["y"], device=self.device).realize()

        def step(x, y):
            with Context(TRAINING=1):
                opt.zero_grad()
                loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y)
                loss.backward()
                return loss.realize(*opt.schedule_step())

        fn = TinyJit(step) if jit else step

        def run():
            loss = fn(x, y)
            self.Device[self.device].synchronize()
            return loss

        return run

    def build_mlp(self, wl, d):
        return self._mlp(d, False)

    def build_mlp_jit(self, wl, d):
        return self._mlp(d, True)

    def _train(self, make_model, d):
        """A TinyJit training step, Adam lr 1e-3, on the fixed batch (d['x'], d['y'])."""
        from tinygrad import Context, TinyJit, nn

        Tensor = self.Tensor
        # layers make their own tensors (BatchNorm's running statistics) on tinygrad's default device,
        # which is not CPU where OpenCL works
        with Context(DEV=self.device):
            model = make_model(nn, lambda a: Tensor(a, device=self.device).realize())
        opt = nn.optim.Adam(nn.state.get_parameters(model), lr=1e-3)
        x, y = Tensor(d["x"], device=self.device).realize(), Tensor(d["y"], device=self.device).realize()

        @TinyJit
        def step(x, y):
            with Context(TRAINING=1):
                opt.zero_grad()
                loss = model(x).sparse_categorical_crossentropy(y)
                loss.backward()
                return loss.realize(*opt.schedule_step())

        def run():
            loss = step(x, y)
            self.Device[self.device].synchronize()
            return loss

        return run

    def build_cnn(self, wl, d):
        from bench.models import TinyCNN

        return self._train(lambda nn, param: TinyCNN(nn, param, d), d)

    def build_gpt(self, wl, d):
        from bench.models import TinyGPT

        return self._train(lambda nn, param: TinyGPT(nn, param, d, wl.arg[2], lambda t: t.gelu()), d)

    def host(self, result) -> np.ndarray:
        return result.numpy() if hasattr(result, "numpy") else np.asarray(result)

    def compile_probe(self, phase: str, cache: Path) -> float:
        env = dict(tinygrad_env(self.threads), CACHEDB=str(cache / "tinygrad.db"))
        return run_probe(["--framework", "tinygrad"], env)["first3_ms"]


# ---------------------------------------------------------------------------------------------------
# tgrad


def _slow_device(name: str) -> bool:
    """Devices that interpret rather than compile here: big workloads would take minutes."""
    if name == "NUMPY":
        return True
    if name in ("TRITON", "CUDA", "AMD"):
        return os.environ.get("TRITON_INTERPRET") == "1" or not _has_gpu()
    return False


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


class TgradContender(Contender):
    group = "tgrad"

    def __init__(self, device: str, threads: int):
        self.device = device
        self.name = f"tgrad {device}"
        self.threads = threads

    def open(self) -> None:
        try:
            import tgrad
            from tgrad.device import get_runtime
        except ImportError as e:
            raise Unavailable(f"tgrad does not import: {e}") from e
        self.tgrad = tgrad
        try:
            self.dev = get_runtime(self.device)
        except Exception as e:
            raise Unavailable(f"{type(e).__name__}: {e}") from e
        from tgrad.graph import Node

        self.Node = Node

    def version(self) -> str:
        return self.tgrad.__version__

    def hardware(self) -> dict:
        """The NUMPY reference, PoCL or another OpenCL CPU device, Mesa's lavapipe / llvmpipe or another CPU
        WebGPU adapter, and Triton's interpreter are marked software: their times say how the emitted code
        runs on this CPU, not how the device would (the plot's ratio panel leaves them out unless asked)."""
        if self.device == "NUMPY":
            return {"hardware": "numpy, node by node (the reference interpreter)", "software": True}
        info = getattr(self.dev, "adapter_info", None)
        if info is not None:  # WEBGPU
            name = f"{info.get('device', '?')} ({info.get('backend_type', '?')})"
            return {"hardware": name, "software": info.get("adapter_type") == "CPU" or software_name(name)}
        cl = getattr(self.dev, "device", None)
        if hasattr(cl, "platform"):  # CL: a pyopencl Device
            import pyopencl

            name = f"{cl.name} ({cl.platform.name})"
            on_cpu = bool(cl.type & pyopencl.device_type.CPU)
            return {"hardware": name, "software": on_cpu or software_name(name)}
        if getattr(self.dev, "interpret", False):  # TRITON
            return {"hardware": "Triton's interpreter on the CPU", "software": True}
        return {}

    def build(self, wl: Workload, data):
        if _slow_device(self.device) and wl.interp_elems > INTERP_MAX_ELEMS:
            gib = wl.interp_elems * 4 / 2**30
            raise Skip(f"{self.device} interprets node by node: a {gib:.0f} GiB intermediate")
        return super().build(wl, data)

    def _t(self, d, *names, grad=False):
        Tensor = self.tgrad.Tensor
        return [Tensor(d[n], device=self.device, requires_grad=grad or None).realize() for n in names]

    def _fresh(self, *tensors):
        # a new graph leaf over the same buffer each run: tgrad's graph is hash-consed, so rebuilding an
        # expression over the same leaves while its last result is alive would reuse that result
        Tensor = self.tgrad.Tensor
        return [Tensor(self.Node.from_buffer(t.node.buffer, t.shape, t.dtype, t.device)) for t in tensors]

    def _sync(self, t):
        t.realize()
        self.dev.synchronize()
        return t

    def build_elementwise(self, wl, d):
        leaves = self._t(d, "a", "b", "c")

        def run():
            a, b, c = self._fresh(*leaves)
            return self._sync((a * b + c).relu().sum())

        return run

    def build_softmax(self, wl, d):
        leaves = self._t(d, "x")
        return lambda: self._sync(self._fresh(*leaves)[0].softmax(-1))

    def build_peak_memory(self, wl, d):
        if self.device != "CPU":
            raise NotApplicable("peak memory is measured on the CPU device")
        leaves = self._t(d, "a", "b")

        def run():
            a, b = self._fresh(*leaves)
            return self._sync(((a * 2 + 1).exp() * b).sum())

        return run

    def peak(self, run):
        """Device bytes (tgrad.device.Stats high-water mark) and, as a cross-check, what tracemalloc sees
        (host arrays the CPU device allocates outside Buffers)."""
        import gc

        from tgrad.device import Stats

        gc.collect()
        base = Stats.reset_peak()
        result = run()
        device_mib = (Stats.peak_live_bytes - base) / 2**20
        del result
        return {"peak_mib": device_mib, "host_peak_mib": traced_peak_mib(run)}

    def build_reduce(self, wl, d):
        leaves = self._t(d, "x")
        return lambda: self._sync(self._fresh(*leaves)[0].sum(wl.arg))

    def build_matmul(self, wl, d):
        leaves = self._t(d, "a", "b")

        def run():
            a, b = self._fresh(*leaves)
            return self._sync(a @ b)

        return run

    def build_conv(self, wl, d):
        Tensor = self.tgrad.Tensor
        if not hasattr(Tensor, "conv2d"):
            raise Skip("Tensor.conv2d is not in this tgrad yet (issue 4)")
        (xl,) = self._t(d, "x")
        w1, w2 = self._t(d, "w1", "w2", grad=True)

        def run():
            w1.grad = w2.grad = None
            (x,) = self._fresh(xl)
            loss = x.conv2d(w1).relu().conv2d(w2).relu().sum()
            loss.backward()
            Tensor.realize(loss, w1.grad, w2.grad)
            self.dev.synchronize()
            return loss

        return run

    def _mlp(self, d, jit: bool):
        try:
            from tgrad import nn
            from tgrad.nn import optim
        except ImportError as e:
            raise Skip(f"tgrad.nn is not in this tgrad yet (issue 4): {e}") from e
        TinyJit = None
        if jit:
            try:
                from tgrad.jit import TinyJit
            except ImportError as e:
                raise Skip(f"tgrad.jit is not in this tgrad yet (issue 4): {e}") from e
        Tensor = self.tgrad.Tensor
        l1, l2 = nn.Linear(784, 128), nn.Linear(128, 10)
        for layer, w, b in ((l1, "w1", "b1"), (l2, "w2", "b2")):
            layer.weight = Tensor(d[w], device=self.device, requires_grad=True).realize()
            layer.bias = Tensor(d[b], device=self.device, requires_grad=True).realize()
        opt = optim.Adam([l1.weight, l1.bias, l2.weight, l2.bias], lr=1e-3)
        x, y = Tensor(d["x"], device=self.device).realize(), Tensor(d["y"], device=self.device).realize()

        def step(x, y):
            old, Tensor.training = Tensor.training, True
            try:
                opt.zero_grad()
                loss = l2(l1(x).relu()).cross_entropy(y)
                loss.backward()
                # realize the loss with the update: realized after step(), it would read the updated
                # weights (step() overwrites the parameters' buffers in place)
                opt.step(loss)
                return loss
            finally:
                Tensor.training = old

        fn = TinyJit(step) if jit else step

        def run():
            loss = fn(x, y)
            self.dev.synchronize()
            return loss

        return run

    def build_mlp(self, wl, d):
        return self._mlp(d, False)

    def build_mlp_jit(self, wl, d):
        return self._mlp(d, True)

    def _train(self, make_model, d):
        """A TinyJit training step, Adam lr 1e-3, on the fixed batch (d['x'], d['y'])."""
        try:
            from tgrad import nn
            from tgrad.jit import TinyJit
            from tgrad.nn import optim
            from tgrad.nn.state import get_parameters
        except ImportError as e:
            raise Skip(f"tgrad.nn / tgrad.jit are not in this tgrad yet: {e}") from e
        Tensor = self.tgrad.Tensor
        # layers make their own tensors (BatchNorm's running statistics) on the default device
        old_device = os.environ.get("DEVICE")
        os.environ["DEVICE"] = self.device
        try:
            model = make_model(nn, lambda a: Tensor(a, device=self.device, requires_grad=True).realize())
        finally:
            if old_device is None:
                del os.environ["DEVICE"]
            else:
                os.environ["DEVICE"] = old_device
        opt = optim.Adam(get_parameters(model), lr=1e-3)
        x, y = Tensor(d["x"], device=self.device).realize(), Tensor(d["y"], device=self.device).realize()

        @TinyJit
        def step(x, y):
            old, Tensor.training = Tensor.training, True
            try:
                opt.zero_grad()
                loss = model(x).sparse_categorical_crossentropy(y)
                loss.backward()
                opt.step(loss)
                return loss
            finally:
                Tensor.training = old

        def run():
            loss = step(x, y)
            self.dev.synchronize()
            return loss

        return run

    def build_cnn(self, wl, d):
        from bench.models import TinyCNN

        return self._train(lambda nn, param: TinyCNN(nn, param, d), d)

    def build_gpt(self, wl, d):
        from bench.models import TinyGPT

        return self._train(lambda nn, param: TinyGPT(nn, param, d, wl.arg[2], lambda t: t.gelu("tanh")), d)

    def build_gpt2_decode(self, wl, d):
        return gpt2.tgrad_decode(self.device, d)  # (tokens come back to the host at every step)

    def build_gpt2_prefill(self, wl, d):
        run = gpt2.tgrad_prefill(self.device, d)
        return lambda: self._sync(run())

    def settle(self, run):
        wait = getattr(self.dev, "wait_for_compiles", None)
        if wait is not None and self.dev.pool.live and wait():
            run()

    def host(self, result) -> np.ndarray:
        return result.numpy() if hasattr(result, "numpy") else np.asarray(result)

    def compile_probe(self, phase: str, cache: Path) -> float:
        env = {"DEVICE": self.device, "TGRAD_CACHE": str(cache), "NUMBA_NUM_THREADS": str(self.threads)}
        return run_probe(["--framework", "tgrad"], env)["first3_ms"]


def all_contenders(devices: list[str], baselines: list[str], threads: int) -> list[Contender]:
    from bench.compiled import JaxContender, TorchCompileContender

    out: list[Contender] = [TgradContender(d, threads) for d in devices]
    table = {"numpy": NumpyContender, "numba": NumbaHandContender, "torch": TorchContender,
             "tinygrad": lambda: TinygradContender(threads), "torch.compile": TorchCompileContender,
             "jax": JaxContender}
    out += [table[b]() for b in baselines]
    return out


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    result = fn()
    return (time.perf_counter() - t0) * 1e3, result
