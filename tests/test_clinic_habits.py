"""The four habits of chapter 11's appendix ("the clinic does not plant them"): each test shows
the mechanism the chapter states, so the prose stays true on the installed torch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from companion.positional import sinusoidal_table


def test_backward_accumulates_without_zero_grad():
    """Without zero_grad, a second backward() of the same batch doubles the gradient."""
    w = torch.ones(3, requires_grad=True)
    weights = torch.tensor([1.0, 2.0, 3.0])
    (w * weights).sum().backward()
    once = w.grad.clone()
    (w * weights).sum().backward()
    assert torch.equal(w.grad, 2 * once), (
        f"expected the gradient to accumulate to {2 * once}, got {w.grad}"
    )
    w.grad = None  # the habit: zero (or drop) the gradients every step
    (w * weights).sum().backward()
    assert torch.equal(w.grad, once), f"expected {once} after zeroing, got {w.grad}"


def test_float_01_mask_blocks_nothing_in_multihead_attention():
    """A 0/1 float mask (1 = may attend) is added to the scores: output 0 still reads key 4;
    a boolean mask (True = blocked, torch.nn's convention) blocks it."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(7))  # (1, 5, 8)
    changed = x.clone()
    changed[0, 4] += 1.0  # change the last token

    def output_0_moves(mask):
        with torch.no_grad():
            before = mha(x, x, x, attn_mask=mask)[0][0, 0]
            after = mha(changed, changed, changed, attn_mask=mask)[0][0, 0]
        return not torch.allclose(before, after)

    float_01 = torch.tril(torch.ones(5, 5))  # 1 = may attend, as floats
    blocked = torch.ones(5, 5, dtype=torch.bool).triu(1)  # True = blocked
    assert output_0_moves(float_01), "expected the 0/1 float mask to let output 0 read key 4"
    assert not output_0_moves(blocked), "expected the boolean mask to block key 4 for output 0"


def test_float16_cannot_hold_minus_1e9():
    """masked_fill with -1e9 overflows float16; an added -1e9 becomes -inf and a row with no key
    gives NaN; torch.finfo(float16).min is safe."""
    scores = torch.zeros(2, 3, dtype=torch.float16)
    blocked = torch.tensor([[True, True, True], [True, False, False]])  # row 0 has no key
    with pytest.raises(RuntimeError, match="overflow"):
        scores.masked_fill(blocked, -1e9)
    additive = torch.softmax((scores + blocked.half() * -1e9).float(), dim=-1)
    safe = torch.softmax(
        scores.masked_fill(blocked, torch.finfo(torch.float16).min).float(), dim=-1
    )
    assert additive[0].isnan().all(), f"expected NaN for the row with no key, got {additive[0]}"
    assert not safe.isnan().any(), f"expected no NaN with finfo.min, got {safe}"
    assert torch.finfo(torch.float16).max == 65504, "expected float16's largest value 65504"


def test_float16_min_added_as_a_bias_can_overflow():
    """Added as a bias, finfo(float16).min stays finite on a score above -16 (float16's spacing
    near 65504 is 32), but a score of -16 or below, or a second such bias, gives -inf."""
    low = torch.finfo(torch.float16).min
    scores = torch.tensor([-1.0, -15.0, -16.0, -17.0], dtype=torch.float16)
    biased = scores + torch.tensor(low, dtype=torch.float16)
    assert biased[:2].isfinite().all() and (biased[:2] == low).all(), (
        f"expected {low} twice, got {biased[:2]}"
    )
    assert biased[2:].isneginf().all(), f"expected -inf for scores -16 and -17, got {biased[2:]}"
    two_biases = torch.zeros(1, dtype=torch.float16) + low + low  # e.g. a causal and a padding bias
    assert two_biases.isneginf().all(), f"expected -inf from two biases, got {two_biases}"


def test_small_embedding_table_needs_its_scale():
    """A table at std d^-1/2 gives token vectors several times shorter than the sinusoidal
    positions (norm sqrt(d/2)); scaled by sqrt(d) they are comparable."""
    d = 32
    table = torch.randn(11, d, generator=torch.Generator().manual_seed(8)) * d**-0.5  # (vocab, d)
    positions = sinusoidal_table(13, d).norm(dim=-1).mean()
    unscaled = (positions / table.norm(dim=-1).mean()).item()
    scaled = (positions / (table * d**0.5).norm(dim=-1).mean()).item()
    assert unscaled > 3, (
        f"expected token vectors over 3x shorter than the positions, got {unscaled:.2f}"
    )
    assert 0.5 < scaled < 2, f"expected comparable norms once scaled, got a ratio of {scaled:.2f}"
