"""FedMR (Hu et al., "Is Aggregation the Only Choice? Federated Learning via Layer-wise Model Recombination",
KDD 2024, arXiv 2208.07677): local models recombined tensor by tensor instead of averaged.

The server keeps ``m`` local models, one per client slot of a round (``m``:
the clients a round samples), all the initial model at the start. A round's
``i``-th sampled client trains the ``i``-th local model, which its reply
replaces. The global model is their uniform mean (the paper's global model,
used for evaluation only; it is never sent to train). Then, from round
``fedmr.first-stage-rounds`` on, every tensor of the local models is
shuffled among them by a permutation of its own (the recombination: the
next round's ``m`` clients each train a model whose layers come from
different clients); before it, every local model becomes the mean (the
paper's two-stage variant). The authors' code shuffles each tensor of the
state separately (a layer's weight and bias by different permutations), and
so does this; the permutations are drawn from the run's seed and the round,
so a run is reproducible and resumes exactly (the local models are in the
checkpoint). A slot whose client sent no valid reply keeps its model.

FedMR changes what each client is sent, so it needs a synchronous run
(asynchrony is refused before training, as is ``update-norm-bound``, which
measures updates from the global model); it weighs every local model the
same, so an ``aggregation`` setting is refused too. A round whose mean is not
finite changes nothing.

>>> import numpy as np
>>> models = [{"w": np.array([float(i)]), "b": np.array([10.0 * i])} for i in range(3)]
>>> shuffled = recombine(models, np.random.default_rng(0))
>>> sorted(float(m["w"][0]) for m in shuffled), sorted(float(m["b"][0]) for m in shuffled)
([0.0, 1.0, 2.0], [0.0, 10.0, 20.0])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedweigh.methods.costs import MethodCost, sample_count_weighting
from fedweigh.methods.declaration import Declaration, Method
from fedweigh.methods.fedavg.server import SAMPLE_COUNT
from fedweigh.methods.fedmr.protocol import FedMRSettings
from fedweigh.protocol import ARRAYS
from fedweigh.settings import Settings
from fedweigh.strategies.averaging import NamedArrays, all_finite, weighted_average
from fedweigh.strategies.library import MethodStrategy
from fedweigh.strategies.updates import RoundUpdate, ServerUpdate


def recombine(models: Sequence[NamedArrays], rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """Each tensor shuffled among ``models`` by its own permutation: model ``i`` takes tensor ``k`` of ``π_k(i)``."""
    recombined: list[dict[str, np.ndarray]] = [{} for _ in models]
    for name in models[0]:
        order = rng.permutation(len(models))
        for target, source in enumerate(order):
            recombined[target][name] = models[source][name]
    return recombined


class Recombination(ServerUpdate):
    """FedMR's server (module docstring): ``m`` local models, their mean, then recombination or the mean for all."""

    name = "fedmr"
    uses_weights = False
    sends_per_client = True

    def __init__(self, first_stage_rounds: int = FedMRSettings().first_stage_rounds, seed: int = 0) -> None:
        self.first_stage_rounds, self.seed = first_stage_rounds, seed
        self.local_models: list[dict[str, np.ndarray]] = []
        self.slot_of: dict[str, int] = {}  # this round's clients -> the local model each was sent
        self.sending_round = 0  # the round slot_of belongs to

    @classmethod
    def build(cls, settings: Settings, server_data: object | None = None) -> Recombination:
        return cls(settings.fedmr.first_stage_rounds, settings.seed)

    @classmethod
    def model_problems(cls, settings: Settings, model: Any) -> list[str]:
        refused = {
            "delay-std": (settings.delay_std, "a late reply cannot replace the local model it was sent"),
            "round-deadline": (settings.round_deadline, "a late reply cannot replace the local model it was sent"),
            "update-norm-bound": (
                settings.update_norm_bound,
                "it bounds updates from the mean, not from the local model each client started from",
            ),
        }
        return [
            f"strategy = 'fedmr' with {key} = {value}: FedMR sends each of a round's clients one of its local "
            f"models and replaces it with the reply; {why}; accepted: {key} = 0"
            for key, (value, why) in refused.items()
            if value > 0
        ]

    def instruction_arrays(self, client: str, model: NamedArrays, model_round: int) -> dict[str, NamedArrays]:
        """The next local model not yet sent in ``model_round`` (the first round's: the initial model)."""
        if model_round != self.sending_round:  # a round that aggregated nothing left its assignments behind
            self.slot_of, self.sending_round = {}, model_round
        slot = self.slot_of.setdefault(client, len(self.slot_of))
        while slot >= len(self.local_models):
            self.local_models.append({name: np.array(value) for name, value in model.items()})
        return {ARRAYS: self.local_models[slot]}

    def __call__(self, update: RoundUpdate) -> dict[str, np.ndarray]:
        local_models, unmatched = list(self.local_models), 0
        for client, trained in zip(update.clients, update.models, strict=True):
            if client in self.slot_of:
                local_models[self.slot_of[client]] = {name: np.array(value) for name, value in trained.items()}
            else:
                unmatched += 1  # no local model of ours was sent to it this round
        self.slot_of = {}
        count = len(local_models)
        mean = weighted_average(local_models, np.full(count, 1.0 / count))
        if unmatched:
            update.diagnostics["fedmr-unmatched"] = unmatched
        update.diagnostics["local-models"] = count
        if not all_finite(mean):  # the round is not aggregated: the local models stay as they were
            return mean
        if update.server_round > self.first_stage_rounds:
            rng = np.random.default_rng([self.seed, update.server_round])
            self.local_models = recombine(local_models, rng)
            update.diagnostics["recombined"] = True
        else:
            self.local_models = [{name: np.array(value) for name, value in mean.items()} for _ in range(count)]
        return mean

    def state(self) -> dict[str, Any]:
        return {
            "local_models": [{name: np.array(value) for name, value in model.items()} for model in self.local_models],
            "slot_of": dict(self.slot_of),
            "sending_round": self.sending_round,
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.local_models = [
            {name: np.asarray(value) for name, value in model.items()} for model in state.get("local_models", [])
        ]
        self.slot_of = {str(client): int(slot) for client, slot in state.get("slot_of", {}).items()}
        self.sending_round = int(state.get("sending_round", 0))


FEDMR = Method("fedmr", SAMPLE_COUNT, update=Recombination, meaning="FedMR: local models recombined tensor by tensor")
_FEDMR = FedMRSettings()


class FedMR(MethodStrategy):
    """FedMR (Hu et al., arXiv 2208.07677): each client trains one of ``m`` local models, recombined every round.

    Each train instruction carries that client's local model in place of the global one; your ClientApp trains
    what it receives, as for FedAvg. The global model (``strategy.start``'s result, and what ``evaluate_fn``
    sees) is the local models' mean. Synchronous runs only. Options as ``[fedmr]``.
    """

    method = FEDMR

    def __init__(self, *, first_stage_rounds: int = _FEDMR.first_stage_rounds, **kwargs: Any) -> None:
        super().__init__(options={"fedmr": {"first_stage_rounds": first_stage_rounds}}, **kwargs)


DECLARATION = Declaration(
    methods=(FEDMR,),
    updates=(Recombination,),
    costs={"fedmr": MethodCost(sample_count_weighting)},
    strategies=(FedMR,),
)
