"""Pretrained model architectures read from their published checkpoint formats (tgrad.models.gpt2)."""
