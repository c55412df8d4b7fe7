"""Isolation-forest anomaly detector over per-minute cost windows, one fit per model version.

The forest looks at each minute of one (engine, model) as a point in a multivariate space of
cost, throughput, utilisation, latency and load, plus the request mix and the hour of the week.
Because load, mix and time are context, a night or weekend trough (few tokens per GPU, so a high
cost per token) is a *normal* point: the forest has seen that combination every night. A
regression is a point off that surface: a high cost per token at a load and hour where it used to
be low, or slow decode steps at normal load. Only the costly direction counts (a cheaper or
faster minute is rare too, but not a regression), and a request mix outside everything in the
training week is not judged at all (score None) until a refit has seen it.

Fitting: on the trailing ``training_days`` (default 7) of the model's windows, across versions,
once at least ``min_training_seconds`` (2 days) of time is covered by windows with tokens,
whatever their step (:func:`history_seconds`: history at 5-minute steps stored as one-minute rows
counts its 5 minutes; a version's own few hours could not cover the week's cycle). A new fit
happens daily and once a newly deployed version has ``version_settle_seconds`` of data; until
then the new version is scored by the forest of the version before it, which is what catches a
regression at the deploy. Windows the current forest scores anomalous are left out of the next
training set (so a regression is not learnt as normal), unless they are a change that has gone
on, up to the fit, for ``max_clean_fraction`` of the training window (then it is the new normal
and is learnt).

Score: normalised so that 0 is the training median and 1 the training ``quantile``; > 1 is
anomalous. An isolation forest alone saturates (every point past the edge of its training data
gets about the same path length, so a 2× regression would score barely more than a 1.2× one), so
the score is the larger of the forest's and the size of the costliest residual (cost per token,
tokens per GPU-second, energy per token, decode efficiency) in units of its training quantile:
it grows with the regression. Export it as
``infercost_anomaly_score{node,engine,model,model_version}`` and use it in rules as
"score > 1 for N minutes".

Fitting uses scikit-learn (imported only inside :meth:`ForestDetector.fit`, which the daemon runs
in a short-lived process); the fitted trees are copied into numpy arrays
(:mod:`agent.detect.trees`) and scored with numpy alone, so a process that only scores never
imports scikit-learn. Persisted as one ``.npz`` of those arrays under the state directory.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.detect.trees import TreeEnsemble, from_sklearn
from agent.samples import CostWindow

logger = logging.getLogger(__name__)

# bump when the persisted layout or its calibration changes (11: the trees flat in pre-order, float32
# values, see agent.detect.trees); others are ignored on load (then refit), except format 9 below
STATE_FORMAT = 11
STATE_FILE = f"forest-v{STATE_FORMAT}.npz"
# Format 9 held the same trees padded (trees × nodes): they are read and converted, so a restart after
# an upgrade scores with the forest it had (the same scores) and keeps its daily refit schedule.
PADDED_FORMAT = 9
PADDED_FILE = f"forest-v{PADDED_FORMAT}.npz"

FEATURE_NAMES: tuple[str, ...] = (
    "log10_usd_per_1m_output",  # log10 of dollars per 1M output tokens
    "log10_output_tokens_per_gpu_second",  # log10 of generation tokens / GPU-second
    "gpu_util_ratio",  # 0–1
    "mem_bw_ratio",  # 0–1
    "log10_joules_per_output_token",  # log10 of joules / generation token
    "log10_ttft_p99_seconds",  # log10 of seconds
    "log10_itl_p99_seconds",  # log10 of seconds
    "kv_cache_usage_ratio",  # 0–1
    "log10_output_tokens_per_second",  # log10 of generation tokens/s: what the load produced
    "roofline_ratio",  # observed decode tok/s ÷ bandwidth ceiling
    "log10_requests_running",  # log10(1 + running requests): the load as the engine is asked to hold it
    "log10_prompt_per_output_ratio",  # log10 of prompt tokens / generation token: the request mix
    "hour_of_week_sin",  # sin(2π · hour_of_week / 168), hour 0 = Monday 00:00 UTC
    "hour_of_week_cos",  # cos(2π · hour_of_week / 168)
)
N_FEATURES = len(FEATURE_NAMES)
# The last four describe the context (how much traffic, of what mix, when); the others are
# outcomes. The traffic is requests in flight, not tokens/s: with a fixed set of GPUs, tokens/s
# determines the cost per token and tokens per GPU-second exactly, so with tokens/s as the context
# their residuals would always be 0 and a slower build (same demand, fewer tokens/s per request in
# flight) would show only in the efficiency group; at like concurrency it costs more per token, and
# with requests in flight as the context the cost group sees that.
# Before the forest sees them, each outcome is replaced by its residual from a least-squares fit
# on the context over the training window, so "high cost per token at night"
# is explained by the night's low traffic, and what is left is the part no load level explains.
# Why: an isolation forest cuts along one feature at a time and is poor at points that are off a
# curved load/cost surface but inside every feature's marginal range, which is exactly where a
# 1.2–1.5× regression lands.
N_OUTCOMES = N_FEATURES - 4
_LOAD = N_OUTCOMES  # index of log10_requests_running
_MIX = N_OUTCOMES + 1  # index of log10_prompt_per_output_ratio
# Which way each outcome goes when the model gets *more expensive or less efficient* (+1: up is
# bad, -1: down is bad). Residuals the other way are set to 0 before the forests see them. Why:
# an isolation forest flags any rare point, and a cheaper minute, a faster one or a change of mix
# that lowers the cost is rare too; the detector is there for cost regressions, and a two-sided
# forest pages for a change in the harmless direction as readily as for one in the costly.
BAD_DIRECTION: tuple[float, ...] = (1.0, -1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0)
# Which request mixes the forest judges: those between the training week's 1st and 99th
# percentiles of the prompt/output ratio; outside, it abstains (score None) until a refit has seen
# that mix, and the like-for-like rules carry on. Why percentiles and no margin beyond them: the
# context fit is barely constrained at the edge of the mix range (few training minutes lie there),
# so the minutes of an unusual mix (a day of long prompts) that a wider range would still admit
# score high on cost per output token for want of a fit, not for a regression, and a rule's 1-hour
# mean over only those judged minutes fires. The 1 % was chosen on the detection benchmark's tuning
# seeds (see infercost_bench/detection.py); the false alarms left at the edge show in its false alarms
# by cause (benchmarks/RESULTS.md).
MIX_QUANTILE = 0.01
MIX_MARGIN_LOG10 = 0.0
# ... and the range is taken over training minutes at least a day old at the fit: a mix first seen
# in the last day is not judged yet. Why: after a daily refit, the few hours of a new mix that the
# training week holds (a day of long-prompt traffic that began that morning) sit inside the 1st–99th
# percentiles, but the context fit, made on a week of the usual mixes, is barely constrained there,
# and those hours would score high on cost per output token and GPU utilisation for the rest of
# the day. Why a day: a whole daily cycle of the new mix (each of its load levels) is then in the
# training set, and with the daily refit a mix that lasts is judged from the next refit on.
MIX_SETTLE_SECONDS = 86400.0
# ... and only where those minutes hold enough of a like mix: at least MIX_SUPPORT_SECONDS of them
# within ±MIX_SUPPORT_LOG10 (≈ ±12 % of the ratio) of the minute's own. Why: the 1st–99th percentiles
# leave 1 % of the week beyond each edge whatever its step, but near an edge the context fit rests on
# a few dozen windows, fewer still at 5-minute steps (a week is 2,016 of them), and the minutes of
# a mix just inside an edge (a long-prompt day on a node read at 5-minute steps) score high on cost
# per output token for want of a fit, not for a regression. Why 3 hours: a few of the day's load
# levels of that mix, the least a fit of its cost should rest on. The ±0.05 width was chosen on the
# detection benchmark's tuning seeds (see infercost_bench/detection.py).
MIX_SUPPORT_LOG10 = 0.05
MIX_SUPPORT_SECONDS = 3 * 3600.0
MIX_BIN_LOG10 = 0.01  # the support histogram's bin width (log10 of the ratio)
# The forest is an ensemble of small forests, one per group of related outcome residuals, and the
# score is the largest group score. Why: in one 10-dimensional forest a point that is extreme in
# a single feature (roofline efficiency down 30 %, say) is rarely isolated before the trees' depth
# limit, because most splits pick one of the other nine; in a 3-feature forest it is isolated at
# once.
FEATURE_GROUPS: tuple[tuple[int, ...], ...] = (
    (0, 1, 4),  # cost: $/1M output, tokens per GPU-second, joules per token
    (2, 3, 9, 8),  # efficiency: GPU utilisation, memory bandwidth, roofline, tokens/s at that concurrency
)
# TTFT, ITL and the KV cache (outcomes 5–7) are fitted on the context like the others but score
# nothing. Why: a latency-only anomaly is not a cost regression. Queues while a late autoscaler brings
# replicas up raise TTFT several times over its fit with the cost per token unchanged, and a latency
# group would score those hours anomalous: false alarms of a cost detector. A slower build shows in
# the cost and efficiency groups (fewer tokens per GPU-second and per request in flight); the
# agent's TTFT rule watches latency (`ttft_p99_high`, info).
# Outcomes whose residual size says *how much* more a token costs: $/1M output, tokens per
# GPU-second, joules per token, roofline. Why: an isolation forest's path lengths saturate past the
# edge of the training data (a 2× and a 1.2× regression score about the same), so the score is the
# larger of the forest's verdict and the biggest of these residuals in units of its own training
# quantile, which grows with the regression (log10 2 = 0.30 against log10 1.2 = 0.08).
MAGNITUDE_OUTCOMES: tuple[int, ...] = (0, 1, 4, 9)
MIN_TRAINING_ROWS = 200  # why: fewer rows than a tree's 256 samples make every tree the same
# The longest step between two windows that still counts as history covered: history imported at
# coarse steps (Prometheus recording rules, exports at 5-minute steps) can arrive as one-minute rows
# 5 minutes apart, and those 5 minutes are history, not a gap. Why 10 minutes: twice the coarsest
# step history is imported at; a longer silence is an outage or an idle model, not covered time.
MAX_HISTORY_STEP_SECONDS = 600.0
POLY_DEGREE = 3  # cubic in log traffic: enough for the batch-size curve, too little to chase noise

_EPOCH_MONDAY = 345600.0  # seconds: 1970-01-05 00:00 UTC was a Monday


def history_seconds(ends: np.ndarray, durations: np.ndarray) -> float:
    """Seconds of time a model's windows cover: each window's own seconds, or the step from the
    window before it where that is longer, up to :data:`MAX_HISTORY_STEP_SECONDS` (so history at
    coarse steps counts its time, not its rows; a long silence counts nothing)."""
    if len(ends) == 0:
        return 0.0
    order = np.argsort(ends)
    e, d = ends[order], durations[order]
    steps = np.diff(e, prepend=e[0] - d[0])
    return float(np.where(steps <= MAX_HISTORY_STEP_SECONDS, np.maximum(d, steps), d).sum())


def features(window: CostWindow) -> np.ndarray | None:
    """The feature vector of one window, in :data:`FEATURE_NAMES` order (NaN where absent).

    None when the window has no output tokens or no GPU time: there is no cost per token to judge
    (an idle or scrape-gap minute is not an anomaly of the model).
    """
    u = window.usage
    if window.usd_per_1m_output is None or u.generation_tokens <= 0 or u.gpu_seconds <= 0 or u.duration <= 0:
        return None
    nan = math.nan

    def log10(x: float | None) -> float:
        return math.log10(x) if x is not None and x > 0 else nan

    def ratio(x: float | None) -> float:
        return nan if x is None else x

    joules_per_token = u.energy_joules / u.generation_tokens if u.energy_joules is not None else None
    how = ((u.end - _EPOCH_MONDAY) / 3600.0) % 168.0
    return np.array(
        [
            log10(window.usd_per_1m_output),
            log10(u.generation_tokens / u.gpu_seconds),
            ratio(u.gpu_util_ratio),
            ratio(u.mem_bw_ratio),
            log10(joules_per_token),
            log10(u.ttft_p99_seconds),
            log10(u.itl_p99_seconds),
            ratio(u.kv_cache_usage_ratio),
            log10(u.generation_tokens / u.duration),
            ratio(window.roofline_ratio),
            nan if u.requests_running is None else math.log10(1.0 + u.requests_running),
            log10(u.prompt_tokens / u.generation_tokens),
            math.sin(2 * math.pi * how / 168.0),
            math.cos(2 * math.pi * how / 168.0),
        ],
        dtype=float,
    )


def _basis(x: np.ndarray) -> np.ndarray:
    """Context basis for the residual fit: powers of log traffic, the mix and its interaction
    with traffic, and the hour-of-week circle."""
    load = x[:, _LOAD : _LOAD + 1]
    mix = x[:, _MIX : _MIX + 1]
    cols = [np.ones_like(load)] + [load**k for k in range(1, POLY_DEGREE + 1)] + [mix, mix * load]
    cols.append(x[:, _MIX + 1 :])
    return np.hstack(cols)


@dataclass
class _Fitted:
    """One trained ensemble and its calibration."""

    forests: list[TreeEnsemble]  # one per FEATURE_GROUPS entry
    group_calibration: np.ndarray  # (groups, 2): training median and quantile of each raw score
    fill: np.ndarray  # per-feature training medians, used where a feature is absent
    coef: np.ndarray  # least-squares coefficients, context basis → each outcome feature
    centre: np.ndarray  # training median of each signed residual (the "usual" point)
    scale: np.ndarray  # training quantile of each transformed residual (MAGNITUDE_OUTCOMES' unit)
    mix_range: tuple[float, float]  # log10 prompt/output ratios the training set spans
    mix_hist_start: float  # left edge of the first MIX_BIN_LOG10 bin of the settled mixes' histogram
    mix_hist: np.ndarray  # seconds of settled training windows per mix bin (see MIX_SUPPORT_SECONDS)
    median: float  # training median of the combined score
    threshold: float  # training quantile of the combined score: normalised score 1
    fitted_at: float  # seconds since the epoch (end of the last training window)
    version: str  # the model version the fit was made for (the newest in its training set)
    n_train: int  # windows used


SeriesKey = tuple[str, str]  # (engine, model)


# The least spread between the training median and quantile a score is normalised by: raw
# isolation-forest scores (in (0, 1); ordinary points a little under 0.5, the training quantile a
# couple of tenths above them: the floor is a fraction of that usual spread) and the combined normalised
# score (median ~0, quantile ≥ 1: half its unit). Why: where a group's residuals are almost all
# inside the dead band, every training row scores the same and the spread collapses towards 0, so
# one odd minute would score in the thousands and carry a rule's 1-hour mean alone; the floor keeps
# one minute from outvoting an hour.
RAW_SPREAD_FLOOR = 0.05
COMBINED_SPREAD_FLOOR = 0.5


def _calibrate(raw: np.ndarray, quantile: float, floor: float) -> tuple[float, float]:
    """(median, quantile) of training scores, at least ``floor`` apart (see RAW_SPREAD_FLOOR)."""
    median = float(np.median(raw))
    threshold = float(np.quantile(raw, quantile))
    return median, max(threshold, median + floor)


# Residuals within this of the usual point count as 0 (log10 units: ≈ 2.3 %; ratios: 1 point).
# Why: an isolation forest is scale-free, so on a tight training set it isolates residuals far
# smaller than any change of cost (a Sunday trough's GPU utilisation half a point under the fit, in
# a minute that was in fact cheaper); a change this small moves no cost. A 1.2× regression is 0.08
# in log10, eight dead bands out.
DEAD_BAND = 0.01
# A group's forest speaks only for a point where one of the group's outcomes is at least this far
# (in units of its training quantile, ``scale``) on the costly side. Why: the dead band and the
# one-sided cut leave most training residuals at exactly 0, and an isolation forest isolates a
# point just off such an atom about as fast as one far out: a minute whose only costly residual is
# a fraction of its usual spread (joules per token on a busy afternoon, say) scores like a
# regression. Such a minute costs nothing more per token; a 1.2× regression lies several scales out
# on the cost group. Why half a scale and not 1: a gate at 1, past the training quantile, would let
# the forest speak only where the magnitudes already do, and a forest that never speaks first is no
# second opinion. The value was chosen on the detection benchmark's seen seeds (see
# infercost_bench/detection.py).
GROUP_GATE = 0.5


def _group_score(
    raw: np.ndarray, calibration: np.ndarray, z: np.ndarray, cols: tuple[int, ...], scale: np.ndarray
) -> np.ndarray:
    """One group's raw forest scores normalised on its training (median, quantile), and 0 where
    none of the group's outcomes reaches :data:`GROUP_GATE` of its scale."""
    near = np.max(z[:, cols] / scale[list(cols)], axis=1) < GROUP_GATE
    return np.where(near, 0.0, (raw - calibration[0]) / (calibration[1] - calibration[0]))


