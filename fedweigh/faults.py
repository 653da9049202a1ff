"""Fault injection: which clients misbehave in a round, and what they do.

A run with ``faults.kinds`` and ``faults.fraction`` set (``[faults]`` in the
run config) makes a seeded share of each round's sampled clients misbehave, so
that a test, a benchmark or an operator can watch the server leave them out.
It works the same in a simulation and in a deployment: the server decides
(:class:`FaultPlan`) and names the fault in that client's train instruction
(:data:`fedweigh.protocol.FAULT`); the ClientApp then commits it
(:func:`corrupt_arrays`, :func:`corrupt_metrics`; ``exception`` and ``stall``
in the ClientApp itself). A ClientApp whose own run config has no faults never
obeys such an instruction. ``duplicate`` is a fault of the transport, which a
ClientApp cannot commit (Flower takes one reply per instruction): the
ServerApp's grid delivers that client's reply twice
(:class:`fedweigh.strategies.replay.ReplayGrid`).

The kinds (:data:`fedweigh.settings.FAULT_KINDS`):

==================  =============================================================
``exception``       the ClientApp raises before training (an error reply)
``stall``           the reply comes ``round-timeout`` + 1 s late
``nan``, ``inf``    the first floating-point tensor is all NaN / +inf
``wrong-shape``     the first tensor loses its last element (flattened)
``wrong-dtype``     the first floating-point tensor comes back as float64
``missing-tensor``  the last tensor is left out
``extra-tensor``    a tensor the model does not have is added
``scaled``          every floating-point tensor times ``faults.scale`` (1e6):
                    finite, plausible-looking, and poison for a weighted mean
``signal-missing``  the signals the client's steps report are left out
``signal-nan``      ... are NaN
``signal-negative`` ... are -1 (those for which -1 is invalid)
``signal-range``    ... lie outside their valid range (OUI 1.5, a loss -1, an
                    OOD score +inf)
``duplicate``       the reply arrives twice
``old-round``       the reply says it trained a model older than
                    ``max-staleness`` accepts
==================  =============================================================

A signal fault corrupts the signals of the instruction's client steps for
which the corrupted value is invalid; when there are none (FedAvg, whose
clients report only a sample count and a loss), the training loss, which every
reply must carry valid.

Which clients, and which kind each: in round ``t`` with ``n`` sampled clients,
``round(fraction × n)`` of them (half up), drawn by
``numpy.random.default_rng([seed, FAULT_STREAM, t])`` from the sampled
partitions; the ``j``-th of them commits kind ``kinds[(c·(t − 1) + j) mod K]``
for ``c`` faulty clients a round, so that the kinds take turns and a run of
``⌈K / c⌉`` rounds commits every one of them. The draw depends only on the
seed, the round and the sampled partitions, never on the strategy: every
strategy compared sees the same faults.

>>> plan = FaultPlan(seed=1, kinds=("nan", "scaled"), fraction=0.5)
>>> sorted(plan.assign(1, [3, 5, 8, 9]).values())
['nan', 'scaled']
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedweigh.methods.catalog import SIGNALS, STEPS
from fedweigh.options import FAULT_KINDS
from fedweigh.protocol import MODEL_ROUND, TRAIN_LOSS, ConfigValue
from fedweigh.settings import Settings

FAULT_STREAM = 0xFA17
"""Keeps the fault draw apart from client sampling's and the simulated delays' random streams."""

EXTRA_TENSOR = "fault.unexpected"
"""The name of the tensor the ``extra-tensor`` fault adds."""

STALL_TIMEOUT_LIMIT = 600.0
"""The longest ``round-timeout`` (s) a run that injects ``stall`` may have: each stalling client holds its round
that long (with the default of 3600 s, an hour a round); the check before training refuses more."""
SIGNAL_FAULTS = ("signal-missing", "signal-nan", "signal-negative", "signal-range")
ARRAY_FAULTS = ("nan", "inf", "wrong-shape", "wrong-dtype", "missing-tensor", "extra-tensor", "scaled")


class InjectedFault(RuntimeError):
    """The exception the ``exception`` fault raises."""


@dataclass(frozen=True)
class FaultPlan:
    """The server's side of fault injection: who misbehaves in a round, and how.

    Attributes
    ----------
    seed : int
        The run's seed.
    kinds : tuple of str
        The kinds to inject, in :data:`FAULT_KINDS` order.
    fraction : float
        The share of each round's sampled clients that misbehave.
    """

    seed: int
    kinds: tuple[str, ...]
    fraction: float

    @classmethod
    def from_settings(cls, settings: Settings) -> FaultPlan | None:
        """The plan of the settings' ``[faults]``; None when the run injects none."""
        kinds = settings.faults.kind_list
        return cls(settings.seed, kinds, settings.faults.fraction) if kinds else None

    def count(self, sampled: int) -> int:
        """How many of ``sampled`` clients misbehave: ``fraction × sampled``, rounded half up."""
        return min(sampled, math.floor(self.fraction * sampled + 0.5))

    def assign(self, server_round: int, partitions: Sequence[int]) -> dict[int, str]:
        """``{position in partitions: kind}`` for the clients of ``server_round`` that misbehave.

        ``partitions`` are the round's sampled clients (their partitions) in
        sampling order; the draw does not depend on that order.
        """
        count = self.count(len(partitions))
        if count == 0:
            return {}
        order = sorted(range(len(partitions)), key=lambda i: (partitions[i], i))
        rng = np.random.default_rng([self.seed, FAULT_STREAM, server_round])
        chosen = [order[i] for i in rng.permutation(len(order))[:count]]
        first = count * (server_round - 1)
        return {position: self.kinds[(first + j) % len(self.kinds)] for j, position in enumerate(chosen)}


