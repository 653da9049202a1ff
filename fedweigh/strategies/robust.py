"""Robust aggregation, off by default: a bound on each update's norm, and a coordinate-wise trimmed mean.

A reply can pass every check (finite, right names, shapes and dtypes, valid
signals) and still poison a weighted mean: a model scaled by 1e6 is finite.
Two optional defences, neither part of any paper here, so both are off unless
a run asks for them:

* ``update-norm-bound = c`` (:func:`bound_update_norms`): each reply's update
  ``Δ_k = θ_k − θ_start(k)`` (relative to the global model it trained) is
  scaled down to at most ``c × median_j ||Δ_j||`` over the round's valid
  replies; an update within the bound is left exactly as it is. With fewer
  than half of the replies poisoned the median is a healthy update's norm, so
  a poisoned update keeps its direction but loses its magnitude. It works
  with every strategy, before the weighting rule and the server update see
  the replies.
* ``trimmed-mean = β`` (:func:`trimmed_weighted_mean`): the weighted mean's
  robust replacement. For every coordinate, the ``⌊β n⌋`` smallest and the
  ``⌊β n⌋`` largest of the ``n`` replies' values are dropped and the rest are
  averaged with the rule's weights, renormalised over the ones kept; with
  ``⌊β n⌋ = 0`` it is the weighted mean, bit for bit. It replaces the mean
  (strategies whose server update is ``mean``).

>>> import numpy as np
>>> start = {"w": np.zeros(2, dtype=np.float32)}
>>> models = [{"w": np.array([1.0, 0.0], np.float32)}, {"w": np.array([0.0, 2.0], np.float32)},
...           {"w": np.array([3e6, 4e6], np.float32)}]
>>> bounded, norms, factors = bound_update_norms(models, [start] * 3, bound=1.0)
>>> norms.tolist(), bounded[2]["w"].tolist()
([1.0, 2.0, 5000000.0], [1.2000000476837158, 1.600000023841858])
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fedweigh.strategies.averaging import NamedArrays, weighted_average


def _floating(value: np.ndarray) -> bool:
    return bool(np.issubdtype(np.asarray(value).dtype, np.floating))


def update_norms(models: Sequence[NamedArrays], starts: Sequence[NamedArrays]) -> np.ndarray:
    """``||θ_k − θ_start(k)||_2`` over every floating-point tensor, one per model (float64)."""
    norms = []
    for model, start in zip(models, starts, strict=True):
        total = 0.0
        for name, value in model.items():
            if _floating(value):
                delta = np.asarray(value, dtype=np.float64) - np.asarray(start[name], dtype=np.float64)
                total += float(np.dot(delta.ravel(), delta.ravel()))
        norms.append(math.sqrt(total))
    return np.array(norms, dtype=np.float64)


def bound_update_norms(
    models: Sequence[NamedArrays], starts: Sequence[NamedArrays], bound: float
) -> tuple[list[NamedArrays], np.ndarray, np.ndarray]:
    """Scale each update down to at most ``bound × median norm``; return the models, the norms and the factors.

    Parameters
    ----------
    models : sequence of mappings
        The replies' models.
    starts : sequence of mappings
        For each reply, the global model it trained.
    bound : float
        ``c`` > 0: the largest norm kept, as a multiple of the round's median update norm.

    Returns
    -------
    models : list of mappings
        ``θ_start + f_k Δ_k``; the reply's own model (the same object) where ``f_k = 1``.
    norms : np.ndarray
        ``||Δ_k||``.
    factors : np.ndarray
        ``f_k = min(1, c · median / ||Δ_k||)``.
    """
    if bound <= 0:
        raise ValueError(f"update-norm-bound = {bound!r}; accepted: a number above 0")
    norms = update_norms(models, starts)
    if len(norms) == 0:
        return [], norms, norms
    cap = bound * float(np.median(norms))
    factors = np.ones_like(norms)
    over = norms > cap
    factors[over] = cap / norms[over]
    bounded: list[NamedArrays] = []
    for model, start, factor in zip(models, starts, factors, strict=True):
        if factor >= 1.0:
            bounded.append(model)
            continue
        bounded.append(
            {
                name: (
                    (
                        np.asarray(start[name], dtype=np.float64)
                        + factor * (np.asarray(value, dtype=np.float64) - np.asarray(start[name], dtype=np.float64))
                    ).astype(np.asarray(value).dtype)
                    if _floating(value)
                    else value
                )
                for name, value in model.items()
            }
        )
    return bounded, norms, factors


def trimmed_weighted_mean(models: Sequence[NamedArrays], weights: np.ndarray, fraction: float) -> dict[str, np.ndarray]:
    """Per coordinate, drop the ``⌊fraction · n⌋`` smallest and largest values and weigh the rest.

    The kept values' weights are renormalised (uniform if they sum to 0);
    integer buffers (counters) take the plain weighted mean. With nothing to
    trim this is :func:`~fedweigh.strategies.averaging.weighted_average`.
    """
    n = len(models)
    trim = math.floor(fraction * n)
    if trim == 0:
        return weighted_average(models, weights)
    if n - 2 * trim < 1:
        raise ValueError(f"trimmed-mean = {fraction!r} leaves nothing of {n} replies")
    weights = np.asarray(weights, dtype=np.float64)
    plain = weighted_average(models, weights)
    result: dict[str, np.ndarray] = {}
    for name, first in models[0].items():
        if not _floating(first):
            result[name] = plain[name]
            continue
        stacked = np.stack([np.asarray(model[name], dtype=np.float64) for model in models])
        order = np.argsort(stacked, axis=0, kind="stable")[trim : n - trim]
        kept = np.take_along_axis(stacked, order, axis=0)
        kept_weights = weights[order]
        total = kept_weights.sum(axis=0)
        uniform = total <= 0
        kept_weights = np.where(uniform, 1.0, kept_weights)
        total = np.where(uniform, kept.shape[0], total)
        result[name] = ((kept_weights * kept).sum(axis=0) / total).astype(np.asarray(first).dtype)
    return result
