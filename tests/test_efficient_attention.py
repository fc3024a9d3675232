"""Block-wise (FlashAttention) attention and banded local attention: values, gradients, memory.

References are computed independently of the code under test: ``torch.softmax`` on the whole
score matrix with masks from :mod:`companion.masking`, in float64, so an agreement to 1e-12
leaves no room for an algorithmic slip (the observed error is ~1e-15)."""

from __future__ import annotations

import math

import pytest
import torch

from companion.efficient_attention import (
    blockwise_attention,
    naive_attention,
    sliding_window_attention,
)
from companion.masking import causal_mask, sliding_window_mask
from companion.measure import peak_memory_bytes

TOL = 1e-12


def reference(q, k, v, mask=None, scale=None):
    """softmax(q kᵀ · scale) v with the whole matrix, and the row log-sum-exp; rows that see no
    key give zeros and -inf."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - torch.where(torch.isinf(lse), 0, lse)[..., None])
    return weights @ v, lse


def qkv(q_len, k_len, d=8, d_v=5, lead=(2, 3), seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    shapes = ((*lead, q_len, d), (*lead, k_len, d), (*lead, k_len, d_v))
    return [
        torch.randn(s, generator=g, dtype=torch.float64).requires_grad_(requires_grad)
        for s in shapes
    ]


def assert_same_forward_and_backward(ours, theirs, inputs, seed=1):
    """Outputs equal to TOL, and the gradients of every input for one random upstream gradient."""
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=0)
    upstream = torch.randn(
        ours.shape, generator=torch.Generator().manual_seed(seed), dtype=ours.dtype
    )
    # (lse does not depend on v: its gradient must then be zero)
    options = dict(retain_graph=True, allow_unused=True, materialize_grads=True)
    grads_ours = torch.autograd.grad(ours, inputs, upstream, **options)
    grads_theirs = torch.autograd.grad(theirs, inputs, upstream, **options)
    for name, a, b in zip("qkv", grads_ours, grads_theirs):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0, msg=f"gradient of {name}")


# --- blockwise attention equals the naive formula ----------------------------------------------


@pytest.mark.parametrize(
    ("q_len", "k_len", "block_size", "is_causal"),
    [
        (37, 37, 7, False),  # 7 does not divide 37: catches a dropped last partial block
        (37, 37, 7, True),  # causal, the diagonal inside blocks
        (16, 16, 4, True),  # blocks that divide the length
        (37, 37, 1, False),  # one row per block: every step rescales
        (37, 37, 100, True),  # one block larger than the sequence: no rescaling at all
        (13, 50, 8, True),  # causal with more keys: bottom-right aligned
        (50, 13, 8, False),  # more queries than keys
        (1, 29, 6, True),  # a single query (one decoding step with a cache)
    ],
)
def test_blockwise_equals_naive_forward_and_backward(q_len, k_len, block_size, is_causal):
    # Catches: a running sum or output that is not rescaled when the maximum grows (wrong as
    # soon as a row has two blocks), a dropped partial block, causal blocks skipped too early
    # or masked top-left, a backward with the wrong D or a missing scale.
    q, k, v = qkv(q_len, k_len)
    mask = causal_mask(q_len, k_len) if is_causal else None
    expected, expected_lse = reference(q, k, v, mask)
    out, lse = blockwise_attention(
        q, k, v, block_size=block_size, is_causal=is_causal, return_lse=True
    )
    assert_same_forward_and_backward(out, expected, (q, k, v))
    torch.testing.assert_close(lse, expected_lse, atol=TOL, rtol=0)
    assert_same_forward_and_backward(lse, expected_lse, (q, k, v))  # lse is differentiable too


def test_blockwise_with_a_scale_and_a_padding_mask():
    q, k, v = qkv(20, 20)
    padding = torch.ones(2, 1, 1, 20, dtype=torch.bool)
    padding[0, ..., 15:] = False  # the last 5 keys of the first sequence are padding
    expected, _ = reference(q, k, v, padding, scale=0.3)
    out = blockwise_attention(q, k, v, block_size=6, mask=padding, scale=0.3)
    assert_same_forward_and_backward(out, expected, (q, k, v))


def test_blockwise_survives_scores_far_beyond_exp_range():
    # Scores up to ~±3,000 overflow exp() in float64 (limit ~709). Keys grow in size along the
    # sequence, so every later block raises the row maximum. Catches a missing max subtraction
    # (inf/NaN) and a maximum that is taken from the first block only and never updated.
    q, k, v = qkv(24, 24, d=4, lead=(1,))
    growth = torch.linspace(1, 60, 24, dtype=torch.float64)[:, None]
    with torch.no_grad():
        k.mul_(growth)
        q.mul_(30)
    out = blockwise_attention(q, k, v, block_size=5)
    expected, _ = reference(q, k, v)
    assert torch.isfinite(out).all()
    assert_same_forward_and_backward(out, expected, (q, k, v))


def test_blockwise_gradcheck():
    q, k, v = qkv(5, 7, d=3, d_v=2, lead=(2,))

    def both(q, k, v):
        return blockwise_attention(q, k, v, block_size=3, is_causal=True, return_lse=True)

    assert torch.autograd.gradcheck(both, (q, k, v))
    mask = torch.rand(2, 5, 7, generator=torch.Generator().manual_seed(3)) > 0.4
    mask[0, 1] = False  # a row with no key at all

    def masked(q, k, v):
        return blockwise_attention(q, k, v, block_size=2, mask=mask)

    assert torch.autograd.gradcheck(masked, (q, k, v))


def test_rows_that_see_no_key_get_zeros_and_zero_gradients():
    q, k, v = qkv(6, 9)
    mask = torch.ones(6, 9, dtype=torch.bool)
    mask[2] = False
    mask[4, :] = False
    out, lse = blockwise_attention(q, k, v, block_size=4, mask=mask, return_lse=True)
    assert torch.isfinite(out).all()
    assert (out[..., [2, 4], :] == 0).all()
    assert torch.isneginf(lse[..., [2, 4]]).all() and torch.isfinite(lse[..., [0, 1, 3, 5]]).all()
    expected, _ = reference(q, k, v, mask)
    assert_same_forward_and_backward(out, expected, (q, k, v))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and (q.grad[..., [2, 4], :] == 0).all()


def test_empty_dimensions():
    q, k, v = qkv(4, 0)  # no key: every row sees nothing
    out = blockwise_attention(q, k, v)
    assert out.shape == (2, 3, 4, 5) and (out == 0).all()
    q, k, v = qkv(0, 6)  # no query: an empty result
    assert blockwise_attention(q, k, v, is_causal=True).shape == (2, 3, 0, 5)
    q, k, v = qkv(3, 6, lead=(0,))  # empty batch
    assert blockwise_attention(q, k, v).shape == (0, 3, 5)


def test_backward_saves_no_quadratic_tensor():
    # Every tensor autograd keeps for the backward pass is at most n·d: catches a backward that
    # stores the probabilities instead of recomputing them. The naive path is the control.
    n, d = 64, 4
    q, k, v = qkv(n, n, d=d, d_v=d, lead=())
    saved_sizes = []

    def keep(tensor):
        saved_sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        blockwise_attention(q, k, v, block_size=8, is_causal=True)
    assert saved_sizes and max(saved_sizes) <= n * d
    saved_sizes.clear()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        naive_attention(q, k, v, is_causal=True)
    assert max(saved_sizes) >= n * n


def test_naive_attention_equals_reference():
    q, k, v = qkv(7, 11)
    mask = torch.rand(7, 11, generator=torch.Generator().manual_seed(4)) > 0.5
    mask[3] = False
    expected, _ = reference(q, k, v, combine := mask & causal_mask(7, 11))
    assert combine.shape == (7, 11)
    out = naive_attention(q, k, v, mask=mask, is_causal=True)
    assert_same_forward_and_backward(out, expected, (q, k, v))


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda q, k, v: (q.long(), k, v, {}), TypeError, r"q must be a floating-point tensor"),
        (lambda q, k, v: (q, k.float(), v, {}), TypeError, r"share one dtype"),
        (
            lambda q, k, v: (q[0, 0, 0], k, v, {}),
            ValueError,
            r"q must have shape \(\.\.\., q_len, d_k\)",
        ),
        (
            lambda q, k, v: (q, k[..., :3], v, {}),
            ValueError,
            r"k must have the same last dimension d_k",
        ),
        (lambda q, k, v: (q, k, v[..., :4, :], {}), ValueError, r"v must have one row per key"),
        (
            lambda q, k, v: (q, k[:1], v[:1], {}),
            ValueError,
            r"identical leading \(batch\) dimensions",
        ),
        (lambda q, k, v: (q * math.nan, k, v, {}), ValueError, r"q contains .* NaN or infinite"),
        (
            lambda q, k, v: (q, k, v, {"block_size": 0}),
            ValueError,
            r"block_size must be >= 1, got 0",
        ),
        (lambda q, k, v: (q, k, v, {"block_size": 2.0}), TypeError, r"block_size must be an int"),
        (lambda q, k, v: (q, k, v, {"is_causal": 1}), TypeError, r"is_causal must be a bool"),
        (lambda q, k, v: (q, k, v, {"scale": math.inf}), ValueError, r"scale must be a finite"),
        (
            lambda q, k, v: (q, k, v, {"mask": torch.ones(6, 6)}),
            TypeError,
            r"mask must be a boolean tensor",
        ),
        (
            lambda q, k, v: (q, k, v, {"mask": torch.ones(4, 6, 6, dtype=torch.bool)}),
            ValueError,
            r"mask of shape \(4, 6, 6\) does not broadcast",
        ),
        (
            lambda q, k, v: (q, k[..., :4, :], v[..., :4, :], {"is_causal": True}),
            ValueError,
            r"is_causal needs k_len >= q_len",
        ),
    ],
)
def test_bad_input_is_named(change, error, message):
    q, k, v, kwargs = change(*qkv(6, 6, d=8, d_v=8, requires_grad=False))
    with pytest.raises(error, match=message):
        blockwise_attention(q, k, v, **kwargs)
    if "block_size" not in kwargs:
        with pytest.raises(error, match=message):
            naive_attention(q, k, v, **kwargs)


# --- memory -------------------------------------------------------------------------------


def test_blockwise_memory_grows_linearly_and_naive_quadratically():
    def peaks(fn, n):
        q, k, v = (torch.randn(1, n, 16, requires_grad=True) for _ in range(3))
        forward = peak_memory_bytes(lambda: fn(q.detach(), k.detach(), v.detach()))
        both = peak_memory_bytes(lambda: fn(q, k, v).sum().backward())
        return forward, both

    def blockwise(q, k, v):
        return blockwise_attention(q, k, v, block_size=32)

    naive_small, naive_large = peaks(naive_attention, 256), peaks(naive_attention, 1024)
    block_small, block_large = peaks(blockwise, 256), peaks(blockwise, 1024)
    for small, large, matrix in zip(naive_small, naive_large, (2, 3)):
        assert large > matrix * 1024**2 * 4  # at least `matrix` float32 n×n matrices
        assert 14 < large / small < 17  # 4× the length: 16× the memory
    for small, large in zip(block_small, block_large):
        assert large < 1024**2 * 4 / 8  # far below one n×n matrix
        assert 2.5 < large / small < 4.5  # 4× the length: about 4× the memory


# --- banded local attention ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("q_len", "k_len", "window", "causal", "chunk_size"),
    [
        (40, 40, 5, True, 7),  # chunks that do not divide the length
        (40, 40, 5, False, 7),  # symmetric band: keys ahead of the chunk too
        (40, 40, 1, True, None),  # the diagonal alone
        (40, 40, 3, False, 1),  # one query per chunk
        (40, 40, 64, True, 16),  # a window wider than the sequence: full causal attention
        (12, 40, 6, True, 5),  # queries are the last 12 of 40 positions
        (12, 40, 6, False, 5),
    ],
)
def test_sliding_window_attention_equals_masked_full_attention(
    q_len, k_len, window, causal, chunk_size
):
    # Catches a chunk whose key range starts one key late or ends one key early (the band's
    # edge rows lose a key), a symmetric band that ignores the keys ahead, and a top-left
    # alignment when k_len > q_len.
    q, k, v = qkv(q_len, k_len)
    mask = sliding_window_mask(q_len, k_len, window=window, causal=causal)
    expected, _ = reference(q, k, v, mask)
    out = sliding_window_attention(q, k, v, window=window, causal=causal, chunk_size=chunk_size)
    assert_same_forward_and_backward(out, expected, (q, k, v))


def test_sliding_window_attention_memory_grows_with_n_times_window():
    def peak(n):
        q, k, v = (torch.randn(1, n, 16, requires_grad=True) for _ in range(3))
        return peak_memory_bytes(
            lambda: sliding_window_attention(q, k, v, window=32).sum().backward()
        )

    small, large = peak(512), peak(2048)
    assert large < 2048**2 * 4 / 8  # far below the n×n matrix the masked version builds
    assert 2.5 < large / small < 5  # 4× the length: about 4× the memory, not 16×


@pytest.mark.parametrize(
    ("kwargs", "shapes", "error", "message"),
    [
        ({"window": 0}, None, ValueError, r"window must be >= 1, got 0"),
        ({"window": 2, "causal": "yes"}, None, TypeError, r"causal must be a bool"),
        ({"window": 2, "chunk_size": 0}, None, ValueError, r"chunk_size must be >= 1"),
        ({"window": 2}, (6, 4), ValueError, r"k must have at least as many positions as q"),
        ({"window": 2, "scale": "big"}, None, TypeError, r"scale must be a finite number"),
    ],
)
def test_sliding_window_attention_bad_input(kwargs, shapes, error, message):
    q_len, k_len = shapes or (6, 6)
    q, k, v = qkv(q_len, k_len, requires_grad=False)
    with pytest.raises(error, match=message):
        sliding_window_attention(q, k, v, **kwargs)
