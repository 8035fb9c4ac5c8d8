"""Tensor's ops: helpers (axis and shape arguments, broadcasting, node builders) and numerics (pow,
division, fmod and floor division as PyTorch computes them)."""
