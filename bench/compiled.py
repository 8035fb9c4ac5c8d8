"""The compiled peers of TinyJit: `torch.compile` (inductor, which turns PyTorch's graph into fused
kernels as tgrad does) and JAX (`jax.jit` of the whole training step, Adam written out as torch.optim's).

Both start from the same numpy weights and batches as every contender (bench/models.py) and are checked
the same way: the first step's loss against numpy's, the second's (after one Adam update) against eager
PyTorch's (suite.cross_check). Their first runs compile (tens of seconds on 2 cores): the warm-up runs
take that, the timed runs do not.
"""

from __future__ import annotations

import math

import numpy as np

from bench import gpt2
from bench.contenders import Contender, NotApplicable, TorchContender, Unavailable, require
from bench.models import CNN_CONVS

LR, BETAS, EPS = 1e-3, (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults, which every contender uses


class TorchCompileContender(TorchContender):
    """PyTorch with `torch.compile` (default mode): the ops' rows compile the op, the training rows the
    model (forward and backward, through AOTAutograd) and the optimizer's step, the GPT-2 rows
    transformers' forward (generate over a static cache: one compiled decode shape)."""

    name = "torch.compile"

    def open(self) -> None:
        super().open()
        import shutil

        if shutil.which("cc") is None and shutil.which("gcc") is None:
            raise Unavailable("torch.compile's CPU backend (inductor) compiles C++: no C compiler here")

    def _prepare(self, fn):
        return self.torch.compile(fn)

    def settle(self, run) -> None:
        """Dynamo compiles again while the guards of its first graphs fail (an optimizer's state appears
        at its first step, its step count changes type): run until three runs in a row take less than
        twice the fastest seen, so the timed runs time compiled code."""
        import time

        best, calm = math.inf, 0
        for _ in range(40):
            t0 = time.perf_counter()
            run()
            ms = time.perf_counter() - t0
            calm = calm + 1 if ms < 2 * best else 0
            best = min(best, ms)
            if calm >= 3:
                return

    def build_elementwise(self, wl, d):
        a, b, c = self._t(d, "a", "b", "c")
        f = self._prepare(lambda a, b, c: (a * b + c).relu().sum())
        return lambda: f(a, b, c)

    def build_softmax(self, wl, d):
        (x,) = self._t(d, "x")
        f = self._prepare(lambda x: x.softmax(-1))
        return lambda: f(x)

    def build_reduce(self, wl, d):
        (x,) = self._t(d, "x")
        axis = wl.arg
        f = self._prepare(lambda x: x.sum(axis))
        return lambda: f(x)

    def build_matmul(self, wl, d):
        raise NotApplicable("torch.compile calls the same BLAS as eager PyTorch for a lone matmul")

    def build_conv(self, wl, d):
        raise NotApplicable("the conv row times an eager forward and backward; see cnn_step for compiled")

    def build_peak_memory(self, wl, d):
        raise NotApplicable("tracemalloc does not see PyTorch's allocator")

    def build_mlp(self, wl, d):
        raise NotApplicable("the eager row: torch.compile's step is in mlp_step_jit")

    def build_mlp_jit(self, wl, d):
        return self._mlp(d)  # (PyTorch's step with the model and optimizer.step compiled: _prepare)

    def build_gpt2_decode(self, wl, d):
        return gpt2.torch_decode(d, self._prepare)

    def build_gpt2_prefill(self, wl, d):
        return gpt2.torch_prefill(d, self._prepare)

    def compile_probe(self, phase: str, cache):
        raise NotApplicable("not measured for torch.compile (its first steps compile for tens of seconds)")


# ---------------------------------------------------------------------------------------------------
# JAX


class JaxContender(Contender):
    """JAX on the CPU: each op row a `jax.jit` function, each training row one `jax.jit` of the whole step
    (loss, gradients by `jax.value_and_grad`, Adam) with the parameters and Adam's state as its inputs and
    outputs (donated: updated in place, as the other contenders' optimizers are)."""

    name = "jax"
    group = "baseline"

    def open(self) -> None:
        self.jax, self.jnp = require("jax", "pip install jax"), require("jax.numpy", "pip install jax")

    def version(self) -> str:
        return self.jax.__version__

    def host(self, result) -> np.ndarray:
        return np.asarray(result)

    def _a(self, d, *names):
        return [self.jnp.asarray(d[n]) for n in names]

    def _ready(self, f):
        return lambda *a: f(*a).block_until_ready()

    def build_elementwise(self, wl, d):
        a, b, c = self._a(d, "a", "b", "c")
        f = self._ready(self.jax.jit(lambda a, b, c: self.jnp.maximum(a * b + c, 0).sum()))
        return lambda: f(a, b, c)

    def build_softmax(self, wl, d):
        (x,) = self._a(d, "x")
        f = self._ready(self.jax.jit(lambda x: self.jax.nn.softmax(x, axis=-1)))
        return lambda: f(x)

    def build_reduce(self, wl, d):
        (x,) = self._a(d, "x")
        axis = wl.arg
        f = self._ready(self.jax.jit(lambda x: x.sum(axis)))
        return lambda: f(x)

    def build_matmul(self, wl, d):
        a, b = self._a(d, "a", "b")
        f = self._ready(self.jax.jit(lambda a, b: a @ b))
        return lambda: f(a, b)

    def _train(self, loss_fn, params: dict, x, y):
        """One jitted step: loss and gradients of `loss_fn(params, x, y)`, then torch.optim.Adam's update
        (lr 1e-3, betas (0.9, 0.999), eps 1e-8, bias-corrected)."""
        jax, jnp = self.jax, self.jnp
        b1, b2 = BETAS

        def step(params, m, v, t, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            t = t + 1
            m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
            v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
            c1, c2 = 1 - b1**t, 1 - b2**t
            params = jax.tree.map(lambda p, m, v: p - LR * (m / c1) / (jnp.sqrt(v / c2) + EPS), params, m, v)
            return loss, params, m, v, t

        jitted = jax.jit(step, donate_argnums=(0, 1, 2))
        state = {"p": {k: jnp.asarray(a) for k, a in params.items()},
                 "m": {k: jnp.zeros(a.shape, a.dtype) for k, a in params.items()},
                 "v": {k: jnp.zeros(a.shape, a.dtype) for k, a in params.items()},
                 "t": jnp.asarray(0.0, jnp.float32)}
        x, y = jnp.asarray(x), jnp.asarray(y)

        def run():
            loss, state["p"], state["m"], state["v"], state["t"] = jitted(
                state["p"], state["m"], state["v"], state["t"], x, y)
            return loss.block_until_ready()

        return run

    def _cross_entropy(self, logits, y):
        logp = self.jax.nn.log_softmax(logits, axis=-1)
        return -self.jnp.take_along_axis(logp, y[:, None], axis=-1).mean()

    def build_mlp_jit(self, wl, d):
        jnp = self.jnp

        def loss_fn(p, x, y):
            h = jnp.maximum(x @ p["w1"].T + p["b1"], 0)
            return self._cross_entropy(h @ p["w2"].T + p["b2"], y)

        return self._train(loss_fn, {k: d[k] for k in ("w1", "b1", "w2", "b2")}, d["x"], d["y"])

    def build_cnn(self, wl, d):
        jax, jnp = self.jax, self.jnp
        lax = jax.lax

        def conv(x, w, b):
            out = lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
            return out + b[None, :, None, None]

        def batchnorm(x, w, b):  # training mode: the batch's statistics (biased variance), eps 1e-5
            mean, var = x.mean((0, 2, 3), keepdims=True), x.var((0, 2, 3), keepdims=True)
            return (x - mean) / jnp.sqrt(var + 1e-5) * w[None, :, None, None] + b[None, :, None, None]

        def pool(x):
            return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

        def loss_fn(p, x, y):
            relu = jax.nn.relu
            h = relu(conv(x, p["c1w"], p["c1b"]))
            h = pool(batchnorm(relu(conv(h, p["c2w"], p["c2b"])), p["bn1w"], p["bn1b"]))
            h = relu(conv(h, p["c3w"], p["c3b"]))
            h = pool(batchnorm(relu(conv(h, p["c4w"], p["c4b"])), p["bn2w"], p["bn2b"]))
            return self._cross_entropy(h.reshape(h.shape[0], -1) @ p["lw"].T + p["lb"], y)

        names = [n + s for n, *_ in CNN_CONVS for s in "wb"] + ["bn1w", "bn1b", "bn2w", "bn2b", "lw", "lb"]
        return self._train(loss_fn, {k: d[k] for k in names}, d["x"], d["y"])

    def build_gpt(self, wl, d):
        jax, jnp = self.jax, self.jnp
        heads = wl.arg[2]

        def layernorm(x, w, b):
            mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
            return (x - mean) / jnp.sqrt(var + 1e-5) * w + b

        def loss_fn(p, idx, y):
            batch, t = idx.shape
            h = p["wte"][idx] + p["wpe"][:t]
            c = h.shape[-1]
            causal = jnp.tril(jnp.ones((t, t), bool))
            i = 0
            while f"h{i}.ln1w" in p:
                q = {k[len(f"h{i}."):]: v for k, v in p.items() if k.startswith(f"h{i}.")}
                a = layernorm(h, q["ln1w"], q["ln1b"]) @ q["attnw"].T + q["attnb"]
                qh, kh, vh = (z.reshape(batch, t, heads, c // heads).transpose(0, 2, 1, 3)
                              for z in jnp.split(a, 3, -1))
                s = jnp.where(causal, qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(c // heads), -jnp.inf)
                att = jax.nn.softmax(s, axis=-1) @ vh
                h = h + att.transpose(0, 2, 1, 3).reshape(batch, t, c) @ q["projw"].T + q["projb"]
                m = jax.nn.gelu(layernorm(h, q["ln2w"], q["ln2b"]) @ q["fcw"].T + q["fcb"], approximate=True)
                h = h + m @ q["fc2w"].T + q["fc2b"]
                i += 1
            logits = layernorm(h, p["lnfw"], p["lnfb"]) @ p["head"].T
            return self._cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

        params = {k: v for k, v in d.items() if k not in ("x", "y")}
        return self._train(loss_fn, params, d["x"], d["y"])
