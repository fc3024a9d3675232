"""companion.configs: the named training configurations and their checks."""

from __future__ import annotations

import pytest
import torch

from companion.configs import CONFIGS, TrainConfig, get_config, resolve_config_name


def test_named_configs_and_auto():
    assert set(CONFIGS) == {"cpu", "gpu", "toy"}
    assert resolve_config_name("auto") == ("gpu" if torch.cuda.is_available() else "cpu")
    cpu = get_config("cpu")
    assert (cpu.model.d_model, cpu.model.num_layers, cpu.label_smoothing) == (256, 3, 0.1)
    # a budget in steps: the same model on any computer (chapter 8, issue #32)
    assert cpu.max_steps == 600 and cpu.time_budget is None and cpu.warmup
    gpu = get_config("gpu")
    assert gpu.model.d_model > cpu.model.d_model and gpu.model.num_layers > cpu.model.num_layers
    # compiling pays back only in a long run on a GPU (TrainConfig's docstring)
    assert gpu.compile and gpu.time_budget >= 1800 and not cpu.compile
    assert TrainConfig.from_dict(cpu.to_dict()) == cpu
    assert get_config("cpu", dropout=0.3).model.dropout == 0.3


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
        (lambda: get_config("cpu", length_penalty_grid=0.6), TypeError, r"length_penalty_grid must be a tuple of numbers >= 0 .*got float"),
        (lambda: get_config("cpu", length_penalty_grid="0.6"), TypeError, r"length_penalty_grid must be a tuple"),
        (lambda: get_config("cpu", length_penalty_grid=(0.6, -1.0)), ValueError, r"length_penalty_grid\[1\] must be"),
    ],
)  # fmt: skip
def test_config_errors(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_train_config_holds_a_transformer_config_and_routes_model_fields() -> None:
    from companion.configs import TrainConfig, get_config
    from companion.model import TransformerConfig

    config = get_config("cpu", d_model=128, num_heads=2, warmup_steps=10)
    assert isinstance(config.model, TransformerConfig)
    assert (config.model.d_model, config.model.num_heads, config.warmup_steps) == (128, 2, 10)
    assert not hasattr(config, "d_model")  # one place for the model's fields
    again = TrainConfig.from_dict(config.to_dict())
    assert again == config
    flat = {k: v for k, v in config.to_dict().items() if k != "model"} | {"d_model": 64}
    assert TrainConfig.from_dict(flat).model.d_model == 64  # the layout of older runs
    with pytest.raises(TypeError, match="unknown TrainConfig field"):
        get_config("cpu", d_modle=128)
    with pytest.raises(ValueError, match="d_model must be divisible by num_heads"):
        get_config("cpu", d_model=130, num_heads=4)


def test_transformer_needs_the_vocabularies() -> None:
    from companion.configs import get_config
    from companion.model import Transformer

    with pytest.raises(ValueError, match="config must set src_vocab and tgt_vocab"):
        Transformer(get_config("cpu").model)


def test_length_penalty_grid_round_trips_through_a_checkpoint_dict() -> None:
    # Catches: a grid stored as a list in config.json / a checkpoint coming back as a list
    # (unequal configs, an unhashable frozen dataclass) or losing its values.
    cpu = get_config("cpu")
    assert cpu.length_penalty_grid == (0.0, 0.6, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0)
    state = cpu.to_dict()
    state["length_penalty_grid"] = list(state["length_penalty_grid"])  # as JSON gives it back
    assert TrainConfig.from_dict(state) == cpu
    assert get_config("gpu").length_penalty_grid == ()
