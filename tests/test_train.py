"""companion.train, the teaching core: teacher forcing, loss, schedule, one step."""

from __future__ import annotations

import math

import pytest
import torch

from companion.model import TransformerConfig
from companion.train import (
    allow_tf32,
    inverse_sqrt_warmup,
    sequence_loss,
    shift_targets,
    train_step,
)


def test_allow_tf32_changes_the_gpu_precision_only_for_a_gpu():
    flags = (torch.backends.cuda.matmul, torch.backends.cudnn)
    before = [flag.allow_tf32 for flag in flags]  # process-wide: put back at the end
    try:
        for flag in flags:
            flag.allow_tf32 = False
        allow_tf32("cpu")
        assert not any(flag.allow_tf32 for flag in flags)
        allow_tf32(torch.device("cuda", 0))  # setting the flags needs no GPU
        assert all(flag.allow_tf32 for flag in flags)
    finally:
        for flag, value in zip(flags, before):
            flag.allow_tf32 = value


def test_shift_targets():
    tgt = torch.tensor([[1, 5, 6, 2], [1, 7, 2, 0]])
    inp, labels = shift_targets(tgt)
    assert inp.tolist() == [[1, 5, 6], [1, 7, 2]]
    assert labels.tolist() == [[5, 6, 2], [7, 2, 0]]
    with pytest.raises(ValueError, match=r"at least 2 positions.*got shape \(2, 1\)"):
        shift_targets(tgt[:, :1])


def test_sequence_loss_ignores_padding_and_smooths():
    logits = torch.randn(2, 3, 5)
    labels = torch.tensor([[1, 2, 0], [3, 0, 0]])
    loss = sequence_loss(logits, labels, pad_id=0)
    by_hand = torch.stack(
        [-torch.log_softmax(logits[b, t], -1)[labels[b, t]] for b, t in [(0, 0), (0, 1), (1, 0)]]
    ).mean()
    torch.testing.assert_close(loss, by_hand)
    smoothed = sequence_loss(logits, labels, pad_id=0, label_smoothing=0.1)
    assert not torch.isclose(loss, smoothed)
    with pytest.raises(ValueError, match=r"labels must have shape \(2, 3\).*got \(2, 4\)"):
        sequence_loss(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\), got 1.2"):
        sequence_loss(logits, labels, label_smoothing=1.2)


def test_inverse_sqrt_warmup_shape():
    lr = inverse_sqrt_warmup(d_model=512, warmup_steps=4000)
    peak = lr(4000)
    assert math.isclose(peak, 512**-0.5 * 4000**-0.5)
    assert lr(1) < lr(2000) < peak and lr(16000) == pytest.approx(peak / 2)
    assert lr(0) == lr(1)
    with pytest.raises(ValueError, match="warmup_steps must be >= 1, got 0"):
        inverse_sqrt_warmup(512, 0)


