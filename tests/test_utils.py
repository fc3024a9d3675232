"""companion.utils: seeds, shape checks, parameter counts, shape traces."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from companion import check_shape, count_parameters, set_seed
from companion.model import TransformerConfig


def test_utils():
    set_seed(3)
    a = torch.rand(3)
    set_seed(3)
    assert torch.equal(a, torch.rand(3))
    assert check_shape(torch.zeros(2, 3), (2, None)).shape == (2, 3)
    with pytest.raises(AssertionError, match=r"scores should have shape \(2, 4\), got \(2, 3\)"):
        check_shape(torch.zeros(2, 3), (2, 4), "scores")
    assert count_parameters(torch.nn.Linear(3, 2)) == 8


def test_trace_shapes_records_every_sub_layer_in_call_order():
    from companion.model import Transformer
    from companion.utils import trace_shapes

    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(30, 40, d_model=16, num_heads=2, num_layers=2, d_ff=24, src_pad_id=0)
    )
    src, tgt = torch.randint(1, 30, (3, 5)), torch.randint(1, 40, (3, 4))
    records = trace_shapes(model, src, tgt)
    names = [r.name for r in records]
    assert names.index("src_embedding") < names.index("encoder") < names.index("tgt_embedding")
    assert names[-1] == "generator" and records[-1].output == (3, 4, 40)
    cross = next(r for r in records if r.name == "decoder.layers.1.cross_attention")
    assert cross.inputs[:3] == ((3, 4, 16), (3, 5, 16), (3, 5, 16))  # queries: target
    assert cross.kind == "MultiHeadAttention" and cross.output == (3, 4, 16)
    assert not any("dropout" in n for n in names)
    chosen = trace_shapes(model, src, tgt, include=lambda name, m: name.count(".") == 0)
    assert [r.name for r in chosen] == [
        "src_embedding", "src_positions", "encoder", "tgt_embedding", "tgt_positions",
        "decoder", "generator",
    ]  # fmt: skip
    assert all(not m._forward_hooks for m in model.modules())  # hooks removed


def test_trace_shapes_removes_hooks_when_the_model_raises():
    from companion.model import Transformer
    from companion.utils import trace_shapes

    model = Transformer(TransformerConfig(10, 10, d_model=8, num_heads=2, num_layers=1, d_ff=8))
    with pytest.raises(ValueError, match="src"):
        trace_shapes(model, torch.tensor([[11]]), torch.tensor([[1]]))  # id out of range
    assert all(not m._forward_hooks for m in model.modules())
    with pytest.raises(TypeError, match="model"):
        trace_shapes("model")
    with pytest.raises(TypeError, match="include"):
        trace_shapes(model, include=3)


def test_glue_returns_plain_python_numbers_and_rejects_bad_input():
    from companion.utils import glue

    assert glue("half", torch.tensor(0.5)) == 0.5 and type(glue("half", torch.tensor(0.5))) is float
    assert type(glue("count", np.int64(7))) is int
    assert glue("word", "beam") == "beam"
    with pytest.raises(ValueError, match="name"):
        glue("two words", 1.0)
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        glue("many", torch.ones(2, 3))
    with pytest.raises(TypeError, match="bool"):
        glue("flag", True)


def test_glue_prints_the_value_on_colab_only(monkeypatch, capsys):
    """Colab shows the markdown's raw {glue:text} placeholder, so there glue prints name = value."""
    import types

    from companion.utils import glue

    glue("quiet", 0.123456)
    assert capsys.readouterr().out == "", (
        "outside Colab glue must print nothing (the book shows it)"
    )
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert glue("gap", 0.123456) == 0.123456
    glue("count", np.int64(7))
    glue("word", "beam")
    assert capsys.readouterr().out == "gap = 0.1235\ncount = 7\nword = beam\n"


# --- enable_colab_widgets ---------------------------------------------------------------


@pytest.fixture
def fake_colab(monkeypatch):
    """A stand-in for Colab's ``google.colab.output`` that records the manager being enabled."""
    import types

    calls = []
    google = types.ModuleType("google")
    colab = types.ModuleType("google.colab")
    output = types.ModuleType("google.colab.output")
    output.enable_custom_widget_manager = lambda: calls.append("enabled")
    colab.output = output
    google.colab = colab
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setitem(sys.modules, "google.colab.output", output)
    return calls


@pytest.mark.parametrize(
    ("version", "enabled"), [("7.7.1", False), ("8.1.9", True), ("9.0.0", True)]
)
def test_enable_colab_widgets_on_colab(fake_colab, monkeypatch, version, enabled):
    import ipywidgets

    from companion.utils import enable_colab_widgets

    monkeypatch.setattr(ipywidgets, "__version__", version)
    assert enable_colab_widgets() is enabled
    assert fake_colab == (["enabled"] if enabled else []), (
        f"ipywidgets {version} on Colab: the custom widget manager should "
        f"{'' if enabled else 'not '}be switched on"
    )


def test_enable_colab_widgets_does_nothing_elsewhere(monkeypatch):
    from companion.utils import enable_colab_widgets

    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    assert enable_colab_widgets() is False
