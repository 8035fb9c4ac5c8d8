"""tgrad.models.gpt2 against transformers' GPT2LMHeadModel on small random checkpoints made here (nothing
downloaded): logits of a left-padded batch, greedy generation with and without the KV cache, float16 /
bfloat16 checkpoints, sampling, and the errors for bad checkpoints and bad input."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tgrad.dtype import dtypes
from tgrad.errors import ArgumentError, IndexRangeError, ShapeError
from tgrad.models.gpt2 import GPT2
from tgrad.nn.state import StateDictError, safe_load, safe_save

# the interpreted devices run every kernel launch slowly: a model of one layer there, two elsewhere
SLOW = {"TRITON", "CUDA", "AMD", "WEBGPU"}
VOCAB, POSITIONS = 96, 96
ROOT = Path(__file__).resolve().parent.parent


def _hf():
    """transformers, imported by the tests that use it: its import takes ~4 s, which every pytest-xdist worker
    paid while collecting the suite"""
    import transformers

    return transformers


def make_checkpoint(path, layers=2, width=32, heads=4, seed=0, **extra):
    """A random GPT-2 saved by transformers. initializer_range 0.2 (transformers' default is 0.02) spreads
    the logits, so a greedy pick is never decided by a last-bit difference between the two libraries."""
    torch.manual_seed(seed)
    hf = _hf()
    cfg = hf.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=VOCAB, n_positions=POSITIONS,
                        initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=0, **extra)
    model = hf.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(path)
    return model


@pytest.fixture
def checkpoint(tmp_path, device):
    layers = 1 if device in SLOW else 2
    return tmp_path, make_checkpoint(tmp_path, layers=layers)


def padded_batch(seed=1):
    """Three prompts of 10, 6 and 3 tokens, left-padded with id 0 and mask 0."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (3, 10))
    mask = np.ones((3, 10), np.int64)
    mask[1, :4] = 0
    mask[2, :7] = 0
    ids[mask == 0] = 0
    return ids, mask


def reference_logits(ref, ids, mask):
    positions = np.where(mask, mask.cumsum(1) - 1, 0)  # what transformers' generate passes
    with torch.no_grad():
        return ref(torch.tensor(ids), attention_mask=torch.tensor(mask),
                   position_ids=torch.tensor(positions)).logits.float().numpy()


def test_logits_match_transformers_for_a_padded_batch(checkpoint):
    path, ref = checkpoint
    ids, mask = padded_batch()
    got = GPT2.from_pretrained(path)(ids, attention_mask=mask).numpy()
    want = reference_logits(ref, ids, mask)
    assert got.shape == want.shape == (3, 10, VOCAB)
    keep = mask == 1  # padded positions' logits mean nothing (transformers' are not defined either)
    np.testing.assert_allclose(got[keep], want[keep], rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_generation_matches_transformers(checkpoint, device, use_cache):
    path, ref = checkpoint
    ids, mask = padded_batch()
    # 64 new tokens; the interpreted devices launch each kernel slowly, so they take 8 (same code path)
    new = 8 if device in SLOW else 64
    with torch.no_grad():
        want = ref.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=new,
                            do_sample=False).numpy()
    model = GPT2.from_pretrained(path)
    streamed = []
    got = model.generate(ids, new, attention_mask=mask, use_cache=use_cache, on_token=streamed.append)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.stack(streamed, 1), got[:, 10:])
    if use_cache and device != "NUMPY":  # (NUMPY has no kernels: TinyJit runs the function every time)
        # one capture of the decode step served every position after the first ones
        assert model._decode.captures == 1 and model._decode.replays == new - 1 - 2
        model.generate(ids, new, attention_mask=mask)  # the same shapes: replays, no capture of its own
        assert model._decode.captures == 1 and model._decode.replays == 2 * (new - 1) - 2


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_half_precision_checkpoints_load(tmp_path, device, half):
    make_checkpoint(tmp_path / "f32", layers=1)
    model16 = _hf().GPT2LMHeadModel.from_pretrained(tmp_path / "f32", dtype=getattr(torch, half))
    model16.save_pretrained(tmp_path / half)
    raw = (tmp_path / half / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    stored = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    assert stored == {"F16" if half == "float16" else "BF16"}
    # the same values
    ref = _hf().GPT2LMHeadModel.from_pretrained(tmp_path / half, dtype=torch.float32).eval()
    ids, mask = padded_batch()
    got = GPT2.from_pretrained(tmp_path / half)(ids, attention_mask=mask).numpy()
    want = reference_logits(ref, ids, mask)
    keep = mask == 1
    np.testing.assert_allclose(got[keep], want[keep], rtol=1e-4, atol=1e-4 * np.abs(want).max())
    kept = GPT2.from_pretrained(tmp_path / half, dtype=None)
    if half == "float16":
        assert kept.lm_head.dtype == dtypes.float16


def test_sampling_stays_in_the_top_k_and_repeats_with_a_seed(checkpoint, device):
    path, ref = checkpoint
    ids = np.array([[5, 17, 33, 2]])
    model = GPT2.from_pretrained(path)
    new = 5 if device in SLOW else 12
    a = model.generate(ids, new, temperature=1.5, top_k=3, seed=7)
    np.testing.assert_array_equal(a, model.generate(ids, new, temperature=1.5, top_k=3, seed=7))
    np.testing.assert_array_equal(model.generate(ids, new, temperature=0.7, top_k=1, seed=3),
                                  model.generate(ids, new))  # top_k=1 is greedy
    with torch.no_grad():
        logits = ref(torch.tensor(a[:, :-1])).logits[0].numpy()
    for t in range(3, a.shape[1] - 1):  # each sampled token is among transformers' 3 best there
        assert a[0, t + 1] in np.argsort(logits[t])[-3:]


def test_bad_input_raises_naming_the_value(checkpoint):
    path, _ = checkpoint
    model = GPT2.from_pretrained(path)
    with pytest.raises(IndexRangeError, match=f"token id {VOCAB} at \\[0, 1\\].*vocab_size {VOCAB}"):
        model([[1, VOCAB, 2]])
    with pytest.raises(IndexRangeError, match="token id -1"):
        model.generate([[1, -1]], 4)
    with pytest.raises(ShapeError, match=f"{POSITIONS + 1} tokens, more than n_positions {POSITIONS}"):
        model(np.ones((1, POSITIONS + 1), np.int64))
    with pytest.raises(ShapeError, match=f"max_new_tokens 90 needs {10 + 89} positions"):
        model.generate(np.ones((1, 10), np.int64), 90)
    with pytest.raises(ArgumentError, match="pad on the left"):
        model.generate([[1, 2, 3]], 2, attention_mask=[[1, 1, 0]])
    with pytest.raises(ArgumentError, match="temperature"):
        model.generate([[1, 2]], 2, temperature=-1.0)
    with pytest.raises(ArgumentError, match="max_new_tokens"):
        model.generate([[1, 2]], 0)


def test_bad_checkpoints_raise_naming_the_tensor_or_setting(tmp_path):
    good = tmp_path / "good"
    make_checkpoint(good, layers=1)
    tensors = safe_load(good / "model.safetensors", "NUMPY")

    def variant(name, state=None, **config):
        d = tmp_path / name
        shutil.copytree(good, d)
        if state is not None:
            safe_save(state, d / "model.safetensors")
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(config)
        (d / "config.json").write_text(json.dumps(cfg))
        return d

    missing = {k: v for k, v in tensors.items() if k != "transformer.h.0.mlp.c_fc.bias"}
    with pytest.raises(StateDictError, match=r"missing tensors: h\.0\.mlp\.c_fc\.bias"):
        GPT2.from_pretrained(variant("missing", missing))
    wrong = dict(tensors, **{"transformer.wpe.weight": np.zeros((POSITIONS - 1, 32), np.float32)})
    shapes = rf"wpe\.weight has shape \({POSITIONS - 1}, 32\).*\({POSITIONS}, 32\)"
    with pytest.raises(ShapeError, match=shapes):
        GPT2.from_pretrained(variant("wrong", wrong))
    with pytest.raises(ArgumentError, match="model_type 'llama'"):
        GPT2.from_pretrained(variant("llama", model_type="llama", architectures=["LlamaForCausalLM"]))
    with pytest.raises(ArgumentError, match="GPT2ForSequenceClassification"):
        GPT2.from_pretrained(variant("classifier", architectures=["GPT2ForSequenceClassification"]))
    with pytest.raises(ArgumentError, match="activation_function 'swish'"):
        GPT2.from_pretrained(variant("swish", activation_function="swish"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        GPT2.from_pretrained(tmp_path / "empty")


def test_the_example_runs_end_to_end(tmp_path, capsys):
    """examples/gpt2.py: --make-random, then greedy generation streamed, timed and compared with
    transformers' generate (the same tokens), written to JSON."""
    spec = importlib.util.spec_from_file_location("gpt2_example", ROOT / "examples" / "gpt2.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model_dir, out = tmp_path / "model", tmp_path / "out.json"
    size = ["--layers", "1", "--width", "32", "--heads", "2", "--vocab", "500", "--positions", "64"]
    example.main(["--make-random", str(model_dir), *size])
    example.main(["--model", str(model_dir), "--prompt-ids", "464,20,75", "--max-new-tokens", "12",
                  "--greedy", "--compare", "--json", str(out)])
    result = json.loads(out.read_text())
    assert len(result["tokens"]) == 15 and result["tokens"][:3] == [464, 20, 75]
    assert result["tokens"] == result["transformers"]["tokens"]
    assert result["prefill_ms"] > 0 and result["decode_tokens_per_s"] > 0
    printed = capsys.readouterr().out
    assert " ".join(map(str, result["tokens"])) in printed and "decode" in printed


def test_the_example_takes_text_through_a_tokenizer_json(tmp_path, capsys):
    """--prompt TEXT with a tokenizer.json in the model directory: encoded by `tokenizers`, and the
    streamed tokens printed as text (a word-level tokenizer made here; GPT-2's is the same file format)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    spec = importlib.util.spec_from_file_location("gpt2_example_text", ROOT / "examples" / "gpt2.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model_dir = tmp_path / "model"
    make_checkpoint(model_dir, layers=1)
    words = [f"w{i}" for i in range(VOCAB)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(model_dir / "tokenizer.json"))
    out = tmp_path / "out.json"
    example.main(["--model", str(model_dir), "--prompt", "w5 w17 w33", "--max-new-tokens", "6", "--greedy",
                  "--warmup", "0", "--json", str(out)])
    tokens = json.loads(out.read_text())["tokens"]
    assert tokens[:3] == [5, 17, 33] and len(tokens) == 9
    want = GPT2.from_pretrained(model_dir).generate([[5, 17, 33]], 6)[0].tolist()
    assert tokens == want
    printed = capsys.readouterr().out
    assert "w5 w17 w33" in printed and all(f"w{t}" in printed for t in tokens[3:])


def test_the_example_says_what_to_install(tmp_path, monkeypatch, capsys):
    """Without transformers, --make-random stops with the install line; without tokenizers a --prompt-ids
    run beside a tokenizer.json still generates (token ids printed as numbers) and --prompt says what to
    install."""
    spec = importlib.util.spec_from_file_location("gpt2_example_bare", ROOT / "examples" / "gpt2.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model_dir = tmp_path / "model"
    make_checkpoint(model_dir, layers=1)
    (model_dir / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "transformers", None)  # (an import of it raises ImportError)
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(SystemExit, match=r"transformers and torch.*pip install -e '\.\[gpt2\]'"):
        example.main(["--make-random", str(tmp_path / "other")])
    with pytest.raises(SystemExit, match=r"--prompt needs tokenizers.*\[gpt2\]"):
        example.main(["--model", str(model_dir), "--prompt", "hello", "--max-new-tokens", "2"])
    out = tmp_path / "out.json"
    example.main(["--model", str(model_dir), "--prompt-ids", "5,17", "--max-new-tokens", "3", "--greedy",
                  "--warmup", "0", "--json", str(out)])
    tokens = json.loads(out.read_text())["tokens"]
    assert tokens == GPT2.from_pretrained(model_dir).generate([[5, 17]], 3)[0].tolist()


def test_a_sharded_checkpoint_loads(tmp_path):
    """save_pretrained(max_shard_size=...) writes model.safetensors.index.json and several files."""
    ref = make_checkpoint(tmp_path / "one", layers=2)
    ref.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    ids, mask = padded_batch()
    got = GPT2.from_pretrained(tmp_path / "sharded")(ids, attention_mask=mask).numpy()
    want = reference_logits(ref, ids, mask)
    keep = mask == 1
    np.testing.assert_allclose(got[keep], want[keep], rtol=1e-4, atol=1e-4 * np.abs(want).max())
