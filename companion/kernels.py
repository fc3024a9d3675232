"""The fast paths: how attention and the feed-forward network run, apart from what they compute.

The teaching modules say *what* is computed - :meth:`companion.attention.MultiHeadAttention.attend`
(``softmax(q kᵀ / √d_k + bias) v`` per head) and :class:`companion.layers.FeedForward`
(``output_proj(dropout(activation(hidden_proj(x))))``). This module decides *how* it runs,
from two entry points, and holds the kernels behind them:

* :func:`attention` - attention of every head at once, without weights: torch's fused
  ``F.scaled_dot_product_attention`` (:func:`fused_attention`, key/value heads paired by the
  kernel itself on torch >= 2.5), except when training with dropout on a CPU outside
  ``torch.compile``, where torch's fused kernel has no dropout and falls back to separate
  operators: there :class:`DroppedAttention` computes the same arithmetic as one autograd node
  with a hand-written backward and :mod:`companion.dropout`'s cheap random numbers. Queries
  whose keys are all blocked get a zero vector (never NaN), whichever kernel runs.
* :func:`relu_dropout_applies` and :func:`kept_relu_linear` - the feed-forward network's
  ReLU + dropout + output projection in fewer passes over the ``d_ff``-wide tensor
  (:class:`KeptReLU`), for training with ReLU and dropout on a CPU, eager.
* :func:`fused_linear` - several linear layers on one input as one matrix product (the q, k
  and v projections of :meth:`companion.attention.MultiHeadAttention.project`, which chapter
  3 prints; importable from :mod:`companion.attention` too).

Each kernel computes what the written-out formula computes (``tests/test_attention.py``,
``tests/test_layers.py``, ``tests/test_parity_gradients.py``); ``benchmarks/README.md``
records what each one bought. Nothing here checks its inputs - the public modules that call
it have checked them - except the public :func:`fused_linear` when a user calls it directly
(:func:`companion._validation.checks_enabled`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import check_floating, check_min_ndim, check_size, checks_enabled
from companion.dropout import Dropout, dropout_factor, keep_mask, survivor_scale
from companion.masking import causal_mask, to_additive_mask

__all__ = [
    "attention",
    "causal_or_mask",
    "fused_attention",
    "attention_with_dropout",
    "DroppedAttention",
    "every_row_has_a_key",
    "rows_with_a_key",
    "zero_queries_without_keys",
    "relu_dropout_applies",
    "kept_relu_linear",
    "KeptReLU",
    "fused_linear",
    "SDPA_HAS_GQA",
]

#: torch >= 2.5: ``F.scaled_dot_product_attention`` pairs query and key/value heads itself
#: (``enable_gqa=True``); older versions get the key/value heads repeated explicitly.
SDPA_HAS_GQA = torch.torch_version.TorchVersion(torch.__version__) >= (2, 5)


# ------------------------------------------------------------------------ attention


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    bias: Tensor | None,
) -> Tensor:
    """Attention in every head, no weights: the one place that picks a kernel.

    Args:
        q: ``(batch, heads, q_len, head_dim)``.
        k, v: ``(batch, kv_heads, k_len, head_dim)``; query head ``r`` reads key/value head
            ``r // (heads / kv_heads)``.
        mask: boolean, ``True`` = may attend, broadcastable to ``(batch, heads, q_len, k_len)``.
        dropout_p: dropout on the weights (0 outside training).
        is_causal: the kernel's own square causal mask (no ``mask``, no ``bias``).
        bias: float, broadcastable to the scores (ALiBi), or ``None``.

    Returns:
        ``(batch, heads, q_len, head_dim)``; zero for a query with no key.
    """
    has_key = None  # rows without a key attend everywhere (no 0/0 = NaN), then are zeroed
    if mask is not None and not every_row_has_a_key(mask):
        has_key = mask.any(dim=-1, keepdim=True)  # (..., q_len or 1, 1)
        mask = mask | ~has_key  # broadcastable to (batch, heads, q_len, k_len)
    if dropout_p > 0 and q.device.type == "cpu" and not torch.compiler.is_compiling():
        k, v = _one_head_per_query_head(k, q.shape[1]), _one_head_per_query_head(v, q.shape[1])
        per_head = attention_with_dropout(q, k, v, mask, dropout_p, is_causal, bias)
    else:
        per_head = fused_attention(q, k, v, mask, dropout_p, is_causal, bias)
    if has_key is not None:
        per_head = per_head.masked_fill(~has_key, 0.0)  # (batch, heads, q_len, head_dim)
    return per_head


def causal_or_mask(
    mask: Tensor | None,
    is_causal: bool,
    q_len: int,
    k_len: int,
    device: torch.device,
    explicit: bool,
) -> tuple[Tensor | None, bool]:
    """Turn ``is_causal`` into what :func:`attention` takes: the fused kernel's own causal flag
    when it can apply it (square, no other mask, no weights wanted and no bias:
    ``explicit=False``), else a causal mask ``(q_len, k_len)`` combined with ``mask``. One
    query (a decoding step) may see every key. Returns ``(mask, kernel_is_causal)``."""
    if not is_causal or q_len == 1:
        return mask, False
    if mask is None and q_len == k_len and not explicit:
        return None, True
    causal = causal_mask(q_len, k_len, device=device)  # (q_len, k_len)
    return (causal if mask is None else mask & causal), False  # broadcastable to the scores


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    bias: Tensor | None,
) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` with fewer key/value heads and an
    additive bias. ``q (batch, heads, q_len, hd)``, ``k, v (batch, kv_heads, k_len, hd)``;
    ``mask`` has a key in every row. Returns ``(batch, heads, q_len, hd)``."""
    attn_mask = mask
    if bias is not None:  # one float mask: the bias where a query may look, -inf elsewhere
        attn_mask = bias if mask is None else torch.where(mask, bias, float("-inf"))
    grouped = {}
    if k.shape[1] != q.shape[1]:
        if SDPA_HAS_GQA:  # the kernel pairs query head h with key/value head h // group
            grouped = {"enable_gqa": True}
        else:  # torch < 2.5: repeat the key/value heads explicitly
            k, v = _one_head_per_query_head(k, q.shape[1]), _one_head_per_query_head(v, q.shape[1])
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **grouped
    )  # (batch, heads, q_len, head_dim)


