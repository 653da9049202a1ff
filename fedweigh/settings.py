"""Typed run settings: the run config of ``pyproject.toml`` plus ``--run-config``.

Flower hands both apps a flat ``UserConfig`` whose nested tables arrive with
dotted keys (``fedprox.proximal-mu``). :func:`validate` turns it into a
:class:`Settings` object and fails *before any training* with one message that
names every bad setting, its value and what is accepted.

This module sits at the bottom of the package and imports only
:mod:`fedweigh.options`, :mod:`fedweigh.protocol` and the methods' tables
of options (:mod:`fedweigh.methods.catalog`). Which
names a setting accepts (strategies, aggregation rules, client steps, models
and their options, datasets) belongs to the layers that define them; they hand
their tables in as a :class:`Catalog` (:func:`fedweigh.preflight.parse_settings`
does, with all of them). Without a catalog only types and ranges are checked,
which is what a ClientApp needs: its server has checked the names already.

Example
-------
>>> settings = validate({"strategy": "fedprox", "dirichlet-alpha": 0.1})
>>> settings.strategy, settings.dirichlet_alpha
('fedprox', 0.1)
>>> validate({"dirichlet-alpha": 0})
Traceback (most recent call last):
...
fedweigh.settings.SettingsError: invalid run config:
  - dirichlet-alpha = 0: Input should be greater than 0
>>> validate({"model": "resnet8"}, Catalog(models={"mlp": ("hidden", "dropout")}))
Traceback (most recent call last):
...
fedweigh.settings.SettingsError: invalid run config:
  - model = 'resnet8': unknown model; accepted: mlp
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, create_model, field_validator, model_validator

from fedweigh.methods.catalog import OPTION_TABLES, DeclarationError, where
from fedweigh.options import INT64_ACCEPTED, FaultSettings, OptionsTable, comma_list
from fedweigh.protocol import dashed


@dataclass(frozen=True)
class Catalog:
    """The names a run config may use, supplied by the layers that own them.

    Every field left at None is not checked.

    Attributes
    ----------
    strategies, rules, steps : sequence of str, or None
        Accepted ``strategy``, ``aggregation`` and ``client-steps`` names.
    models : mapping, or None
        Model name to the options it accepts (``width``, ``hidden``, ``dropout``).
    dataset : callable, or None
        Returns the canonical form of a ``dataset`` value or raises
        ``ValueError`` saying what is accepted.
    """

    strategies: Sequence[str] | None = None
    rules: Sequence[str] | None = None
    steps: Sequence[str] | None = None
    models: Mapping[str, Sequence[str]] | None = None
    dataset: Callable[[str], str] | None = None


def _catalog(info: ValidationInfo) -> Catalog:
    context = info.context or {}
    return context.get("catalog") or Catalog()


def _check_name(value: str, accepted: Sequence[str] | None, what: str) -> str:
    if accepted is not None and value not in accepted:
        raise ValueError(f"unknown {what}; accepted: {', '.join(sorted(accepted))}")
    return value


CLIENT_SAMPLERS = ("per-round", "python-sequence")
"""Accepted values of ``client-sampling`` (:mod:`fedweigh.strategies.sampling` draws them)."""


RAY_BACKEND = "ray"
"""The simulation backend of Flower: each ClientApp in a Ray actor."""


IN_PROCESS_BACKEND = "in-process"
"""The simulation backend that runs the ClientApp in the simulation's own process (fedweigh/flower/engine.py)."""


SIMULATION_BACKENDS = (RAY_BACKEND, IN_PROCESS_BACKEND)
"""Accepted values of ``simulation-backend``."""


PARTITIONERS = ("iid", "dirichlet", "soft-capped-dirichlet", "niid-bench-dirichlet", "pathological", "shard")
"""Accepted values of the ``partitioner`` setting (:mod:`fedweigh.data.partitioning` builds them)."""


