"""Isolation-forest trees as numpy arrays: the same scores as scikit-learn's score_samples."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.ensemble import IsolationForest

from agent.detect.trees import TreeEnsemble, average_path_length, from_sklearn


def test_average_path_length_reference_values() -> None:
    # c(1) = 0, c(2) = 1, c(256) = 2 (ln 255 + γ) − 2 · 255 / 256 ≈ 10.2448
    got = average_path_length(np.array([1, 2, 256]))
    assert got.tolist() == pytest.approx([0.0, 1.0, 2 * (np.log(255) + np.euler_gamma) - 2 * 255 / 256])
    assert got[2] == pytest.approx(10.2448, abs=1e-4)


@pytest.mark.parametrize(("n_features", "seed"), [(3, 0), (4, 1), (7, 2)])
def test_scores_equal_scikit_learn_on_held_back_rows(n_features: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(3000, n_features)) * rng.uniform(0.1, 10, n_features)
    train, held = x[:2000], np.vstack([x[2000:], rng.normal(scale=20, size=(50, n_features))])
    forest = IsolationForest(n_estimators=100, max_samples=256, random_state=seed).fit(train)
    ens = from_sklearn(forest)
    assert np.max(np.abs(ens.score_samples(held) - forest.score_samples(held))) < 1e-9
    again = TreeEnsemble.from_arrays(ens.arrays())
    assert np.array_equal(again.score_samples(held), ens.score_samples(held))


def _padded(forest: IsolationForest) -> dict[str, np.ndarray]:
    """A forest's trees in the earlier stored layout: trees × nodes, padded, in scikit-learn's node
    order, with separate thresholds, children and leaf depths."""
    estimators = forest.estimators_
    size = max(e.tree_.node_count for e in estimators)
    shape = (len(estimators), size)
    a = {
        "feature": np.full(shape, -1, dtype=np.int16),
        "threshold": np.zeros(shape),
        "left": np.full(shape, -1, dtype=np.int32),
        "right": np.full(shape, -1, dtype=np.int32),
        "leaf_depth": np.zeros(shape),
    }
    for i, (est, cols) in enumerate(zip(estimators, forest.estimators_features_, strict=True)):
        tree = est.tree_
        k = tree.node_count
        leaf = tree.children_left[:k] == -1
        a["feature"][i, :k] = np.where(leaf, -1, np.asarray(cols)[np.maximum(tree.feature[:k], 0)])
        a["threshold"][i, :k] = tree.threshold[:k]
        a["left"][i, :k] = tree.children_left[:k]
        a["right"][i, :k] = tree.children_right[:k]
        a["leaf_depth"][i, :k] = (
            tree.compute_node_depths()[:k] + average_path_length(tree.n_node_samples[:k]) - 1
        )
    depth = max(e.tree_.max_depth for e in estimators)
    a["meta"] = np.array([len(estimators) * average_path_length(np.array([256]))[0], float(depth)])
    return a


def test_the_earlier_padded_layout_loads_with_the_same_scores_in_fewer_bytes() -> None:
    rng = np.random.default_rng(4)
    x = np.maximum(rng.normal(size=(2500, 4)), 0.0)  # residuals cut at 0, as the detector's
    forest = IsolationForest(n_estimators=100, max_samples=256, random_state=4).fit(x[:2000])
    old = _padded(forest)
    ens = TreeEnsemble.from_padded(old)
    assert np.array_equal(ens.score_samples(x[2000:]), from_sklearn(forest).score_samples(x[2000:]))
    assert np.max(np.abs(ens.score_samples(x[2000:]) - forest.score_samples(x[2000:]))) < 1e-9
    # no padding, one float32 per node, the left child implied: well under a third of the bytes
    assert sum(v.nbytes for v in ens.arrays().values()) < sum(v.nbytes for v in old.values()) / 3
    assert len(ens.value) == sum(e.tree_.node_count for e in forest.estimators_)


def test_a_row_that_reaches_a_shallow_leaf_stays_there() -> None:
    # one tree: root splits x0 at 0.5; left is a leaf (depth 1), right splits x1 at 2.0 into two leaves
    ens = TreeEnsemble(
        feature=np.array([0, -1, 1, -1, -1], dtype=np.int8),
        value=np.array([0.5, 0, 2.0, 1, 2], dtype=np.float32),  # thresholds, and at leaves an index
        leaf_values=np.array([1.0, 2.0, 2.5]),
        right_step=np.array([2, 0, 2, 0, 0], dtype=np.uint16),
        roots=np.array([0]),
        denominator=1.0,
        max_depth=2,
    )
    rows = np.array([[0.0, 9.0], [1.0, 1.0], [1.0, 3.0], [np.nan, 3.0]])
    assert ens.score_samples(rows).tolist() == [-(2.0**-1.0), -(2.0**-2.0), -(2.0**-2.5), -(2.0**-2.5)]


def test_float32_thresholds_keep_every_decision_at_and_next_to_each_threshold() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2000, 3)) * np.array([1e-3, 1.0, 1e3])
    forest = IsolationForest(n_estimators=50, max_samples=256, random_state=5).fit(x)
    t = np.concatenate([e.tree_.threshold[e.tree_.children_left != -1] for e in forest.estimators_])
    t32 = t.astype(np.float32)
    near = np.concatenate(
        [t32, np.nextafter(t32, np.float32(np.inf)), np.nextafter(t32, np.float32(-np.inf))]
    )
    rows = np.tile(near.astype(np.float64)[:, None], (1, 3))
    assert np.array_equal(from_sklearn(forest).score_samples(rows), forest.score_samples(rows))
