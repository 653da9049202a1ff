"""The server-update step: from a round's replies to the new global model.

After the rule has weighed the round's valid replies, a *server update* turns
them into the next global model. It is given everything the round produced
(:class:`RoundUpdate`): the global model the round sent, the replies' models
and the round each one trained from, the rule's weights, the signals, the
global models of earlier rounds that stale replies started from, and the
server's own data when the run has some. Its state (if any) goes into the
checkpoint, so a resumed run continues exactly.

:class:`WeightedMean` is the default, and every weighting strategy's update:
``θ = Σ_k w_k θ_k``, exactly as Flower's FedAvg computes it. A stale reply
(trained on the model of an earlier round ``s``) is applied as the update it
made, relative to the model it started from: it enters the mean as
``θ_t + (θ_k − θ_s)``. With fresh replies only that is the plain weighted
mean, bit for bit. :class:`AsyncMixing` (FedAsync) mixes each arrival into the model in
turn, discounted by its staleness. Other updates (Feddle's coefficient search
on server-held data in :mod:`fedweigh.methods.feddle.update`, FedBuff's buffer of
K updates in :mod:`fedweigh.methods.fedbuff.server`, Center and Fed+FT in
:mod:`fedweigh.methods.feddle.server_training`) subclass
:class:`ServerUpdate` too. An update says what it needs, and the check before
training holds a run to it: the rule's weights (``uses_weights``; if not, an
``aggregation`` setting is refused), the server's data (``server_data``: the
kinds it accepts), client replies at all (``needs_clients``). It may write
what it did into the round's record (``RoundUpdate.diagnostics``).

Example
-------
>>> import numpy as np
>>> start = {"w": np.array([0.0, 0.0])}
>>> current = {"w": np.array([1.0, 1.0])}
>>> fresh, stale = {"w": np.array([2.0, 2.0])}, {"w": np.array([0.5, -0.5])}
>>> update = RoundUpdate(
...     server_round=2, global_model=current, models=[fresh, stale], model_rounds=[2, 1],
...     weights=np.array([0.5, 0.5]), num_examples=np.array([10.0, 10.0]), start_models={1: start},
... )
>>> WeightedMean()(update)["w"].tolist()  # the stale reply counts as 1 + (0.5, -0.5)
[1.75, 1.25]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fedweigh.settings import Settings
from fedweigh.strategies.averaging import NamedArrays, weighted_average
from fedweigh.strategies.robust import trimmed_weighted_mean


@dataclass(frozen=True)
class RoundUpdate:
    """What the server-update step is given.

    Attributes
    ----------
    server_round : int
        The round being aggregated.
    global_model : mapping
        The global model this round sent (the previous global model).
    models : sequence of mappings
        The valid replies' models, in partition order.
    model_rounds : sequence of int
        For each reply, the round whose global model it trained
        (``server_round`` for a fresh reply).
    weights : np.ndarray
        The rule's weights, one per reply, summing to 1.
    num_examples : np.ndarray
        Each reply's training sample count.
    signals : mapping
        The rule's signals, one array per name, in reply order.
    start_models : mapping
        Round number to the global model it sent, for every round a stale
        reply started from.
    server_data : object or None
        The server's own data, when the run has some (Feddle).
    partitions : sequence of int
        Each reply's partition (client), for the record.
    clients_per_round : int
        How many clients the round sampled.
    clients : sequence of str
        Each reply's client as :func:`client_key` names it (what an update keeps per client is keyed so).
    num_clients : int
        How many clients the federation has (the nodes connected, or the partitions they announce).
    reports : sequence of mappings
        Each reply's checked signals: the rule's and those of the client steps it was told to run (SCAFFOLD
        reads its ``scaffold-step-size`` here).
    diagnostics : dict
        Filled by the update with what it did; goes into the round's record.
    """

    server_round: int
    global_model: NamedArrays
    models: Sequence[NamedArrays]
    model_rounds: Sequence[int]
    weights: np.ndarray
    num_examples: np.ndarray
    signals: Mapping[str, np.ndarray] = field(default_factory=dict)
    start_models: Mapping[int, NamedArrays] = field(default_factory=dict)
    server_data: object | None = None
    partitions: Sequence[int] = ()
    clients_per_round: int = 0
    clients: Sequence[str] = ()
    num_clients: int = 0
    reports: Sequence[Mapping[str, float]] = ()
    diagnostics: dict[str, Any] = field(default_factory=dict)

    def start_model(self, index: int) -> NamedArrays:
        """The global model reply ``index`` started from."""
        model_round = self.model_rounds[index]
        return self.global_model if model_round == self.server_round else self.start_models[model_round]

    def staleness(self, index: int) -> int:
        """Rounds between the model reply ``index`` trained and this round."""
        return self.server_round - self.model_rounds[index]

    def current_models(self) -> list[NamedArrays]:
        """Every reply as a model of this round (see :func:`as_current`)."""
        return as_current(self.models, self.model_rounds, self.server_round, self.global_model, self.start_models)


def as_current(
    models: Sequence[NamedArrays],
    model_rounds: Sequence[int],
    server_round: int,
    global_model: NamedArrays,
    start_models: Mapping[int, NamedArrays],
) -> list[NamedArrays]:
    """Replies as models of ``server_round``: stale ones rebased (:func:`rebase`), fresh ones as they are."""
    return [
        model if model_round == server_round else rebase(model, start_models[model_round], global_model)
        for model, model_round in zip(models, model_rounds, strict=True)
    ]


def client_key(partition_id: int, node_id: int) -> str:
    """What names a client across rounds and restarts: ``p<partition>``, or ``n<node id>`` for a site without one.

    >>> client_key(3, 81723), client_key(-1, 81723)
    ('p3', 'n81723')
    """
    return f"p{partition_id}" if partition_id >= 0 else f"n{node_id}"


def rebase(model: NamedArrays, start: NamedArrays, current: NamedArrays) -> dict[str, np.ndarray]:
    """``current + (model - start)``: a client's update applied to a newer global model, tensor by tensor.

    >>> rebase({"w": np.array([3.0])}, {"w": np.array([1.0])}, {"w": np.array([10.0])})["w"].tolist()
    [12.0]
    """
    return {
        name: np.asarray(current[name]) + (np.asarray(value) - np.asarray(start[name])) for name, value in model.items()
    }


class ServerUpdate:
    """Base of every server-update step.

    Subclasses implement :meth:`__call__`; those keeping state across rounds
    override :meth:`state` and :meth:`load_state` (the checkpoint holds it).
    """

    name: ClassVar[str] = "update"
    uses_weights: ClassVar[bool] = True
    """False for an update that ignores the rule's weights (the check before training then refuses ``aggregation``)."""
    server_data: ClassVar[tuple[str, ...]] = ()
    """The kinds of server data it needs (``"id"``, ``"ood"``); empty: none."""
    needs_clients: ClassVar[bool] = True
    """False for an update that trains on the server's data alone (no client is sent anything)."""
    sends_per_client: ClassVar[bool] = False
    """True for an update that sends each client arrays of its own with the instruction (:meth:`instruction_arrays`)."""

    @classmethod
    def build(cls, settings: Settings, server_data: object | None = None) -> ServerUpdate:
        """The update the settings describe (most take no options)."""
        return cls()

    @classmethod
    def model_problems(cls, settings: Settings, model: Any) -> list[str]:
        """What in the settings cannot work with the run's model (built on PyTorch's meta device); none by default."""
        return []

    def __call__(self, update: RoundUpdate) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def instruction_arrays(self, client: str, model: NamedArrays, model_round: int) -> Mapping[str, NamedArrays]:
        """Records of arrays to send ``client`` (:func:`client_key`) with ``model_round``'s model ``model``, by key.

        Called for each train instruction when :attr:`sends_per_client` is set (SCAFFOLD's correction ``c − c_i``).
        """
        return {}

    def state(self) -> dict[str, Any]:
        """Everything needed to continue after a restart."""
        return {}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state` returned."""


class WeightedMean(ServerUpdate):
    """``θ = Σ_k w_k θ_k`` over the replies as models of this round (stale ones rebased).

    Under asynchrony this is FedAvg's handling of stale updates (spec A13):
    every round, over whatever arrived (fresh and late alike),
    ``θ_t + Σ_k w_k (θ_k − θ_s(k))``, with FedAvg's ``w_k = n_k / Σ n``, each
    update taken relative to the model it started from, no staleness discount
    and no server learning rate; a round where nothing arrives keeps the
    model. (The FedBuff of this package before issue 51 was this with uniform
    weights, which is why no FedBuff–FedAvg gap like the paper's could show.)

    With ``trim`` > 0 (the ``trimmed-mean`` setting, off by default) it is the
    coordinate-wise trimmed weighted mean of :mod:`fedweigh.strategies.robust`.
    """

    name = "mean"

    def __init__(self, trim: float = 0.0) -> None:
        self.trim = trim

    @classmethod
    def build(cls, settings: Settings, server_data: object | None = None) -> WeightedMean:
        return cls(settings.trimmed_mean)

    def __call__(self, update: RoundUpdate) -> dict[str, np.ndarray]:
        if self.trim > 0:
            return trimmed_weighted_mean(update.current_models(), update.weights, self.trim)
        return weighted_average(update.current_models(), update.weights)
