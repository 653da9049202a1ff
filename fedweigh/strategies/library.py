"""The methods as Flower strategies for your own ServerApp.

Each class is a Flower ``FedAvg`` (through
:class:`~fedweigh.strategies.base.WeightedFedAvg`) that you construct in
code, with Flower's usual arguments and the method's options as keyword
arguments, and run as you run ``FedAvg``::

    from fedweigh.strategies import FedOUI  # or from fedweigh.methods.fedoui.server

    strategy = FedOUI(fraction_train=0.5, window=3)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=10,
                            evaluate_fn=central_evaluation)

The options' defaults are the papers' (the same tables as the run config's,
:mod:`fedweigh.settings`), and a bad one is refused with the run config's
message, naming its table (``fedoui.epsilon = 0.7: ...``). The strategy
asks your ClientApp for what its rule weighs with: each train instruction's
ConfigRecord lists the client steps (``client-steps``, e.g. ``["oui"]``),
their options (``oui.probe-size``) and round values (FLood's
``asw-lambda``); :mod:`fedweigh.client` has the functions that compute the
signals with your model and data and put them in the reply. Replies need
``num-examples`` and ``train_loss`` (as Flower's quickstart sends) and the
signals; a reply without them is left out of the round and logged, never
aggregated.

Nothing else of fedweigh is needed: clients are known by their node ids
and sampled reproducibly from ``seed``. ``sample_by_partition = True``
instead asks each new node for its ``partition-id`` (fedweigh's ClientApp
answers) and samples by partition, so that every strategy compared sees the
same clients.

Any strategy takes another aggregation (``aggregation=DAC()``, or
:func:`aggregation` by its run-config name): its clients then report what
that rule reads.

Each method's class lives in its package (``fedweigh/methods/<method>/server.py``)
and :mod:`fedweigh.strategies` offers them all by name.

Example
-------
>>> from fedweigh.strategies import DAC, FedOUI, FedProx
>>> strategy = FedOUI(fraction_train=0.5, window=3)
>>> type(strategy).__name__, strategy.rule.name, strategy.recipe["client-steps"], strategy.recipe["oui.probe-size"]
('FedOUI', 'oui-beta', ['oui'], 32)
>>> FedProx(proximal_mu=0.1, aggregation=DAC(alpha=1.0)).recipe["client-steps"]
['ood-score']
>>> FedOUI(epsilon=0.7)
Traceback (most recent call last):
...
fedweigh.settings.SettingsError: invalid run config:
  - fedoui.epsilon = 0.7: Input should be less than 0.5
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from fedweigh.methods.catalog import STEPS, producers
from fedweigh.methods.declaration import Method
from fedweigh.methods.fedavg.server import FEDAVG
from fedweigh.protocol import CLIENT_STEPS, ConfigValue, dashed, recipe_key, table_entries
from fedweigh.rules.base import WeightingRule
from fedweigh.settings import Settings, validate
from fedweigh.strategies.base import WeightedFedAvg
from fedweigh.strategies.deadline import Deadline
from fedweigh.strategies.sampling import NodeDirectory
from fedweigh.strategies.schedules import Schedule
from fedweigh.strategies.updates import ServerUpdate

_RUN = Settings()
_FLOWER = {"fraction_train": 1.0, "fraction_evaluate": 1.0, "min_train_nodes": 2, "min_evaluate_nodes": 2}
"""Flower's ``FedAvg`` defaults, which these strategies keep."""


def checked_settings(options: Mapping[str, Mapping[str, Any]], **common: Any) -> Settings:
    """Settings from a strategy's keyword arguments, checked as the run config is.

    ``options`` maps a table (``"fedoui"``) to its options by Python name;
    ``common`` holds run-level settings by Python name (``fraction_train``).
    Every problem is reported at once, named by its run-config key.
    """
    flat = {f"{table}.{dashed(key)}": value for table, values in options.items() for key, value in values.items()}
    flat.update({dashed(key): value for key, value in common.items()})
    return validate(flat)


