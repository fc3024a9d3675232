"""companion._validation: the shared input checks (the ones not covered through the modules)."""

from __future__ import annotations

import math

import pytest

from companion._validation import check_positive_float


@pytest.mark.parametrize("value", [1, 0.25, 30.0, 1e-9, 10**6])
def test_check_positive_float_accepts_positive_finite_numbers(value: float) -> None:
    result = check_positive_float("timeout", value)
    assert result == value and type(result) is float


@pytest.mark.parametrize("value", [0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf])
def test_check_positive_float_rejects_zero_negative_nan_inf(value: float) -> None:
    with pytest.raises(ValueError, match=f"timeout must be > 0 and finite, got {value}"):
        check_positive_float("timeout", value)


@pytest.mark.parametrize(("value", "type_name"), [(True, "bool"), ("3", "str"), (None, "NoneType")])
def test_check_positive_float_rejects_non_numbers(value: object, type_name: str) -> None:
    with pytest.raises(TypeError, match=f"scale must be a number > 0, got {type_name}"):
        check_positive_float("scale", value)
