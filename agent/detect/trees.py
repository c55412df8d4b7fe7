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

Layout: the nodes of all trees in one flat run, each tree in pre-order (a node, its left subtree,
its right subtree), so a node's left child is the next node and only the step to its right child
is stored. A node holds one float32: its threshold, or at a leaf the index of its depth in a short
table of the ensemble's distinct leaf depths (float64). No padding. A float32 threshold loses no
decision: the rows are float32, and for a float32 ``x``, ``x <= t`` exactly when ``x`` is at most
the largest float32 not above ``t``, which is what is stored. The trees are walked together, one
level at a time: ``max_depth`` vectorised steps over a (trees × rows) array of node indices; a row
that reached a leaf stays there (its step is 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

LEAF = -1  # feature of a leaf (scikit-learn's children index of a leaf too)
CHUNK_ROWS = 512  # rows scored together
# Stored narrow: the daemon holds the ensembles of every series between fits. A forest has a few
# features (int8); a tree of max_samples rows has under 2 · max_samples nodes, and the step from a
# node to its right child is less than that (uint16 while max_samples ≤ 32,768, checked at the copy).
FEATURE_DTYPE = np.int8
STEP_DTYPE = np.uint16


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
    """The fitted trees of one isolation forest, flat in pre-order (see the module docstring)."""

    feature: np.ndarray  # FEATURE_DTYPE: column of the input compared at each node; LEAF at leaves
    value: np.ndarray  # float32: the threshold (go left when x[feature] <= it), at a leaf an index
    leaf_values: np.ndarray  # float64: the leaf depths a leaf's value indexes
    right_step: np.ndarray  # STEP_DTYPE: right child's index − the node's; 0 at leaves
    roots: np.ndarray  # int64: each tree's first node
    denominator: float  # trees × c(max_samples)
    max_depth: int  # levels to walk

    ARRAY_NAMES = ("feature", "value", "right_step", "roots", "leaf_values", "meta")  # keys of arrays()

    def score_samples(self, x: np.ndarray) -> np.ndarray:
        """scikit-learn's ``score_samples`` of rows ``x`` (higher = more normal)."""
        rows = np.asarray(x, dtype=np.float32).astype(np.float64)
        if not len(rows):
            return np.zeros(0)
        # why chunks of 512 rows: the (trees × rows) index arrays then stay in the CPU cache
        return np.concatenate(
            [self._score_chunk(rows[i : i + CHUNK_ROWS]) for i in range(0, len(rows), CHUNK_ROWS)]
        )

    def _score_chunk(self, rows: np.ndarray) -> np.ndarray:
        n, n_cols = rows.shape
        flat_rows = rows.ravel()
        row_base = (np.arange(n, dtype=np.int64) * n_cols)[None, :]
        node = np.broadcast_to(self.roots[:, None], (len(self.roots), n)).copy()  # each (tree, row)'s node
        for _ in range(self.max_depth):
            f = np.take(self.feature, node)
            inner = f != LEAF
            # left when x[feature] <= threshold (a NaN goes right, as in scikit-learn)
            go_left = np.take(flat_rows, row_base + np.maximum(f, 0)) <= np.take(self.value, node)
            # left child: the next node; a leaf steps 0 either way and stays
            node += np.where(go_left, inner, np.take(self.right_step, node))
        depths = np.take(self.leaf_values, np.take(self.value, node).astype(np.int64)).sum(axis=0)
        return np.asarray(-(2.0 ** (-depths / self.denominator)))

    def arrays(self) -> dict[str, np.ndarray]:
        """The ensemble as named arrays (for ``np.savez``)."""
        return {
            "feature": self.feature,
            "value": self.value,
            "right_step": self.right_step,
            "roots": self.roots,
            "leaf_values": self.leaf_values,
            "meta": np.array([self.denominator, float(self.max_depth)]),
        }

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray] | Any) -> TreeEnsemble:
        """The inverse of :meth:`arrays`."""
        meta = a["meta"]
        return cls(
            np.asarray(a["feature"], dtype=FEATURE_DTYPE),
            np.asarray(a["value"], dtype=np.float32),
            np.asarray(a["leaf_values"], dtype=np.float64),
            np.asarray(a["right_step"], dtype=STEP_DTYPE),
            np.asarray(a["roots"], dtype=np.int64),
            float(meta[0]),
            int(meta[1]),
        )

    @classmethod
    def from_padded(cls, a: dict[str, np.ndarray] | Any) -> TreeEnsemble:
        """An ensemble saved in the earlier layout (trees × nodes, padded, with ``threshold``,
        ``left``, ``right`` and ``leaf_depth`` arrays): the same trees, so the same scores."""
        meta = a["meta"]
        trees = [
            _preorder(f, t, d, lc, rc)
            for f, t, d, lc, rc in zip(
                a["feature"], a["threshold"], a["leaf_depth"], a["left"], a["right"], strict=True
            )
        ]
        return _flat(trees, float(meta[0]), int(meta[1]))