def test_train_step_learns_a_fixed_batch():
    from companion.model import Transformer

    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(8, 8, d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.0)
    )
    src = torch.randint(3, 8, (4, 5))
    tgt = torch.cat(
        [torch.ones(4, 1, dtype=torch.long), src, 2 * torch.ones(4, 1, dtype=torch.long)], 1
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = train_step(model, src, tgt, optimizer)
    for _ in range(60):
        last = train_step(model, src, tgt, optimizer)
    assert first.tokens == 4 * 6 and last.loss < first.loss / 3


def test_train_step_reports_the_whole_batch_when_a_process_holds_a_share():
    """``whole_batch`` (used with DistributedDataParallel) decides the loss to back-propagate
    and the reported figures; an identity share gives exactly the plain step."""
    from companion.model import Transformer

    src = torch.randint(3, 8, (4, 5))
    tgt = torch.cat([torch.ones(4, 1, dtype=torch.long), src], 1)
    tgt[0, -2:] = 0  # padding
    steps = {}
    for name in ("plain", "identity", "halved"):
        torch.manual_seed(0)
        model = Transformer(
            TransformerConfig(8, 8, d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.0)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        calls = []

        def share(loss, tokens, name=name, calls=calls):
            calls.append(int(tokens))
            scale = 0.5 if name == "halved" else 1.0
            return loss * scale, loss.detach() + 1.0, torch.tensor(100)

        stats = train_step(
            model=model,
            src=src,
            tgt=tgt,
            optimizer=optimizer,
            pad_id=0,
            clip_norm=None,
            whole_batch=None if name == "plain" else share,
        )
        steps[name] = (stats, stats.grad_norm, [p.detach().clone() for p in model.parameters()])
        if name != "plain":
            assert calls == [4 * 5 - 2]  # this process's non-padding target tokens
    plain, identity, halved = steps["plain"], steps["identity"], steps["halved"]
    assert plain[0].tokens == 18 and identity[0].tokens == halved[0].tokens == 100
    assert identity[0].loss == pytest.approx(plain[0].loss + 1.0)
    assert identity[1] == plain[1]  # the same gradient ...
    for a, b in zip(identity[2], plain[2]):
        assert torch.equal(a, b)  # ... and the same update
    assert halved[1] == pytest.approx(plain[1] / 2)  # the weighted loss is back-propagated


@pytest.mark.parametrize("pad_id", [None, 0])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.6])
def test_sequence_loss_value_and_gradient_equal_torch_cross_entropy(pad_id, eps):
    """On a CPU, sequence_loss computes the smoothed loss and its gradient itself."""
    torch.manual_seed(0)
    logits = (3 * torch.randn(5, 9, 13, dtype=torch.float64)).requires_grad_()
    labels = torch.randint(1, 13, (5, 9))
    if pad_id is not None:
        labels[1, 4:] = pad_id
        labels[3, :] = pad_id  # a sequence of pads only
    ours = sequence_loss(logits, labels, pad_id=pad_id, label_smoothing=eps)
    (ours_grad,) = torch.autograd.grad(2.5 * ours, logits)  # an upstream gradient ≠ 1
    theirs = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1),
        labels.flatten(),
        ignore_index=-100 if pad_id is None else pad_id,
        label_smoothing=eps,
    )
    (theirs_grad,) = torch.autograd.grad(2.5 * theirs, logits)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours_grad, theirs_grad, rtol=1e-12, atol=1e-14)
    if pad_id is not None:
        assert (ours_grad[3] == 0).all()


def test_sequence_loss_passes_gradcheck():
    logits = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[1, 2, 0], [4, 0, 0]])
    assert torch.autograd.gradcheck(
        lambda x: sequence_loss(x, labels, pad_id=0, label_smoothing=0.2), (logits,)
    )


def test_sequence_loss_checks_the_labels():
    """Issue 11, item 3: float labels and ids outside the vocabulary name ``labels``; padding
    positions may hold anything."""
    logits = torch.randn(2, 3, 7)
    with pytest.raises(
        TypeError, match=r"^labels must be an integer tensor .* got dtype torch.float32"
    ):
        sequence_loss(logits, torch.zeros(2, 3))
    with pytest.raises(TypeError, match="^labels must be an integer tensor"):
        sequence_loss(logits, torch.zeros(2, 3, dtype=torch.bool))
    too_big = torch.tensor([[1, 2, 7], [0, 0, 0]])
    with pytest.raises(ValueError, match=r"^labels must hold ids in \[0, 6\] .* got 7"):
        sequence_loss(logits, too_big, pad_id=0)
    with pytest.raises(ValueError, match=r"^labels must hold ids in \[0, 6\] .* got -1"):
        sequence_loss(logits, torch.tensor([[1, 2, -1], [0, 0, 0]]))
    with pytest.raises(ValueError, match=r"^labels must hold ids in \[0, 6\] .* got 7"):
        sequence_loss(logits, too_big)  # without a pad id, every position counts
    with pytest.raises(ValueError, match="^pad_id must be >= 0"):
        sequence_loss(logits, torch.zeros(2, 3, dtype=torch.long), pad_id=-1)
    padded = torch.tensor([[1, 2, 9], [3, 9, 9]])  # pad id 9 lies outside the vocabulary: fine
    loss = sequence_loss(logits, padded, pad_id=9)
    expected = torch.nn.functional.cross_entropy(logits[padded != 9], padded[padded != 9])
    torch.testing.assert_close(loss, expected)
    for dtype in (torch.int32, torch.int16, torch.uint8):  # any integer dtype is accepted
        loss = sequence_loss(logits, padded.clamp(max=6).to(dtype))
        assert torch.isfinite(loss)