class MethodStrategy(WeightedFedAvg):
    """A method (:class:`~fedweigh.methods.declaration.Method`) as a Flower strategy; the base of the library's classes.

    Subclasses name their method (:attr:`method`) and turn their keyword
    arguments into option tables. What the method adds up to (its rule, the
    client steps its rule and local objective need with their options, the
    per-round values those steps read) is built by :meth:`from_settings`,
    which the run-config app (:func:`fedweigh.strategies.build.build_strategy`)
    calls too: one implementation for both.

    Parameters
    ----------
    aggregation : WeightingRule, optional
        Another aggregation rule than the method's own.
    seed : int
        Seeds client sampling (and fedweigh's simulated delays).
    max_staleness : int
        Rounds a reply's model may lag behind and still be aggregated.
    sample_by_partition : bool
        Ask each new node for its ``partition-id`` and sample by partition
        (fedweigh's ClientApp answers); otherwise nodes are known by their ids.
    round_deadline, min_round_replies : float, int
        Real asynchrony (a deployment): a round closes this many seconds
        after its instructions went out once this many replies are in; late
        replies join later rounds, applied to the model they started from
        (``max_staleness`` rounds at most). 0: a round waits for every reply.
    delay_std : float
        Simulated asynchrony: every reply held back a seeded half-normal
        number of rounds (σ); 0: none.
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes
        As for Flower's ``FedAvg``, with its defaults.
    **strategy_kwargs
        Further arguments of :class:`~fedweigh.strategies.base.WeightedFedAvg`.
    """

    method: ClassVar[Method] = FEDAVG
    """The method it is (:class:`~fedweigh.methods.declaration.Method`: rule, client steps, server update)."""

    def __init__(
        self,
        *,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        aggregation: WeightingRule | None = None,
        seed: int = 0,
        max_staleness: int = 0,
        round_deadline: float = _RUN.round_deadline,
        min_round_replies: int = _RUN.min_round_replies,
        delay_std: float = _RUN.delay_std,
        sample_by_partition: bool = False,
        fraction_train: float = _FLOWER["fraction_train"],
        fraction_evaluate: float = _FLOWER["fraction_evaluate"],
        min_train_nodes: int = _FLOWER["min_train_nodes"],
        min_evaluate_nodes: int = _FLOWER["min_evaluate_nodes"],
        min_available_nodes: int | None = None,
        **strategy_kwargs: Any,
    ) -> None:
        settings = checked_settings(
            options or {},
            strategy=self.method.name,
            seed=seed,
            max_staleness=max_staleness,
            round_deadline=round_deadline,
            min_round_replies=min_round_replies,
            delay_std=delay_std,
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
        )
        deadline = (
            Deadline(
                settings.round_deadline, settings.min_round_replies, settings.max_staleness, timeout=_RUN.round_timeout
            )
            if settings.round_deadline > 0
            else None
        )
        strategy_kwargs.setdefault("update", self.server_update(settings))
        self._build(
            settings,
            aggregation=aggregation,
            directory=NodeDirectory(ask=sample_by_partition),
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_train_nodes if min_available_nodes is None else min_available_nodes,
            delay_std=settings.delay_std,
            deadline=deadline,
            **strategy_kwargs,
        )

    def server_update(self, settings: Settings) -> ServerUpdate:
        """The method's step from the replies to the new global model (the weighted mean for most)."""
        return self.method.update.build(settings, None)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        plan: Any = None,
        recipe: Mapping[str, ConfigValue] | None = None,
        schedules: Sequence[Schedule] = (),
        directory: NodeDirectory | None = None,
        **strategy_kwargs: Any,
    ) -> MethodStrategy:
        """The strategy a run's settings describe (the run-config app's way in).

        ``plan`` (the settings' :class:`~fedweigh.methods.registry.RunPlan`)
        picks the method, the rule and the client steps, ``recipe`` replaces
        the instruction's static entries (the app sends its training recipe
        too), ``schedules`` are every per-round value (the client steps' too).
        """
        strategy = cls.__new__(cls)
        if plan is not None:
            strategy.method = plan.method  # the method the settings name (a class of its own or not)
        rule = plan.rule.build(settings) if plan is not None else None
        steps = plan.comma_list if plan is not None else None
        strategy._build(
            settings,
            aggregation=rule,
            steps=steps,
            recipe=recipe,
            schedules=schedules,
            directory=directory,
            **strategy_kwargs,
        )
        return strategy

    def _build(
        self,
        settings: Settings,
        *,
        aggregation: WeightingRule | None = None,
        steps: Sequence[str] | None = None,
        recipe: Mapping[str, ConfigValue] | None = None,
        schedules: Sequence[Schedule] = (),
        directory: NodeDirectory | None = None,
        **strategy_kwargs: Any,
    ) -> None:
        method = self.method
        rule = aggregation if aggregation is not None else method.rule.build(settings)
        step_schedules = []
        if steps is None:  # a library user's: the method's steps, those of the rule's signals, their schedules
            steps = list(dict.fromkeys([*method.steps, *producers(rule.signals)]))
            step_schedules = [build(settings) for name, build in self.step_schedules().items() if name in steps]
        if recipe is None:
            recipe = self.instruction(settings, steps)
        strategy_kwargs.setdefault("min_available_nodes", settings.min_train_nodes)
        super().__init__(
            rule,
            recipe,
            schedules=[*schedules, *step_schedules],
            seed=settings.seed,
            max_staleness=settings.max_staleness,
            fraction_train=settings.fraction_train,
            fraction_evaluate=settings.fraction_evaluate,
            min_train_nodes=settings.min_train_nodes,
            **strategy_kwargs,
        )
        if directory is not None:
            self.directory = directory

    @classmethod
    def step_schedules(cls) -> Mapping[str, Any]:
        """The per-round values its own client steps need (FLood's λ(t)); none by default."""
        return {}

    def instruction(self, settings: Settings, steps: Sequence[str]) -> dict[str, ConfigValue]:
        """What every train instruction of a library strategy carries: the client steps and their options."""
        entries: dict[str, ConfigValue] = {CLIENT_STEPS: list(steps)} if steps else {}
        for name in steps:
            table = STEPS[name].options
            if table is not None:
                entries.update(table_entries(table, getattr(settings, table.replace("-", "_"))))
        if self.method.proximal:
            entries[recipe_key("proximal_mu")] = settings.fedprox.proximal_mu
        return entries
