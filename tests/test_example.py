"""The examples learn: short runs of examples/beautiful_mnist.py (MLP and conv net) on sklearn digits and
of examples/gpt.py."""
import importlib.util
from pathlib import Path

import pytest


def _load(name: str):
    path = Path(__file__).resolve().parent.parent / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example():
    return _load("beautiful_mnist")


def test_beautiful_mnist_mlp_learns_digits(example):
    result = example.train("mlp", steps=150, batch_size=32, lr=3e-3, dataset="digits", quiet=True)
    assert result["dataset"] == "digits"
    assert result["accuracy"] >= 0.90, result
    assert result["final_loss"] < 0.5
    # the jitted step replays the same kernels each time
    assert result["kernels_per_step"] == sum(result["kernel_names"].values())


def test_beautiful_mnist_cnn_learns_digits(example):
    """The conv net path (the demo trains the 28x28 CNN by default; here the small 8x8 one, for time)."""
    result = example.train("cnn", steps=40, batch_size=32, lr=3e-3, dataset="digits", quiet=True, size=8)
    assert result["model"] == "cnn" and result["accuracy"] >= 0.85, result


def test_progress_shows_the_accuracy_once_measured_and_never_nan(example, capsys):
    """The progress line gives the loss from the first step and the test accuracy once it was measured
    (every 25 steps): before that nothing, not 'nan%' (issue 45)."""
    example.train("mlp", steps=30, batch_size=32, lr=3e-3, dataset="digits", quiet=False)
    out = capsys.readouterr()
    shown = (out.out + out.err).replace("\r", "\n")
    assert "loss" in shown and "accuracy" in shown
    assert "nan" not in shown.lower()


def test_digits_scaled_to_28(example):
    import numpy as np

    x = np.arange(2 * 64, dtype=np.float32).reshape(2, 8, 8)
    big = example.to_28(x)
    assert big.shape == (2, 28, 28) and big[:, :2].sum() == 0 and big[:, :, -2:].sum() == 0
    np.testing.assert_array_equal(big[:, 2:26:3, 2:26:3], x)
    np.testing.assert_array_equal(big[:, 4:26:3, 4:26:3], x)


@pytest.fixture(scope="module")
def gpt_example():
    return _load("gpt")


def test_gpt_example_learns_and_writes_text(gpt_example, capsys):
    """A tiny char GPT on 20 KB of the standard library's source: the loss falls from ~ln(vocab) and
    generation prints text made of the vocabulary."""
    import math

    r = gpt_example.train(steps=40, batch_size=8, ctx=16, width=32, heads=2, layers=1, lr=1e-2,
                          text_bytes=20_000, sample_chars=40, quiet=False)
    assert abs(r["first_loss"] - math.log(r["vocab"])) < 0.7, r["first_loss"]  # ~ a uniform guess at first
    assert r["final_loss"] < r["first_loss"] - 1.0, (r["first_loss"], r["final_loss"])
    assert len(r["sample"]) == len("def ") + 40 and r["sample"].startswith("def ")
    out = capsys.readouterr().out
    assert r["sample"] in out and "sampled characters" in out


def _greedy_by_recomputing(gpt_example, model, ids: list[int], n: int) -> list[int]:
    """The example's sampling rule, each character by running the char GPT itself over the text since the
    last start (when that passes ctx characters, its last ctx // 2 start again at position 0)."""
    import numpy as np

    from tgrad import Tensor

    out, window = list(ids), list(ids)
    for _ in range(n):
        if len(window) > model.ctx:
            window = window[-(model.ctx // 2):]
        logits = model(Tensor(np.array([window], np.int32)))[0, -1].numpy()
        out.append(int(logits.argmax()))
        window.append(out[-1])
    return out


@pytest.mark.parametrize("prompt", ["def ", "class Foo(object):\n    def __init__(self, x"])
def test_gpt_example_samples_through_the_kv_cache_as_the_model_computes(gpt_example, prompt):
    """generate() runs the char GPT as tgrad.models.gpt2.GPT2 with its KV cache: the same logits as the
    model's own forward, and greedy sampling the same characters as running the model again for each one,
    across several restarts of the position window (ctx 16, 70 characters) and for a prompt longer than
    the context."""
    import numpy as np

    from tgrad import Tensor

    Tensor.manual_seed(3)
    text = gpt_example.load_text(20_000)
    itos = sorted(set(text) | {"\n", "?"})
    stoi = {c: i for i, c in enumerate(itos)}
    model = gpt_example.GPT(len(itos), 16, width=32, heads=2, layers=2)
    ids = np.array([[stoi[c] for c in text[100:116]], [stoi[c] for c in text[300:316]]])
    with Tensor.no_grad:
        want = model(Tensor(ids.astype(np.int32))).numpy()
        got = gpt_example.as_gpt2(model)(ids).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    start = [stoi.get(c, stoi["?"]) for c in prompt]
    want_text = "".join(itos[i] for i in _greedy_by_recomputing(gpt_example, model, start, 70))
    sample = gpt_example.generate(model, stoi, itos, prompt, 70, 0.0, np.random.default_rng(0))
    assert sample == want_text
    # sampling: seeded by the generator, characters of the vocabulary, n of them after the prompt
    drawn = [gpt_example.generate(model, stoi, itos, prompt, 40, 0.8, np.random.default_rng(5)) for _ in "ab"]
    assert drawn[0] == drawn[1] and drawn[0].startswith(prompt) and len(drawn[0]) == len(prompt) + 40
    assert set(drawn[0]) <= set(itos)
