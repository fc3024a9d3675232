"""The bug museum: mutants of ``companion`` that the test suite must catch (issue #18)."""
