"""A run's strategy, built from its settings.

:func:`build_strategy` turns a :class:`~fedweigh.methods.registry.RunPlan` into a
:class:`~fedweigh.strategies.base.WeightedFedAvg` through the library's
classes (:mod:`fedweigh.strategies.library`: the method's class, or
:class:`~fedweigh.strategies.library.MethodStrategy` for the others), which
build the rule and the client steps' schedules as they do for a library
user; the app adds the server update from
:class:`~fedweigh.methods.registry.RunPlan`, the train instruction (the
:class:`~fedweigh.protocol.TrainRecipe`, the client steps and their options),
the learning-rate schedule, asynchrony and fault injection.

Example
-------
>>> from fedweigh.settings import validate
>>> strategy = build_strategy(validate({"strategy": "fedprox"}))
>>> type(strategy).__name__, strategy.rule.name, strategy.recipe["proximal-mu"]
('FedProx', 'sample-count', 0.01)
"""

from __future__ import annotations

from fedweigh.faults import FaultPlan
from fedweigh.methods.catalog import STEPS
from fedweigh.methods.registry import STEP_SCHEDULES, STRATEGY_CLASSES, RunPlan, plan_run
from fedweigh.protocol import CLIENT_STEPS, ConfigValue, TrainRecipe, table_entries
from fedweigh.settings import Settings
from fedweigh.strategies.base import WeightedFedAvg
from fedweigh.strategies.deadline import Deadline
from fedweigh.strategies.library import MethodStrategy
from fedweigh.strategies.sampling import NodeDirectory
from fedweigh.strategies.schedules import LearningRateDecay


def train_instruction(settings: Settings, plan: RunPlan) -> dict[str, ConfigValue]:
    """The static entries of every train instruction: the recipe, the client steps and their options."""
    mu = settings.fedprox.proximal_mu if plan.proximal else 0.0
    instruction: dict[str, ConfigValue] = TrainRecipe.from_settings(settings, proximal_mu=mu).to_config()
    if plan.steps:
        instruction[CLIENT_STEPS] = plan.comma_list
    for name in plan.comma_list:
        table = STEPS[name].options
        if table is not None:
            instruction.update(table_entries(table, getattr(settings, table.replace("-", "_"))))
    return instruction


def build_strategy(
    settings: Settings,
    round_offset: int = 0,
    server_data: object | None = None,
    directory: NodeDirectory | None = None,
    frozen_digest: str = "",
) -> WeightedFedAvg:
    """The strategy the settings describe, ready for ``start``.

    ``server_data`` is the server's own data (see
    :func:`fedweigh.components.server_and_test_data`); ``directory``, the
    node directory the app has already filled while waiting for the nodes;
    ``frozen_digest``, the hash of the model's frozen part (sent to clients).
    """
    plan = plan_run(settings)
    deadline = (
        Deadline(
            settings.round_deadline, settings.min_round_replies, settings.max_staleness, timeout=settings.round_timeout
        )
        if settings.round_deadline > 0
        else None
    )
    return STRATEGY_CLASSES.get(settings.strategy, MethodStrategy).from_settings(
        settings,
        plan=plan,
        recipe=train_instruction(settings, plan),
        schedules=[
            LearningRateDecay(settings.learning_rate, settings.lr_decay),
            *(STEP_SCHEDULES[name](settings) for name in plan.comma_list if name in STEP_SCHEDULES),
        ],
        directory=directory,
        update=plan.update.build(settings, server_data),
        delay_std=settings.delay_std,
        deadline=deadline,
        server_data=server_data,
        client_sampling=settings.client_sampling,
        round_offset=round_offset,
        frozen_digest=frozen_digest,
        update_norm_bound=settings.update_norm_bound,
        faults=FaultPlan.from_settings(settings),
        min_evaluate_nodes=1 if settings.fraction_evaluate > 0 else 0,
    )