def _one_head_per_query_head(x: Tensor, num_heads: int) -> Tensor:
    """``(batch, kv_heads, len, hd)`` → ``(batch, num_heads, len, hd)``, each key/value head
    repeated in place for its group, as :func:`companion.attention.repeat_kv_heads` does."""
    group = num_heads // x.shape[1]
    return x if group == 1 else x.repeat_interleave(group, dim=1)  # (batch, num_heads, len, hd)


def attention_with_dropout(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    bias: Tensor | None = None,
) -> Tensor:
    """Training-mode attention on a CPU with dropout on the weights.

    torch's fused CPU kernel has no dropout, so with ``dropout_p > 0`` torch falls back to
    its step-by-step path, whose dropout draws one random number per weight with
    ``bernoulli_``. Written out here, the same arithmetic uses :func:`companion.dropout`'s
    random lanes and runs as one autograd node (:class:`DroppedAttention`); the mask becomes
    a small broadcast bias (``-inf`` where blocked). ``mask`` has a key in every row; ``bias``
    (ALiBi) is added to the scores. ``k`` and ``v`` have one head per query head.
    """
    if is_causal and mask is None:
        mask = causal_mask(q.shape[-2], k.shape[-2], device=q.device)  # (q_len, k_len)
    if mask is not None:
        blocked = to_additive_mask(mask, q.dtype)  # mask's shape: 0 where a query may look, -inf
        bias = blocked if bias is None else bias + blocked  # broadcastable to the scores
    return DroppedAttention.apply(q, k, v, bias, dropout_p)  # (batch, heads, q_len, head_dim)


