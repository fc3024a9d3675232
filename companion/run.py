"""A whole training run of chapter 8, from a configuration, and its command line.

- :func:`prepare_data` loads the datasets and vocabularies of ``config.task`` (Multi30k, or a
  toy task) into a :class:`RunData`; :func:`build_model` builds the configuration's
  :class:`~companion.model.Transformer`;
- :func:`train` puts it together: data, model, a :class:`~companion.trainer.Trainer`, the
  training itself, and the test-set figures at the end (BLEU with
  :class:`~companion.metrics.Translator` on Multi30k, exact-match accuracy on a toy task),
  returned as a :class:`TrainResult` and written to ``out_dir``;
- ``python -m companion.run --config cpu --out runs/cpu`` (or ``python -m companion.train``,
  the same command) is :func:`main`; :func:`build_parser` lists the options (``--help``).
  Under ``torchrun --nproc_per_node=N`` it trains with ``DistributedDataParallel``, each
  process taking its share of every batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from companion._files import OutputFolderError, atomic_write, check_output_folder
from companion._validation import check_positive_int
from companion.checkpoint import write_json
from companion.configs import CONFIG_NAMES, MODEL_FIELDS, PRECISIONS, TrainConfig, get_config
from companion.data import (
    PAD_ID,
    CopyReverseDataset,
    Tokenizer,
    Vocab,
    WordTokenizer,
    collate_batch,
    prepare_multi30k,
)
from companion.distributed import init_distributed, rank_and_world
from companion.history import History
from companion.metrics import Translator, length_penalty_sweep, sequence_accuracy
from companion.model import Transformer, TransformerConfig
from companion.train import allow_tf32
from companion.trainer import Trainer
from companion.utils import set_threads

__all__ = [
    "OutputFolderError",
    "RunData",
    "prepare_data",
    "build_model",
    "TrainResult",
    "TimeEstimate",
    "estimate_training_time",
    "train",
    "build_parser",
    "main",
]


@dataclass
class RunData:
    """Datasets and vocabularies of a run (:func:`prepare_data`).

    ``test_pairs`` holds the raw ``(source, reference)`` sentences of the test set for BLEU
    (Multi30k); it is empty for a toy task.
    """

    train: Dataset
    val: Dataset
    test: Dataset
    src_vocab: Vocab
    tgt_vocab: Vocab
    tokenizer: Tokenizer
    test_pairs: list[tuple[str, str]]


def prepare_data(
    config: TrainConfig,
    data_root: str | os.PathLike[str] | None = None,
    *,
    download: bool = True,
    progress: bool = True,
) -> RunData:
    """The datasets of ``config.task``: Multi30k (from ``data_root``, ``$MULTI30K_ROOT`` or
    the download cache) or a :class:`~companion.data.CopyReverseDataset` (train / validation
    / test drawn with seeds ``seed``, ``seed + 1``, ``seed + 2``)."""
    if config.task == "multi30k":
        data = prepare_multi30k(
            root=data_root,
            min_freq=config.min_freq,
            lowercase=config.lowercase,
            download=download,
            progress=progress,
        )
        return RunData(
            train=data.datasets["train"],
            val=data.datasets["val"],
            test=data.datasets["test_2016_flickr"],
            src_vocab=data.src_vocab,
            tgt_vocab=data.tgt_vocab,
            tokenizer=data.tokenizer,
            test_pairs=data.datasets["test_2016_flickr"].pairs,
        )
    sizes = {"train": config.toy_examples, "val": max(config.toy_examples // 10, 1)}
    sizes["test"] = sizes["val"]
    sets = {
        split: CopyReverseDataset(
            task=config.task,
            num_examples=size,
            max_len=config.toy_max_len,
            num_symbols=config.toy_symbols,
            seed=config.seed + offset,
        )
        for offset, (split, size) in enumerate(sizes.items())
    }
    vocab = sets["train"].vocab
    return RunData(
        train=sets["train"],
        val=sets["val"],
        test=sets["test"],
        src_vocab=vocab,
        tgt_vocab=vocab,
        tokenizer=WordTokenizer(),
        test_pairs=[],
    )


def build_model(config: TrainConfig, src_vocab_size: int, tgt_vocab_size: int) -> Transformer:
    """The :class:`~companion.model.Transformer` of ``config`` (padding id :data:`PAD_ID`)."""
    model = replace(
        config.model,
        src_vocab=src_vocab_size,
        tgt_vocab=tgt_vocab_size,
        src_pad_id=PAD_ID,
        tgt_pad_id=PAD_ID,
    )
    return Transformer(model)


@dataclass
class TrainResult:
    """What :func:`train` returns: the trainer (with ``model`` and ``history``), the data and
    the final figures (also written to ``out_dir/results.json``)."""

    trainer: Trainer
    data: RunData
    results: dict[str, Any]

    @property
    def model(self) -> Transformer:
        return self.trainer.model

    @property
    def history(self) -> History:
        return self.trainer.history


@dataclass(frozen=True)
class TimeEstimate:
    """What :func:`estimate_training_time` measured and expects, in seconds."""

    steps: int  #: optimiser steps of the run
    seconds_per_step: float  #: the median of the timed steps
    validations: int  #: validation passes the run will make (after each epoch and at the end)
    seconds_per_validation: float  #: one pass over the validation set

    @property
    def total_seconds(self) -> float:
        """Training and validation, the progress bar's whole run."""
        return self.steps * self.seconds_per_step + self.validations * self.seconds_per_validation

    def __str__(self) -> str:
        return (
            f"about {self.total_seconds / 60:.1f} min: {self.steps:,} steps × "
            f"{self.seconds_per_step:.2f} s + {self.validations} validation passes × "
            f"{self.seconds_per_validation:.1f} s"
        )


