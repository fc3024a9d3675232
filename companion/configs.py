"""Training configurations (chapter 8): one :class:`TrainConfig` holds everything a run needs.

Three named configurations live in :data:`CONFIGS`:

* ``"cpu"`` - a small Transformer for Multi30k German→English, trained for a fixed number of
  steps on a laptop-class CPU: ``d_model=256``, 4 heads, 3 + 3 Pre-LN layers, ``d_ff=512``,
  dropout 0.1 on the embeddings and residual branches only (the paper's sites), tied target
  embedding and output layer, label smoothing 0.1, batches of at most 3,000 tokens bucketed by
  length, the inverse-square-root warm-up over 300 steps (peak learning rate 1.8e-3), and 600
  steps: chapter 8's run, the same model on any computer (about 6 minutes of training on the
  course's 2-core machine; the whole command, with data preparation and the test-set BLEU with
  beam search, stays under 10 minutes there);
* ``"gpu"`` - a bigger model (``d_model=512``, 8 heads, 6 + 6 layers, ``d_ff=2048``, dropout
  0.2 at every site) with larger batches and a 30-minute budget, trained through
  ``torch.compile``;
* ``"toy"`` - a tiny model (one layer each side, ``d_model=64``) on the copy task of
  :class:`~companion.data.CopyReverseDataset`: about 90% of the test sequences come out exactly
  right after 300 steps (a few seconds), for tests and for debugging.

``"auto"`` means ``"gpu"`` when ``torch.cuda.is_available()`` and ``"cpu"`` otherwise.
:func:`get_config` returns a named configuration with some fields changed::

    config = get_config("cpu", time_budget=120.0)
    config.to_dict()  # plain Python types: stored in every checkpoint

The configuration is frozen; :meth:`TrainConfig.replace` makes a changed copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch

from companion._validation import (
    check_bool,
    check_choice,
    check_instance,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
    check_probability,
)
from companion.model import TransformerConfig

__all__ = [
    "TASKS",
    "PRECISIONS",
    "CPU_MODEL",
    "MODEL_FIELDS",
    "TrainConfig",
    "CONFIGS",
    "CONFIG_NAMES",
    "get_config",
    "resolve_config_name",
]

#: What a run can train on: Multi30k German→English, or one of the two toy tasks.
TASKS: tuple[str, ...] = ("multi30k", "copy", "reverse")
#: The arithmetic of a training step (:func:`companion.train.autocast_dtype`): float32, bf16 or
#: fp16 autocast, or ``"auto"`` (bf16 on a CUDA GPU that has it, fp16 with a gradient scaler
#: on one without, e.g. a Colab T4; float32 on a CPU).
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16", "auto")


#: The model of the ``cpu`` configuration: 3 + 3 Pre-LN layers of width 256, tied output
#: embedding (vocabulary sizes and padding ids come from the data), dropout 0.1 where the
#: paper puts it - the embeddings and the residual branches - and not on the attention
#: weights or the feed-forward hidden layer (see :class:`TrainConfig`, "Dropout").
CPU_MODEL = TransformerConfig(
    d_model=256,
    num_heads=4,
    num_layers=3,
    d_ff=512,
    dropout=0.1,
    norm_first=True,
    tie_embeddings=True,
    attention_dropout=0.0,
    activation_dropout=0.0,
)
#: Model settings that :meth:`TrainConfig.replace` accepts by name (they go into ``model``).
MODEL_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(TransformerConfig) if f.name not in ("src_vocab", "tgt_vocab")
)


def _check_optional_positive(name: str, value: object, kind: type) -> None:
    if value is None:
        return
    if kind is int:
        check_positive_int(name, value)
        return
    unit = " of seconds" if name == "time_budget" else ""
    check_positive_float(name, value, f"a positive number{unit} or None")


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run: model, data, optimiser, budget and decoding.

    Model:
        model: a :class:`~companion.model.TransformerConfig` without vocabularies (they come
            from the data: :func:`companion.run.build_model` fills them in, with the padding
            ids). :meth:`replace`, :func:`get_config` and ``--set`` also take its fields by
            name (``get_config("cpu", d_model=128)`` changes ``config.model.d_model``).

    Dropout (the ``cpu`` configuration's choice): ``dropout=0.1`` on the embeddings and the
    residual branches, ``attention_dropout=0`` and ``activation_dropout=0`` - the sites of the
    paper's section 5.4, where ``torch.nn.Transformer`` also drops attention weights and
    feed-forward activations. Chosen on the validation loss (510 s of training, seeds 0-2,
    2026-11-25, ``benchmarks/README.md``; means over the seeds): these two sites 1.721, lower
    than dropout at every site (1.737) in each seed, and than no dropout (1.787) in each seed.
    Test BLEU was recorded too but had no part in the choice.

    Data:
        task: ``"multi30k"``, ``"copy"`` or ``"reverse"``.
        min_freq: Multi30k vocabulary: keep tokens seen this often in the training split.
        lowercase: lowercase Multi30k before tokenizing.
        max_tokens: token budget of one (global) batch, source + target, padding included
            (:class:`~companion.data.TokenBatchSampler`); with several processes each takes
            its share of every batch.
        toy_examples, toy_max_len, toy_symbols: size of the toy task's training set (its
            validation and test sets have ``toy_examples // 10`` examples each), longest
            sequence, alphabet.

    Optimisation:
        label_smoothing: ε of the training loss.
        warmup_steps, lr_factor: learning rate
            ``lr_factor · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)``.
        warmup: ``False`` removes the linear ramp and nothing else: the rate starts at its
            peak (that of step ``warmup_steps``) and decays from there as with the ramp
            (:func:`companion.train.inverse_sqrt_warmup`, ``ramp``). The ``cpu``
            configuration keeps the ramp: at its 600 steps, without it, the validation BLEU
            was lower in each of three seeds (2026-11-27, ``benchmarks/README.md``; chapter 8
            shows the table from ``companion/results/translator.json``).
        adam_beta1, adam_beta2, adam_eps: Adam's settings (the paper: 0.9, 0.98, 1e-9).
        clip_norm: gradient clipping threshold (``None``: no clipping).

    Budget (the run stops at whichever comes first; ``None`` = no limit):
        time_budget: seconds of training (validation included, data preparation and the final
            BLEU not).
        max_steps: optimiser steps.
        max_epochs: passes over the training data.

    Decoding and seed:
        beam_size: beam width of the final evaluation (1 = greedy).
        length_penalty: α of the GNMT length penalty (:func:`companion.decode.beam_search`).
        length_penalty_grid: α values to try on the **validation** set after training (beam
            search only); the one with the highest validation BLEU scores the test set, and
            ``results.json`` records it. Empty: use ``length_penalty``. The ``cpu``
            configuration tries ``(0.0, 0.6, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0)``: how long a 10-minute model's
            translations come out changes from run to run (the length ratio of three runs
            ranged from 0.86 to 1.01 on validation), and the best α with it; chosen on
            validation it gained +1.2 and +1.4 test BLEU on the two short-output runs and
            kept 0.6 on the third (2026-11-25, ``benchmarks/README.md``). After 600 steps five
            of six recorded runs chose 2.0, the top of that grid
            (``benchmarks/results/translator_runs.json``), so the grid now reaches past it and
            starts at 0 (no penalty), so that the best value is inside it. It costs one beam
            search over the 1,014 validation sentences for all the values together (the
            search does not depend on α: :meth:`companion.metrics.Translator.translate_with_penalties`).
        seed: seeds the model's initialisation, dropout and the batch shuffles.
        precision: ``"fp32"``, ``"bf16"``, ``"fp16"`` or ``"auto"`` (:data:`PRECISIONS`): the
            forward pass of each step under ``torch.autocast`` in that type (the loss, the
            gradients' updates and the weights stay float32); ``"fp16"`` adds a gradient
            scaler. ``"auto"`` is bf16 on a CUDA GPU that supports it, fp16 on an older one
            (a Colab T4) and float32 elsewhere; the ``gpu`` configuration uses it, the ``cpu``
            one float32 (bf16 arithmetic is slower than float32 on most CPUs).
        compile: train the model through :func:`companion.train.compile_model`
            (``torch.compile(model, fullgraph=True)``; the model compiles without a graph
            break). The compilation counts against ``time_budget``. On by default only in the
            ``gpu`` configuration, whose 30-minute budget pays for it. On an H100 (2026-11-25,
            ``benchmarks/README.md``) the compiled step ran 1.37 x as many steps a second as
            eager (13.3 against 9.7, validation included) after 114-123 s of compilation in
            two runs (49-55 s for the first batch shape, 66-68 s more at the first new
            one). It catches up with eager after about 7 minutes, so a 30-minute run should
            end with about 28 % more steps (projected from those rates; no full 30-minute
            run was measured), while a 2-minute run does almost nothing (2 steps against
            1,181 eager). Off in the ``cpu`` configuration: on the course's 2-core CPU the
            compiled step is slower than eager (0.83 x ``nn.Transformer``'s eager step against
            1.30 x for eager companion, plus 20-35 s of compilation), and the 10-minute run
            compiled did 999 steps against 1,334 eager and scored 32.4 against 36.5 BLEU.
    """

    name: str = "custom"
    task: str = "multi30k"
    model: TransformerConfig = field(default_factory=lambda: CPU_MODEL)
    # data
    min_freq: int = 2
    lowercase: bool = False
    max_tokens: int = 3000
    toy_examples: int = 4000
    toy_max_len: int = 8
    toy_symbols: int = 10
    # optimisation
    label_smoothing: float = 0.1
    warmup_steps: int = 300
    warmup: bool = True
    lr_factor: float = 0.5
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    clip_norm: float | None = 1.0
    # budget
    time_budget: float | None = None
    max_steps: int | None = None
    max_epochs: int | None = None
    # decoding, seed
    beam_size: int = 4
    length_penalty: float = 0.6
    length_penalty_grid: tuple[float, ...] = ()
    seed: int = 0
    precision: str = "fp32"
    compile: bool = False

    def __post_init__(self) -> None:
        check_instance("name", self.name, str)
        check_choice("task", self.task, TASKS)
        check_choice("precision", self.precision, PRECISIONS)
        check_instance("model", self.model, TransformerConfig)
        for name in ("min_freq", "max_tokens"):
            check_positive_int(name, getattr(self, name))
        for name in ("toy_examples", "toy_max_len", "toy_symbols", "warmup_steps", "beam_size"):
            check_positive_int(name, getattr(self, name))
        check_positive_int("seed", self.seed, minimum=0)
        check_probability("label_smoothing", self.label_smoothing)
        check_bool("lowercase", self.lowercase)
        check_bool("compile", self.compile)
        check_bool("warmup", self.warmup)
        for name in ("lr_factor", "adam_eps"):
            _check_optional_positive(name, getattr(self, name), float)
        for name in ("adam_beta1", "adam_beta2"):
            check_probability(name, getattr(self, name))
        check_nonnegative_float("length_penalty", self.length_penalty)
        grid = self.length_penalty_grid
        if isinstance(grid, (str, bytes)) or not isinstance(grid, (tuple, list)):
            raise TypeError(
                "length_penalty_grid must be a tuple of numbers >= 0 (empty: no tuning), "
                f"got {type(grid).__name__}"
            )
        for i, alpha in enumerate(grid):
            check_nonnegative_float(f"length_penalty_grid[{i}]", alpha)
        object.__setattr__(self, "length_penalty_grid", tuple(float(a) for a in grid))
        _check_optional_positive("clip_norm", self.clip_norm, float)
        _check_optional_positive("time_budget", self.time_budget, float)
        _check_optional_positive("max_steps", self.max_steps, int)
        _check_optional_positive("max_epochs", self.max_epochs, int)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some fields changed (checked again). Fields of the model's
        :class:`~companion.model.TransformerConfig` may be given by name too; unknown names
        raise ``TypeError``."""
        own = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - own - set(MODEL_FIELDS))
        if unknown:
            known = sorted(own | set(MODEL_FIELDS))
            raise TypeError(f"unknown TrainConfig field(s) {unknown}; the fields are {known}")
        model_changes = {name: changes.pop(name) for name in list(changes) if name in MODEL_FIELDS}
        if model_changes:
            model = changes.get("model", self.model)
            check_instance("model", model, TransformerConfig)
            changes["model"] = replace(model, **model_changes)
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain Python types, the model's as a nested dict (safe for
        ``torch.load(weights_only=True)``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> TrainConfig:
        """Rebuild a configuration from :meth:`to_dict`'s output (or from the flat layout of
        older runs, whose model fields sit at the top level)."""
        check_instance("state", state, Mapping, "a dict from to_dict()")
        state = dict(state)
        if "model" in state:
            model = check_instance("state['model']", state["model"], Mapping, "a dict")
            state["model"] = TransformerConfig(**model)
        return cls().replace(**state)


#: The named configurations (see the module docstring).
CONFIGS: dict[str, TrainConfig] = {
    "cpu": TrainConfig(
        name="cpu", max_steps=600, length_penalty_grid=(0.0, 0.6, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0)
    ),
    "gpu": TrainConfig(
        name="gpu",
        model=replace(
            CPU_MODEL,
            d_model=512,
            num_heads=8,
            num_layers=6,
            d_ff=2048,
            dropout=0.2,
            attention_dropout=None,  # 0.2 at every site: not measured on a GPU yet
            activation_dropout=None,
        ),
        max_tokens=8000,
        warmup_steps=1000,
        lr_factor=1.0,
        time_budget=1800.0,
        max_epochs=60,
        precision="auto",  # bf16 autocast on an A100/H100/L4, fp16 + gradient scaler on a T4
        compile=True,  # pays back after about 7 minutes on an H100 (see `compile`)
    ),
    "toy": TrainConfig(
        name="toy",
        task="copy",
        model=replace(
            CPU_MODEL, d_model=64, num_layers=1, d_ff=128, dropout=0.0, tie_embeddings=False
        ),
        max_tokens=1200,
        warmup_steps=40,
        lr_factor=0.2,
        label_smoothing=0.0,
        max_epochs=10,
        beam_size=1,
    ),
}
#: Names :func:`get_config` accepts.
CONFIG_NAMES: tuple[str, ...] = ("auto", *CONFIGS)


def resolve_config_name(name: str) -> str:
    """``"auto"`` → ``"gpu"`` if CUDA is available, else ``"cpu"``; other names unchanged."""
    check_choice("config", name, CONFIG_NAMES)
    if name == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    return name


def get_config(name: str = "auto", **changes: Any) -> TrainConfig:
    """The named configuration (``"auto"``, ``"cpu"``, ``"gpu"`` or ``"toy"``) with ``changes``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
        TypeError: an unknown field in ``changes``.
    """
    return CONFIGS[resolve_config_name(name)].replace(**changes)
