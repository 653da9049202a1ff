"""The methods as Flower strategies for your own ServerApp.

Each class is a Flower ``FedAvg`` (through
:class:`~fedweigh.strategies.base.WeightedFedAvg`) that you construct in
code, with Flower's usual arguments and the method's options as keyword
arguments, and run as you run ``FedAvg``::

    from fedweigh.strategies import FedOUI

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

Example
-------
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

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from fedweigh.data.server import ServerData
from fedweigh.data.tensors import ImageTensors
from fedweigh.methods import METHODS, RunPlan
from fedweigh.options import (
    DACSettings,
    FedAsyncSettings,
    FedBuffSettings,
    FeddleSettings,
    FedOUISettings,
    FedProxSettings,
    FLoodSettings,
    OUIProbeSettings,
    UAggSettings,
    UFLSettings,
)
from fedweigh.protocol import CLIENT_STEPS, STEPS, ConfigValue, dashed, producers, recipe_key, table_entries
from fedweigh.rules.base import WeightingRule
from fedweigh.rules.dac import DACRule
from fedweigh.rules.registry import RULES
from fedweigh.settings import Settings, SettingsError, validate
from fedweigh.strategies.base import WeightedFedAvg
from fedweigh.strategies.deadline import Deadline
from fedweigh.strategies.feddle import FeddleUpdate
from fedweigh.strategies.registry import UPDATES
from fedweigh.strategies.sampling import NodeDirectory
from fedweigh.strategies.schedules import STEP_SCHEDULES, Schedule
from fedweigh.strategies.updates import ServerUpdate

_FEDOUI, _OUI, _UFL, _UAGG = FedOUISettings(), OUIProbeSettings(), UFLSettings(), UAggSettings()
_FLOOD, _DAC, _FEDPROX = FLoodSettings(), DACSettings(), FedProxSettings()
_FEDBUFF, _FEDASYNC, _FEDDLE, _RUN = FedBuffSettings(), FedAsyncSettings(), FeddleSettings(), Settings()
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


def aggregation(name: str, **options: Any) -> WeightingRule:
    """An aggregation rule by its run-config name (``fednolowe``, ``dac``, ...), its options as keyword arguments.

    >>> aggregation("uagg", signal="mean").signals
    ('uncertainty-mean',)
    """
    if name not in RULES:
        raise SettingsError([f"aggregation = {name!r}: unknown aggregation rule; accepted: {', '.join(sorted(RULES))}"])
    table = RULES[name].table
    if options and table is None:
        raise SettingsError([f"aggregation = {name!r} has no options; accepted: none, got {sorted(options)}"])
    return RULES[name].build(checked_settings({table: options} if table else {}))


class DAC(DACRule):
    """FLood's DAC aggregation, usable with any strategy here: its clients then report ``ood-score`` (φ).

    ``w = (n_k/Σn + α · share of φ_k) / (1 + α)``; options as ``[dac]``.
    """

    def __init__(
        self, alpha: float = _DAC.alpha, mapping: str = _DAC.mapping, temperature: float = _DAC.temperature
    ) -> None:
        options = checked_settings({"dac": {"alpha": alpha, "mapping": mapping, "temperature": temperature}}).dac
        super().__init__(options.alpha, options.mapping, options.temperature)


class MethodStrategy(WeightedFedAvg):
    """A method of :data:`fedweigh.methods.METHODS` as a Flower strategy; the base of this module's classes.

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

    method: ClassVar[str] = "fedavg"

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
            strategy=self.method,
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
        return UPDATES[METHODS[self.method].update].build(settings, None)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        plan: RunPlan | None = None,
        recipe: Mapping[str, ConfigValue] | None = None,
        schedules: Sequence[Schedule] = (),
        directory: NodeDirectory | None = None,
        **strategy_kwargs: Any,
    ) -> MethodStrategy:
        """The strategy a run's settings describe (the run-config app's way in).

        ``plan`` (the settings' :class:`~fedweigh.methods.RunPlan`) picks the
        rule and the client steps, ``recipe`` replaces the instruction's
        static entries (the app sends its training recipe too), ``schedules``
        come before the steps' own.
        """
        strategy = cls.__new__(cls)
        strategy.method = settings.strategy  # the method the settings name (a class of its own or not)
        rule = RULES[plan.rule].build(settings) if plan is not None else None
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
        method = METHODS[self.method]
        rule = aggregation if aggregation is not None else RULES[method.rule].build(settings)
        if steps is None:
            steps = list(dict.fromkeys([*method.steps, *producers(rule.signals)]))
        if recipe is None:
            recipe = self.instruction(settings, steps)
        step_schedules = [STEP_SCHEDULES[name](settings) for name in steps if name in STEP_SCHEDULES]
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

    def instruction(self, settings: Settings, steps: Sequence[str]) -> dict[str, ConfigValue]:
        """What every train instruction of a library strategy carries: the client steps and their options."""
        entries: dict[str, ConfigValue] = {CLIENT_STEPS: list(steps)} if steps else {}
        for name in steps:
            table = STEPS[name].options
            if table is not None:
                entries.update(table_entries(table, getattr(settings, table.replace("-", "_"))))
        if METHODS[self.method].proximal:
            entries[recipe_key("proximal_mu")] = settings.fedprox.proximal_mu
        return entries


