"""Unit tests of the general argument checks in :mod:`companion._validation`."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
import torch

from companion._validation import (
    check_bool_tensor,
    check_callable,
    check_finite_float,
    check_instance,
    check_nonnegative_float,
    check_positive_float,
)

NON_NUMBERS = [True, False, "1.0", None, [1.0], torch.tensor(1.0)]
NON_FINITE = [math.nan, math.inf, -math.inf]


# --------------------------------------------------------------------------------------------
# check_finite_float
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 0.0, -3, 2.5, -1e300, 1e-300, 7])
def test_finite_float_accepts_finite_numbers_and_returns_a_float(value):
    result = check_finite_float("x", value)
    assert type(result) is float
    assert result == value


@pytest.mark.parametrize("value", NON_NUMBERS)
def test_finite_float_rejects_non_numbers_and_bools(value):
    with pytest.raises(TypeError, match=r"x must be a finite number, got \w+"):
        check_finite_float("x", value)


@pytest.mark.parametrize("value", NON_FINITE)
def test_finite_float_rejects_nan_and_infinity(value):
    with pytest.raises(ValueError, match=rf"x must be a finite number, got {value}"):
        check_finite_float("x", value)


def test_finite_float_words_the_message_with_expected():
    with pytest.raises(ValueError, match="scale must be a real scale, got nan"):
        check_finite_float("scale", math.nan, "a real scale")


# --------------------------------------------------------------------------------------------
# check_nonnegative_float
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 0.0, -0.0, 1e-300, 0.6, 3])
def test_nonnegative_float_accepts_zero_and_positive_numbers(value):
    result = check_nonnegative_float("alpha", value)
    assert type(result) is float
    assert result == value


@pytest.mark.parametrize("value", [-1e-12, -0.5, -1])
def test_nonnegative_float_rejects_negative_numbers(value):
    with pytest.raises(ValueError, match=rf"alpha must be a finite number >= 0, got {value}"):
        check_nonnegative_float("alpha", value)


@pytest.mark.parametrize("value", NON_FINITE)
def test_nonnegative_float_rejects_nan_and_infinity(value):
    with pytest.raises(ValueError, match="alpha must be a finite number >= 0"):
        check_nonnegative_float("alpha", value)


@pytest.mark.parametrize("value", NON_NUMBERS)
def test_nonnegative_float_rejects_non_numbers_and_bools(value):
    with pytest.raises(TypeError, match="alpha must be a finite number >= 0, got"):
        check_nonnegative_float("alpha", value)


# --------------------------------------------------------------------------------------------
# check_positive_float
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1e-300, 0.5, 1, 4000.0])
def test_positive_float_accepts_positive_numbers(value):
    result = check_positive_float("lr", value)
    assert type(result) is float
    assert result == value


@pytest.mark.parametrize("value", [0, 0.0, -0.0, -1e-12, -2])
def test_positive_float_rejects_zero_and_negative_numbers(value):
    with pytest.raises(ValueError, match=rf"lr must be a positive finite number, got {value}"):
        check_positive_float("lr", value)


@pytest.mark.parametrize("value", NON_FINITE)
def test_positive_float_rejects_nan_and_infinity(value):
    with pytest.raises(ValueError, match="lr must be a positive finite number"):
        check_positive_float("lr", value)


@pytest.mark.parametrize("value", NON_NUMBERS)
def test_positive_float_rejects_non_numbers_and_bools(value):
    with pytest.raises(TypeError, match="lr must be a positive finite number, got"):
        check_positive_float("lr", value)


def test_positive_float_words_the_message_with_expected():
    with pytest.raises(ValueError, match="time_budget must be a positive number of seconds"):
        check_positive_float("time_budget", 0, "a positive number of seconds or None")


# --------------------------------------------------------------------------------------------
# check_instance, check_callable, check_bool_tensor
# --------------------------------------------------------------------------------------------


def test_instance_returns_the_value_and_accepts_subclasses():
    assert check_instance("name", "abc", str) == "abc"
    assert check_instance("flag", True, int) is True  # bool is an int subclass
    state = {"a": 1}
    assert check_instance("state", state, Mapping, "a dict from to_dict()") is state


def test_instance_names_the_argument_the_expected_type_and_what_was_given():
    with pytest.raises(TypeError, match="name must be a str, got int"):
        check_instance("name", 3, str)
    with pytest.raises(TypeError, match=r"state must be a dict from to_dict\(\), got list"):
        check_instance("state", [("a", 1)], Mapping, "a dict from to_dict()")
    with pytest.raises(TypeError, match="generator must be a torch.Generator, got int"):
        check_instance("generator", 0, torch.Generator, "a torch.Generator")


def test_callable_accepts_functions_classes_and_callable_objects():
    for value in (len, lambda: None, int, torch.nn.Identity()):
        assert check_callable("fn", value) is value


@pytest.mark.parametrize("value", [None, 3, "len", [len]])
def test_callable_rejects_what_cannot_be_called(value):
    with pytest.raises(TypeError, match=rf"fn must be callable, got {type(value).__name__}"):
        check_callable("fn", value)
    with pytest.raises(TypeError, match=r"include must be a function \(name, module\) -> bool"):
        check_callable("include", value, "a function (name, module) -> bool")


def test_bool_tensor_accepts_boolean_tensors_of_any_shape():
    for mask in (torch.ones(3, dtype=torch.bool), torch.zeros(2, 1, 4, dtype=torch.bool)):
        assert check_bool_tensor("mask", mask) is mask


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.float32, torch.float16])
def test_bool_tensor_rejects_other_dtypes_even_with_0_1_values(dtype):
    with pytest.raises(TypeError, match=f"mask must be a boolean tensor, got dtype {dtype}"):
        check_bool_tensor("mask", torch.ones(2, 3, dtype=dtype))


@pytest.mark.parametrize("value", [[True, False], True, None])
def test_bool_tensor_rejects_non_tensors(value):
    with pytest.raises(TypeError, match="mask must be a torch.Tensor"):
        check_bool_tensor("mask", value)


# --------------------------------------------------------------------------- checks at the edge


def _count_checks(monkeypatch, classes_and_methods):
    """Wrap each ``cls.method`` so that its calls are counted; returns the counter dict."""
    from collections import Counter

    counts: Counter[str] = Counter()
    for cls, method in classes_and_methods:
        original = getattr(cls, method)

        def counting(self, *args, _original=original, _key=f"{cls.__name__}.{method}", **kw):
            counts[_key] += 1
            return _original(self, *args, **kw)

        monkeypatch.setattr(cls, method, counting)
    return counts


def test_a_public_call_checks_its_inputs_once_and_inner_calls_skip_theirs(monkeypatch) -> None:
    import torch

    from companion.attention import MultiHeadAttention
    from companion.layers import DecoderLayer, EncoderLayer, FeedForward
    from companion.model import Transformer, TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig(20, 20, d_model=16, num_heads=2, num_layers=2, d_ff=32)
    model = Transformer(config).eval()
    counts = _count_checks(
        monkeypatch,
        [
            (Transformer, "check_forward"),
            (Transformer, "check_encode"),
            (Transformer, "check_decode"),
            (EncoderLayer, "check_inputs"),
            (DecoderLayer, "check_inputs"),
            (MultiHeadAttention, "check_inputs"),
            (FeedForward, "check_inputs"),
        ],
    )
    src, tgt = torch.randint(0, 20, (3, 6)), torch.randint(0, 20, (3, 5))
    model(src, tgt)
    assert dict(counts) == {"Transformer.check_forward": 1}
    counts.clear()
    attention = model.encoder.layers[0].self_attention
    x = torch.randn(3, 6, 16)
    attention(x, x, x)  # the same module, called by a user: checks its own inputs
    model.encoder.layers[0](x)
    assert dict(counts) == {"MultiHeadAttention.check_inputs": 1, "EncoderLayer.check_inputs": 1}


def test_inner_modules_still_reject_bad_input_when_called_directly() -> None:
    import pytest
    import torch

    from companion.model import Transformer, TransformerConfig

    model = Transformer(TransformerConfig(20, 20, d_model=16, num_heads=2, num_layers=1, d_ff=32))
    layer = model.encoder.layers[0]
    with pytest.raises(ValueError, match=r"x contains 1 NaN"):
        layer(torch.tensor([[[float("nan")] + [0.0] * 15]]))
    with pytest.raises(ValueError, match=r"src must hold ids in \[0, 19\]"):
        model(torch.tensor([[1, 25]]), torch.tensor([[1, 2]]))  # checked at the edge


def test_a_failed_check_leaves_the_next_call_checked() -> None:
    import pytest
    import torch

    from companion.attention import MultiHeadAttention

    attention = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError):
        attention(torch.randn(1, 3, 7), torch.randn(1, 3, 8), torch.randn(1, 3, 8))
    with pytest.raises(ValueError, match="query must have shape"):  # still checked
        attention(torch.randn(1, 3, 7), torch.randn(1, 3, 8), torch.randn(1, 3, 8))


def test_inputs_checked_switches_checks_off_inside_and_restores_them() -> None:
    import pytest
    import torch

    from companion._validation import inputs_checked
    from companion.layers import FeedForward

    feed_forward = FeedForward(4, 8)
    with inputs_checked(), pytest.raises(RuntimeError):  # unchecked: torch's own error
        feed_forward(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 4\)"):
        feed_forward(torch.randn(2, 5))