def estimate_training_time(
    config: TrainConfig,
    data: RunData,
    steps: int | None = None,
    *,
    probe_steps: int = 5,
    device: str | torch.device | None = None,
) -> TimeEstimate:
    """How long :func:`train` will take here: time ``probe_steps`` steps (after one untimed
    step) and one validation pass of a throwaway copy of ``config``'s model, on the first
    batches the run itself will see, and scale to ``steps`` (default ``config.max_steps``).

    The random state is left as it was, so the run that follows is the same with or without
    the estimate. Compilation (``config.compile``) is not timed: the copy runs eagerly.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if not isinstance(data, RunData):
        raise TypeError(
            f"data must be the RunData of prepare_data(config), got {type(data).__name__}"
        )
    steps = config.max_steps if steps is None else steps
    if steps is None:
        raise ValueError("steps must be given when the config has no max_steps, got None")
    check_positive_int("steps", steps)
    check_positive_int("probe_steps", probe_steps)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(config.seed)
        model = build_model(config, len(data.src_vocab), len(data.tgt_vocab))
        trainer = Trainer(model, config.replace(compile=False), data.train, data.val,
                          device=device, progress=False)  # fmt: skip
        batches = trainer.epoch_batches(0)
        times = []
        for indices in batches[: probe_steps + 1]:
            src, tgt = collate_batch([data.train[i] for i in indices])  # (batch, len) each
            start = time.perf_counter()
            trainer.train_step(src.to(device), tgt.to(device))
            if cuda:
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        trainer.evaluate()
        validation = time.perf_counter() - start
    per_step = float(np.median(times[1:] or times))  # the first step allocates: not counted
    return TimeEstimate(
        steps=steps,
        seconds_per_step=per_step,
        validations=steps // len(batches) + 1,
        seconds_per_validation=validation,
    )


def _final_evaluation(trainer: Trainer, data: RunData, out_dir: Path | None) -> dict[str, Any]:
    """Test-set figures of a finished run: BLEU for Multi30k, exact match for a toy task."""
    config = trainer.config
    start = time.perf_counter()
    if config.task != "multi30k":
        accuracy = sequence_accuracy(trainer.model, data.test)
        return {"test_accuracy": accuracy, "decode_seconds": time.perf_counter() - start}
    translator = Translator(
        model=trainer.model,
        tokenizer=data.tokenizer,
        src_vocab=data.src_vocab,
        tgt_vocab=data.tgt_vocab,
        beam_size=config.beam_size,
        length_penalty=config.length_penalty,
    )
    tuning: dict[str, Any] = {}
    if config.beam_size > 1 and config.length_penalty_grid:  # α chosen on validation, not test
        by_alpha = length_penalty_sweep(translator, data.val.pairs, config.length_penalty_grid)
        translator.length_penalty = max(by_alpha, key=by_alpha.__getitem__)  # first best
        tuning = {"val_bleu_by_length_penalty": {str(a): b for a, b in by_alpha.items()}}
    scores, translations = translator.evaluate(data.test_pairs)
    if out_dir is not None:
        text = "".join(line + "\n" for line in translations)
        atomic_write(out_dir / "test_translations.txt", lambda f: f.write(text.encode("utf-8")))
    return {
        "test_bleu": scores.bleu,
        "test_tokenized_bleu": scores.tokenized_bleu,
        "beam_size": config.beam_size,
        "length_penalty": translator.length_penalty,
        **tuning,
        "decode_seconds": time.perf_counter() - start,
    }


def train(
    config: TrainConfig | str = "auto",
    out_dir: str | os.PathLike[str] | None = None,
    *,
    data_root: str | os.PathLike[str] | None = None,
    download: bool = True,
    time_budget: float | None = None,
    max_steps: int | None = None,
    max_epochs: int | None = None,
    resume: bool = False,
    device: str | torch.device | None = None,
    progress: bool = True,
    evaluate: bool = True,
) -> TrainResult:
    """Train a Transformer as ``config`` says and score it on the test set.

    Args:
        config: a :class:`~companion.configs.TrainConfig` or a name (``"auto"``, ``"cpu"``,
            ``"gpu"``, ``"toy"``; see :mod:`companion.configs`).
        out_dir: folder for ``checkpoint.pt`` (after every epoch and at the end),
            ``history.json``, ``config.json``, ``results.json`` and, for Multi30k,
            ``test_translations.txt``. ``None`` writes nothing.
        data_root: folder with the Multi30k files (else ``$MULTI30K_ROOT`` or the cache).
        download: allow downloading Multi30k when no local copy is found.
        time_budget, max_steps, max_epochs: override the configuration's limits.
        resume: continue from ``out_dir/checkpoint.pt`` if it exists.
        device: default ``"cuda"`` when available, else ``"cpu"``.
        progress: progress bars.
        evaluate: score the test set at the end (BLEU, or exact match for a toy task).

    Returns:
        a :class:`TrainResult`; ``results`` holds the step count, training time, target
        tokens per second, the last validation loss and the test figures.

    Raises:
        OutputFolderError: ``out_dir`` cannot be created or written (read-only, not a
            folder), or has no room for two checkpoints; raised before the data is prepared
            (the room: before the first step).

    Under ``torchrun`` (``WORLD_SIZE > 1``) it joins the process group (gloo on CPU, NCCL on
    GPU); only the first process writes files and evaluates the test set.
    """
    if isinstance(config, str):
        config = get_config(config)
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig or a name, got {type(config).__name__}")
    changes = {"time_budget": time_budget, "max_steps": max_steps, "max_epochs": max_epochs}
    config = config.replace(**{k: v for k, v in changes.items() if v is not None})
    if config.time_budget is None and config.max_steps is None and config.max_epochs is None:
        raise ValueError("train needs a limit: time_budget, max_steps or max_epochs, got none")
    device, started_group = init_distributed(device)
    rank, world = rank_and_world()
    allow_tf32(device)  # on a GPU: TensorFloat-32 matrix products
    out = None if out_dir is None else Path(out_dir)
    if out is not None and rank == 0:  # a read-only or full folder fails now, not at the end
        check_output_folder(out, name="out_dir")
    try:
        if world > 1 and rank != 0:
            dist.barrier()  # the first process prepares (and maybe downloads) the data first
        data = prepare_data(
            config=config,
            data_root=data_root,
            download=download,
            progress=progress and rank == 0,
        )
        if world > 1 and rank == 0:
            dist.barrier()
        torch.manual_seed(config.seed)  # the same initial weights in every process
        model = build_model(config, len(data.src_vocab), len(data.tgt_vocab))
        torch.manual_seed(config.seed + 1 + rank)  # dropout: a different stream per process
        random.seed(config.seed + rank)
        np.random.seed(config.seed + rank)
        if out is not None and rank == 0:  # room for two checkpoints (the atomic save's copy)
            weights = sum(p.numel() * p.element_size() for p in model.parameters())
            check_output_folder(out, needed_bytes=2 * 3 * weights, name="out_dir")  # + Adam
        trainer = Trainer(
            model=model,
            config=config,
            train_data=data.train,
            val_data=data.val,
            src_vocab=data.src_vocab,
            tgt_vocab=data.tgt_vocab,
            tokenizer=data.tokenizer,
            device=device,
            out_dir=out,
            progress=progress,
        )
        if resume and trainer.checkpoint_path is not None and trainer.checkpoint_path.is_file():
            trainer.load_checkpoint()
        if out is not None and rank == 0:
            write_json(out / "config.json", config.to_dict())
        trainer.fit()
    finally:
        if started_group and dist.is_initialized():
            dist.destroy_process_group()
    history = trainer.history
    results: dict[str, Any] = {
        "config": config.name,
        "task": config.task,
        "world_size": world,
        "device": str(device),
        "stop_reason": trainer.stop_reason,
        "steps": trainer.step,
        "epochs": trainer.epochs_done,
        "train_seconds": trainer.elapsed,
        "target_tokens_per_second": history.tokens_per_second(),
        "val_loss": history.val_loss[-1] if history.val_loss else None,
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
    }
    if rank == 0:
        if evaluate:
            results.update(_final_evaluation(trainer, data, out))
        if out is not None:
            history.save_json(out / "history.json")
            write_json(out / "results.json", results)
    return TrainResult(trainer=trainer, data=data, results=results)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def _parse_setting(text: str) -> tuple[str, Any]:
    """``"FIELD=VALUE"`` → ``(field, value)`` converted to the TrainConfig field's type."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--set expects FIELD=VALUE, got {text!r}")
    name, raw = (part.strip() for part in text.split("=", 1))
    types = {f.name: str(f.type) for f in fields(TrainConfig) if f.name != "model"}
    types |= {f.name: str(f.type) for f in fields(TransformerConfig) if f.name in MODEL_FIELDS}
    if name not in types:
        raise argparse.ArgumentTypeError(
            f"--set: unknown field {name!r}; the fields are {', '.join(sorted(types))}"
        )
    kind = types[name]
    if raw.lower() == "none" and "None" in kind:
        return name, None
    try:
        if kind.startswith("bool"):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return name, raw.lower() in ("true", "1")
        if kind.startswith("int"):
            return name, int(raw)
        if kind.startswith("float"):
            return name, float(raw)
        if kind.startswith("tuple[float"):  # "0.6,1.0" (an empty value: the empty tuple)
            return name, tuple(float(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--set {name}: expected a value of type {kind}, got {raw!r}"
        ) from None
    return name, raw


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser(prog: str = "python -m companion.run") -> argparse.ArgumentParser:
    """The parser of ``python -m companion.run`` (``prog``: the command shown in ``--help``)."""
    module = prog.split()[-1]
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Train the course's Transformer (Multi30k German->English, or a toy task) and\n"
            "write checkpoint.pt, history.json, config.json and results.json (test BLEU) into\n"
            "--out. Under 'torchrun --nproc_per_node=N' it trains with DistributedDataParallel."
        ),
        epilog=(
            "examples:\n"
            f"  {prog} --config cpu --out runs/cpu\n"
            f"  {prog} --config toy --out runs/toy --max-steps 300\n"
            f"  torchrun --nproc_per_node=2 --standalone -m {module} --config cpu "
            "--out runs/ddp"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        default="auto",
        choices=CONFIG_NAMES,
        help="named configuration; auto = gpu if CUDA is available, else cpu (default: auto)",
    )
    parser.add_argument("--out", required=True, help="output folder (checkpoint, history, results)")
    parser.add_argument(
        "--time-budget", type=_positive_float, help="seconds of training (overrides the config)"
    )
    parser.add_argument("--max-steps", type=_positive_int, help="optimiser steps at most")
    parser.add_argument("--max-epochs", type=_positive_int, help="epochs at most")
    parser.add_argument("--data-root", help="folder with the Multi30k .gz files")
    parser.add_argument(
        "--no-download", action="store_true", help="never download Multi30k (fail instead)"
    )
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available)")
    parser.add_argument(
        "--threads",
        type=_positive_int,
        help="torch CPU threads (default: the cores other work leaves free, at least 1: "
        "companion.utils.set_threads)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="fp32, bf16 or fp16 autocast, or auto (bf16 on a GPU that has it, fp16 + "
        "gradient scaler on one without, float32 on a CPU; default: the configuration's)",
    )
    parser.add_argument("--beam-size", type=_positive_int, help="beam width for the test BLEU")
    parser.add_argument("--max-tokens", type=_positive_int, help="tokens per (global) batch")
    parser.add_argument("--seed", type=int, help="random seed")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        type=_parse_setting,
        metavar="FIELD=VALUE",
        help="change any TrainConfig field, e.g. --set dropout=0.2 (repeatable)",
    )
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="train through torch.compile(fullgraph=True), or not (TrainConfig.compile; "
        "default: the configuration's, on for gpu only; compile time counts against the "
        "time budget, about 2 minutes on an H100)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--no-eval", action="store_true", help="skip the test-set evaluation")
    return parser