Tree = tuple[np.ndarray, np.ndarray, np.ndarray]  # one tree's (feature, value, right_step), pre-order


def _preorder(
    feature: np.ndarray, threshold: np.ndarray, leaf_depth: np.ndarray, left: np.ndarray, right: np.ndarray
) -> Tree:
    """One tree (node 0 its root, ``left``/``right`` its children, LEAF at leaves) in pre-order."""
    order: list[int] = []
    stack = [0]
    while stack:
        i = stack.pop()
        order.append(i)
        if left[i] != LEAF:
            stack += (int(right[i]), int(left[i]))  # left popped first: it follows its parent
    old = np.array(order)
    position = np.zeros(int(old.max()) + 1, dtype=np.int64)
    position[old] = np.arange(len(old))
    inner = left[old] != LEAF
    step = np.where(inner, position[np.where(inner, right[old], 0)] - np.arange(len(old)), 0)
    if step.max(initial=0) > np.iinfo(STEP_DTYPE).max or feature.max(initial=0) > np.iinfo(FEATURE_DTYPE).max:
        raise ValueError(f"a tree of {len(old)} nodes or {feature.max() + 1} features is too large to store")
    return (
        np.where(inner, feature[old], LEAF).astype(FEATURE_DTYPE),
        np.where(inner, threshold[old], leaf_depth[old]).astype(np.float64),
        step.astype(STEP_DTYPE),
    )


def _flat(trees: list[Tree], denominator: float, max_depth: int) -> TreeEnsemble:
    """The trees (float64 thresholds and leaf depths) in the stored layout."""
    sizes = np.array([len(t[0]) for t in trees], dtype=np.int64)
    feature = np.concatenate([t[0] for t in trees])
    wide = np.concatenate([t[1] for t in trees])
    leaf = feature == LEAF
    leaf_values, index = np.unique(wide[leaf], return_inverse=True)
    if len(leaf_values) > 2**24:  # a float32 holds every integer up to 2**24 exactly
        raise ValueError(f"{len(leaf_values)} distinct leaf depths are too many to index")
    value = wide.astype(np.float32)  # the thresholds rounded down to a float32 (see the module docstring)
    up = value.astype(np.float64) > wide
    value[up] = np.nextafter(value[up], np.float32(-np.inf))
    value[leaf] = index
    return TreeEnsemble(
        feature,
        value,
        leaf_values,
        np.concatenate([t[2] for t in trees]),
        np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64),
        denominator,
        max_depth,
    )


def from_sklearn(forest: Any) -> TreeEnsemble:
    """Copy a fitted ``sklearn.ensemble.IsolationForest``'s trees into arrays (no sklearn import here)."""
    trees: list[Tree] = []
    depth_max = 0
    for est, cols in zip(forest.estimators_, forest.estimators_features_, strict=True):
        tree = est.tree_
        k = tree.node_count
        left = tree.children_left[:k]
        feature = np.where(left == LEAF, LEAF, np.asarray(cols)[np.maximum(tree.feature[:k], 0)])
        leaf_depth = tree.compute_node_depths()[:k] + average_path_length(tree.n_node_samples[:k]) - 1.0
        trees.append(_preorder(feature, tree.threshold[:k], leaf_depth, left, tree.children_right[:k]))
        depth_max = max(depth_max, int(tree.max_depth))
    denominator = len(trees) * float(average_path_length(np.array([forest._max_samples]))[0])
    return _flat(trees, denominator, depth_max)
