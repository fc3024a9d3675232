"""Chapter 3, section 3.5: the four-neighbours task trained long, one head against four (CPU, 1 thread).

The chapter trains one head and four heads for 300 steps. Would one head catch up with more
steps? The build cannot afford long runs, so this script runs the **chapter's own code** (the
task of ``book/03_multi_head_attention.ipynb``, cell id ``ch03-neighbours-example``, and its
model and training function, cell id ``ch03-neighbours``) for seeds 0, 1 and 2: one head to
8,000 steps, four heads to 2,000, with the same constant learning rate. Every ``steps`` entry
records the share of test tokens whose four neighbours are all named right (the chapter's 2,000
test sequences, generator seed 9). With a constant learning rate the model after ``k`` steps is
the one ``train_neighbours(h, seed, steps=k)`` returns; the script checks this at step 300 for
every run. The chapter reads ``companion/results/ch03_long_runs.json``, checks its step-300
entries against its own runs and shows the curves.

Usage: ``python benchmarks/ch03_long_runs.py`` (about 1.5 CPU-minutes; 81 CPU-seconds when recorded).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from notebook_code import chapter_code as run_chapter_cell
from notebook_code import write_record

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "book" / "03_multi_head_attention.ipynb"
TASK_CELL_ID = "ch03-neighbours-example"  # the symbols, sizes and neighbours_task
TASK_MARKER = "test_symbols, test_neighbours ="  # the definitions end here
CELL_ID = "ch03-neighbours"  # the model and train_neighbours
OUT = ROOT / "companion" / "results" / "ch03_long_runs.json"
SEEDS = (0, 1, 2)
LAST_STEP = {1: 8000, 4: 2000}  # heads → steps trained
EVAL_STEPS = [*range(100, 1001, 100), *range(1500, 8001, 500)]
PRELUDE = """
import torch
from torch import nn
from companion.attention import MultiHeadAttention
from companion.utils import set_seed
"""


def chapter_code() -> dict:
    """Execute the chapter's task, model and training function; return their namespace."""
    run_chapter_cell(NOTEBOOK, TASK_CELL_ID, TASK_MARKER, PRELUDE)  # checks the cell and marker
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    (task,) = ("".join(c["source"]) for c in cells if c.get("id") == TASK_CELL_ID)
    # the training cell's functions read the task's names as globals: run both in one namespace
    prelude = PRELUDE + task.split(TASK_MARKER)[0]
    return run_chapter_cell(NOTEBOOK, CELL_ID, "with one_thread():", prelude)


def all_four_right_scorer(code: dict) -> Callable[[torch.nn.Module], float]:
    """The chapter's test: the share of the tokens of its 2,000 test sequences (generator seed 9)
    whose four neighbours a model names all right, rounded to 4 digits."""
    test_symbols, test_neighbours = code["neighbours_task"](2000, torch.Generator().manual_seed(9))

    @torch.no_grad()
    def all_four_right(model: torch.nn.Module) -> float:
        model.eval()
        right = model(test_symbols).argmax(-1) == test_neighbours  # (2000, n, 4)
        model.train()
        return round(right.all(-1).float().mean().item(), 4)

    return all_four_right


def train_curve(
    code: dict,
    heads: int,
    seed: int,
    last: int,
    eval_steps: list[int],
    score: Callable[[torch.nn.Module], float],
    cosine: bool = False,
) -> list[float]:
    """The loop of the chapter's ``train_neighbours`` (Adam at 1e-2, its seeds) for ``last``
    steps, with ``score(model)`` at every step in ``eval_steps``; with ``cosine`` the learning
    rate decays to 0 along a cosine over the ``last`` steps."""
    code["set_seed"](seed)
    model = code["Neighbours"](code["D_JOBS"], heads)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=last) if cosine else None
    data = torch.Generator().manual_seed(200 + seed)
    curve = []
    for step in range(1, last + 1):
        tokens, neighbours = code["neighbours_task"](code["JOBS_BATCH"], data)
        logits = model(tokens).flatten(0, 2)
        loss = torch.nn.functional.cross_entropy(logits, neighbours.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if schedule is not None:
            schedule.step()
        if step in eval_steps:
            curve.append(score(model))
    return curve


def main() -> None:
    torch.set_num_threads(1)
    code = chapter_code()
    all_four_right = all_four_right_scorer(code)

    runs: dict[str, dict[str, list[float]]] = {}
    start = time.process_time()
    for h, last in LAST_STEP.items():
        runs[str(h)] = {}
        for seed in SEEDS:
            curve = train_curve(code, h, seed, last, EVAL_STEPS, all_four_right)
            at_300 = all_four_right(code["train_neighbours"](h, seed=seed))
            if at_300 != curve[EVAL_STEPS.index(300)]:
                raise RuntimeError(f"h={h} seed {seed}: step 300 differs from train_neighbours")
            runs[str(h)][str(seed)] = curve
            print(
                f"h = {h}, seed {seed}: all four right {curve[2]:.3f} at 300, {curve[-1]:.3f} at {last}"
            )
    record = {
        "task": "chapter 3's four-neighbours task (section 3.5), d_model 16, Adam lr 1e-2 constant",
        "metric": "share of 2,000 test sequences' tokens with all four neighbours named right",
        "steps": {h: [s for s in EVAL_STEPS if s <= last] for h, last in LAST_STEP.items()},
        "all_four_right": runs,
    }
    write_record(OUT, record, start)


if __name__ == "__main__":
    main()
