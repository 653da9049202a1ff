"""Typed run settings: the run config of ``pyproject.toml`` plus ``--run-config``.

Flower hands both apps a flat ``UserConfig`` whose nested tables arrive with
dotted keys (``fedprox.proximal-mu``). :func:`parse_settings` turns it into a
:class:`Settings` object and fails *before any training* with one message that
names every bad setting, its value and what is accepted.

Example
-------
>>> settings = parse_settings({"strategy": "fedprox", "dirichlet-alpha": 0.1})
>>> settings.strategy, settings.dirichlet_alpha
('fedprox', 0.1)
>>> parse_settings({"dirichlet-alpha": 0})
Traceback (most recent call last):
...
fedweigh.settings.SettingsError: invalid run config:
  - dirichlet-alpha = 0: Input should be greater than 0
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fedweigh.data.sources import validate_dataset_setting
from fedweigh.models import model_names


def _dashed(name: str) -> str:
    return name.replace("_", "-")


class _Section(BaseModel):
    """Base of every settings table: dashed keys, unknown keys rejected."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=_dashed,
        populate_by_name=True,
        frozen=True,
    )


class FedProxSettings(_Section):
    """``[tool.flwr.app.config.fedprox]``: the proximal term of FedProx."""

    proximal_mu: float = Field(0.01, ge=0.0)


class FedAslSettings(_Section):
    """``[tool.flwr.app.config.fedasl]``: FedAsl's loss-deviation weights (FedNolowe's baseline).

    ``alpha``: half-width of the good region around the median loss, in
    standard deviations; ``beta``: the distance given to clients inside it.
    Defaults are those of the FedNolowe paper's code.
    """

    alpha: float = Field(0.5, ge=0.0, allow_inf_nan=False)
    beta: float = Field(0.2, gt=0.0, allow_inf_nan=False)


class FedOUISettings(_Section):
    """``[tool.flwr.app.config.fedoui]``: FedOUI's rule and OUI probe (see :mod:`fedweigh.strategies.fedoui`)."""

    epsilon: float = Field(1e-3, ge=0.0, lt=0.5)  # stability constant and Beta-fit clip
    size_exponent: float = Field(1.0, ge=0.0)  # rho in w ∝ n^rho (s + eps)^gamma
    score_exponent: float = Field(1.0, ge=0.0)  # gamma
    window: int = Field(1, ge=1)  # rounds of OUIs pooled into the Beta fit (1: this round only)
    probe_size: int = Field(32, ge=2)  # B, probe samples per client
    probe_layer: str = ""  # module to hook; "" means the model's own probe_layer


class FedAlignSettings(_Section):
    """``[tool.flwr.app.config.fedalign]``: the cosine-alignment baseline of the FedOUI paper."""

    epsilon: float = Field(1e-3, ge=0.0)
    size_exponent: float = Field(1.0, ge=0.0)  # rho in w ∝ n^rho (max(0, cos) + eps)^eta
    alignment_exponent: float = Field(1.0, ge=0.0)  # eta


class UFLSettings(_Section):
    """``[tool.flwr.app.config.ufl]``: UFL's client step and U-Agg (see :mod:`fedweigh.strategies.ufl`)."""

    mc_passes: int = Field(10, ge=1)  # N, MC-dropout forward passes
    ratio: float = Field(0.3, gt=0.0, le=1.0)  # r, fraction of samples up-weighted
    alpha: float = Field(0.2, ge=0.0, allow_inf_nan=False)  # lambda = 1 + alpha * u for the selected
    dropout: float = Field(0.5, ge=0.0, lt=1.0)  # p of the dropout inserted before the classifier
    normalize: bool = False  # batch loss / sum(lambda) instead of / B (the paper)
    aggregation_signal: Literal["sum", "mean"] = "sum"  # U-Agg on U_k (paper) or U_k / m_k
    size_aware: bool = False  # U-Agg weights times n_k
    cheap_path: bool = True  # run only the layers after the first dropout N times


