"""The FLOP model of a method's server rule and client extras (:func:`fedweigh.flops.round_flops` adds training).

Each method package declares its :class:`MethodCost` (``Declaration.costs``)
from the counting functions here and its own; the counts follow the
implementations (additions, multiplications, divisions and square roots;
comparisons and sorting are not counted).

>>> sample_count_weighting(4), complement_share_weighting(4)
(7, 22)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

PROXIMAL_FLOPS_PER_PARAMETER = 6
"""FedProx's extra element-wise FLOPs per trainable parameter and local step (see the module docstring)."""


def sample_count_weighting(num_clients: int) -> int:
    return 2 * num_clients - 1  # sum, then one division per client


def uniform_weighting(num_clients: int) -> int:
    return 1  # 1 / K


def complement_share_weighting(num_clients: int) -> int:
    if num_clients == 1:
        return 0
    # divide by the maximum, sum, divide, subtract from 1, sum, divide
    return 6 * num_clients - 2


def no_extra(trainable_parameters: int) -> int:
    return 0


def no_matching(num_clients: int, matched: Sequence[tuple[int, int]]) -> int:
    return 0


def proximal_extra(trainable_parameters: int) -> int:
    return PROXIMAL_FLOPS_PER_PARAMETER * trainable_parameters


@dataclass(frozen=True)
class MethodCost:
    """What a strategy adds to plain local training and averaging, in FLOPs.

    Attributes
    ----------
    weighting : callable
        Server FLOPs to turn ``K`` clients' signals into weights, ``K -> int``.
    extra_per_step : callable
        Client FLOPs added to every local step, ``d -> int`` for ``d``
        trainable parameters.
    matching : callable
        Server FLOPs to align ``K`` client models before averaging,
        ``(K, [(rows, row length) of each matched tensor]) -> int``.
    """

    weighting: Callable[[int], int]
    extra_per_step: Callable[[int], int] = no_extra
    matching: Callable[[int, Sequence[tuple[int, int]]], int] = no_matching