class DroppedAttention(torch.autograd.Function):
    r"""``dropout(softmax(q kᵀ / √d_k + bias), p) v`` as one autograd node (CPU, eager).

    Written with separate torch operators, attention with dropout keeps three tensors of the
    size of the scores for the backward pass (weights, dropout factor, dropped weights) and
    reads them back in several passes. Here the backward pass is written out and needs only
    the weights ``w`` and the dropped weights ``d = f ⊙ w`` (``f`` the dropout factor, 0 or
    ``1/(1-p)``; ``g_o`` the gradient of the output ``d v``):

    * ``∂L/∂v = dᵀ g_o`` and ``∂L/∂w = f ⊙ g`` with ``g = g_o vᵀ``;
    * the softmax backward ``∂L/∂scores = w ⊙ ∂L/∂w - w ⊙ rowsum(w ⊙ ∂L/∂w)`` with
      ``w ⊙ ∂L/∂w = g ⊙ d =: t`` (as ``w ⊙ f = d``): ``∂L/∂scores = t - w ⊙ rowsum(t)``;
    * ``∂L/∂q = ∂L/∂scores k / √d_k`` and ``∂L/∂k = ∂L/∂scoresᵀ q / √d_k``.

    Shapes: ``q (batch, heads, q_len, d)``, ``k, v (batch, heads, k_len, d)``; ``bias``
    ``None`` or broadcastable to ``(batch, heads, q_len, k_len)``; every row has a key.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, p: float) -> Tensor:
        batch, heads, q_len, head_dim = q.shape
        k_len, rows = k.shape[-2], batch * heads
        scaled_q = torch.mul(q, head_dim**-0.5, out=q.new_empty(q.shape))  # contiguous
        q3 = scaled_q.view(rows, q_len, head_dim)  # (rows, q_len, d), rows = batch·heads
        k3 = k.reshape(rows, k_len, head_dim)  # (rows, k_len, d)
        v3 = v.reshape(rows, k_len, v.shape[-1])  # (rows, k_len, d_v)
        if bias is None:
            scores = torch.bmm(q3, k3.mT)  # (rows, q_len, k_len)
        else:
            scores = q.new_empty(batch, heads, q_len, k_len)
            scores.copy_(bias.expand(scores.shape))  # the bias, then the products added to it
            scores = scores.view(rows, q_len, k_len)  # (rows, q_len, k_len)
            torch.baddbmm(scores, q3, k3.mT, out=scores)  # (rows, q_len, k_len) bias + q kᵀ
        weights = torch.softmax(scores, dim=-1, out=scores)  # (rows, q_len, k_len) in place
        dropped = dropout_factor(weights, p).mul_(weights)  # (rows, q_len, k_len) d = f ⊙ w
        ctx.save_for_backward(q3, k3, v3, weights, dropped)
        ctx.shapes = (q.shape, k.shape, v.shape, None if bias is None else bias.shape)
        output = torch.bmm(dropped, v3)  # (rows, q_len, d_v)
        return output.view(batch, heads, q_len, v.shape[-1])  # (batch, heads, q_len, d_v)

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        q3, k3, v3, weights, dropped = ctx.saved_tensors
        q_shape, k_shape, v_shape, bias_shape = ctx.shapes
        grad_q = grad_k = grad_v = grad_bias = None
        go = grad_output.reshape(v3.shape[0], q3.shape[1], v3.shape[2])  # (rows, q_len, d_v)
        if ctx.needs_input_grad[2]:
            grad_v = torch.bmm(dropped.mT, go).view(v_shape)  # (batch, heads, k_len, d_v)
        grad_scores = torch.bmm(go, v3.mT).mul_(dropped)  # (rows, q_len, k_len) t = g ⊙ d
        row_sums = grad_scores.sum(dim=-1, keepdim=True)  # (rows, q_len, 1)
        grad_scores.addcmul_(weights, row_sums, value=-1.0)  # (rows, q_len, k_len) t - w ⊙ rowsum
        if ctx.needs_input_grad[0]:
            grad_q = torch.bmm(grad_scores, k3).mul_(q_shape[-1] ** -0.5).view(q_shape)
        if ctx.needs_input_grad[1]:
            grad_k = torch.bmm(grad_scores.mT, q3).view(k_shape)  # q3 carries the 1/√d
        if ctx.needs_input_grad[3]:
            full = grad_scores.view(*q_shape[:-1], k_shape[-2])  # (batch, heads, q_len, k_len)
            grad_bias = full.sum_to_size(bias_shape)  # summed over the broadcast dimensions
        return grad_q, grad_k, grad_v, grad_bias, None


# ------------------------------------------------------------------------ rows without keys


def every_row_has_a_key(mask: Tensor) -> bool:
    """Whether every query of ``mask`` may attend to some key - asked only where the answer is
    cheap: on a CPU outside ``torch.compile`` (a host read, no graph break). Elsewhere it
    answers ``False`` and the caller zeroes the rows without a key, which changes nothing when
    there are none."""
    if mask.device.type != "cpu" or torch.compiler.is_compiling():
        return False
    return bool(mask.any(dim=-1).all())


def rows_with_a_key(mask: Tensor) -> Tensor:
    """``(batch or 1, q_len or 1, 1)``: ``True`` where a query may attend to a key in some head."""
    has_key = mask.any(dim=-1, keepdim=True)  # (..., q_len or 1, 1), up to 4-D
    has_key = has_key.reshape((1,) * (4 - has_key.dim()) + tuple(has_key.shape))  # 4-D
    return has_key.any(dim=1)  # (batch or 1, q_len or 1, 1)


def zero_queries_without_keys(output: Tensor, mask: Tensor | None, k_len: int) -> Tensor:
    """``output (batch, q_len, d_model)`` with zeros for every query that no head lets attend
    anywhere (``mask`` broadcastable to ``(batch, heads, q_len, k_len)``), and everywhere when
    there are no keys at all (``k_len = 0``): zeros, not the output projection's bias."""
    if mask is not None and not every_row_has_a_key(mask):
        return output.masked_fill(~rows_with_a_key(mask), 0.0)  # (batch, q_len, d_model)
    if k_len == 0:
        return output * 0.0  # (batch, q_len, d_model)
    return output


# ------------------------------------------------------------------------ feed-forward