def fault_to_commit(settings: Settings, config: Mapping[str, ConfigValue], key: str) -> str:
    """The fault an instruction asks of this client; ``""`` unless its own run config injects faults."""
    fault = str(config.get(key, ""))
    if not fault or not settings.faults.kind_list:
        return ""
    if fault not in FAULT_KINDS:
        raise ValueError(f"the instruction asks for fault {fault!r}; accepted: {', '.join(FAULT_KINDS)}")
    return fault


def _first_floating(arrays: Mapping[str, torch.Tensor]) -> str:
    return next(name for name, value in arrays.items() if value.is_floating_point())


def corrupt_arrays(fault: str, arrays: Mapping[str, torch.Tensor], scale: float = 1e6) -> dict[str, torch.Tensor]:
    """The model tensors a client with ``fault`` returns instead of ``arrays`` (unchanged for other faults).

    >>> arrays = {"w": torch.ones(2, 2), "b": torch.zeros(2)}
    >>> {k: tuple(v.shape) for k, v in corrupt_arrays("wrong-shape", arrays).items()}
    {'w': (3,), 'b': (2,)}
    >>> list(corrupt_arrays("missing-tensor", arrays))
    ['w']
    """
    out = {name: value.detach().clone() for name, value in arrays.items()}
    if fault not in ARRAY_FAULTS or not out:
        return out
    first = _first_floating(out)
    if fault == "nan":
        out[first] = torch.full_like(out[first], math.nan)
    elif fault == "inf":
        out[first] = torch.full_like(out[first], math.inf)
    elif fault == "wrong-shape":
        name = next(iter(out))
        out[name] = out[name].flatten()[:-1]
    elif fault == "wrong-dtype":
        out[first] = out[first].to(torch.float64)
    elif fault == "missing-tensor":
        out.pop(list(out)[-1])
    elif fault == "extra-tensor":
        out[EXTRA_TENSOR] = torch.zeros(3)
    elif fault == "scaled":
        out = {name: value * scale if value.is_floating_point() else value for name, value in out.items()}
    return out


def invalid_value(fault: str, check: object) -> float | None:
    """The value a signal fault reports for a signal with ``check``; None: ``fault`` leaves it out.

    For ``signal-range``: the first of 1.5, -1 and +inf that the check refuses.
    """
    if fault == "signal-missing":
        return None
    if fault == "signal-nan":
        return math.nan
    if fault == "signal-negative":
        return -1.0
    return next(value for value in (1.5, -1.0, math.inf) if not check(value))  # type: ignore[operator]


def corrupt_metrics(
    fault: str,
    metrics: Mapping[str, float | int],
    steps: Sequence[str],
    server_round: int,
    max_staleness: int,
) -> dict[str, float | int]:
    """The reply metrics a client with ``fault`` returns instead of ``metrics`` (unchanged for other faults).

    ``steps`` are the instruction's client steps: their signals are the ones
    a signal fault corrupts (the training loss when none of them can be).

    >>> corrupt_metrics("signal-range", {"train_loss": 0.5, "oui": 0.3}, ["oui"], 1, 0)["oui"]
    1.5
    >>> corrupt_metrics("old-round", {"model-round": 4}, [], 4, 1)["model-round"]
    2
    """
    out = dict(metrics)
    if fault == "old-round":
        out[MODEL_ROUND] = server_round - max_staleness - 1
        return out
    if fault not in SIGNAL_FAULTS:
        return out
    reported = [name for step in steps for name in STEPS[step].produces if name in out]
    values = {name: invalid_value(fault, SIGNALS[name].check) for name in [*reported, TRAIN_LOSS]}
    targets = [name for name in reported if values[name] is None or not SIGNALS[name].check(values[name])]
    for name in targets or [TRAIN_LOSS]:
        if values[name] is None:
            out.pop(name, None)
        else:
            out[name] = values[name]
    return out