def main(
    argv: Sequence[str] | None = None, *, prog: str = "python -m companion.run"
) -> dict[str, Any]:
    """Entry point of ``python -m companion.run``; returns the results dict. ``argv`` defaults to the command line's; ``prog`` is shown in ``--help``."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    changes = dict(args.settings)
    for name, value in (
        ("beam_size", args.beam_size),
        ("max_tokens", args.max_tokens),
        ("seed", args.seed),
    ):
        if value is not None:
            changes[name] = value
    if args.compile is not None:
        changes["compile"] = args.compile
    if args.precision is not None:
        changes["precision"] = args.precision
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    else:
        print(set_threads(), file=sys.stderr, flush=True)  # what the thread policy chose
    try:
        config = get_config(args.config, **changes)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    try:
        result = train(
            config=config,
            out_dir=args.out,
            data_root=args.data_root,
            download=not args.no_download,
            time_budget=args.time_budget,
            max_steps=args.max_steps,
            max_epochs=args.max_epochs,
            resume=args.resume,
            device=args.device,
            progress=not args.no_progress,
            evaluate=not args.no_eval,
        )
    except OutputFolderError as error:  # a clear one-line error, before any training
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result.results, indent=1), file=sys.stdout, flush=True)
    return result.results


if __name__ == "__main__":
    main()