class Settings(_Section):
    """Every setting of a run; see the README for what each one does."""

    # run
    strategy: str = "fedavg"
    seed: int = Field(1, ge=0)
    num_server_rounds: int = Field(5, ge=1)
    fraction_train: float = Field(0.5, gt=0.0, le=1.0)
    min_train_nodes: int = Field(2, ge=1)
    fraction_evaluate: float = Field(0.0, ge=0.0, le=1.0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    output_dir: str = "outputs"
    run_name: str = ""
    resume_from: str = ""
    # data
    dataset: str = "digits"
    partitioner: Literal["iid", "dirichlet", "pathological", "shard"] = "dirichlet"
    dirichlet_alpha: float = Field(0.5, gt=0.0)
    classes_per_client: int = Field(2, ge=1)
    shards_per_client: int = Field(2, ge=1)
    min_partition_size: int = Field(0, ge=0)
    train_subset: int = Field(0, ge=0)
    test_subset: int = Field(0, ge=0)
    augment: bool = True
    rare_clients: float = Field(0.0, ge=0.0, lt=1.0)  # fraction of clients capped at rare-client-cap samples
    rare_client_cap: int = Field(120, ge=1)
    noisy_clients: float = Field(0.0, ge=0.0, le=1.0)  # fraction of clients with symmetric label flips
    label_noise: float = Field(0.4, ge=0.0, le=1.0)  # share of a noisy client's labels flipped
    # model
    model: str = "mlp"
    # local training recipe
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    learning_rate: float = Field(0.05, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    # keep each client's SGD momentum between the rounds it trains in (FedNolowe's code; spec A12)
    persist_optimizer_state: bool = False
    eval_batch_size: int = Field(512, ge=1)
    # extra client steps on top of the strategy's own, comma-separated (e.g. "ufl-dropout", "ufl")
    client_steps: str = ""
    # per-method tables
    fedprox: FedProxSettings = FedProxSettings()
    ufl: UFLSettings = UFLSettings()
    fedasl: FedAslSettings = FedAslSettings()
    fedoui: FedOUISettings = FedOUISettings()
    fedalign: FedAlignSettings = FedAlignSettings()

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        from fedweigh.strategies import strategy_names  # the registry imports us

        if value not in strategy_names():
            raise ValueError(f"unknown strategy; accepted: {', '.join(strategy_names())}")
        return value

    @field_validator("client_steps")
    @classmethod
    def _known_steps(cls, value: str) -> str:
        from fedweigh.client.steps import CLIENT_STEPS  # filled when fedweigh.strategies is imported
        from fedweigh.strategies import strategy_names  # noqa: F401  (imports every paper module)

        unknown = [name for name in step_names(value) if name not in CLIENT_STEPS]
        if unknown:
            raise ValueError(f"unknown client step(s) {unknown}; accepted: {', '.join(sorted(CLIENT_STEPS))}")
        return value

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in model_names():
            raise ValueError(f"unknown model; accepted: {', '.join(model_names())}")
        return value

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        try:
            return validate_dataset_setting(value)
        except ValueError as err:
            raise ValueError(str(err)) from None


def step_names(value: str) -> list[str]:
    """``"ufl, oui"`` to ``["ufl", "oui"]``."""
    return [name.strip() for name in value.split(",") if name.strip()]


class SettingsError(ValueError):
    """A run config that cannot be used; the message lists every problem."""


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Turn Flower's dotted keys (``fedprox.proximal-mu``) back into tables."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *tables, leaf = key.split(".")
        node = nested
        for table in tables:
            node = node.setdefault(table, {})
            if not isinstance(node, dict):
                raise SettingsError(f"invalid run config:\n  - {key}: {table} is not a table")
        node[leaf] = value
    return nested


def _lookup(nested: Mapping[str, Any], location: tuple[Any, ...]) -> Any:
    node: Any = nested
    for part in location:
        if not isinstance(node, Mapping) or part not in node:
            return "<missing>"
        node = node[part]
    return node


def parse_settings(run_config: Mapping[str, Any]) -> Settings:
    """Validate a Flower run config and return typed :class:`Settings`.

    Raises
    ------
    SettingsError
        Listing, for each bad entry, the setting, the value given and what is
        accepted. Unknown settings are reported the same way.
    """
    nested = _nest(run_config)
    try:
        return Settings.model_validate(nested)
    except ValidationError as err:
        lines = []
        for problem in err.errors():
            location = tuple(problem["loc"])
            name = ".".join(str(part) for part in location)
            value = _lookup(nested, location)
            message = problem["msg"].removeprefix("Value error, ")
            if problem["type"] == "extra_forbidden":
                message = "unknown setting"
            lines.append(f"  - {name} = {value!r}: {message}")
        raise SettingsError("invalid run config:\n" + "\n".join(lines)) from None
