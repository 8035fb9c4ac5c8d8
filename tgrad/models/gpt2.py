"""GPT-2 from a Hugging Face checkpoint directory (config.json + model.safetensors), as transformers'
GPT2LMHeadModel computes it, with KV-cache generation.

    model = GPT2.from_pretrained("path/to/gpt2")           # float32 / float16 / bfloat16 weights
    logits = model(ids, attention_mask=mask)                # (B, T, vocab), left padding as transformers
    out = model.generate(ids, max_new_tokens=64)            # greedy; temperature=0.8, top_k=40 samples

Position ids come from the attention mask (cumsum - 1, 0 on padding), as transformers' generate makes
them. generate() runs the prompt once (prefill), which writes every layer's keys and values into a cache
allocated once per call at its final length, shape (B, n_head, L, head_dim); then each new token is one
call of a TinyJit decode step that writes its key and value at the current slot and attends over
cache[:, :, :seen], `seen` a bound Variable (symbolic.py: the slots written so far), so one capture serves
every position: `cache_slots` is the one place that knows how a slot is addressed.
use_cache=False runs the whole window again for every token (one shape, so its kernels compile once).
Bad input (ids >= vocab, a prompt longer than n_positions, a checkpoint with missing or mis-shaped
tensors, an architecture other than GPT-2) raises an error naming the value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tgrad.dtype import DType, dtypes
from tgrad.errors import ArgumentError, DTypeError, IndexRangeError, ShapeError
from tgrad.jit import TinyJit
from tgrad.nn.state import StateDictError, safe_load
from tgrad.symbolic import BoundVariable, Variable
from tgrad.tensor import Tensor

ARCHITECTURES = ("GPT2LMHeadModel", "GPT2Model")
# transformers' ACT2FN names -> tgrad's gelu(approximate=...) (None: relu)
ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none",
               "relu": None}
IGNORED_KEYS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers of older checkpoints, not weights


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int
    activation: str | None  # gelu's approximate argument; None for relu
    layer_norm_epsilon: float
    scale_attn_weights: bool
    scale_attn_by_inverse_layer_idx: bool
    tie_word_embeddings: bool

    @staticmethod
    def from_dict(cfg: dict, where: str) -> GPT2Config:
        """The fields of a transformers config.json; anything this GPT-2 cannot compute raises, naming it."""
        model_type = cfg.get("model_type", "gpt2")
        archs = cfg.get("architectures") or ["GPT2LMHeadModel"]
        if model_type != "gpt2" or not any(a in ARCHITECTURES for a in archs):
            raise ArgumentError(f"GPT2.from_pretrained: {where} has model_type {model_type!r} and "
                                f"architectures {archs}; only model_type 'gpt2' with "
                                f"{' or '.join(ARCHITECTURES)} is supported")
        act = cfg.get("activation_function", "gelu_new")
        if act not in ACTIVATIONS:
            raise ArgumentError(f"GPT2.from_pretrained: {where} has activation_function {act!r}; supported: "
                                f"{', '.join(ACTIVATIONS)}")
        if cfg.get("add_cross_attention"):
            raise ArgumentError(f"GPT2.from_pretrained: {where} has add_cross_attention true (an "
                                "encoder-decoder GPT-2), which is not supported")
        n_embd, n_head = int(cfg.get("n_embd", 768)), int(cfg.get("n_head", 12))
        if n_embd % n_head:
            raise ArgumentError(f"GPT2.from_pretrained: {where}: n_embd {n_embd} is not a multiple of n_head "
                                f"{n_head}")
        return GPT2Config(
            vocab_size=int(cfg.get("vocab_size", 50257)),
            n_positions=int(cfg.get("n_positions", cfg.get("n_ctx", 1024))),
            n_embd=n_embd, n_layer=int(cfg.get("n_layer", 12)), n_head=n_head,
            n_inner=int(cfg.get("n_inner") or 4 * n_embd), activation=ACTIVATIONS[act],
            layer_norm_epsilon=float(cfg.get("layer_norm_epsilon", 1e-5)),
            scale_attn_weights=bool(cfg.get("scale_attn_weights", True)),
            scale_attn_by_inverse_layer_idx=bool(cfg.get("scale_attn_by_inverse_layer_idx", False)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        )

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the model needs, by its checkpoint name (without the 'transformer.' prefix)."""
        c, inner = self.n_embd, self.n_inner
        out = {"wte.weight": (self.vocab_size, c), "wpe.weight": (self.n_positions, c),
               "ln_f.weight": (c,), "ln_f.bias": (c,)}
        for i in range(self.n_layer):
            out.update({f"h.{i}.ln_1.weight": (c,), f"h.{i}.ln_1.bias": (c,),
                        f"h.{i}.attn.c_attn.weight": (c, 3 * c), f"h.{i}.attn.c_attn.bias": (3 * c,),
                        f"h.{i}.attn.c_proj.weight": (c, c), f"h.{i}.attn.c_proj.bias": (c,),
                        f"h.{i}.ln_2.weight": (c,), f"h.{i}.ln_2.bias": (c,),
                        f"h.{i}.mlp.c_fc.weight": (c, inner), f"h.{i}.mlp.c_fc.bias": (inner,),
                        f"h.{i}.mlp.c_proj.weight": (inner, c), f"h.{i}.mlp.c_proj.bias": (c,)})
        if not self.tie_word_embeddings:
            out["lm_head.weight"] = (self.vocab_size, c)
        return out


