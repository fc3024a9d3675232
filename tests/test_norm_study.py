"""companion.norm_study: chapter 6's training study reproduces the recorded grid, and rejects
bad input with a clear message."""

from __future__ import annotations

import json
import math
from importlib.resources import files

import numpy as np
import pytest
import torch

from companion import norm_study
from companion.utils import set_seed


@pytest.fixture(scope="module")
def grid() -> dict:
    return json.loads((files("companion") / "results" / "ch06_grid.json").read_text())


@pytest.mark.parametrize(
    ("placement", "schedule"),
    [("Post-LN", "constant"), ("Pre-LN", "warm-up"), ("Post-LN", "decay")],
)
def test_train_run_reproduces_the_recorded_grid(grid, placement, schedule):
    """The first steps of three recorded arms (seed 0, 3e-3), trained again with this module."""
    torch.set_num_threads(1)
    steps = 6
    data = norm_study.train_data()
    set_seed(0)  # as the grid does before it builds the seed-0 model
    model = norm_study.build_model(6, placement == "Pre-LN", data.vocab_size)
    record = norm_study.train_run(model, data, 3e-3, schedule, seed=0, steps=steps)
    recorded = np.array(grid["arms"][f"{placement}|{schedule}|0.003|0"]["loss"][:steps])
    np.testing.assert_allclose(record["loss"], recorded, rtol=0, atol=1e-4)
    assert record["grad_ratio"].shape == (steps,) and np.isfinite(record["grad_ratio"]).all()
    first = record["delta_f"][:steps]
    assert record["delta_f"].shape == (norm_study.FIRST_STEPS,) and np.isfinite(first).all()
    # Adam's first update moves each weight by about the learning rate (chapter 6, section 6.7.2)
    assert 0.9 < record["adam_step"][0] <= 1.0, record["adam_step"][0]


def test_lr_schedule_peaks_at_warmup():
    warm = [norm_study.lr_schedule("warm-up", 3e-3)(step) for step in range(200)]
    assert int(np.argmax(warm)) == norm_study.WARMUP
    assert math.isclose(max(warm), 3e-3)
    assert math.isclose(warm[1], 3e-3 / norm_study.WARMUP)
    assert norm_study.lr_schedule("constant", 1e-3)(57) == 1e-3


@pytest.mark.parametrize("warmup", [20, norm_study.WARMUP, 120])
def test_decay_is_warm_up_without_its_ramp(warmup):
    """The "decay" schedule holds the peak up to step ``warmup``, then follows warm-up exactly;
    "warm-up" with another length peaks at that step."""
    warm = [norm_study.lr_schedule("warm-up", 3e-3, warmup)(step) for step in range(200)]
    decay = [norm_study.lr_schedule("decay", 3e-3, warmup)(step) for step in range(200)]
    assert int(np.argmax(warm)) == warmup and math.isclose(max(warm), 3e-3)
    np.testing.assert_allclose(decay[: warmup + 1], 3e-3, rtol=1e-12)
    np.testing.assert_allclose(decay[warmup:], warm[warmup:], rtol=1e-12)
    assert warm[warmup - 1] < decay[warmup - 1]  # the two differ before the peak


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: norm_study.lr_schedule("cosine", 1e-3), "kind"),
        (lambda: norm_study.lr_schedule("constant", -1.0), "peak_lr"),
        (lambda: norm_study.lr_schedule("decay", 1e-3, 0), "warmup"),
        (lambda: norm_study.train_data(0), "steps"),
        (lambda: norm_study.build_model(0, True), "num_layers"),
        (lambda: norm_study.build_model(2, "pre"), "norm_first"),
        (
            lambda: norm_study.train_run(
                torch.nn.Linear(2, 2), norm_study.train_data(2), 1e-3, "constant"
            ),
            "model",
        ),
        (
            lambda: norm_study.train_run(
                norm_study.build_model(1, True), norm_study.train_data(2), 1e-3, "constant", steps=3
            ),
            "steps",
        ),
        (
            lambda: norm_study.train_run(
                norm_study.build_model(1, True),
                norm_study.train_data(2),
                1e-3,
                "constant",
                steps=1,
                moment_batches=-1,
            ),
            "moment_batches",
        ),
    ],
)
def test_bad_input_names_the_argument(call, argument):
    with pytest.raises(ValueError, match=argument):
        call()


def test_gradient_norm_needs_gradients():
    with pytest.raises(ValueError, match="module"):
        norm_study.gradient_norm(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: norm_study.init_encoder(0, True, 0), "num_layers"),
        (lambda: norm_study.init_encoder(2, "pre", 0), "norm_first"),
        (lambda: norm_study.init_encoder(2, True, -1), "seed"),
        (lambda: norm_study.init_encoder(2, True, 0, final_norm="no"), "final_norm"),
        (lambda: norm_study.init_inputs(0, "mse"), "loss_kind"),
    ],
)
def test_init_bad_input_names_the_argument(call, argument):
    with pytest.raises((TypeError, ValueError), match=argument):
        call()


