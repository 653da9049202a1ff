"""Strategies by name: what ``strategy = "..."`` in the run config builds.

Each entry pairs a weighting rule with the client recipe it needs. Adding a
method means adding a builder here; the ServerApp and ClientApp stay as they
are.

Example
-------
>>> from fedweigh.settings import parse_settings
>>> strategy = build_strategy(parse_settings({"strategy": "fedprox"}))
>>> type(strategy).__name__, strategy.rule.name, strategy.recipe["proximal-mu"]
('WeightedFedAvg', 'sample-count', 0.01)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fedweigh.client.steps import with_steps
from fedweigh.settings import step_names
from fedweigh.strategies.base import RecipeValue, WeightedFedAvg
from fedweigh.strategies.fednolowe import build_fedasl, build_fednolowe
from fedweigh.strategies.fedoui import build_fedalign, build_fedoui
from fedweigh.strategies.ufl import build_ufl, build_ufl_fedavg
from fedweigh.strategies.weighting import SampleCountRule, UniformRule

if TYPE_CHECKING:
    from fedweigh.settings import Settings

Builder = Callable[["Settings", dict[str, RecipeValue], dict], WeightedFedAvg]


def training_recipe(settings: Settings) -> dict[str, RecipeValue]:
    """The local-training part of every recipe, from the run settings."""
    return {
        "local-epochs": settings.local_epochs,
        "batch-size": settings.batch_size,
        "learning-rate": settings.learning_rate,
        "momentum": settings.momentum,
        "weight-decay": settings.weight_decay,
        "persist-optimizer-state": settings.persist_optimizer_state,
        "proximal-mu": 0.0,
    }


def _fedavg(settings: Settings, recipe: dict[str, RecipeValue], common: dict) -> WeightedFedAvg:
    return WeightedFedAvg(SampleCountRule(), recipe, **common)


def _fedprox(settings: Settings, recipe: dict[str, RecipeValue], common: dict) -> WeightedFedAvg:
    recipe["proximal-mu"] = settings.fedprox.proximal_mu
    return WeightedFedAvg(SampleCountRule(), recipe, **common)


def _uniform(settings: Settings, recipe: dict[str, RecipeValue], common: dict) -> WeightedFedAvg:
    return WeightedFedAvg(UniformRule(), recipe, **common)


STRATEGIES: dict[str, Builder] = {
    "fedavg": _fedavg,
    "fedprox": _fedprox,
    "fedoui": build_fedoui,
    "fedalign": build_fedalign,
    "uniform": _uniform,
    "fednolowe": build_fednolowe,
    "fedasl": build_fedasl,
    "ufl": build_ufl,
    "ufl-fedavg": build_ufl_fedavg,
}


def strategy_names() -> list[str]:
    """Accepted values of the ``strategy`` setting."""
    return sorted(STRATEGIES)


def build_strategy(settings: Settings, round_offset: int = 0) -> WeightedFedAvg:
    """The strategy named by ``settings.strategy``, ready for ``start``."""
    common = {
        "seed": settings.seed,
        "round_offset": round_offset,
        "fraction_train": settings.fraction_train,
        "min_train_nodes": settings.min_train_nodes,
        "min_available_nodes": settings.min_train_nodes,
        "fraction_evaluate": settings.fraction_evaluate,
        "min_evaluate_nodes": 1 if settings.fraction_evaluate > 0 else 0,
    }
    strategy = STRATEGIES[settings.strategy](settings, training_recipe(settings), common)
    with_steps(strategy.recipe, settings, step_names(settings.client_steps))
    return strategy