def cache_slots(seen: BoundVariable, length: int, device: str) -> Tensor:
    """The decode step's cache addressing. `seen` (a bound Variable, 1..length: the slots attended, those
    written so far and this step's, so one TinyJit capture serves every position) is the extent the
    attention reads (cache[:, :, :seen]); `write` (length, 1) marks slot seen - 1, where the new key and
    value go (an assign writes the whole cache: symbolic.py takes no assign into a symbolic slice)."""
    slots = Tensor.arange(length, device=device, dtype=dtypes.int32)
    return (slots == Tensor(seen, device=device) - 1).reshape(length, 1)


def _read_checkpoint(path: Path, device: str | None) -> dict[str, Tensor]:
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        return safe_load(single, device)
    if index.is_file():  # a sharded checkpoint: the index maps each tensor to its file
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for f in files for k, v in safe_load(path / f, device).items()}
    raise FileNotFoundError(f"GPT2.from_pretrained: {path} has no model.safetensors (nor a sharded "
                            "model.safetensors.index.json); transformers' save_pretrained writes one")


def _pick(logits: np.ndarray, temperature: float, top_k: int | None, rng: np.random.Generator) -> np.ndarray:
    """The next token of each row: argmax (the first of equal maxima, as torch) or a sample."""
    if temperature <= 0:
        return logits.argmax(-1)
    z = logits.astype(np.float64) / temperature
    if top_k is not None:
        kth = np.sort(z, -1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.array([rng.choice(len(row), p=row) for row in p])


class GPT2:
    """GPT-2 with the weights of a checkpoint; see the module docstring."""

    def __init__(self, config: GPT2Config, weights: dict[str, Tensor]):
        self.config = config
        self.weights = weights
        self.head_dim = config.n_embd // config.n_head
        base = 1 / math.sqrt(self.head_dim) if config.scale_attn_weights else 1.0
        inverse = config.scale_attn_by_inverse_layer_idx
        self.scales = [base / (i + 1) if inverse else base for i in range(config.n_layer)]
        self.lm_head = weights["wte.weight" if config.tie_word_embeddings else "lm_head.weight"]
        self._decode_shape: tuple | None = None

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | None = None,
                        dtype: DType | str | None = "float32") -> GPT2:
        """Read config.json and model.safetensors from a directory. dtype: the weights' and computation's
        dtype (None keeps the checkpoint's)."""
        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"GPT2.from_pretrained: {path} has no config.json")
        cfg_path = path / "config.json"
        config = GPT2Config.from_dict(json.loads(cfg_path.read_text()), str(cfg_path))
        raw = {k.removeprefix("transformer."): v for k, v in _read_checkpoint(path, device).items()
               if not k.endswith(IGNORED_KEYS)}
        if config.tie_word_embeddings:
            raw.pop("lm_head.weight", None)  # transformers ties it to wte whatever the file holds
        want = config.shapes()
        missing = [k for k in want if k not in raw]
        unexpected = [k for k in raw if k not in want]
        if missing or unexpected:
            parts = ([f"missing tensors: {', '.join(missing)}"] if missing else []) + \
                    ([f"unexpected tensors: {', '.join(unexpected)}"] if unexpected else [])
            raise StateDictError(f"GPT2.from_pretrained: {path}: " + "; ".join(parts))
        wrong = [f"{k} has shape {raw[k].shape}, config.json needs {s}" for k, s in want.items()
                 if raw[k].shape != s]
        if wrong:
            raise ShapeError(f"GPT2.from_pretrained: {path}: " + "; ".join(wrong))
        if dtype is not None:
            dt = dtypes.from_any(dtype) if isinstance(dtype, str) else dtype
            if not dt.is_float:
                raise DTypeError(f"GPT2.from_pretrained: dtype must be a float type, got {dt.name}")
            raw = {k: v.cast(dt) for k, v in raw.items()}
        weights = {k: v.contiguous() for k, v in raw.items()}
        first, *rest = weights.values()
        first.realize(*rest)
        return cls(config, weights)

    # ---- inputs ----
    def _inputs(self, ids: Any, attention_mask: Any) -> tuple[np.ndarray, np.ndarray]:
        arr = ids.numpy() if isinstance(ids, Tensor) else np.asarray(ids)
        if arr.ndim == 1:
            arr = arr[None]
        if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
            raise ShapeError(f"GPT2: token ids must be (batch, length) with both > 0, got shape {arr.shape}")
        if arr.dtype.kind not in "iu":
            raise DTypeError(f"GPT2: token ids must be integers, got {arr.dtype}")
        bad = np.argwhere((arr < 0) | (arr >= self.config.vocab_size))
        if len(bad):
            b, t = bad[0]
            raise IndexRangeError(f"GPT2: token id {arr[b, t]} at [{b}, {t}] is out of range for vocab_size "
                                  f"{self.config.vocab_size}")
        if arr.shape[1] > self.config.n_positions:
            raise ShapeError(f"GPT2: the prompt has {arr.shape[1]} tokens, more than n_positions "
                             f"{self.config.n_positions}")
        if attention_mask is None:
            return arr.astype(np.int32), np.ones(arr.shape, bool)
        m = attention_mask.numpy() if isinstance(attention_mask, Tensor) else np.asarray(attention_mask)
        m = m[None] if m.ndim == 1 else m
        if m.shape != arr.shape or not np.isin(m, (0, 1)).all():
            raise ShapeError(f"GPT2: attention_mask must be 0s and 1s of the ids' shape {arr.shape}, got "
                             f"shape {m.shape}")
        empty = np.flatnonzero(m.sum(1) == 0)
        if len(empty):
            raise ArgumentError(f"GPT2: row {empty[0]} of attention_mask has no token")
        return arr.astype(np.int32), m.astype(bool)

    # ---- the network ----
    def _tensor(self, values: np.ndarray) -> Tensor:
        return Tensor(values, device=self.lm_head.device)

    def _embed(self, ids: Tensor, positions: Tensor) -> Tensor:
        # ids were checked on the host, positions are < n_positions by construction: no device check
        return self.weights["wte.weight"]._take(0, ids, checked=True) + \
            self.weights["wpe.weight"]._take(0, positions, checked=True)

    def _norm(self, x: Tensor, name: str) -> Tensor:
        w = self.weights
        return x.layernorm((-1,), self.config.layer_norm_epsilon) * w[f"{name}.weight"] + w[f"{name}.bias"]

    def _dense(self, x: Tensor, name: str) -> Tensor:  # transformers' Conv1D: weight (in, out)
        return x.matmul(self.weights[f"{name}.weight"]) + self.weights[f"{name}.bias"]

    def _attend(self, i: int, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
        scores = q.matmul(k.transpose(-2, -1)) * self.scales[i]
        return allowed.where(scores, -math.inf).softmax(-1).matmul(v)

    def _block(self, i: int, h: Tensor, attend: Callable) -> Tensor:
        (batch, t, c), heads = h.shape, self.config.n_head
        qkv = self._dense(self._norm(h, f"h.{i}.ln_1"), f"h.{i}.attn.c_attn")
        q, k, v = (z.reshape(batch, t, heads, self.head_dim).transpose(1, 2) for z in qkv.split(c, 2))
        a = attend(i, q, k, v).transpose(1, 2).reshape(batch, t, c)
        h = h + self._dense(a, f"h.{i}.attn.c_proj")
        x = self._dense(self._norm(h, f"h.{i}.ln_2"), f"h.{i}.mlp.c_fc")
        x = x.relu() if self.config.activation is None else x.gelu(self.config.activation)
        return h + self._dense(x, f"h.{i}.mlp.c_proj")

    def _logits(self, h: Tensor) -> Tensor:
        return self._norm(h, "ln_f").linear(self.lm_head)

    def _hidden(self, ids: np.ndarray, mask: np.ndarray, kv: list | None = None) -> Tensor:
        """The last hidden states (B, T, n_embd) of a whole sequence; kv collects each layer's (k, v)."""
        t = ids.shape[1]
        positions = np.where(mask, np.cumsum(mask, 1) - 1, 0).astype(np.int32)
        causal = np.tril(np.ones((t, t), bool))
        # a padded query attends to itself as well, so no softmax row is empty (its output is not used)
        allowed = causal[None] & (mask[:, None, :] | np.eye(t, dtype=bool)[None])
        allowed_t = self._tensor(allowed[:, None])

        def attend(i, q, k, v):
            if kv is not None:
                kv.append((k, v))
            return self._attend(i, q, k, v, allowed_t)

        h = self._embed(self._tensor(ids), self._tensor(positions))
        for i in range(self.config.n_layer):
            h = self._block(i, h, attend)
        return h

    def __call__(self, ids: Any, attention_mask: Any = None) -> Tensor:
        """Logits (B, T, vocab) over token ids (B, T) (or (T,)); attention_mask: 1 token, 0 padding."""
        ids, mask = self._inputs(ids, attention_mask)
        return self._logits(self._hidden(ids, mask))

    @TinyJit
    def _decode(self, tok: Tensor, seen: BoundVariable, positions: Tensor, valid: Tensor,
                caches: list[Tensor]) -> Tensor:
        """One token per row: tok and positions (B, 1), seen the slots attended (this step's slot is seen -
        1), valid (B, L) the slots that hold tokens (not padding), caches [k0, v0, k1, v1, ...] each (B,
        n_head, L, head_dim)."""
        batch, length = valid.shape
        write = cache_slots(seen, length, tok.device)
        allowed = valid[:, :seen].reshape(batch, 1, 1, seen)

        def attend(i, q, k, v):
            kc, vc = caches[2 * i], caches[2 * i + 1]
            kc.assign(write.where(k, kc))
            vc.assign(write.where(v, vc))
            return self._attend(i, q, kc[:, :, :seen], vc[:, :, :seen], allowed)

        h = self._embed(tok, positions)
        for i in range(self.config.n_layer):
            h = self._block(i, h, attend)
        return self._logits(h[:, -1])

    def generate(self, ids: Any, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
                 attention_mask: Any = None, use_cache: bool = True, seed: int | None = None,
                 on_token: Callable[[np.ndarray], None] | None = None) -> np.ndarray:
        """ids (B, T) followed by max_new_tokens new tokens each, (B, T + max_new_tokens) int32. temperature
        0: greedy (transformers' do_sample=False); else samples from softmax(logits / temperature), over the
        top_k largest if given (numpy's generator, seeded by seed). Rows of different lengths are left-padded
        with attention_mask 0. on_token(tokens (B,)) is called as each step's tokens come."""
        ids, mask = self._inputs(ids, attention_mask)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
                or max_new_tokens < 1:
            raise ArgumentError(f"GPT2.generate: max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        if not math.isfinite(temperature) or temperature < 0:
            raise ArgumentError(f"GPT2.generate: temperature must be >= 0 and finite, got {temperature}")
        if top_k is not None and not 1 <= top_k <= self.config.vocab_size:
            raise ArgumentError(f"GPT2.generate: top_k must be in 1..{self.config.vocab_size}, got {top_k}")
        batch, t = ids.shape
        length = t + max_new_tokens - 1  # the positions fed to the model (the last new token is not)
        if length > self.config.n_positions:
            raise ShapeError(f"GPT2.generate: a prompt of {t} tokens plus max_new_tokens {max_new_tokens} "
                             f"needs {length} positions, more than n_positions {self.config.n_positions}")
        if (np.diff(mask.astype(np.int8), axis=1) < 0).any():
            raise ArgumentError("GPT2.generate: attention_mask must pad on the left (0s before the tokens), "
                                "as transformers' generate expects of a decoder-only model")
        valid = np.concatenate([mask, np.ones((batch, length - t), bool)], 1)
        rng = np.random.default_rng(seed)
        steps = self._cached(ids, mask, valid) if use_cache else self._uncached(ids, valid)
        out = [ids]
        logits = next(steps)
        for step in range(max_new_tokens):
            tok = _pick(logits, temperature, top_k, rng).astype(np.int32)
            out.append(tok[:, None])
            if on_token is not None:
                on_token(tok)
            if step + 1 < max_new_tokens:
                logits = steps.send(tok)
        steps.close()
        return np.concatenate(out, 1)

    def _cached(self, ids: np.ndarray, mask: np.ndarray, valid: np.ndarray):
        """Logits (B, vocab) of the prompt's last token, then of each token sent in."""
        (batch, t), length = ids.shape, valid.shape[1]
        kv: list = []
        h = self._hidden(ids, mask, kv)
        pad = ((0, 0), (0, 0), (0, length - t), (0, 0))
        caches = [c.pad(pad).contiguous() for pair in kv for c in pair]  # allocated here, at length L
        logits = self._logits(h[:, -1])
        logits.realize(*caches)
        signature = (batch, length, self.lm_head.dtype)
        if signature != self._decode_shape:  # keep one capture: the jit holds only this call's shapes
            self._decode.reset()
            self._decode_shape = signature
        valid_t, count = self._tensor(valid), mask.sum(1).astype(np.int32)
        tok = yield logits.numpy()
        slots = Variable("seen", 1, length)
        for pos in range(t, length):
            positions = self._tensor((count + pos - t)[:, None])
            tok = yield self._decode(self._tensor(tok[:, None]), slots.bind(pos + 1), positions, valid_t,
                                     caches).numpy()

    def _uncached(self, ids: np.ndarray, valid: np.ndarray):
        """As _cached, running the whole window (B, L) for every token: later slots are hidden by the
        causal mask, and the window's one shape keeps the kernels the same from token to token."""
        (batch, t), length = ids.shape, valid.shape[1]
        window = np.zeros((batch, length), np.int32)
        window[:, :t] = ids
        for pos in range(t - 1, length):
            pick = np.zeros((1, length, 1), np.float32)
            pick[0, pos] = 1  # the hidden state at pos, as a sum (exact: the other terms are zeros)
            h = (self._hidden(window, valid) * self._tensor(pick).cast(self.lm_head.dtype)).sum(1)
            tok = yield self._logits(h).numpy()
            if pos + 1 < length:
                window[:, pos + 1] = tok
