"""What the scripts that rerun chapter 10's section-10.2 toy share (the chapter's cell ``f10obj01``).

``ch10_objectives.py``, ``ch10_matched_budget.py``, ``ch10_sparse_targets.py`` and
``ch10_equal_steps.py`` each execute that cell, up to the line that marks its end, with a few lines
replaced, for several training seeds, and record one JSON in ``companion/results/``. The code is not copied: this module reads the cell from
the notebook (:func:`cell_source`), gives it the names it imports (:func:`cell_namespace`) and runs
the seeds and writes the record (:func:`run_and_record`).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F

from companion.data import BOS_ID, EOS_ID, PAD_ID, causal_lm_example, masked_lm_example
from companion.families import DecoderOnlyTransformer
from companion.model import TransformerConfig
from companion.train import sequence_loss
from companion.utils import set_seed

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "book" / "10_three_families.ipynb"
CELL = "f10obj01"
CELL_END = "# (benchmarks/ch10_objectives.py runs this cell up to here)"
ARMS_LINE = 'TOY_ARMS = {"causal LM": True, "masked LM": False, "masked LM, causal mask": True}'
LOSS_LINE = "selected = targets != PAD_ID"  # the cell's line that picks the symbols a loss scores
COUNT_SELECTED = "; PREDICTIONS[objective] += int(selected.sum())"  # appended to LOSS_LINE
#: what every record that counts predictions adds: the causal LM's count, the test sizes
COUNTED_RECORD = {"causal_lm_predictions": 400 * 64 * 12, "test_rows": 2000, "written_rows": 500}


def cell_source(cells: list[dict], seed: int, needles: tuple[str, ...] = ()) -> str:
    """The cell's code up to its end marker, with ``OBJ_SEED = seed``; fails if the cell no
    longer holds the end marker, the seed line or one of ``needles`` (lines a script replaces)."""
    source = "".join(next(c for c in cells if c.get("id") == CELL)["source"])
    for needle in ("OBJ_SEED = 0", CELL_END, *needles):
        assert needle in source, f"cell {CELL} changed: {needle!r} not found"
    return source.split(CELL_END)[0].replace("OBJ_SEED = 0", f"OBJ_SEED = {seed}", 1)


def cell_namespace(**extra: object) -> dict:
    """The names the cell uses (the chapter imports them in earlier cells), plus ``extra``."""
    return {
        "torch": torch, "F": F, "time": time, "BOS_ID": BOS_ID, "EOS_ID": EOS_ID, "PAD_ID": PAD_ID,
        "causal_lm_example": causal_lm_example, "masked_lm_example": masked_lm_example,
        "DecoderOnlyTransformer": DecoderOnlyTransformer, "TransformerConfig": TransformerConfig,
        "sequence_loss": sequence_loss, "set_seed": set_seed,
    } | extra  # fmt: skip


def run_cell(source: str, namespace: dict) -> dict:
    """Execute the (edited) cell in ``namespace`` and return the namespace."""
    exec(compile(source, f"{NOTEBOOK.name}:{CELL}", "exec"), namespace)
    return namespace


def run_one_arm(source: str, arm: str, seed: int, **extra: object) -> dict:
    """Run the edited cell for one arm, counting the predictions it trains on (the source must
    add to ``PREDICTIONS[objective]``), and return the run's record with ``extra`` after its steps."""
    predictions = {arm: 0}
    namespace = run_cell(source, cell_namespace(PREDICTIONS=predictions))
    blank, valid = namespace["toy_results"][arm]
    return {
        "seed": seed,
        "steps": namespace["TOY_STEPS"],
        **extra,
        "predictions_trained_on": predictions[arm],
        "blank_accuracy": blank,
        "valid_rows": valid,
        "cpu_seconds": round(namespace["toy_seconds"], 1),
    }


def describe_counted(run: dict) -> str:
    """One line for a run of :func:`run_one_arm`."""
    return (
        f"predictions {run['predictions_trained_on']}, blank {run['blank_accuracy']:.3f}, "
        f"valid rows {run['valid_rows']:.3f}"
    )


def run_and_record(
    doc: str,
    out: Path,
    run_seed: Callable[[list[dict], int], dict],
    describe: Callable[[dict], str],
    record: dict,
) -> None:
    """The scripts' ``main``: parse ``--seeds`` and ``--out``, run ``run_seed(cells, seed)`` for
    each seed on one thread (printing ``describe(run)``), and write ``record`` with the runs, the
    machine, the torch version and the date to ``out`` as JSON."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", type=Path, default=out)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    runs = []
    for seed in args.seeds:
        run = run_seed(cells, seed)
        print(f"seed {seed}: {describe(run)}, {run['cpu_seconds']:.0f} CPU-s", flush=True)
        runs.append(run)
    result = record | {
        "runs": runs,
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "date": date.today().isoformat(),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