def relu_dropout_applies(dropout: nn.Module, activation: str, hidden: Tensor) -> bool:
    """Training with ReLU and a :class:`~companion.dropout.Dropout` on a CPU, eager: the case
    :func:`kept_relu_linear` computes in fewer passes (elsewhere torch's fused kernels or the
    compiler do). ``hidden (..., d_ff)``."""
    return (
        dropout.training
        and dropout.p > 0
        and not dropout.inplace
        and type(dropout) is Dropout
        and activation == "relu"
        and hidden.device.type == "cpu"
        and not torch.compiler.is_compiling()
    )


def kept_relu_linear(hidden: Tensor, p: float, linear: nn.Linear) -> Tensor:
    """``linear(dropout(relu(hidden), p))`` with the random decisions of
    :class:`~companion.dropout.Dropout`, in fewer passes over the ``d_ff``-wide tensor: ReLU
    and the 0/1 keep mask in one autograd node (:class:`KeptReLU`), and the survivors' scale
    ``1/(1-p)`` on the weight instead of the activations (``(m ⊙ relu(h)) (s W)ᵀ =
    (s m ⊙ relu(h)) Wᵀ``). ``hidden (..., d_ff)`` → ``(..., d_out)``."""
    kept = KeptReLU.apply(hidden, p)  # (..., d_ff) relu(h) or 0
    weight = linear.weight * survivor_scale(p)  # (d_out, d_ff)
    return F.linear(kept, weight, linear.bias)  # (..., d_out)


class KeptReLU(torch.autograd.Function):
    """``relu(h) ⊙ m`` with ``m`` a 0/1 keep mask drawn for ``p`` (no scale), one autograd node.

    Its output is positive exactly where ``h > 0`` and the element is kept, so the backward
    pass is one masked copy of the gradient - where separate ReLU and dropout nodes multiply
    by the saved mask and then apply ReLU's own backward, two passes over the ``d_ff``-wide
    tensor, with two saved tensors instead of one.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, p: float) -> Tensor:
        kept = keep_mask(hidden.shape, p, hidden.device, dtype=hidden.dtype)  # (..., d_ff) 0/1
        output = hidden.clamp_min(0.0).mul_(kept)  # (..., d_ff) relu(h) ⊙ m
        ctx.save_for_backward(output)
        return output

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor, None]:
        (output,) = ctx.saved_tensors
        return torch.ops.aten.threshold_backward(grad_output, output, 0.0), None  # 0 where ≤ 0


# ------------------------------------------------------------------------ projections


def fused_linear(x: Tensor, projections: Sequence[nn.Linear]) -> Tensor:
    """Apply several linear layers to the same input with one matrix product.

    The weights ``(out_i, d_in)`` are stacked into one ``(out_1 + out_2 + ..., d_in)`` matrix,
    so one product computes every layer's output, side by side: the same numbers as calling
    the layers one by one and concatenating, with one call instead of several.

    Args:
        x: input of shape ``(..., d_in)``.
        projections: one or more ``nn.Linear(d_in, out_i)``, all with biases or all without.

    Returns:
        Tensor of shape ``(..., out_1 + out_2 + ...)``:
        ``[projections[0](x) | projections[1](x) | ...]``.
    """
    if checks_enabled():  # not when called from inside a checked module
        projections = _check_projections(x, projections)
    weight = torch.cat([p.weight for p in projections])  # (out_1 + out_2 + ..., d_in)
    return F.linear(x, weight, _concat_bias(projections))  # (..., out_1 + out_2 + ...)


def _check_projections(x: object, projections: object) -> tuple[nn.Linear, ...]:
    """Validate the arguments of :func:`fused_linear`; return the layers as a tuple."""
    if not isinstance(projections, (Sequence, nn.ModuleList)) or len(projections) == 0:
        raise TypeError(
            f"projections must be a non-empty sequence of nn.Linear, got {projections!r:.80}"
        )
    for i, layer in enumerate(projections):
        if not isinstance(layer, nn.Linear):
            raise TypeError(f"projections[{i}] must be an nn.Linear, got {type(layer).__name__}")
    d_in = projections[0].in_features
    if any(p.in_features != d_in for p in projections):
        sizes = [p.in_features for p in projections]
        raise ValueError(f"projections must share one input size in_features, got {sizes}")
    if len({p.bias is None for p in projections}) > 1:
        raise ValueError("projections must all have biases or all have none")
    if not (isinstance(x, Tensor) and x.is_floating_point() and x.dim() and x.shape[-1] == d_in):
        check_floating("x", x)  # these raise the clear error
        check_min_ndim("x", x, 1, f"(..., {d_in})")
        check_size("x", x, -1, d_in, f"(..., {d_in})")
    return tuple(projections)


def _concat_bias(projections: tuple[nn.Linear, ...]) -> Tensor | None:
    if projections[0].bias is None:
        return None
    return torch.cat([p.bias for p in projections])  # (out_1 + out_2 + ...,)
