"""companion.metrics.clustered_se and verdict (chapter 10's comparison rule)."""

import math

import numpy as np
import pytest

from companion.metrics import clustered_se, verdict


def test_one_item_per_cluster_is_the_plain_standard_error():
    values = np.random.default_rng(0).normal(size=50)
    expected = values.std(ddof=0) / math.sqrt(len(values))
    assert math.isclose(clustered_se(values, np.arange(50)), expected, rel_tol=1e-12)


def test_cluster_labels_are_only_labels():
    values = np.array([0.5, -1.0, 2.0, 0.25, 3.0, -0.5])
    a = clustered_se(values, [0, 0, 1, 1, 2, 2])
    b = clustered_se(values, [70, 70, -3, -3, 11, 11])
    assert math.isclose(a, b, rel_tol=1e-12)


def test_matches_the_formula_by_hand():
    values = np.array([1.0, 2.0, 4.0, 0.0, -1.0])
    clusters = np.array([0, 0, 1, 2, 2])
    centred = values - values.mean()
    sums = [centred[:2].sum(), centred[2], centred[3:].sum()]
    expected = math.sqrt(sum(s * s for s in sums)) / len(values)
    assert math.isclose(clustered_se(values, clusters), expected, rel_tol=1e-12)


def test_correlated_clusters_give_a_larger_error():
    # each cluster repeats one draw 10 times: 10 copies carry the information of one value
    draws = np.random.default_rng(1).normal(size=40)
    values = np.repeat(draws, 10)  # (400,)
    clustered = clustered_se(values, np.repeat(np.arange(40), 10))
    naive = clustered_se(values, np.arange(400))
    assert clustered > 2.5 * naive  # about sqrt(10) = 3.2 times
    assert math.isclose(clustered, draws.std(ddof=0) / math.sqrt(40), rel_tol=1e-9)


@pytest.mark.parametrize(
    "values, clusters",
    [
        (np.ones((2, 3)), np.zeros((2, 3))),  # not 1-D
        ([1.0, 2.0, 3.0], [0, 1]),  # lengths differ
        ([1.0], [0]),  # one item
        ([1.0, 2.0, 3.0], [4, 4, 4]),  # one cluster
        ([1.0, math.nan, 3.0], [0, 1, 2]),  # not finite
    ],
)
def test_clustered_se_rejects_bad_input(values, clusters):
    with pytest.raises(ValueError):
        clustered_se(values, clusters)


def test_verdict_win_tie_loss():
    assert verdict(0.21, 0.1) == "win"
    assert verdict(0.19, 0.1) == "tie"
    assert verdict(0.0, 0.1) == "tie"
    assert verdict(-0.19, 0.1) == "tie"
    assert verdict(-0.21, 0.1) == "loss"
    assert verdict(0.2, 0.1) == "tie"  # exactly two standard errors is not beyond them
    assert verdict(0.25, 0.1, threshold=3) == "tie"
    assert verdict(1e-9, 0.0) == "win"


@pytest.mark.parametrize(
    "advantage, se, threshold",
    [(math.nan, 0.1, 2), (0.1, -0.1, 2), (0.1, math.inf, 2), (0.1, 0.1, 0), (0.1, 0.1, -1)],
)
def test_verdict_rejects_bad_input(advantage, se, threshold):
    with pytest.raises(ValueError):
        verdict(advantage, se, threshold=threshold)
