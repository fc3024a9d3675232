"""companion.configs: the named training configurations and their checks."""

from __future__ import annotations

import pytest
import torch

from companion.configs import CONFIGS, TrainConfig, get_config, resolve_config_name


def test_named_configs_and_auto():
    assert set(CONFIGS) == {"cpu", "gpu", "toy"}
    assert resolve_config_name("auto") == ("gpu" if torch.cuda.is_available() else "cpu")
    cpu = get_config("cpu")
    assert (cpu.d_model, cpu.num_layers, cpu.label_smoothing) == (256, 3, 0.1)
    assert cpu.time_budget is not None and cpu.time_budget <= 600
    gpu = get_config("gpu")
    assert gpu.d_model > cpu.d_model and gpu.num_layers > cpu.num_layers
    assert TrainConfig.from_dict(cpu.to_dict()) == cpu
    assert get_config("cpu", dropout=0.3).dropout == 0.3


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: get_config("laptop"), ValueError, r"config must be one of 'auto', 'cpu', 'gpu', 'toy', got 'laptop'"),
        (lambda: get_config("cpu", time_budget=0), ValueError, r"time_budget must be a positive number of seconds or None, got 0"),
        (lambda: get_config("cpu", time_budget=-5.0), ValueError, r"time_budget must be a positive .* got -5.0"),
        (lambda: get_config("cpu", max_steps=0), ValueError, r"max_steps must be >= 1, got 0"),
        (lambda: get_config("cpu", beam_size=0), ValueError, r"beam_size must be >= 1, got 0"),
        (lambda: get_config("cpu", num_heads=3), ValueError, r"d_model must be divisible by num_heads"),
        (lambda: get_config("cpu", task="de-fr"), ValueError, r"task must be one of 'multi30k', 'copy', 'reverse', got 'de-fr'"),
        (lambda: get_config("cpu", learning_rate=1.0), TypeError, r"unknown TrainConfig field\(s\) \['learning_rate'\]"),
        (lambda: get_config("cpu", dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got 1.0"),
    ],
)  # fmt: skip
def test_config_errors(make, error, message):
    with pytest.raises(error, match=message):
        make()
