"""GPT-2 text generation from a Hugging Face checkpoint directory (config.json + model.safetensors), with
tgrad's KV cache and TinyJit decode step; tokens are printed as they come, then prefill ms and decode
tokens/s (and, with --compare, the same for transformers' generate with its cache, on the same threads).

    python examples/gpt2.py --make-random /tmp/gpt2-random       # a random GPT-2 124M-shaped checkpoint
    python examples/gpt2.py --model /tmp/gpt2-random --prompt-ids 464,2068,7586 --max-new-tokens 128 \\
        --greedy --compare --json out.json
    python examples/gpt2.py --model DIR --prompt "Hello, my dog"  # DIR holds a tokenizer.json

Nothing is downloaded: --make-random saves transformers' GPT2LMHeadModel with random weights (its
--layers / --width / --heads / --vocab make a smaller one). A real checkpoint directory (e.g. the files of
huggingface.co/gpt2) works the same. The timed run follows one untimed run of the same shapes (--warmup),
so the numbers leave out kernel compilation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tgrad.models.gpt2 import GPT2  # noqa: E402


def _need_transformers(what: str) -> None:
    """Stop with the install line where transformers (and torch) are missing."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"{what} needs transformers and torch ({e}): pip install -e '.[gpt2]'") from e


def make_random(path: str, layers: int = 12, width: int = 768, heads: int = 12, vocab: int = 50257,
                positions: int = 1024, seed: int = 0) -> None:
    """Save a GPT-2 with random weights (transformers' initialisation) to path."""
    _need_transformers("--make-random")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=positions,
                     bos_token_id=None, eos_token_id=None)
    GPT2LMHeadModel(cfg).save_pretrained(path)


class Timer:
    """on_token callback: prints tokens as they come and times the first one (prefill) and the rest."""

    def __init__(self, decode=None, quiet: bool = False):
        self.decode, self.quiet = decode, quiet
        self.start = self.first = self.last = time.perf_counter()
        self.count = 0

    def __call__(self, tokens: np.ndarray) -> None:
        self.last = time.perf_counter()
        if self.count == 0:
            self.first = self.last
        self.count += 1
        if not self.quiet:
            text = self.decode([int(tokens[0])]) if self.decode else f" {int(tokens[0])}"
            print(text, end="", flush=True)

    def result(self, batch: int) -> dict:
        decode_s = self.last - self.first
        return {"prefill_ms": (self.first - self.start) * 1e3,
                "decode_tokens_per_s": batch * (self.count - 1) / decode_s if decode_s > 0 else float("nan")}


def run_tgrad(model: GPT2, ids: np.ndarray, args, decode=None, quiet: bool = False) -> dict:
    kw = dict(temperature=0.0 if args.greedy else args.temperature, top_k=None if args.greedy else args.top_k,
              seed=args.seed, use_cache=not args.no_cache)
    for _ in range(args.warmup):
        model.generate(ids, args.max_new_tokens, **kw)
    timer = Timer(decode, quiet)
    out = model.generate(ids, args.max_new_tokens, on_token=timer, **kw)
    return {"tokens": out[0].tolist(), **timer.result(len(ids))}


def run_transformers(path: str, ids: np.ndarray, args) -> dict:
    """transformers' generate with its cache, timed by a streamer the same way."""
    _need_transformers("--compare")
    import torch
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(path, dtype=torch.float32).eval()

    class Streamer:
        def __init__(self):
            self.timer = Timer(quiet=True)
            self.prompt_seen = False

        def put(self, value):  # first the prompt, then each new token
            if self.prompt_seen:
                self.timer(value.reshape(-1).numpy())
            self.prompt_seen = True

        def end(self):
            pass

    kw = dict(max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens,
              do_sample=not args.greedy, top_k=args.top_k if not args.greedy else None, pad_token_id=0)
    if not args.greedy:
        kw["temperature"] = args.temperature
    x = torch.tensor(ids)
    with torch.no_grad():
        for _ in range(args.warmup):
            model.generate(x, **kw)
        streamer = Streamer()
        out = model.generate(x, streamer=streamer, **kw)
    return {"tokens": out[0].tolist(), "threads": torch.get_num_threads(), **streamer.timer.result(len(ids))}


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="checkpoint directory (config.json + model.safetensors)")
    p.add_argument("--prompt-ids", help="comma-separated token ids")
    p.add_argument("--prompt", help="text; needs tokenizer.json in the model directory (tokenizers package)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--greedy", action="store_true", help="argmax decoding (else temperature / top-k)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-cache", action="store_true", help="run the whole window for every token")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (kernels compile there)")
    p.add_argument("--device", help="tgrad device (CPU, CL, ...): sets DEVICE")
    p.add_argument("--compare", action="store_true", help="time transformers' generate too")
    p.add_argument("--json", help="write tokens, prefill_ms, decode_tokens_per_s (and transformers') here")
    p.add_argument("--make-random", metavar="DIR", help="save a random GPT-2 checkpoint to DIR and stop")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--positions", type=int, default=1024)
    a = p.parse_args(argv)
    if a.make_random:
        make_random(a.make_random, a.layers, a.width, a.heads, a.vocab, a.positions, a.seed)
        print(f"saved a random GPT-2 ({a.layers} layers, width {a.width}) to {a.make_random}")
        return None
    if not a.model or bool(a.prompt_ids) == bool(a.prompt):
        p.error("give --model and one of --prompt-ids / --prompt (or --make-random DIR)")
    if a.device:
        os.environ["DEVICE"] = a.device
    decode = None
    if a.prompt or (Path(a.model) / "tokenizer.json").is_file():
        if not (Path(a.model) / "tokenizer.json").is_file():
            p.error(f"--prompt needs {Path(a.model) / 'tokenizer.json'}; pass --prompt-ids instead")
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # (token ids still work: they are printed as numbers)
            if a.prompt:
                raise SystemExit(f"--prompt needs tokenizers ({e}): pip install -e '.[gpt2]'") from e
            Tokenizer = None  # noqa: N806
        if Tokenizer is not None:
            tok = Tokenizer.from_file(str(Path(a.model) / "tokenizer.json"))
            decode = tok.decode
    ids = tok.encode(a.prompt).ids if a.prompt else [int(x) for x in a.prompt_ids.split(",")]
    ids = np.array([ids], np.int64)
    model = GPT2.from_pretrained(a.model)
    print(decode(ids[0].tolist()) if decode else " ".join(map(str, ids[0])), end="", flush=True)
    result = run_tgrad(model, ids, a, decode)
    print(f"\ntgrad: prefill {result['prefill_ms']:.1f} ms, "
          f"decode {result['decode_tokens_per_s']:.1f} tokens/s")
    if a.compare:
        ref = run_transformers(a.model, ids, a)
        print(f"transformers ({ref['threads']} threads): prefill {ref['prefill_ms']:.1f} ms, decode "
              f"{ref['decode_tokens_per_s']:.1f} tokens/s" + ("; the same tokens" if a.greedy and
                                                               ref["tokens"] == result["tokens"] else ""))
        result["transformers"] = ref
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
