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