TRACKERS = ("tensorboard", "mlflow")
"""What ``tracking`` may name, comma-separated (or ``none``); :mod:`fedweigh.tracking` says what each one writes."""


class RunSettings(OptionsTable):
    """The settings of a run besides the methods' tables; :data:`Settings` adds those."""

    # run
    strategy: str = "fedavg"
    aggregation: str = ""  # "" = the strategy's own rule
    seed: int = Field(1, ge=0)
    num_server_rounds: int = Field(5, ge=1)
    fraction_train: float = Field(0.5, gt=0.0, le=1.0)
    min_train_nodes: int = Field(2, ge=1)
    fraction_evaluate: float = Field(0.0, ge=0.0, le=1.0)
    client_sampling: Literal[CLIENT_SAMPLERS] = "per-round"
    max_staleness: int = Field(0, ge=0)  # rounds a reply's model may lag behind and still be used
    round_timeout: float = Field(3600.0, gt=0.0, allow_inf_nan=False)  # seconds a round waits for replies
    # simulation: the engine hands messages on when they are stored (false: Flower 1.41's 0.1 s polling loops)
    event_driven_simulation: bool = True
    # simulation: "ray" runs each ClientApp in a Ray actor (Flower's backend); "in-process" in the simulation's
    # own process, one message at a time, with no copy of the model through Ray (fedweigh/flower/engine.py)
    simulation_backend: Literal[SIMULATION_BACKENDS] = RAY_BACKEND
    # robust aggregation, off by default (the papers' methods as published)
    update_norm_bound: float = Field(0.0, ge=0.0, allow_inf_nan=False)  # cap ||update|| at this x the round's median
    trimmed_mean: float = Field(0.0, ge=0.0, lt=0.5)  # share trimmed at each end, per coordinate; 0: the plain mean
    # asynchrony: simulated (each reply held back a half-normal number of rounds) and real (a round's deadline)
    delay_std: float = Field(0.0, ge=0.0, allow_inf_nan=False)  # σ of the half-normal delay, in rounds; 0: none
    round_deadline: float = Field(0.0, ge=0.0, allow_inf_nan=False)  # seconds; 0: a round waits for every reply
    min_round_replies: int = Field(1, ge=1)  # a round closes at its deadline once this many replies are in
    # the server's own data: "" none, "id" (held out of the test split), or a dataset (out-of-distribution)
    server_data: str = ""
    server_data_size: int = Field(1000, ge=0)  # images the server holds; 0: a whole dataset
    test_holdout: int = Field(0, ge=0)  # test images never evaluated on (the draw "id" server data comes from)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    output_dir: str = "outputs"
    run_name: str = ""
    resume_from: str = ""
    # experiment tracking (the ServerApp logs every round's record to these as well as to metrics.jsonl)
    tracking: str = "none"  # none, or comma-separated TRACKERS: tensorboard, mlflow
    tensorboard_dir: str = ""  # TensorBoard's event folder; "": <run folder>/tensorboard
    tracking_uri: str = ""  # MLflow's tracking URI; "": sqlite:///<output dir>/mlflow.db (beside the run folders)
    tracking_experiment: str = ""  # MLflow's experiment; "": fedweigh (an experiment grid: its name)
    # data
    dataset: str = "digits"
    partitioner: Literal[PARTITIONERS] = "dirichlet"
    partition_seed: int = Field(-1, ge=-1)  # -1: the run's seed
    dirichlet_alpha: float = Field(0.5, gt=0.0)
    dirichlet_self_balancing: bool = False
    classes_per_client: int = Field(2, ge=1)
    shards_per_client: int = Field(2, ge=1)
    min_partition_size: int = Field(0, ge=0)
    partition_top_up: bool = False
    train_subset: int = Field(0, ge=0)
    test_subset: int = Field(0, ge=0)
    augment: bool = True
    # channel: one mean and std per channel; feature: per pixel, fitted on the train split (StandardScaler)
    normalization: Literal["channel", "feature"] = "channel"
    # channel statistics, one comma-separated value per input channel; "": the dataset's own (a pretrained model's)
    normalization_mean: str = ""
    normalization_std: str = ""
    rare_clients: float = Field(0.0, ge=0.0, lt=1.0)  # fraction of clients capped at rare-client-cap samples
    rare_client_cap: int = Field(120, ge=1)
    noisy_clients: float = Field(0.0, ge=0.0, le=1.0)  # fraction of clients with symmetric label flips
    label_noise: float = Field(0.4, ge=0.0, le=1.0)  # share of a noisy client's labels flipped
    # model
    model: str = "mlp"
    model_width: int = Field(0, ge=0)  # 0: the model's own width
    model_hidden: str = ""  # "" or comma-separated layer sizes, e.g. "128,128"
    model_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    model_pretrained: bool = False  # start from the model's published (or model-weights') weights
    model_weights: str = ""  # "": the published weights; or a local file/folder, or a Hub id
    model_input_size: int = Field(0, ge=0)  # 0: the model's own input size (224 for the pretrained models)
    # fine-tuning: "" the model's own (LoRA for the ViTs, full otherwise), "full", "lora" or "head"
    fine_tuning: Literal["", "full", "lora", "head"] = ""
    lora_rank: int = Field(4, ge=1)
    lora_alpha: float = Field(8.0, gt=0.0, allow_inf_nan=False)
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    lora_targets: str = ""  # "": the model's own (a ViT's attention projections); or comma-separated module names
    mixed_precision: Literal["off", "bf16", "fp16"] = "off"  # autocast in training and evaluation
    # local training recipe
    local_epochs: int = Field(3, ge=1)
    batch_size: int = Field(32, ge=1)
    optimizer: Literal["sgd", "adam"] = "sgd"
    learning_rate: float = Field(0.05, gt=0.0, allow_inf_nan=False)
    lr_decay: float = Field(1.0, gt=0.0, le=1.0)  # lr of round t = learning-rate * lr-decay^(t-1)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)  # SGD only
    weight_decay: float = Field(0.0, ge=0.0)
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0)
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0)
    adam_eps: float = Field(1e-8, gt=0.0)
    # keep each client's optimizer state between the rounds it trains in (FedNolowe's code; spec A12)
    persist_optimizer_state: bool = False
    eval_batch_size: int = Field(512, ge=1)
    evaluate_every: int = Field(1, ge=1)  # central evaluation every this many rounds (and after the last)
    # MC-dropout passes for the tail of u of the final model on the test set (summary.json); 0: not computed
    final_uncertainty: int = Field(0, ge=0)
    # extra client steps on top of the strategy's and the rule's, comma-separated (e.g. "ufl-dropout")
    client_steps: str = ""
    # fault injection (the methods' own tables are added by Settings below)
    faults: FaultSettings = FaultSettings()

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str, info: ValidationInfo) -> str:
        return _check_name(value, _catalog(info).strategies, "strategy")

    @field_validator("aggregation")
    @classmethod
    def _known_rule(cls, value: str, info: ValidationInfo) -> str:
        return value and _check_name(value, _catalog(info).rules, "aggregation rule")

    @field_validator("client_steps")
    @classmethod
    def _known_steps(cls, value: str, info: ValidationInfo) -> str:
        accepted = _catalog(info).steps
        unknown = [name for name in comma_list(value) if accepted is not None and name not in accepted]
        if unknown:
            raise ValueError(f"unknown client step(s) {unknown}; accepted: {', '.join(sorted(accepted or []))}")
        return value

    @field_validator("tracking")
    @classmethod
    def _known_trackers(cls, value: str) -> str:
        names = comma_list(value)
        unknown = [name for name in names if name not in (*TRACKERS, "none")]
        if unknown or not names or ("none" in names and len(names) > 1) or len(set(names)) < len(names):
            problem = f"unknown tracker {', '.join(map(repr, unknown))}" if unknown else "not a choice of trackers"
            both = ",".join(TRACKERS)
            raise ValueError(f"{problem}; accepted: none, {', '.join(TRACKERS)}, or both comma-separated ({both})")
        return value

    @field_validator("server_data")
    @classmethod
    def _known_server_data(cls, value: str, info: ValidationInfo) -> str:
        check = _catalog(info).dataset
        if value in ("", "id") or check is None:
            return value
        try:
            return check(value)
        except ValueError as err:  # the dataset check names "dataset"; say it of server-data instead
            text = str(err)
            reason = text.split(": ", 1)[1] if text.startswith("invalid setting dataset") else text
            reason, _, datasets = reason.partition("; accepted: ")
            raise ValueError(
                f"{reason}; accepted: '' (none), 'id' (held out of the test split), or a dataset ({datasets})"
            ) from None

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str, info: ValidationInfo) -> str:
        models = _catalog(info).models
        return _check_name(value, None if models is None else list(models), "model")

    @field_validator("model_hidden")
    @classmethod
    def _layer_sizes(cls, value: str) -> str:
        hidden_sizes(value)
        return value

    @field_validator("normalization_mean", "normalization_std")
    @classmethod
    def _channel_values(cls, value: str, info: ValidationInfo) -> str:
        channel_values(value, positive=info.field_name == "normalization_std")
        return value

    @model_validator(mode="after")
    def _statistics_in_pairs(self) -> Settings:
        if bool(self.normalization_mean) != bool(self.normalization_std):
            given = "normalization-mean" if self.normalization_mean else "normalization-std"
            missing = "normalization-std" if self.normalization_mean else "normalization-mean"
            raise ValueError(f"{given} is set but {missing} is not; accepted: both (one value per channel) or neither")
        if self.normalization_mean and self.normalization == "feature":
            raise ValueError(
                f"normalization-mean = {self.normalization_mean!r} gives channel statistics, but normalization = "
                "'feature' standardises every pixel; accepted: normalization = 'channel' with them, or neither set"
            )
        if len(channel_values(self.normalization_mean)) != len(channel_values(self.normalization_std)):
            raise ValueError(
                f"normalization-mean = {self.normalization_mean!r} and normalization-std = "
                f"{self.normalization_std!r} have different lengths; accepted: one value per channel in each"
            )
        return self

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str, info: ValidationInfo) -> str:
        check = _catalog(info).dataset
        return check(value) if check is not None else value

    @model_validator(mode="after")
    def _options_the_model_has(self, info: ValidationInfo) -> Settings:
        models = _catalog(info).models
        if models is None or self.model not in models:
            return self
        refused = [option for option in self.model_options() if option not in models[self.model]]
        if refused:
            offered = [f"model-{dashed(option)}" for option in models[self.model]]
            raise ValueError(
                f"model = {self.model!r} has no option {', '.join(f'model-{dashed(o)}' for o in refused)}; "
                f"accepted for this model: {', '.join(offered) or 'none'}"
            )
        return self

    @model_validator(mode="after")
    def _weights_need_pretrained(self) -> Settings:
        if self.model_weights and not self.model_pretrained:
            raise ValueError(
                f"model-weights = {self.model_weights!r} is only read with model-pretrained = true; "
                "accepted: model-pretrained = true, or model-weights = ''"
            )
        return self

    def model_options(self) -> dict[str, Any]:
        """The model options this run sets (those left at their defaults are not listed)."""
        options: dict[str, Any] = {}
        if self.model_width:
            options["width"] = self.model_width
        if self.model_hidden:
            options["hidden"] = hidden_sizes(self.model_hidden)
        if self.model_dropout:
            options["dropout"] = self.model_dropout
        if self.model_pretrained:
            options["pretrained"] = True
        if self.model_weights:
            options["weights"] = self.model_weights
        if self.model_input_size:
            options["input_size"] = self.model_input_size
        return options

    @property
    def tracker_names(self) -> tuple[str, ...]:
        """The trackers ``tracking`` names, in :data:`TRACKERS` order (empty for ``none``)."""
        names = comma_list(self.tracking)
        return tuple(name for name in TRACKERS if name in names)

    @property
    def lora_target_names(self) -> tuple[str, ...]:
        """``lora-targets`` as a tuple of module names (empty: the model's own)."""
        return tuple(comma_list(self.lora_targets))

    @property
    def channel_statistics(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """``normalization-mean`` and ``normalization-std`` as floats; None when they are not set."""
        if not self.normalization_mean:
            return None
        return channel_values(self.normalization_mean), channel_values(self.normalization_std)

    @property
    def data_seed(self) -> int:
        """The seed of the data split: ``partition-seed``, or the run's seed when that is -1."""
        return self.seed if self.partition_seed < 0 else self.partition_seed


def python_name(table: str) -> str:
    """A run-config table's name as a :class:`Settings` field (``fedma-simplified`` -> ``fedma_simplified``)."""
    return table.replace("-", "_")


_clashes = [table for table in OPTION_TABLES if python_name(table) in RunSettings.model_fields]
if _clashes:  # a method's table named like a run setting would replace it
    raise DeclarationError(
        f"option tables {_clashes} ({', '.join(where('option table', t) for t in _clashes)}) are named like run "
        "settings; accepted: a name that is not a setting of RunSettings"
    )

Settings = create_model(  # type: ignore[call-overload]
    "Settings",
    __base__=RunSettings,
    __module__=__name__,
    __doc__="Every setting of a run, with every method's table (``settings.fedoui``); docs/guide.md (Settings).",
    **{python_name(table): (model, model()) for table, model in OPTION_TABLES.items()},
)
"""Every setting of a run: :class:`RunSettings` and each method's options table
(:data:`fedweigh.methods.catalog.OPTION_TABLES`) as a field of the same name."""


def hidden_sizes(value: str) -> tuple[int, ...]:
    """``"128, 128"`` to ``(128, 128)``; the empty string to ``()``.

    >>> hidden_sizes("64,128"), hidden_sizes("")
    ((64, 128), ())
    """
    parts = [part.strip() for part in value.split(",") if part.strip()]
    try:
        sizes = tuple(int(part) for part in parts)
    except ValueError:
        sizes = ()
        parts = ["?"]
    if len(sizes) != len(parts) or any(size < 1 for size in sizes):
        raise ValueError('accepted: comma-separated positive layer sizes, e.g. "128,128"')
    return sizes


def channel_values(value: str, *, positive: bool = False) -> tuple[float, ...]:
    """``"0.49, 0.48, 0.45"`` to a tuple of finite floats (positive ones if asked); ``""`` to ``()``.

    >>> channel_values("0.2023,0.1994,0.2010", positive=True)
    (0.2023, 0.1994, 0.201)
    """
    parts = [part.strip() for part in value.split(",")] if value.strip() else []
    try:
        numbers = tuple(float(part) for part in parts)
    except ValueError:
        numbers = (math.nan,)
    if any(not math.isfinite(x) or (positive and x <= 0) for x in numbers):
        kind = "positive numbers" if positive else "numbers"
        raise ValueError(f'accepted: comma-separated finite {kind}, one per channel, e.g. "0.49,0.48,0.45"')
    return numbers


class SettingsError(ValueError):
    """A run config that cannot be used; the message lists every problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid run config:\n" + "\n".join(f"  - {problem}" for problem in self.problems))


def setting_names() -> list[str]:
    """Every run-config key, dotted for the tables (``fedprox.proximal-mu``)."""
    names = []
    for name, field in Settings.model_fields.items():
        table = field.annotation
        if isinstance(table, type) and issubclass(table, OptionsTable):
            names += [f"{dashed(name)}.{dashed(key)}" for key in table.model_fields]
        else:
            names.append(dashed(name))
    return names


def _accepted_keys(key: str) -> str:
    close = difflib.get_close_matches(key, setting_names(), n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"accepted: the keys of the app's [tool.flwr.app.config] (docs/guide.md: Settings){hint}"


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


def _leaves(name: str, value: Any) -> list[tuple[str, Any]]:
    if not isinstance(value, Mapping):
        return [(name, value)]
    return [leaf for key, item in value.items() for leaf in _leaves(f"{name}.{key}", item)]


def _nest(flat: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Flower's dotted keys back into tables, and the keys that cannot be placed in them."""
    keys = {str(key) for key in flat}
    tables = {name.split(".")[0] for name in setting_names() if "." in name}
    nested: dict[str, Any] = {}
    problems = []
    for key, value in flat.items():
        name, shown = str(key), _shown(value)
        parts = name.split(".")
        blocked = [prefix for prefix in (".".join(parts[:end]) for end in range(1, len(parts))) if prefix in keys]
        if not all(parts):
            problems.append(f"{name!r} = {shown}: not a setting name (empty between dots); {_accepted_keys(name)}")
        elif blocked and blocked[0] not in tables:
            problems.append(f"{name} = {shown}: unknown setting ({blocked[0]} is not a table); {_accepted_keys(name)}")
        elif name in tables and not isinstance(value, Mapping):
            problems.append(f"{name} = {shown}: {name} is a table; accepted: its keys one by one ({name}.<key> = ...)")
        else:
            node = nested
            for table in parts[:-1]:
                node = node.setdefault(table, {})
            if isinstance(value, Mapping):
                node.setdefault(parts[-1], {}).update(value)
            else:
                node[parts[-1]] = value
    return nested, problems


def flatten(tables: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables to Flower's flat run-config keys (``fedoui.window``): what :func:`nest` undoes.

    >>> flatten({"seed": 1, "fedoui": {"window": 5}})
    {'seed': 1, 'fedoui.window': 5}
    """
    flat: dict[str, Any] = {}
    for key, value in tables.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten(value, full))
        else:
            flat[full] = value
    return flat


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Turn Flower's dotted keys (``fedprox.proximal-mu``) back into tables."""
    nested, problems = _nest(flat)
    if problems:
        raise SettingsError(problems)
    return nested


def _lookup(nested: Mapping[str, Any], location: tuple[Any, ...]) -> Any:
    node: Any = nested
    for part in location:
        if not isinstance(node, Mapping) or part not in node:
            return "<missing>"
        node = node[part]
    return node


def validate(run_config: Mapping[str, Any], catalog: Catalog | None = None) -> Settings:
    """Validate a Flower run config and return typed :class:`Settings`.

    Parameters
    ----------
    run_config : Mapping
        Flat run config (dotted keys for tables).
    catalog : Catalog, optional
        Accepted names; without one, names are not checked.

    Raises
    ------
    SettingsError
        Listing, for each bad entry, the setting, the value given and what is
        accepted. Unknown settings are reported the same way.
    """
    nested, lines = _nest(run_config)
    try:
        settings = Settings.model_validate(nested, context={"catalog": catalog or Catalog()})
    except ValidationError as err:
        for problem in err.errors():
            location = tuple(problem["loc"])
            name = ".".join(str(part) for part in location)
            message = problem["msg"].removeprefix("Value error, ")
            if problem["type"] == "extra_forbidden":  # named as written: a table's dotted keys one by one
                for key, value in _leaves(name, _lookup(nested, location)):
                    lines.append(f"{key} = {_shown(value)}: unknown setting; {_accepted_keys(key)}")
                continue
            if problem["type"] == "int_parsing_size":  # a string of thousands of digits
                message = INT64_ACCEPTED
            if not location:  # a check across settings names them itself
                lines.append(message)
                continue
            lines.append(f"{name} = {_shown(_lookup(nested, location))}: {message}")
        raise SettingsError(lines) from None
    if lines:
        raise SettingsError(lines)
    return settings
