"""An isolation forest's fitted trees as plain numpy arrays, scored without scikit-learn.

scikit-learn and SciPy take about 130 MB of memory just to import; the daemon must stay small.
So a forest is fitted by scikit-learn (in a short-lived process, see :mod:`agent.detect.forest`),
its trees are copied into the arrays below, and the daemon scores with numpy alone. The score is
scikit-learn's ``IsolationForest.score_samples``, computed the same way:

- each tree sends a row left when ``x[feature] <= threshold`` (the row read as float32, as
  scikit-learn's trees read it), down to a leaf;
- a leaf's depth counts its path length from the root plus the average path length of an
  unsuccessful binary-search-tree search over the training samples that reached it, minus one;
- the score is ``-2 ** (-mean depth / c(max_samples))`` with ``c(n) = 2 (ln(n − 1) + γ) − 2 (n − 1) / n``.

Trees of one ensemble are padded to the same node count and walked together, one level at a time:
``max_depth`` vectorised steps over a (trees × rows) array.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

LEAF = -1  # feature / child index of a leaf
CHUNK_ROWS = 512  # rows scored together
# Stored narrow: the daemon holds two ensembles per series for the day between fits (at 64-bit
# indices ~1.1 MB each). A tree of max_samples rows has under 2 · max_samples nodes, far inside
# int32; the feature columns are the forest's few features, inside int16. The walk widens to int64.
NODE_DTYPE = np.int32
FEATURE_DTYPE = np.int16


def average_path_length(n: np.ndarray) -> np.ndarray:
    """``c(n)``: average path length of an unsuccessful search in a binary search tree of ``n`` nodes
    (0 for n ≤ 1, 1 for n = 2), as in Liu, Ting and Zhou's isolation-forest paper."""
    n = np.asarray(n, dtype=np.float64)
    out = np.zeros_like(n)
    out[n == 2] = 1.0
    big = n > 2
    out[big] = 2.0 * (np.log(n[big] - 1.0) + np.euler_gamma) - 2.0 * (n[big] - 1.0) / n[big]
    return out


@dataclass(frozen=True, slots=True)
class TreeEnsemble:
    """The fitted trees of one isolation forest (arrays of shape trees × nodes, padded)."""

    feature: (
        np.ndarray
    )  # FEATURE_DTYPE: column of the input compared at each node; LEAF at leaves and padding
    threshold: np.ndarray  # float64: go left when x[feature] <= threshold
    left: np.ndarray  # NODE_DTYPE: left child's node index; LEAF at leaves
    right: np.ndarray  # NODE_DTYPE: right child's node index; LEAF at leaves
    leaf_depth: np.ndarray  # float64: path length + c(samples in the leaf) − 1, at leaves
    denominator: float  # trees × c(max_samples)
    max_depth: int  # levels to walk

    ARRAY_NAMES = ("feature", "threshold", "left", "right", "leaf_depth", "meta")  # keys of arrays()

    def score_samples(self, x: np.ndarray) -> np.ndarray:
        """scikit-learn's ``score_samples`` of rows ``x`` (higher = more normal)."""
        rows = np.asarray(x, dtype=np.float32).astype(np.float64)
        if not len(rows):
            return np.zeros(0)
        walk = self._walk()
        # why chunks of 512 rows: the (trees × rows) index arrays then stay in the CPU cache
        return np.concatenate(
            [self._score_chunk(rows[i : i + CHUNK_ROWS], *walk) for i in range(0, len(rows), CHUNK_ROWS)]
        )

    def _walk(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The trees laid out for walking: (each tree's first node, the feature compared at each
        node, the children, the thresholds), flat over all trees. ``children[2 · node + go_left]``
        is the next node's flat index; a leaf (and padding) is its own child on both sides, so a
        row that reached a leaf stays there for the remaining levels without a per-level test."""
        t, m = self.feature.shape
        leaf = self.feature == LEAF
        base = (np.arange(t, dtype=np.int64) * m)[:, None]
        itself = base + np.arange(m, dtype=np.int64)[None, :]
        right = np.where(leaf, itself, base + self.right)
        left = np.where(leaf, itself, base + self.left)
        children = np.stack([right, left], axis=-1).ravel()
        feature = np.where(leaf, 0, self.feature).ravel()
        return base, feature, children, self.threshold.ravel()

    def _score_chunk(
        self,
        rows: np.ndarray,
        base: np.ndarray,
        feature: np.ndarray,
        children: np.ndarray,
        threshold: np.ndarray,
    ) -> np.ndarray:
        n, n_cols = rows.shape
        flat_rows = rows.ravel()
        row_base = (np.arange(n, dtype=np.int64) * n_cols)[None, :]
        node = np.broadcast_to(base, (len(base), n)).copy()  # flat index of each (tree, row)'s current node
        for _ in range(self.max_depth):
            # left when x[feature] <= threshold (a NaN goes right, as in scikit-learn)
            go_left = np.take(flat_rows, row_base + np.take(feature, node)) <= np.take(threshold, node)
            node = np.take(children, 2 * node + go_left)
        depths = np.take(self.leaf_depth.ravel(), node).sum(axis=0)
        return np.asarray(-(2.0 ** (-depths / self.denominator)))

    def arrays(self) -> dict[str, np.ndarray]:
        """The ensemble as named arrays (for ``np.savez``)."""
        return {
            "feature": self.feature,
            "threshold": self.threshold,
            "left": self.left,
            "right": self.right,
            "leaf_depth": self.leaf_depth,
            "meta": np.array([self.denominator, float(self.max_depth)]),
        }

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray] | Any) -> TreeEnsemble:
        """The inverse of :meth:`arrays`."""
        meta = a["meta"]
        return cls(
            np.asarray(a["feature"], dtype=FEATURE_DTYPE),
            np.asarray(a["threshold"], dtype=np.float64),
            np.asarray(a["left"], dtype=NODE_DTYPE),
            np.asarray(a["right"], dtype=NODE_DTYPE),
            np.asarray(a["leaf_depth"], dtype=np.float64),
            float(meta[0]),
            int(meta[1]),
        )


def from_sklearn(forest: Any) -> TreeEnsemble:
    """Copy a fitted ``sklearn.ensemble.IsolationForest``'s trees into arrays (no sklearn import here)."""
    estimators = forest.estimators_
    size = max(e.tree_.node_count for e in estimators)
    t = len(estimators)
    feature = np.full((t, size), LEAF, dtype=FEATURE_DTYPE)
    threshold = np.zeros((t, size))
    left = np.full((t, size), LEAF, dtype=NODE_DTYPE)
    right = np.full((t, size), LEAF, dtype=NODE_DTYPE)
    leaf_depth = np.zeros((t, size))
    depth_max = 0
    for i, (est, cols) in enumerate(zip(estimators, forest.estimators_features_, strict=True)):
        tree = est.tree_
        k = tree.node_count
        is_leaf = tree.children_left[:k] == LEAF
        feature[i, :k] = np.where(is_leaf, LEAF, np.asarray(cols)[np.maximum(tree.feature[:k], 0)])
        threshold[i, :k] = tree.threshold[:k]
        left[i, :k] = tree.children_left[:k]
        right[i, :k] = tree.children_right[:k]
        depths = tree.compute_node_depths()[:k]
        leaf_depth[i, :k] = depths + average_path_length(tree.n_node_samples[:k]) - 1.0
        depth_max = max(depth_max, int(tree.max_depth))
    denominator = t * float(average_path_length(np.array([forest._max_samples]))[0])
    return TreeEnsemble(feature, threshold, left, right, leaf_depth, denominator, depth_max)
