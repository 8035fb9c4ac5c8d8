"""tinygrad.nn.optim: tgrad's optimizers."""

from tgrad.nn.optim import *  # noqa: F403
