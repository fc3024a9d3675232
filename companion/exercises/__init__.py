"""Self-checking exercises, one module per chapter (``ch01``, ``ch02``, ...).

Each ``check_*`` function takes *your* function, runs it on random cases next to the
reference solution and prints what is wrong (expected vs got, shapes, the entry with the
largest difference). It returns a :class:`CheckResult` that is truthy when everything matches::

    from companion.exercises import ch01
    ch01.check_row_softmax(my_row_softmax)
"""

from companion.exercises._checker import CheckResult, compare, run_check

__all__ = ["CheckResult", "compare", "run_check"]
