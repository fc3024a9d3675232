"""Section 7.7's toy with an untied generator and the factor sqrt(d_model).

``benchmarks/ch07_seed_runs.py`` trains the tied toy from independent seeds with and without the
factor. Switching the factor off there does two things at once: the untrained tied model stops
copying the token just fed, and the tokens shrink against the positions. Untied, the toy does not
copy at initialisation with or without the factor (chapter 7, section 7.4), so this script separates
the two: for the same seeds (initialisation and data order) it trains the toy with a separate,
Xavier-initialised generator and the factor, and records greedy exact match
on the 300 test sequences and the mean loss of the last 20 steps. It writes
``companion/results/ch07_untied_runs.json``, which the chapter's appendix (A.1) reads and asserts on.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch07_untied_runs.py 0 1 2 3 4 5 6 7 8 9 10 11 12
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ch07_nudge_runs import run  # noqa: E402
from ch07_seed_runs import record_seeds  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "companion" / "results" / "ch07_untied_runs.json"


def main(seeds: list[int]) -> None:
    record_seeds(
        OUT,
        "section 7.7's toy as in ch07_seed_runs.json (same seeds: initialisation and data order), "
        "but tie_embeddings=False (a separate generator, the package's Xavier initialisation); with the "
        "factor sqrt(d_model); greedy exact match on the 300 test "
        "sequences and the mean training loss of the last 20 steps",
        seeds,
        lambda seed: run(0, init_seed=seed, tie=False),
        lambda seed, result: f"seed {seed}: {result}",
    )


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1:]] or list(range(13)))
