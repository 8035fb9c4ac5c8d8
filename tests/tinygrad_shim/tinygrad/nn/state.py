"""tinygrad.nn.state: tgrad's state helpers."""

from tgrad.nn.state import *  # noqa: F403