class FedProx(MethodStrategy):
    """FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", arXiv 1812.06127).

    Sends ``proximal-mu`` with every instruction, as Flower's ``FedProx``
    does: the client adds ``μ/2 ‖w − w_global‖²`` to its loss. The plug-in
    partner of FLood's pieces: ``FedProx(aggregation=DAC())``.
    """

    method = "fedprox"

    def __init__(self, *, proximal_mu: float = _FEDPROX.proximal_mu, **kwargs: Any) -> None:
        super().__init__(options={"fedprox": {"proximal_mu": proximal_mu}}, **kwargs)


class FedOUI(MethodStrategy):
    """FedOUI: weights from the typicality of each client's OUI under a Beta fit of the round's OUIs.

    The client reports ``oui``, the Overfitting-Underfitting Indicator of a
    layer's pre-activations on a fixed probe batch after training
    (:func:`fedweigh.client.oui_signal`). ``w ∝ n^ρ (ε + s)^γ`` with ``s``
    the bilateral typicality score; ``window`` > 1 pools the last rounds'
    OUIs into the fit. Options as ``[fedoui]`` and ``[oui]``.
    """

    method = "fedoui"

    def __init__(
        self,
        *,
        epsilon: float = _FEDOUI.epsilon,
        window: int = _FEDOUI.window,
        score_exponent: float = _FEDOUI.score_exponent,
        size_exponent: float = _FEDOUI.size_exponent,
        probe_size: int = _OUI.probe_size,
        probe_layer: str = _OUI.probe_layer,
        probe_transform: str = _OUI.probe_transform,
        **kwargs: Any,
    ) -> None:
        fedoui = {
            "epsilon": epsilon,
            "window": window,
            "score_exponent": score_exponent,
            "size_exponent": size_exponent,
        }
        oui = {"probe_size": probe_size, "probe_layer": probe_layer, "probe_transform": probe_transform}
        super().__init__(options={"fedoui": fedoui, "oui": oui}, **kwargs)


class FedNolowe(MethodStrategy):
    """FedNolowe: normalised-loss weights, ``w = (1 − L_k/ΣL)/(K−1)`` on the clients' ``train_loss``.

    Nothing beyond Flower's quickstart reply is needed from the client: its
    mean training loss is the signal.
    """

    method = "fednolowe"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)


