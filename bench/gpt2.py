"""The GPT-2 inference rows: a random checkpoint of GPT-2 124M's shape made locally with transformers,
tgrad.models.gpt2 against transformers' GPT2LMHeadModel (PyTorch eager), and peak memory as the peak
resident set (VmHWM) of a new process that loads the model and runs the workload once: the same measure
for both libraries (PyTorch's CPU allocator is invisible to tracemalloc)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# GPT-2 124M: 12 layers, width 768, 12 heads, vocabulary 50257, 1024 positions
FULL = {"layers": 12, "width": 768, "heads": 12, "vocab": 50257, "positions": 1024}
SMALL = {"layers": 2, "width": 128, "heads": 4, "vocab": 1024, "positions": 256}  # --quick / --tiny
SEED = 0


def checkpoint(size: dict) -> str:
    """A random GPT-2 of this size saved by transformers (seeded), made once and kept in the temp folder."""
    path = Path(tempfile.gettempdir()) / "tgrad-bench-gpt2-{layers}x{width}-v{vocab}-s0".format(**size)
    if not (path / "model.safetensors").is_file():
        import torch  # (only here: the tgrad process of peak_rss imports neither)
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(SEED)
        cfg = GPT2Config(n_layer=size["layers"], n_embd=size["width"], n_head=size["heads"],
                         vocab_size=size["vocab"], n_positions=size["positions"], bos_token_id=None,
                         eos_token_id=None)
        GPT2LMHeadModel(cfg).save_pretrained(path)
    return str(path)


def params(size: dict) -> int:
    c = size["width"]
    return size["vocab"] * c + size["positions"] * c + size["layers"] * 12 * c * c


def shape(phase: str) -> tuple[int, int, int]:
    """batch, prompt tokens, new tokens."""
    return (1, 32, 128) if phase == "decode" else (8, 128, 0)


def inputs(size: dict, phase: str) -> dict[str, np.ndarray]:
    batch, prompt, new = shape(phase)
    rng = np.random.default_rng(3)
    return {"path": np.array(checkpoint(size)), "new": np.array(new), "full": np.array(size is FULL),
            "ids": rng.integers(0, size["vocab"], (batch, prompt)).astype(np.int64)}


def _status() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) / 1024
    return out


def peak_rss(contender: str, kind: str, d: dict) -> dict[str, float]:
    """{'peak_rss_mib': the peak resident set of a new process that loads the model and runs the workload
    once, 'model_rss_mib': its resident set after loading, 'run_peak_mib': the run's peak above that}; {}
    for a contender with no such run. A process of its own: in the suite's process both libraries and every
    earlier row share one high-water mark."""
    framework = "torch" if contender == "torch" else contender.split()[1] if contender.startswith("tgrad ") \
        else None
    if framework is None or not sys.platform.startswith("linux"):
        return {}
    args = [sys.executable, "-m", "bench.gpt2", framework, kind.removeprefix("gpt2_"),
            "full" if bool(d["full"]) else "small"]
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(args, capture_output=True, text=True, cwd=root, env=dict(os.environ))
    if out.returncode:
        return {}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _probe(framework: str, phase: str, which: str) -> None:
    d = inputs(FULL if which == "full" else SMALL, phase)
    if framework == "torch":
        run = torch_decode(d) if phase == "decode" else torch_prefill(d)
    else:
        run = tgrad_decode(framework, d) if phase == "decode" else tgrad_prefill(framework, d)
    loaded = _status()
    try:  # the high-water mark from here on: the run's own peak (Linux resets it on "5")
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    result = run()
    if hasattr(result, "realize"):
        result.realize()
    after = _status()
    print(json.dumps({"peak_rss_mib": round(max(loaded["VmHWM"], after["VmHWM"]), 1),
                      "model_rss_mib": round(loaded["VmRSS"], 1),
                      "run_peak_mib": round(after["VmHWM"] - loaded["VmRSS"], 1)}))


def tgrad_decode(device: str, d: dict):
    from tgrad.models.gpt2 import GPT2

    model = GPT2.from_pretrained(str(d["path"]), device=device)
    ids, new = d["ids"], int(d["new"])
    return lambda: model.generate(ids, new)


def tgrad_prefill(device: str, d: dict):
    from tgrad.models.gpt2 import GPT2

    model = GPT2.from_pretrained(str(d["path"]), device=device)
    ids, mask = d["ids"].astype(np.int32), np.ones(d["ids"].shape, bool)
    # the last position's logits, as generate's prefill computes them (and transformers' logits_to_keep=1)
    return lambda: model._logits(model._hidden(ids, mask)[:, -1])


def torch_model(d: dict):
    import torch
    from transformers import GPT2LMHeadModel

    return torch, GPT2LMHeadModel.from_pretrained(str(d["path"]), dtype=torch.float32).eval()


def torch_decode(d: dict, compile_with=None):
    """transformers' greedy generate; with compile_with (torch.compile) its forward compiled over a static
    cache (transformers' recipe for a compiled generate: one shape for every decode step)."""
    torch, model = torch_model(d)
    ids, new = torch.from_numpy(d["ids"]), int(d["new"])
    extra = {}
    if compile_with is not None:
        model.forward = compile_with(model.forward)
        extra["cache_implementation"] = "static"

    def run():
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                  pad_token_id=0, **extra)

    return run


def torch_prefill(d: dict, compile_with=None):
    torch, model = torch_model(d)
    ids = torch.from_numpy(d["ids"])
    forward = model if compile_with is None else compile_with(model)

    def run():
        with torch.no_grad():
            return forward(ids, logits_to_keep=1).logits[:, -1]

    return run


def expected_decode(d: dict) -> np.ndarray:
    """transformers' greedy tokens (a random model's logits are close together, but its largest two
    differ by far more than the two libraries' rounding on the prompts used here)."""
    return torch_decode(d)().numpy()


def expected_prefill(d: dict) -> np.ndarray:
    return torch_prefill(d)().numpy()


if __name__ == "__main__":  # python -m bench.gpt2 tgrad-device|torch decode|prefill full|small
    _probe(*sys.argv[1:4])