def _transform(x: np.ndarray, coef: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """What the forests see: outcome residuals from the context fit, turned so that "worse" is
    positive, less their training median and :data:`DEAD_BAND`, and cut at 0 (no better-than-usual
    side); the context columns are kept after them."""
    resid = (x[:, :N_OUTCOMES] - _basis(x) @ coef) * np.asarray(BAD_DIRECTION)
    return np.hstack([np.maximum(resid - centre - DEAD_BAND, 0.0), x[:, N_OUTCOMES:]])


class ForestDetector:
    """Per-(engine, model) isolation forests, refitted daily and per model version.

    ``state_dir`` None keeps everything in memory (benchmarks, tests of scoring).
    """

    def __init__(
        self,
        state_dir: Path | None,
        *,
        training_days: float = 7.0,
        refit_seconds: float = 86400.0,
        version_settle_seconds: float = 6 * 3600.0,
        min_training_seconds: float = 2 * 86400.0,
        n_estimators: int = 100,
        max_samples: int = 256,
        clean_above: float = 1.0,
        quantile: float = 0.995,
        max_clean_fraction: float = 0.2,
        seed: int = 0,
    ) -> None:
        """Configure the detector.

        Why these defaults: 7 days covers every hour of the week once; a daily refit follows
        slow legitimate change; 6 h of a new version spans enough load levels to learn it; 2 days
        (of windows with tokens, whatever their step: 1-minute or imported 5-minute history) is the
        least history whose daily cycle the forest has seen twice; the 99.5 % quantile
        puts about 7 normal minutes a day over 1, which "for N minutes" in a rule absorbs; a
        change going on for 20 % of the training week (1.4 days) up to a fit is the new normal; 256
        samples per tree is the isolation-forest paper's default; windows scoring over
        ``clean_above`` under the previous forest are left out of the next training set.
        """
        self.state_dir = state_dir
        self.training_seconds = training_days * 86400.0
        self.refit_seconds = refit_seconds
        self.version_settle_seconds = version_settle_seconds
        self.min_training_seconds = min_training_seconds
        self.n_estimators = n_estimators
        self.max_samples = max_samples
        self.clean_above = clean_above
        self.quantile = quantile
        self.max_clean_fraction = max_clean_fraction
        self.seed = seed
        self._fits: dict[SeriesKey, _Fitted] = {}

    # -- fitting ----------------------------------------------------------------------------

    def fitted(self, engine: str, model: str) -> bool:
        """Whether a forest exists for this series."""
        return (engine, model) in self._fits

    def trained_on(self, engine: str, model: str) -> int:
        """How many windows the series' forest was trained on (0 without one)."""
        fit = self._fits.get((engine, model))
        return 0 if fit is None else fit.n_train

    def fitted_at(self, engine: str, model: str) -> float | None:
        """When the series' forest was last fitted (seconds since the epoch), or None."""
        fit = self._fits.get((engine, model))
        return None if fit is None else fit.fitted_at

    def needs_refit(
        self, engine: str, model: str, now: float, last_version_change: float | None = None
    ) -> bool:
        """Whether to call :meth:`fit` now: no forest yet, a day has passed, or a new version
        (deployed at ``last_version_change``, seconds since the epoch) has settled."""
        fit = self._fits.get((engine, model))
        if fit is None or now - fit.fitted_at >= self.refit_seconds:
            return True
        if last_version_change is None:
            return False
        settled = last_version_change + self.version_settle_seconds
        return fit.fitted_at < settled <= now

    def fit(self, history: Sequence[CostWindow], now: float | None = None) -> list[SeriesKey]:
        """Fit one forest per (engine, model) in ``history`` on its trailing training window.

        ``now`` (seconds since the epoch) defaults to the end of the newest window. Series with
        less than ``min_training_seconds`` of usable windows keep their previous forest. Returns
        the series that were (re)fitted.
        """
        by_series: dict[SeriesKey, list[CostWindow]] = {}
        for w in history:
            by_series.setdefault((w.usage.engine, w.usage.model), []).append(w)
        refitted: list[SeriesKey] = []
        for key, windows in by_series.items():
            end = max(w.usage.end for w in windows) if now is None else now
            recent = [w for w in windows if end - self.training_seconds <= w.usage.end <= end]
            usable = [(w, f) for w, f in ((w, features(w)) for w in recent) if f is not None]
            rows = [f for _, f in usable]
            ends = np.array([w.usage.end for w, _ in usable])
            secs = np.array([w.usage.duration for w, _ in usable])
            covered = history_seconds(ends, secs)
            if covered < self.min_training_seconds or len(rows) < MIN_TRAINING_ROWS:
                logger.debug(
                    "forest %s/%s: %.1f h of usable windows, need %.1f h",
                    *key,
                    covered / 3600.0,
                    self.min_training_seconds / 3600.0,
                )
                continue
            x = np.vstack(rows)
            previous = self._fits.get(key)
            if previous is not None:
                keep = self._trainable(previous, x, ends)
                x, ends, secs = x[keep], ends[keep], secs[keep]
            newest = max(recent, key=lambda w: w.usage.end).usage.model_version
            self._fits[key] = self._train(x, end, newest, ends <= end - MIX_SETTLE_SECONDS, secs)
            refitted.append(key)
            logger.info("forest %s/%s fitted on %d windows (version %s)", key[0], key[1], len(x), newest)
        return refitted

    def _trainable(self, previous: _Fitted, x: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Which training rows the next fit keeps: not those the previous forest scored anomalous,
        unless they are a change that has lasted (the new normal).

        A change has lasted when, counting back from the newest minute, every hour with judged
        minutes had most of them anomalous for at least ``max_clean_fraction`` of the training
        window: that run is kept whole, anomalous minutes before it are still left out. When more
        than half of all judged minutes scored anomalous, whatever their order, everything is
        kept (the model changed in a pattern no unbroken run shows, e.g. two hours in every three).
        Why an unbroken run and not "more than ``max_clean_fraction`` of the rows in all": the
        anomalous minutes of separate changes (a step that was rolled back, then a drift still
        going on) can add up to that share without any of them having lasted; learnt as the usual,
        their residuals would widen the scale, and the next regression would score under 1.
        """
        judged = self._judgeable(previous, x)
        flagged = (self._scores(previous, x) > self.clean_above) & judged
        if flagged.sum() > 0.5 * max(1, judged.sum()):
            return np.ones(len(x), dtype=bool)
        age_hours = np.floor((ends.max() - ends) / 3600.0).astype(int)  # 0: the newest hour
        judged_per_hour = np.bincount(age_hours, weights=judged.astype(float))
        flagged_per_hour = np.bincount(age_hours, weights=flagged.astype(float))
        # hours with no judged minute (a scrape gap) neither break nor extend the run
        broken = (judged_per_hour > 0) & (flagged_per_hour <= 0.5 * judged_per_hour)
        run_hours = int(np.argmax(broken)) if broken.any() else len(broken)
        if run_hours * 3600.0 >= self.max_clean_fraction * self.training_seconds:
            return ~flagged | (age_hours < run_hours)
        return ~flagged

    def _train(
        self, x: np.ndarray, fitted_at: float, version: str, settled: np.ndarray, seconds: np.ndarray
    ) -> _Fitted:
        fill = np.nanmedian(x, axis=0)
        fill = np.where(np.isnan(fill), 0.0, fill)
        x = np.where(np.isnan(x), fill, x)
        coef, *_ = np.linalg.lstsq(_basis(x), x[:, :N_OUTCOMES], rcond=None)
        signed = (x[:, :N_OUTCOMES] - _basis(x) @ coef) * np.asarray(BAD_DIRECTION)
        centre = np.median(signed, axis=0)
        # the mixes it judges: those of minutes a day old (all of them while fewer than a tree's worth)
        few = settled.sum() < MIN_TRAINING_ROWS
        seen, seen_s = (x[:, _MIX], seconds) if few else (x[settled, _MIX], seconds[settled])
        mix_range = (
            float(np.quantile(seen, MIX_QUANTILE)),
            float(np.quantile(seen, 1.0 - MIX_QUANTILE)),
        )
        first = math.floor(float(seen.min()) / MIX_BIN_LOG10)
        bins = np.floor(seen / MIX_BIN_LOG10).astype(int) - first
        mix_hist = np.bincount(bins, weights=seen_s)
        z = _transform(x, coef, centre)
        # at least DEAD_BAND: a residual just past the dead band is not yet a multiple of anything
        scale = np.maximum(np.quantile(z[:, :N_OUTCOMES], self.quantile, axis=0), DEAD_BAND)
        from sklearn.ensemble import IsolationForest  # only where a forest is fitted

        forests: list[TreeEnsemble] = []
        calibration = np.zeros((len(FEATURE_GROUPS), 2))
        normalised: list[np.ndarray] = []
        for g, cols in enumerate(FEATURE_GROUPS):
            fitted = IsolationForest(
                n_estimators=self.n_estimators,
                max_samples=self.max_samples,
                random_state=self.seed + g,
                n_jobs=1,
            )
            fitted.fit(z[:, cols])
            forests.append(from_sklearn(fitted))
            # scikit-learn's own scores on the training rows (equal to the arrays' within 1e-9, faster here)
            raw = -fitted.score_samples(z[:, cols])
            calibration[g] = _calibrate(raw, self.quantile, RAW_SPREAD_FLOOR)
            normalised.append(_group_score(raw, calibration[g], z, cols, scale))
        median, threshold = _calibrate(
            np.max(np.vstack(normalised), axis=0), self.quantile, COMBINED_SPREAD_FLOOR
        )
        return _Fitted(
            forests,
            calibration,
            fill,
            coef,
            centre,
            scale,
            mix_range,
            first * MIX_BIN_LOG10,
            mix_hist,
            median,
            threshold,
            fitted_at,
            version,
            len(x),
        )

    @staticmethod
    def _combined(fit: _Fitted, z: np.ndarray) -> np.ndarray:
        """The largest group score (each group normalised on its training distribution)."""
        per_group = [
            _group_score(-forest.score_samples(z[:, cols]), fit.group_calibration[g], z, cols, fit.scale)
            for g, (forest, cols) in enumerate(zip(fit.forests, FEATURE_GROUPS, strict=True))
        ]
        return np.asarray(np.max(np.vstack(per_group), axis=0))

    # -- scoring ----------------------------------------------------------------------------

    @classmethod
    def _scores(cls, fit: _Fitted, x: np.ndarray) -> np.ndarray:
        """Normalised scores (0 = training median, 1 = training quantile) of feature rows."""
        x = np.where(np.isnan(x), fit.fill, x)
        z = _transform(x, fit.coef, fit.centre)
        forest = cls._normalise(fit, cls._combined(fit, z))
        cols = list(MAGNITUDE_OUTCOMES)
        magnitude = np.max(z[:, cols] / fit.scale[cols], axis=1)
        return np.maximum(forest, magnitude)

    @staticmethod
    def _judgeable(fit: _Fitted, x: np.ndarray) -> np.ndarray:
        """Rows whose request mix lies within what the forest was trained on and has enough
        settled training time near it (see MIX_QUANTILE and MIX_SUPPORT_SECONDS)."""
        mix = x[:, _MIX]
        lo, hi = fit.mix_range
        in_range = (mix >= lo - MIX_MARGIN_LOG10) & (mix <= hi + MIX_MARGIN_LOG10)
        cum = np.concatenate([[0.0], np.cumsum(fit.mix_hist)])
        k = round(MIX_SUPPORT_LOG10 / MIX_BIN_LOG10)
        idx = np.floor((np.nan_to_num(mix) - fit.mix_hist_start) / MIX_BIN_LOG10).astype(int)
        n = len(fit.mix_hist)
        support = cum[np.clip(idx + k + 1, 0, n)] - cum[np.clip(idx - k, 0, n)]
        return np.isnan(mix) | (in_range & (support >= MIX_SUPPORT_SECONDS))

    @staticmethod
    def _normalise(fit: _Fitted, raw: np.ndarray) -> np.ndarray:
        return (raw - fit.median) / (fit.threshold - fit.median)

    def score(self, window: CostWindow) -> float | None:
        """Normalised anomaly score of one window (> 1 anomalous), or None when there is no
        forest for its series yet, the window has no tokens to judge, or its request mix is one
        the forest has not been trained on (it abstains until a refit has seen that mix)."""
        return self.score_many([window])[0]

    def score_many(self, windows: Sequence[CostWindow]) -> list[float | None]:
        """:meth:`score` for many windows at once (one vectorised pass per series)."""
        out: list[float | None] = [None] * len(windows)
        groups: dict[SeriesKey, tuple[list[int], list[np.ndarray]]] = {}
        for i, w in enumerate(windows):
            f = features(w)
            key = (w.usage.engine, w.usage.model)
            if f is None or key not in self._fits:
                continue
            idx, rows = groups.setdefault(key, ([], []))
            idx.append(i)
            rows.append(f)
        for key, (idx, rows) in groups.items():
            fit = self._fits[key]
            x = np.vstack(rows)
            scores = self._scores(fit, x)
            for i, s, ok in zip(idx, scores, self._judgeable(fit, x), strict=True):
                # a non-finite score (a feature out of every range) is no verdict: absent, so it
                # never reaches the store's sums (one NaN would void a rule's whole hour) or /metrics
                out[i] = float(s) if ok and math.isfinite(s) else None
        return out

    # -- persistence --------------------------------------------------------------------------

    def save(self) -> Path | None:
        """Write the fitted arrays to ``state_dir`` (atomically); None when there is no state dir."""
        if self.state_dir is None:
            return None
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self.state_dir / STATE_FILE
        out: dict[str, np.ndarray] = {
            "format": np.array([STATE_FORMAT]),
            "series": np.array([f"{e}\x00{m}" for e, m in self._fits], dtype=str),
        }
        for i, fit in enumerate(self._fits.values()):
            p = f"s{i}/"
            for g, ens in enumerate(fit.forests):
                out.update({f"{p}g{g}/{k}": v for k, v in ens.arrays().items()})
            out.update(
                {
                    p + "group_calibration": fit.group_calibration,
                    p + "fill": fit.fill,
                    p + "coef": fit.coef,
                    p + "centre": fit.centre,
                    p + "scale": fit.scale,
                    p + "numbers": np.array(
                        [
                            *fit.mix_range,
                            fit.mix_hist_start,
                            fit.median,
                            fit.threshold,
                            fit.fitted_at,
                            float(fit.n_train),
                        ]
                    ),
                    p + "mix_hist": fit.mix_hist,
                    p + "version": np.array([fit.version], dtype=str),
                }
            )
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as f:
            np.savez(f, allow_pickle=False, **out)
        tmp.replace(path)
        (self.state_dir / PADDED_FILE).unlink(missing_ok=True)  # read once, now superseded
        return path

    def load(self) -> bool:
        """Read the arrays saved by :meth:`save` (or by the release before, see PADDED_FORMAT);
        False (and nothing loaded) when absent, unreadable or written in another format (then refit)."""
        if self.state_dir is None:
            return False
        path = self.state_dir / STATE_FILE
        if not path.exists():
            path = self.state_dir / PADDED_FILE
            if not path.exists():
                return False
        try:
            with np.load(path, allow_pickle=False) as z:
                fmt = int(z["format"][0])
                if fmt not in (STATE_FORMAT, PADDED_FORMAT) or path.name != f"forest-v{fmt}.npz":
                    logger.warning("forest state %s has another format; will refit", path)
                    return False
                fits = self._read(z, fmt)
        except Exception as err:  # a truncated or foreign file: refit rather than crash
            logger.warning("forest state %s unreadable (%s); will refit", path, err)
            return False
        self._fits = fits
        return True

    @staticmethod
    def _read(z: Any, fmt: int) -> dict[SeriesKey, _Fitted]:
        """The fits in an open ``.npz`` of format ``fmt``."""
        names, convert = (
            (TreeEnsemble.ARRAY_NAMES, TreeEnsemble.from_arrays)
            if fmt == STATE_FORMAT
            else (("feature", "threshold", "left", "right", "leaf_depth", "meta"), TreeEnsemble.from_padded)
        )
        fits: dict[SeriesKey, _Fitted] = {}
        for i, key in enumerate(z["series"].tolist()):
            engine, model = str(key).split("\x00", 1)
            p = f"s{i}/"
            forests = [convert({k: z[f"{p}g{g}/{k}"] for k in names}) for g in range(len(FEATURE_GROUPS))]
            lo, hi, hist_start, median, threshold, fitted_at, n_train = z[p + "numbers"].tolist()
            fits[(engine, model)] = _Fitted(
                forests, z[p + "group_calibration"], z[p + "fill"], z[p + "coef"], z[p + "centre"],
                z[p + "scale"], (lo, hi), hist_start, z[p + "mix_hist"],
                median, threshold, fitted_at, str(z[p + "version"][0]), int(n_train),
            )  # fmt: skip
        return fits