class UFL(MethodStrategy):
    """UFL: an uncertainty-weighted local loss, and U-Agg weights ``w = (1 − U_k/ΣU)/(K−1)``.

    Before training the client computes each sample's MC-dropout uncertainty
    ``u`` on the received model, up-weights its top ``ratio`` samples by
    ``1 + alpha·u`` in the loss, and reports ``uncertainty`` (U_k) and
    ``uncertainty-mean`` (:func:`fedweigh.client.ufl_weights`). Options as
    ``[ufl]`` (sent to the client) and ``[uagg]`` (the rule).
    """

    method = "ufl"

    def __init__(
        self,
        *,
        mc_passes: int = _UFL.mc_passes,
        ratio: float = _UFL.ratio,
        alpha: float = _UFL.alpha,
        dropout: float = _UFL.dropout,
        normalize: bool = _UFL.normalize,
        cheap_path: bool = _UFL.cheap_path,
        signal: str = _UAGG.signal,
        size_aware: bool = _UAGG.size_aware,
        **kwargs: Any,
    ) -> None:
        ufl = {
            "mc_passes": mc_passes,
            "ratio": ratio,
            "alpha": alpha,
            "dropout": dropout,
            "normalize": normalize,
            "cheap_path": cheap_path,
        }
        super().__init__(options={"ufl": ufl, "uagg": {"signal": signal, "size_aware": size_aware}}, **kwargs)


class FLood(MethodStrategy):
    """FLood: pseudo-OOD samples weighted by λ(t) in the loss (ASW), and DAC weights.

    Every instruction carries λ of its round (``asw-lambda``, from 0 to
    ``2a`` by round ``halt_round``): the client weighs the lowest-scoring
    ``q`` share of each batch by λ (:func:`fedweigh.client.asw_sample_weights`)
    and after training reports ``ood-score``, its model's mean energy score φ
    (:func:`fedweigh.client.ood_score_signal`). DAC mixes sample counts with
    the φ shares by ``alpha``. Options as ``[flood]`` and ``[dac]``.
    """

    method = "flood"

    def __init__(
        self,
        *,
        q: float = _FLOOD.q,
        a: float = _FLOOD.a,
        halt_round: int = _FLOOD.halt_round,
        schedule: str = _FLOOD.schedule,
        lag: bool = _FLOOD.lag,
        score: str = _FLOOD.score,
        temperature: float = _FLOOD.temperature,
        mask: str = _FLOOD.mask,
        phi_augment: bool = _FLOOD.phi_augment,
        alpha: float = _DAC.alpha,
        mapping: str = _DAC.mapping,
        **kwargs: Any,
    ) -> None:
        flood = {
            "q": q,
            "a": a,
            "halt_round": halt_round,
            "schedule": schedule,
            "lag": lag,
            "score": score,
            "temperature": temperature,
            "mask": mask,
            "phi_augment": phi_augment,
        }
        super().__init__(options={"flood": flood, "dac": {"alpha": alpha, "mapping": mapping}}, **kwargs)


class FedBuff(MethodStrategy):
    """FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", arXiv 2106.06639).

    Client updates wait in a buffer; once it holds ``buffer_size`` (K) the
    server steps, ``w ← w + η_g / K · Σ s(τ) Δ``, ``s(τ) = 1/√(1 + τ)`` with τ
    the server steps since the update's model (``staleness_scaling``), and the
    buffer empties. Made for asynchrony: give ``round_deadline`` (a
    deployment) or ``delay_std`` (a simulation) and ``max_staleness``.
    ``buffer_size = 0``: a step every round on what arrived. Options as
    ``[fedbuff]``.
    """

    method = "fedbuff"

    def __init__(
        self,
        *,
        buffer_size: int = _FEDBUFF.buffer_size,
        server_lr: float = _FEDBUFF.server_lr,
        staleness_scaling: bool = _FEDBUFF.staleness_scaling,
        **kwargs: Any,
    ) -> None:
        fedbuff = {"buffer_size": buffer_size, "server_lr": server_lr, "staleness_scaling": staleness_scaling}
        super().__init__(options={"fedbuff": fedbuff}, **kwargs)


