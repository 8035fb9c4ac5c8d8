"""The README demo learns: a short MLP run of examples/beautiful_mnist.py on sklearn digits."""
import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def example():
    path = Path(__file__).resolve().parent.parent / "examples" / "beautiful_mnist.py"
    spec = importlib.util.spec_from_file_location("beautiful_mnist", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_beautiful_mnist_mlp_learns_digits(example):
    result = example.train("mlp", steps=150, batch_size=32, lr=3e-3, dataset="digits", quiet=True)
    assert result["dataset"] == "digits"
    assert result["accuracy"] >= 0.90, result
    assert result["final_loss"] < 0.5
    # the jitted step replays the same kernels each time
    assert result["kernels_per_step"] == sum(result["kernel_names"].values())