@pytest.mark.parametrize(("norm_first", "final_norm"), [(True, True), (True, False), (False, True)])
def test_init_encoder_is_section_6_3s_setup(norm_first, final_norm):
    """init_encoder and init_inputs equal section 6.3's setup written out by hand: d_model 64,
    4 heads, d_ff 256, no dropout, Xavier-normal matrices, zero biases, inputs and read-out
    directions from a generator seeded with 1000 + seed (exercise 3's check measures with them)."""
    from companion.model import Encoder, TransformerConfig

    torch.set_num_threads(1)
    torch.manual_seed(1)
    config = TransformerConfig(
        num_layers=3, d_model=64, num_heads=4, d_ff=256, dropout=0.0,
        norm_first=norm_first, final_norm=final_norm,
    )  # fmt: skip
    by_hand = Encoder(config)
    for name, parameter in by_hand.named_parameters():
        if parameter.dim() > 1:
            torch.nn.init.xavier_normal_(parameter)
        elif name.endswith("bias"):
            torch.nn.init.zeros_(parameter)
    gen = torch.Generator().manual_seed(1001)
    x_by_hand = torch.randn(8, 16, 64, generator=gen)
    directions = torch.randn(8, 16, 64, generator=gen)
    ((directions * by_hand(x_by_hand)).sum() / math.sqrt(8 * 16)).backward()
    expected = by_hand.layers[-1].feed_forward.output_proj.weight.grad.norm().item()

    encoder = norm_study.init_encoder(3, norm_first, seed=1, final_norm=final_norm)
    x, loss_fn = norm_study.init_inputs(1)
    assert torch.equal(x, x_by_hand), "init_inputs should draw x first from 1000 + seed"
    loss_fn(encoder(x)).backward()
    got = encoder.layers[-1].feed_forward.output_proj.weight.grad.norm().item()
    assert math.isclose(got, expected, rel_tol=1e-6), (got, expected)


def test_init_encoder_final_norm_switches_the_last_layernorm():
    with_norm = norm_study.init_encoder(2, True, 0)  # the package default for Pre-LN: a final norm
    without = norm_study.init_encoder(2, True, 0, final_norm=False)
    post = norm_study.init_encoder(2, False, 0)
    assert isinstance(with_norm.final_norm, torch.nn.LayerNorm)
    assert not isinstance(without.final_norm, torch.nn.LayerNorm)
    assert not isinstance(post.final_norm, torch.nn.LayerNorm)
    x, _ = norm_study.init_inputs(0)
    assert x.shape == (norm_study.INIT_BATCH, norm_study.INIT_SEQ_LEN, norm_study.D_MODEL)
    with torch.no_grad():  # without the final norm the Pre-LN output keeps the stream's scale
        assert without(x).pow(2).mean() > 1.5 * with_norm(x).pow(2).mean()


def test_init_inputs_losses():
    x, readout = norm_study.init_inputs(2)
    _, cross_entropy = norm_study.init_inputs(2, "cross-entropy")
    y = torch.zeros_like(x)
    assert readout(y).item() == 0.0
    assert math.isclose(cross_entropy(y).item(), math.log(32), rel_tol=1e-6)


def test_train_run_records_each_decoder_norms_divisor():
    """norm_scale[0] is D = sqrt(Var + eps) of each decoder norm's input on the first batch,
    averaged over the target tokens (padding left out), measured here with hooks of its own."""
    from torch.utils.data import DataLoader

    from companion.data import PAD_ID, collate_batch

    torch.set_num_threads(1)
    data = norm_study.train_data(2)
    set_seed(0)
    model = norm_study.build_model(2, False, data.vocab_size)
    loader = DataLoader(data, batch_size=norm_study.BATCH, shuffle=True, collate_fn=collate_batch,
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    src, tgt = next(iter(loader))  # train_run's first batch
    real = tgt[:, :-1] != PAD_ID  # (batch, tgt_len - 1)
    seen = []
    norms = [n for layer in model.decoder.layers
             for n in (layer.self_attention_norm, layer.cross_attention_norm, layer.feed_forward_norm)]  # fmt: skip
    handles = [n.register_forward_hook(lambda m, i, o: seen.append(i[0].detach())) for n in norms]
    with torch.no_grad():
        model.train()(src, tgt[:, :-1])
    for handle in handles:
        handle.remove()
    expected = [torch.sqrt(x.var(-1, unbiased=False) + 1e-5)[real].mean().item() for x in seen]
    record = norm_study.train_run(model, data, 1e-3, "constant", seed=0, steps=2)
    assert record["norm_scale"].shape == (2, 6) and np.isfinite(record["norm_scale"]).all()
    np.testing.assert_allclose(record["norm_scale"][0], expected, rtol=1e-5)
    # the hooks are gone afterwards: a later forward pass records nothing
    assert not any(n._forward_pre_hooks for n in norms)


def test_replay_encoder_matches_the_stream_by_hand():
    """nu from replay_encoder equals the per-token ratio computed from a Pre-LN stream."""
    from companion.exercises import ch06

    torch.set_num_threads(1)
    encoder = norm_study.init_encoder(3, True, 0, final_norm=False)
    x, _ = norm_study.init_inputs(0)
    rms, nu, out = norm_study.replay_encoder(encoder.layers, x)
    stream = [x]
    with torch.no_grad():
        for layer in encoder.layers:  # before and after each sub-layer, by hand
            h = stream[-1]
            h = h + layer.self_attention(*(3 * [layer.self_attention_norm(h)]))[0]
            stream.append(h)
            stream.append(h + layer.feed_forward(layer.feed_forward_norm(h)))
    stream = torch.stack(stream)  # (7, 8, 16, 64)
    np.testing.assert_allclose(nu, ch06.reference_relative_updates(stream).numpy(), rtol=1e-4)
    np.testing.assert_allclose(
        rms, (stream[:-1].norm(dim=-1) / 8).mean(dim=(1, 2)).numpy(), rtol=1e-4
    )
    assert torch.allclose(out, stream[-1], atol=1e-5)
    with pytest.raises(ValueError, match="x"):
        norm_study.replay_encoder(encoder.layers, x[0])
    with pytest.raises(ValueError, match="layers"):
        norm_study.replay_encoder([torch.nn.Linear(64, 64)], x)
