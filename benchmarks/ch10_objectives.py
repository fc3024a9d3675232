"""Section 10.2's controlled test of the objective, over training seeds.

The chapter trains one stack (a ``DecoderOnlyTransformer``) three times on the same toy rows for
the same number of steps: as a causal LM (causal mask, every next symbol predicted), as a masked
LM (no mask, about 15% of the symbols hidden and predicted), and with the masked-LM objective
under the causal mask, which separates the mask from the objective. It then asks each model to
fill a blank in the middle of a row and to write rows left to right. The chapter runs seed 0;
this script runs the chapter's own cell for several seeds and writes
``companion/results/ch10_objectives.json``, which the chapter reads to show that the result
does not hang on one training run.

The code is not copied: the script reads the notebook and executes cell ``f10obj01`` up to the
line that marks its end, with ``OBJ_SEED`` replaced by each seed.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch10_objectives.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch10_objectives.py --seeds 0 1 2

About 16 CPU-seconds per seed on the course's 2-core machine.
"""

from __future__ import annotations

from ch10_toy import ROOT, cell_namespace, cell_source, run_and_record, run_cell

OUT = ROOT / "companion" / "results" / "ch10_objectives.json"


def run_seed(cells: list[dict], seed: int) -> dict:
    """Run section 10.2's cell with `seed`; each arm's blank accuracy and valid rows."""
    source = cell_source(cells, seed)
    namespace = run_cell(source, cell_namespace())
    results = namespace["toy_results"]
    return {
        "seed": seed,
        "both_sides_best": namespace["both_sides_best"],
        "blank_accuracy": {name: blank for name, (blank, _) in results.items()},
        "valid_rows": {name: valid for name, (_, valid) in results.items()},
        "cpu_seconds": round(namespace["toy_seconds"], 1),
    }


def main() -> None:
    run_and_record(
        __doc__,
        OUT,
        run_seed,
        lambda run: f"blank {run['blank_accuracy']}, valid rows {run['valid_rows']}",
        {
            "description": "Section 10.2's toy test (the chapter's cell f10obj01): one stack trained "
            "as a causal LM, as a masked LM, and with the masked-LM objective under the causal mask, on "
            "the same rows for the same steps; the share of blanks each fills (2,000 test rows) and of rows each writes validly (500 samples)",
            "test_rows": 2000,
            "written_rows": 500,
        },
    )


if __name__ == "__main__":
    main()
