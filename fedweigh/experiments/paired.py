"""Seed-paired statistics of an experiment's arms: mean ± std over seeds, and paired differences.

Papers here report small margins, often within seed noise. An arm's score is
reported as the mean and sample standard deviation over its seeds
(:func:`mean_std`); two arms run on the same seeds (and, checked by
:mod:`fedweigh.experiments.sampling`, the same clients) are compared seed by
seed (:func:`paired_difference`): the mean difference, its standard error
and the win count.

Example
-------
>>> mean_std([0.2, 0.4])
(0.30000000000000004, 0.14142135623730953)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (``ddof=1``; None for one value)."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        raise ValueError("mean_std needs at least one value")
    return float(array.mean()), (float(array.std(ddof=1)) if array.size > 1 else None)


@dataclass(frozen=True)
class PairedDifference:
    """``arm - reference`` over the seeds both have: mean, standard error, wins, ties, losses.

    Attributes
    ----------
    mean : float
        Mean of the per-seed differences.
    sem : float or None
        Their sample std (ddof = 1) divided by ``sqrt(pairs)``; None for one pair.
    wins, ties, losses : int
        Seeds where the arm's value is strictly greater than, equal to, or
        smaller than the reference's.
    """

    mean: float
    sem: float | None
    wins: int
    ties: int
    losses: int

    @property
    def pairs(self) -> int:
        return self.wins + self.ties + self.losses

    def __str__(self) -> str:
        sem = "" if self.sem is None else f" ± {self.sem:.4f}"
        return f"{round(self.mean, 4) + 0.0:+.4f}{sem}"  # + 0.0: a mean that rounds to zero reads +0.0000, not -0.0000


def paired_difference(values: Mapping[int, float], reference: Mapping[int, float]) -> PairedDifference | None:
    """Compare an arm's per-seed values with the reference arm's on the same seeds; None without a common seed.

    >>> d = paired_difference({1: 0.80, 2: 0.70, 3: 0.60, 4: 0.9}, {1: 0.75, 2: 0.70, 3: 0.65})
    >>> round(d.mean, 6), round(d.sem, 6), (d.wins, d.ties, d.losses)
    (0.0, 0.028868, (1, 1, 1))
    """
    seeds = sorted(set(values) & set(reference))
    if not seeds:
        return None
    differences = np.array([values[seed] - reference[seed] for seed in seeds], dtype=np.float64)
    sem = float(differences.std(ddof=1) / np.sqrt(differences.size)) if differences.size > 1 else None
    return PairedDifference(
        mean=float(differences.mean()),
        sem=sem,
        wins=int((differences > 0).sum()),
        ties=int((differences == 0).sum()),
        losses=int((differences < 0).sum()),
    )