class FedAsync(MethodStrategy):
    """FedAsync (Xie et al., "Asynchronous Federated Optimization", arXiv 1903.03934).

    Each arrival in turn: ``w ← (1 − α_τ) w + α_τ w_k``, ``α_τ = alpha (τ + 1)^(−a)``,
    τ in rounds. Made for asynchrony, as :class:`FedBuff`. Options as ``[fedasync]``.
    """

    method = "fedasync"

    def __init__(self, *, alpha: float = _FEDASYNC.alpha, a: float = _FEDASYNC.a, **kwargs: Any) -> None:
        super().__init__(options={"fedasync": {"alpha": alpha, "a": a}}, **kwargs)


class Feddle(MethodStrategy):
    """Feddle: the new model is ``w + Σ ĉ_m ā_m`` over an atlas of past client updates, ĉ searched on server data.

    Clients train as they always do (no client step). The server holds
    images of its own: of the clients' classes (``kind = "id"``), or another
    dataset's (``"ood"``: a linear head on the model's ``classifier`` layer
    is fitted to them first). ``server_images`` are ``uint8`` ``[N, C, H, W]``
    as your dataset stores them, ``preprocess`` what your pipeline does to a
    batch of them before the model (say, scale and normalise), ``model`` a
    model of your architecture (its weights are overwritten). Without server
    data the step is the fallback (FedBuff's step over the round's arrivals).
    Made for asynchrony, as :class:`FedBuff`. Options as ``[feddle]``.
    """

    method = "feddle"

    def __init__(
        self,
        *,
        model: nn.Module,
        server_images: torch.Tensor | None = None,
        server_labels: torch.Tensor | None = None,
        preprocess: Callable[[torch.Tensor], torch.Tensor] = lambda images: images.float() / 255.0,
        kind: str = "id",
        classifier: str = "",
        search_epochs: int = _FEDDLE.search_epochs,
        search_lr: float = _FEDDLE.search_lr,
        regularization: float = _FEDDLE.regularization,
        atlas_size: int = _FEDDLE.atlas_size,
        **kwargs: Any,
    ) -> None:
        if kind not in ("id", "ood"):
            raise SettingsError([f"kind = {kind!r}: the server data's classes; accepted: 'id' (the clients'), 'ood'"])
        if classifier:
            model.classifier_layer = classifier  # what an out-of-distribution head replaces
        self._model = model
        self._server_data = None
        if server_images is not None:
            if server_labels is None:
                raise SettingsError(["server_labels = None with server_images: accepted: one label per image"])
            labels = server_labels.to(torch.int64)
            classes = int(labels.max()) + 1 if len(labels) else 0
            self._server_data = ServerData(
                kind, ImageTensors(server_images, labels), classes, _Preprocessing(preprocess), "library"
            )
        feddle = {
            "search_epochs": search_epochs,
            "search_lr": search_lr,
            "regularization": regularization,
            "atlas_size": atlas_size,
        }
        super().__init__(options={"feddle": feddle}, server_data=self._server_data, **kwargs)

    def server_update(self, settings: Settings) -> ServerUpdate:
        return FeddleUpdate.for_model(settings, self._model, self._server_data)


class _Preprocessing:
    """A user's batch preprocessing as a :class:`~fedweigh.data.transforms.BatchTransform` (no augmentation)."""

    def __init__(self, preprocess: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.preprocess = preprocess

    def __call__(self, images: torch.Tensor, train: bool = False, generator: torch.Generator | None = None) -> Any:
        return self.preprocess(images)


STRATEGY_CLASSES: dict[str, type[MethodStrategy]] = {
    strategy.method: strategy for strategy in (FedProx, FedOUI, FedNolowe, UFL, FLood, FedBuff, FedAsync)
}
"""The library classes by ``strategy`` name; the run-config app builds every other method as a
:class:`MethodStrategy`."""
