"""The one check before training: settings, names, combinations, the data split.

:func:`check_run` is called once before anything trains: by ``fedweigh
simulate`` before it starts a SuperLink, by the experiment runner for every
run of a grid before the first one, and by the ServerApp (which plain
``flwr run`` may start) before it sends any message. It raises one
:class:`~fedweigh.settings.SettingsError` listing every problem, each naming
the setting, the value and what is accepted:

1. types, ranges and names (:func:`parse_settings`, with the
   :class:`~fedweigh.settings.Catalog` of every registry);
2. combinations (:func:`combination_problems`): an ``aggregation`` chosen
   for a strategy whose server update ignores weights, a strategy without
   the server data it needs, simulated delays that ``max-staleness`` would
   leave out entirely, and client steps that cannot run on the chosen model
   (checked on the model built on PyTorch's ``meta`` device: no memory, no
   weights);
3. the data, when the number of partitions is known (:func:`data_problems`):
   the split, and the server's own data (found, labelled, not empty, and
   brought to the clients' input shape).

Example
-------
>>> parse_settings({"aggregation": "fednolowe", "strategy": "fedprox"}).aggregation
'fednolowe'
>>> check_run({"aggregation": "fedoui", "oui.probe-layer": "conv1"})
Traceback (most recent call last):
...
fedweigh.settings.SettingsError: invalid run config:
  - aggregation = 'fedoui' runs the client step 'oui', which cannot run on model = 'mlp': \
oui.probe-layer = 'conv1' is not a submodule of DigitsMLP; accepted: flatten, fc1, relu1, fc2
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from fedweigh.client.registry import CLIENT_STEPS
from fedweigh.components import data_spec, new_model, server_and_test_data
from fedweigh.data.federated import partition_sizes
from fedweigh.data.sources import validate_dataset_setting
from fedweigh.methods import METHODS, plan_run
from fedweigh.models import model_names, model_options
from fedweigh.models.weights import WeightsUnavailable, fetch
from fedweigh.protocol import STEPS
from fedweigh.rules.registry import RULES
from fedweigh.settings import Catalog, Settings, SettingsError, validate
from fedweigh.strategies.build import train_instruction
from fedweigh.strategies.registry import UPDATES


def catalog() -> Catalog:
    """Every name a run config may use, from the registries."""
    return Catalog(
        strategies=list(METHODS),
        rules=list(RULES),
        steps=list(STEPS),
        models={name: model_options(name) for name in model_names()},
        dataset=validate_dataset_setting,
    )


def parse_settings(run_config: Mapping[str, Any]) -> Settings:
    """Types, ranges and names of a run config; raises :class:`SettingsError` listing every problem."""
    return validate(run_config, catalog())


def combination_problems(settings: Settings) -> list[str]:
    """Settings that are valid alone but not together, each naming both settings."""
    plan = plan_run(settings)
    problems = []
    update = UPDATES[plan.update]
    if settings.aggregation and not update.uses_weights:
        problems.append(
            f"aggregation = {settings.aggregation!r} cannot be combined with strategy = {settings.strategy!r}: "
            f"its server update '{update.name}' does not use aggregation weights; accepted: aggregation = '' "
            "(the strategy's own)"
        )
    problems += _server_data_problems(settings, update.name, update.server_data)
    if settings.delay_std > 0 and settings.max_staleness == 0:
        problems.append(
            f"delay-std = {settings.delay_std!r} holds every reply back by a half-normal number of rounds, but "
            "max-staleness = 0 leaves out every reply that arrives late; accepted: max-staleness >= 1 "
            f"(about {math.ceil(3 * settings.delay_std)} keeps 99.7% of them)"
        )
    try:
        RULES[plan.rule].build(settings)
    except ValueError as err:
        problems.append(f"{plan.rule_origin}: {err}")
    if settings.mixed_precision == "fp16" and settings.device == "cpu":
        problems.append(
            "mixed-precision = 'fp16' needs a CUDA device, but device = 'cpu'; accepted: mixed-precision = 'bf16' "
            "or 'off' on a CPU, or device = 'cuda' / 'auto' on GPU machines"
        )
    if settings.model_pretrained:
        try:
            fetch(settings.model, settings.model_weights)  # downloads once, into the cache the clients read
        except WeightsUnavailable as err:
            problems.append(str(err))
    try:
        with torch.device("meta"):  # the architecture, fine-tuning included, without memory or weights
            model = new_model(settings, pretrained_weights=False)
    except ValueError as err:
        return [*problems, f"model = {settings.model!r} cannot be built as the settings say: {err}"]
    if plan.steps:
        instruction = train_instruction(settings, plan)
        for name, origin in plan.steps:
            try:
                CLIENT_STEPS[name].check_model(model, instruction)
            except ValueError as err:
                problems.append(
                    f"{origin} runs the client step '{name}', which cannot run on model = {settings.model!r}: {err}"
                )
    return problems


def _server_data_problems(settings: Settings, update: str, kinds: tuple[str, ...]) -> list[str]:
    """A strategy whose server update needs data of its own that the settings do not give it."""
    if not kinds or (update == "feddle" and not settings.feddle.search):
        return []
    given = "id" if settings.server_data == "id" else ("ood" if settings.server_data else "")
    if given in kinds:
        return []
    accepted = " or ".join(
        {"id": "'id' (held out of the test split)", "ood": "a dataset (out-of-distribution)"}[kind] for kind in kinds
    )
    extra = "; or feddle.search = false (FedBuff's step)" if update == "feddle" else ""
    return [
        f"strategy = {settings.strategy!r} trains on the server's own data, but server-data = "
        f"{settings.server_data!r}; accepted: server-data = {accepted}{extra}"
    ]


def data_problems(settings: Settings, num_partitions: int) -> list[str]:
    """Why the data cannot be split ``num_partitions`` ways, or the server's data not used (empty when fine)."""
    accepted = (
        "accepted: at most as many partitions as the training samples allow "
        "(fewer SuperNodes, a larger train-subset, partition-top-up = true, or a different partitioner)"
    )
    prefix = f"dataset = {settings.dataset!r} with {num_partitions} partitions ({settings.partitioner})"
    try:
        sizes = partition_sizes(data_spec(settings, num_partitions))
    except (IndexError, ValueError) as err:  # Flower Datasets' partitioners fail this way
        return [f"{prefix} cannot be split: {err}; {accepted}"]
    empty = [index for index, size in enumerate(sizes) if size == 0]
    if empty:
        return [f"{prefix} leaves partitions {empty[:10]} empty; {accepted}"]
    if settings.server_data or settings.test_holdout:
        try:
            server_and_test_data(settings, num_partitions)
        except ValueError as err:
            return [str(err)]
    return []


def check_run(run_config: Mapping[str, Any], num_partitions: int | None = None) -> Settings:
    """Everything that can be checked before training; the settings, or one error listing every problem.

    Parameters
    ----------
    run_config : Mapping
        The full flat run config (the app's defaults with overrides applied).
    num_partitions : int, optional
        The federation's size; without it the data split is not checked.
    """
    settings = parse_settings(run_config)
    problems = combination_problems(settings)
    if num_partitions is not None and not problems:
        problems += data_problems(settings, num_partitions)
    if problems:
        raise SettingsError(problems)
    return settings
