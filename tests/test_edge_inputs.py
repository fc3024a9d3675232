"""The review of every public entry point (issue 11, "beyond these cases"): empty batches for
the decoders, token ids of a dtype an embedding cannot index with, float inputs of another
dtype than a module's weights, and damaged or foreign files (histories, parallel text files,
checkpoints whose model cannot be rebuilt). Each gives a clear error that names the argument
or the file."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from helpers import tiny_transformer

from companion.checkpoint import CheckpointError, model_from_checkpoint, save_checkpoint
from companion.data.multi30k import read_parallel
from companion.decode import beam_search, greedy_decode, sample_decode
from companion.history import History
from companion.layers import DecoderLayer, EncoderLayer, FeedForward
from companion.model import Decoder, Encoder, TokenEmbedding, TransformerConfig


@pytest.mark.parametrize(
    "decode",
    [
        lambda m, s: greedy_decode(m, s, max_len=4),
        lambda m, s: beam_search(m, s, beam_size=2, max_len=4),
        lambda m, s: sample_decode(m, s, max_len=4),
    ],
    ids=["greedy", "beam", "sample"],
)
def test_decoders_reject_an_empty_batch(decode):
    model = tiny_transformer(11).eval()
    with pytest.raises(ValueError, match=r"^src must hold at least one sentence .* \(0, 4\)"):
        decode(model, torch.zeros(0, 4, dtype=torch.long))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16])
def test_token_ids_of_a_dtype_embeddings_cannot_index(dtype):
    model = tiny_transformer(11).eval()
    ids = torch.ones(2, 3, dtype=dtype)
    with pytest.raises(TypeError, match=rf"^src must be a torch.long .* got dtype {dtype}"):
        model(ids, ids.long())
    with pytest.raises(TypeError, match=rf"^tgt must be a torch.long .* got dtype {dtype}"):
        model(ids.long(), ids)
    with pytest.raises(TypeError, match=rf"^tokens must be a torch.long .* got dtype {dtype}"):
        TokenEmbedding(11, 8)(ids)
    assert model(ids.int(), ids.int()).shape == (2, 3, 11)  # int32 works, as in nn.Embedding


def test_float_inputs_must_match_the_weights_dtype():
    config = TransformerConfig(d_model=8, num_heads=2, num_layers=1, d_ff=12)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    pattern = (
        r"^{} must have dtype torch.float32 to match the parameters of \w+, got dtype torch.float64"
    )
    for module, args, name in (
        (FeedForward(8, 12), (x,), "x"),
        (EncoderLayer(8, 2, 12), (x,), "x"),
        (DecoderLayer(8, 2, 12), (x, x.float()), "x"),
        (DecoderLayer(8, 2, 12), (x.float(), x), "memory"),
        (Encoder(config), (x,), "x"),
        (Decoder(config), (x, x.float()), "x"),
    ):
        with pytest.raises(TypeError, match=pattern.format(name)):
            module(*args)
    model = tiny_transformer(11).eval()
    memory = torch.randn(2, 3, 32, dtype=torch.float64)
    with pytest.raises(TypeError, match=pattern.format("memory")):
        model.decode(torch.ones(2, 3, dtype=torch.long), memory)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast mixes dtypes on purpose
        assert FeedForward(8, 12)(x.float()).shape == (2, 3, 8)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "Expecting value"),
        ("not json", "Expecting value"),
        ('{"step": [1, 2', "Expecting"),
        ("[1, 2]", "got list"),
        ('{"a": 1}', "lacks the key"),
    ],
    ids=["empty", "garbage", "truncated", "list", "other keys"],
)
def test_damaged_history_files(text, reason, tmp_path):
    path = tmp_path / "history.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"^{path} is not a history .*{reason}"):
        History.load_json(path)
    with pytest.raises(FileNotFoundError, match="no history file at"):
        History.load_json(tmp_path / "missing.json")
    history = History()
    history.save_json(path)  # a good file reads back
    assert History.load_json(path).to_dict() == json.loads(path.read_text())


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("garbage.gz", b"\x00\xffgarbage", "BadGzipFile"),
        ("truncated.gz", gzip.compress(b"ein Satz\n" * 200)[:40], "EOFError"),
        ("text.gz", b"plain text\n", "BadGzipFile"),
        ("latin1.txt", "Gr\xfc\xdfe\n".encode("latin-1"), "UnicodeDecodeError"),
    ],
    ids=["garbage gz", "truncated gz", "text as gz", "latin-1 text"],
)
def test_damaged_parallel_text_files(name, data, reason, tmp_path):
    bad, good = tmp_path / name, tmp_path / "good.txt"
    bad.write_bytes(data)
    good.write_text("a sentence\n")
    with pytest.raises(
        ValueError, match=rf"^{bad} is not a readable .*{reason}.* download or copy"
    ):
        read_parallel(bad, good)


def test_checkpoint_whose_model_cannot_be_rebuilt(tmp_path):
    model = tiny_transformer(11)
    state = {"format": 1, "model": model.state_dict(), "config": {}}
    good = dict(model.config.__dict__)
    for name, model_config, weights in (
        ("unknown field", {**good, "bogus": 1}, model.state_dict()),
        ("wrong sizes", {**good, "d_model": 16, "num_heads": 2}, model.state_dict()),
        ("missing weights", good, {"x": torch.ones(1)}),
    ):
        path = save_checkpoint({**state, "model_config": model_config, "model": weights},
                               tmp_path / f"{name}.pt")  # fmt: skip
        with pytest.raises(CheckpointError, match=rf"^{path} does not hold a model"):
            model_from_checkpoint(path)
    path = save_checkpoint({**state, "model_config": good}, tmp_path / "good.pt")
    assert model_from_checkpoint(path).config == model.config
