"""companion.attention.scaled_dot_product_attention: equal to torch's, NaN-free, strict inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from companion.attention import AdditiveScore, scaled_dot_product_attention

TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-5}


@st.composite
def attention_inputs(draw):
    lead = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    q_len, k_len = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    d_k, d_v = draw(st.integers(1, 16)), draw(st.integers(1, 16))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    seed = draw(st.integers(0, 2**31 - 1))
    use_mask = draw(st.sampled_from(["none", "full", "broadcast", "causal"]))
    return lead, q_len, k_len, d_k, d_v, dtype, seed, use_mask


@given(attention_inputs())
def test_matches_torch_functional(case):
    lead, q_len, k_len, d_k, d_v, dtype, seed, use_mask = case
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, q_len, d_k, generator=gen, dtype=dtype)
    k = torch.randn(*lead, k_len, d_k, generator=gen, dtype=dtype)
    v = torch.randn(*lead, k_len, d_v, generator=gen, dtype=dtype)
    mask = None
    if use_mask == "full":
        mask = torch.rand(*lead, q_len, k_len, generator=gen) > 0.3
    elif use_mask == "broadcast":
        mask = torch.rand(*(1,) * len(lead), 1, k_len, generator=gen) > 0.3
    elif use_mask == "causal":
        mask = torch.ones(q_len, k_len, dtype=torch.bool).tril()
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == (*lead, q_len, d_v)
    assert weights.shape == (*lead, q_len, k_len)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    if mask is None:
        live = torch.ones(*lead, q_len, dtype=torch.bool)
    else:
        live = mask.expand(*lead, q_len, k_len).any(-1)  # queries with at least one key
    if live.any():
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        err = (out - reference)[live].abs().max().item()
        assert err <= TOLERANCE[dtype], f"max abs error {err}"
        row_sums = weights.sum(-1)[live]
        assert torch.allclose(row_sums, torch.ones_like(row_sums), atol=TOLERANCE[dtype])
    # queries that may attend to nothing: zero weights and zero output, never NaN
    assert (weights[~live] == 0).all() and (out[~live] == 0).all()


def test_blocked_keys_get_exactly_zero_weight():
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 5)
    mask = torch.tensor([True, True, True, False, False, False]).expand(2, 4, 6)
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    assert (weights[..., 3:] == 0).all()


def test_fully_masked_row_has_finite_gradient():
    q = torch.randn(1, 3, 4, requires_grad=True)
    k, v = torch.randn(1, 5, 4), torch.randn(1, 5, 2)
    mask = torch.zeros(1, 3, 5, dtype=torch.bool)
    mask[0, 0, :2] = True  # only query 0 may attend; queries 1 and 2 see nothing
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()
    assert (q.grad[0, 1:] == 0).all()


def test_scale_argument_and_default():
    q, k, v = torch.randn(3, 16), torch.randn(5, 16), torch.randn(5, 2)
    _, default = scaled_dot_product_attention(q, k, v)
    _, explicit = scaled_dot_product_attention(q, k, v, scale=0.25)  # 1/sqrt(16)
    _, unscaled = scaled_dot_product_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(default, explicit)
    torch.testing.assert_close(unscaled, torch.softmax(q @ k.T, -1))


def test_dropout_keeps_returned_weights_and_changes_output():
    torch.manual_seed(0)
    q, k, v = torch.randn(4, 6, 8), torch.randn(4, 6, 8), torch.randn(4, 6, 8)
    out0, w0 = scaled_dot_product_attention(q, k, v)
    out1, w1 = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.testing.assert_close(w0, w1)  # weights are returned before dropout
    assert not torch.allclose(out0, out1)


BAD_INPUTS = [
    # (description, kwargs, exception, message fragment)
    ("q is not a tensor", dict(q=[[1.0]]), TypeError, r"q must be a torch.Tensor, got list"),
    (
        "integer q",
        dict(q=torch.ones(2, 3, dtype=torch.long)),
        TypeError,
        r"q must be a floating-point",
    ),
    (
        "1-D q",
        dict(q=torch.ones(3)),
        ValueError,
        r"q must have shape \(\.\.\., q_len, d_k\).*got a 1-D",
    ),
    (
        "d_k mismatch",
        dict(k=torch.ones(5, 4)),
        ValueError,
        r"so k must be \(\.\.\., k_len, 3\), got \(5, 4\)",
    ),
    (
        "k/v lengths",
        dict(v=torch.ones(4, 2)),
        ValueError,
        r"v must be \(\.\.\., 5, d_v\), got \(4, 2\)",
    ),
    ("batch mismatch", dict(q=torch.ones(2, 2, 3)), ValueError, r"identical leading"),
    (
        "dtype mismatch",
        dict(v=torch.ones(5, 2, dtype=torch.float64)),
        TypeError,
        r"share one dtype",
    ),
    ("float mask", dict(mask=torch.zeros(2, 5)), TypeError, r"mask must be a boolean tensor"),
    (
        "mask wrong shape",
        dict(mask=torch.ones(3, 5, dtype=torch.bool)),
        ValueError,
        r"mask of shape \(3, 5\) does not broadcast to the scores .*\(2, 5\)",
    ),
    (
        "mask enlarges",
        dict(mask=torch.ones(4, 2, 5, dtype=torch.bool)),
        ValueError,
        r"does not broadcast",
    ),
    ("dropout > 1", dict(dropout_p=1.5), ValueError, r"dropout_p must be in \[0, 1\), got 1.5"),
]


@pytest.mark.parametrize(
    "description,kwargs,error,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_is_reported_clearly(description, kwargs, error, message):
    args = dict(q=torch.ones(2, 3), k=torch.ones(5, 3), v=torch.ones(5, 2))
    args.update(kwargs)
    with pytest.raises(error, match=message):
        scaled_dot_product_attention(**args)


def test_additive_score_shapes_and_errors():
    score = AdditiveScore(d_query=4, d_key=6, d_hidden=8)
    out = score(torch.randn(2, 3, 4), torch.randn(2, 5, 6))
    assert out.shape == (2, 3, 5)
    # matches the formula w^T tanh(W_q q + W_k k) for one pair
    q, k = torch.randn(4), torch.randn(6)
    by_hand = score.score_proj.weight @ torch.tanh(
        score.query_proj.weight @ q + score.key_proj.weight @ k
    )
    torch.testing.assert_close(score(q[None], k[None])[0, 0], by_hand[0])
    with pytest.raises(ValueError, match=r"k must be \(\.\.\., k_len, 6\), got \(5, 4\)"):
        score(torch.randn(3, 4), torch.randn(5, 4))
    with pytest.raises(ValueError, match="d_hidden must be >= 1, got 0"):
        AdditiveScore(4, 4, 0)
