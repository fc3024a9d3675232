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
