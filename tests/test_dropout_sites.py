"""Where dropout acts (``attention_dropout``, ``activation_dropout``) and the fused Adam."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import companion.kernels as kernels_module
import companion.train as train_module
from companion.attention import MultiHeadAttention
from companion.checkpoint import model_checkpoint, model_from_checkpoint, save_checkpoint
from companion.configs import get_config
from companion.families import DecoderOnlyTransformer
from companion.interop import from_torch, to_torch
from companion.layers import DecoderLayer, EncoderLayer, FeedForward
from companion.model import Transformer, TransformerConfig
from companion.train import adam

SMALL = dict(src_vocab=11, tgt_vocab=13, d_model=16, num_heads=2, num_layers=2, d_ff=32)


def _probabilities(model: nn.Module) -> dict[str, set[float]]:
    """Every dropout probability of the model, by site."""
    sites: dict[str, set[float]] = {"attention": set(), "activation": set(), "other": set()}
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            sites["attention"].add(module.dropout)
        elif isinstance(module, nn.Dropout):
            owner = name.rsplit(".", 1)[0]
            is_feed_forward = isinstance(model.get_submodule(owner), FeedForward)
            sites["activation" if is_feed_forward else "other"].add(module.p)
    return sites


def test_defaults_put_one_probability_everywhere():
    sites = _probabilities(Transformer(TransformerConfig(**SMALL, dropout=0.3)))
    assert sites == {"attention": {0.3}, "activation": {0.3}, "other": {0.3}}


def test_each_site_gets_its_own_probability():
    config = TransformerConfig(**SMALL, dropout=0.2, attention_dropout=0.0, activation_dropout=0.05)
    sites = _probabilities(Transformer(config))
    assert sites == {"attention": {0.0}, "activation": {0.05}, "other": {0.2}}
    only_decoder = DecoderOnlyTransformer(
        TransformerConfig(13, 13, 16, 2, 2, 32, 0.2, True, attention_dropout=0.1)
    )
    assert _probabilities(only_decoder)["attention"] == {0.1}


@pytest.mark.parametrize("name", ["attention_dropout", "activation_dropout"])
@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.1", True])
def test_bad_probabilities_are_named(name, bad):
    with pytest.raises((ValueError, TypeError), match=name):
        TransformerConfig(**SMALL, **{name: bad})
    with pytest.raises((ValueError, TypeError), match=name):
        EncoderLayer(16, 2, 32, **{name: bad})


def test_attention_dropout_zero_is_deterministic_in_training():
    """With dropout only on the residual branches, a layer whose residual dropout is off too
    gives the same output twice in training mode: nothing else draws random numbers."""
    torch.manual_seed(0)
    layer = DecoderLayer(16, 2, 32, dropout=0.0, attention_dropout=0.5, activation_dropout=0.5)
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    layer.train()
    assert not torch.equal(layer(x, memory), layer(x, memory))  # the two sites draw
    layer.self_attention.dropout = layer.cross_attention.dropout = 0.0
    layer.feed_forward.dropout.p = 0.0
    torch.testing.assert_close(layer(x, memory), layer(x, memory), rtol=0, atol=0)


@pytest.mark.parametrize("cls", [EncoderLayer, DecoderLayer])
def test_interop_carries_each_probability(cls):
    ours = cls(16, 2, 32, dropout=0.2, attention_dropout=0.0, activation_dropout=0.05)
    theirs = to_torch(ours)
    attentions = [theirs.self_attn] + ([theirs.multihead_attn] if cls is DecoderLayer else [])
    assert [a.dropout for a in attentions] == [0.0] * len(attentions)
    assert theirs.dropout.p == 0.05  # torch's feed-forward dropout
    assert theirs.dropout1.p == theirs.dropout2.p == 0.2  # residual branches
    back = from_torch(theirs)
    assert (back.dropout, back.attention_dropout, back.activation_dropout) == (0.2, 0.0, 0.05)


def test_checkpoint_keeps_the_sites(tmp_path):
    config = TransformerConfig(**SMALL, attention_dropout=0.0, activation_dropout=0.0)
    path = save_checkpoint(model_checkpoint(Transformer(config), "Transformer"), tmp_path / "m.pt")
    loaded = model_from_checkpoint(path)
    assert loaded.config == config
    assert _probabilities(loaded) == {"attention": {0.0}, "activation": {0.0}, "other": {0.1}}


def test_adam_is_fused_and_equals_the_loop():
    torch.manual_seed(0)
    fused_model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    loop_model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    loop_model.load_state_dict(fused_model.state_dict())
    fused = adam(fused_model.parameters(), lr=1e-2)
    loop = torch.optim.Adam(loop_model.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-9)
    assert fused.defaults["fused"] is True
    assert (fused.defaults["betas"], fused.defaults["eps"]) == ((0.9, 0.98), 1e-9)
    x = torch.randn(16, 5)
    for _ in range(5):
        for model, optimizer in ((fused_model, fused), (loop_model, loop)):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    for a, b in zip(fused_model.parameters(), loop_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(fused_model[0].weight, nn.Linear(5, 7).weight)


def test_adam_falls_back_where_there_is_no_fused_kernel(monkeypatch):
    made = []

    class NoFusedAdam(torch.optim.Adam):
        def __init__(self, params, **kwargs):
            made.append(kwargs.get("fused"))
            if kwargs.get("fused"):
                raise RuntimeError(
                    "`fused=True` requires all the params to be on supported devices"
                )
            super().__init__(params, **kwargs)

    monkeypatch.setattr(train_module.torch.optim, "Adam", NoFusedAdam)
    parameters = (p for p in nn.Linear(3, 2).parameters())  # a generator: used up only once
    optimizer = adam(parameters, lr=0.5)
    assert made == [True, None]
    assert optimizer.defaults["lr"] == 0.5
    assert sum(len(group["params"]) for group in optimizer.param_groups) == 2


def test_adam_does_not_hide_other_errors():
    with pytest.raises(ValueError, match="beta"):
        adam(nn.Linear(3, 2).parameters(), betas=(1.5, 0.98))


def test_cpu_config_drops_out_where_the_paper_does():
    cpu, gpu = get_config("cpu").model, get_config("gpu").model
    assert (cpu.dropout, cpu.attention_dropout, cpu.activation_dropout) == (0.1, 0.0, 0.0)
    assert (gpu.dropout, gpu.attention_dropout, gpu.activation_dropout) == (0.2, None, None)
    assert get_config("cpu", attention_dropout=0.2).model.attention_dropout == 0.2


def test_without_attention_dropout_training_uses_the_fused_kernel(monkeypatch):
    """The written-out CPU attention exists only for dropout on the weights."""
    calls = []
    original = kernels_module.attention_with_dropout
    monkeypatch.setattr(
        kernels_module,
        "attention_with_dropout",
        lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs),
    )
    src, tgt = torch.randint(1, 11, (2, 6)), torch.randint(1, 13, (2, 5))
    for attention_dropout, expected in ((0.0, 0), (0.1, 6)):  # 2 + 2·2 attentions
        calls.clear()
        config = TransformerConfig(**SMALL, attention_dropout=attention_dropout)
        Transformer(config).train()(src, tgt)
        assert len(calls) == expected


def test_interop_reads_the_probabilities_the_modules_have_now():
    ours = EncoderLayer(16, 2, 32, dropout=0.1)
    ours.self_attention.dropout, ours.feed_forward.dropout.p = 0.0, 0.3
    theirs = to_torch(ours)
    assert (theirs.self_attn.dropout, theirs.dropout.p, theirs.dropout1.p) == (0.0, 0.3, 0.1)
