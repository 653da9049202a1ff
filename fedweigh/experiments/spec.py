"""The experiment file: a base run config, arms, seeds, and the paper's numbers.

An experiment file is TOML::

    [experiment]
    name = "fedoui-cifar10-pilot"        # folder name of the results
    description = "FedOUI vs FedAvg ..."
    seeds = [1, 2, 3]
    num-supernodes = 20                  # simulated clients (partitions)
    cpus-per-client = 1                  # Ray resources per client
    paper-source = "FedOUI, 20-round pilot"
    reference-arm = "fedavg"             # optional: paired differences against this arm
    paired-comparisons = [["fedoui-window5", "fedavg"]]  # optional: more paired tables, arm − other

    [base]                               # run-config overrides shared by every arm
    dataset = "../shared/datasets/cifar10"
    num-server-rounds = 20

    [[arms]]
    name = "fedavg"                      # run folders are <arm>-seed<k>
    strategy = "fedavg"
    paper = { final = "0.164 ± 0.002", auc = "0.132 ± 0.013" }

    [[arms]]
    name = "fedoui-window5"
    strategy = "fedoui"
    [arms.overrides]                     # run-config overrides of this arm only
    fedoui.window = 5

:func:`load_experiment` checks all of it before anything runs: unknown keys
at any level, unknown strategies, run-config keys the app does not define,
keys the runner sets itself, and every arm's merged run config through
:func:`fedweigh.preflight.check_run`. One :class:`ExperimentError` lists
every problem, each naming the arm and the setting.

Example
-------
>>> spec = ExperimentSpec.model_validate({
...     "experiment": {"name": "demo", "seeds": [1, 2]},
...     "arms": [{"name": "fedavg", "strategy": "fedavg", "paper": {"final": "0.21 ± 0.02"}}],
... })
>>> spec.experiment.seeds, spec.arms[0].paper["final"]
([1, 2], Reported(mean=0.21, std=0.02))
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from fedweigh.settings import flatten

__all__ = [
    "RESERVED_KEYS",
    "SCORE_NAMES",
    "ArmSpec",
    "Experiment",
    "ExperimentError",
    "ExperimentSection",
    "ExperimentSpec",
    "Reported",
    "load_experiment",
    "parse_reported",
]

SCORE_NAMES = ("final", "best", "mean", "auc", "last", "late-max")
"""The per-run accuracy scores a paper's numbers can be given for (see :mod:`.report`)."""

RESERVED_KEYS = ("strategy", "seed", "output-dir", "run-name", "resume-from", "num-supernodes")
"""Run-config keys the runner sets itself; an experiment file may not set them in ``[base]`` or ``overrides``."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_PLUS_MINUS = re.compile(r"^\s*([-+0-9.eE]+)\s*(?:±|\+-|\+/-)\s*([-+0-9.eE]+)\s*$")


class ExperimentError(ValueError):
    """An experiment file that cannot be run; the message lists every problem."""


class Reported(NamedTuple):
    """A number a paper reports: mean and, when given, standard deviation."""

    mean: float
    std: float | None = None

    def __str__(self) -> str:
        return f"{self.mean:.4f}" if self.std is None else f"{self.mean:.4f} ± {self.std:.4f}"


def parse_reported(value: Any) -> Reported:
    """Read a reported number: ``0.234``, ``"0.234 ± 0.063"`` (or ``+-``, ``+/-``), ``{mean, std}``.

    Examples
    --------
    >>> parse_reported("0.2343 ± 0.0631")
    Reported(mean=0.2343, std=0.0631)
    >>> parse_reported({"mean": 0.9, "std": 0.01}), parse_reported(0.5)
    (Reported(mean=0.9, std=0.01), Reported(mean=0.5, std=None))
    """
    accepted = "accepted: a number, 'mean ± std' (or 'mean +- std'), or a table {mean = .., std = ..}"
    if isinstance(value, Reported):
        return value
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number; {accepted}")
    if isinstance(value, int | float):
        return Reported(float(value))
    if isinstance(value, str):
        match = _PLUS_MINUS.match(value)
        try:
            if match:
                return Reported(float(match.group(1)), float(match.group(2)))
            return Reported(float(value))
        except ValueError:
            pass
        raise ValueError(f"cannot read {value!r}; {accepted}")
    if isinstance(value, Mapping) and set(value) <= {"mean", "std"} and "mean" in value:
        std = value.get("std")
        try:
            return Reported(parse_reported(value["mean"]).mean, None if std is None else parse_reported(std).mean)
        except ValueError:
            pass
    raise ValueError(f"cannot read {value!r}; {accepted}")


def _dashed(name: str) -> str:
    return name.replace("_", "-")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=_dashed, populate_by_name=True, frozen=True)


def _check_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError("must start with a letter or digit and hold only letters, digits, '_', '.' and '-'")
    return value


RunName = Annotated[str, AfterValidator(_check_name)]
ReportedNumber = Annotated[Reported, BeforeValidator(parse_reported)]


class ExperimentSection(_Strict):
    """``[experiment]``: what the comparison is called, its seeds and federation."""

    name: RunName
    description: str = ""
    seeds: list[int] = Field(min_length=1)
    num_supernodes: int = Field(10, ge=1)
    cpus_per_client: int = Field(1, ge=1)
    gpus_per_client: float = Field(0.0, ge=0.0)
    paper_source: str = ""
    reference_arm: str = ""  # "": no paired table; else the arm every other arm is compared with, seed by seed
    paired_comparisons: list[tuple[RunName, RunName]] = Field(default_factory=list)  # (arm, other): arm − other

    @field_validator("paired_comparisons")
    @classmethod
    def _two_arms_each(cls, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        if any(arm == other for arm, other in pairs) or len(set(pairs)) != len(pairs):
            raise ValueError("each pair must name two different arms, each pair once")
        return pairs

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int]) -> list[int]:
        if any(seed < 0 for seed in seeds) or len(set(seeds)) != len(seeds):
            raise ValueError("seeds must be distinct integers >= 0")
        return seeds


class ArmSpec(_Strict):
    """One ``[[arms]]`` entry: a strategy, its overrides and the paper's numbers for it."""

    name: RunName
    strategy: str
    description: str = ""
    overrides: dict[str, Any] = Field(default_factory=dict)
    paper: dict[Literal["final", "best", "mean", "auc", "last", "late-max"], ReportedNumber] = Field(
        default_factory=dict
    )


class ExperimentSpec(_Strict):
    """The whole experiment file."""

    experiment: ExperimentSection
    base: dict[str, Any] = Field(default_factory=dict)
    arms: list[ArmSpec] = Field(min_length=1)

    @field_validator("arms")
    @classmethod
    def _distinct_arms(cls, arms: list[ArmSpec]) -> list[ArmSpec]:
        names = [arm.name for arm in arms]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"arm names must be distinct; repeated: {', '.join(repeated)}")
        return arms


@dataclass(frozen=True)
class Experiment:
    """A validated experiment: the file's content plus each arm's merged run config.

    Attributes
    ----------
    spec : ExperimentSpec
        The file, with command-line overrides (seeds, rounds) applied.
    path : Path | None
        Where it was read from.
    arm_configs : dict[str, dict[str, Any]]
        Arm name to its flat run-config overrides: ``[base]``, then the
        arm's ``overrides``, then ``strategy`` (seed, output dir and run name
        are added per run by :mod:`fedweigh.experiments.grid`).
    settings : dict[str, Any]
        Values set for every run on the command line (``--set``), already in
        ``arm_configs``; kept to say so in the report.
    """

    spec: ExperimentSpec
    path: Path | None
    arm_configs: dict[str, dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.experiment.name

    @property
    def seeds(self) -> list[int]:
        return list(self.spec.experiment.seeds)

    @property
    def arms(self) -> list[ArmSpec]:
        return list(self.spec.arms)

    def rounds(self, arm: str, app_defaults: Mapping[str, Any]) -> int:
        """Number of rounds an arm's runs are asked for."""
        return int(self.arm_configs[arm].get("num-server-rounds", app_defaults["num-server-rounds"]))


def _describe_location(location: tuple[Any, ...], raw: Mapping[str, Any]) -> str:
    """``arms.1.strategy`` -> ``arm 'fedoui': strategy`` where the arm has a name."""
    # a key that is not a plain name (a newline, a space, nothing) is quoted, so that the message stays one line
    parts = [part if _KEY.match(part) else repr(part) for part in (str(p) for p in location if p != "[key]")]
    if len(parts) >= 2 and parts[0] == "arms" and parts[1].isdigit():
        arms = raw.get("arms")
        index = int(parts[1])
        arm = arms[index] if isinstance(arms, list) and index < len(arms) else None
        name = arm.get("name") if isinstance(arm, Mapping) else None
        label = f"arm {name!r}" if isinstance(name, str) else f"arm #{index + 1}"
        rest = ".".join(parts[2:])
        return f"{label}: {rest}" if rest else label
    return ".".join(parts)


def _accepted_keys(key: str, app_defaults: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(app_defaults), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"accepted: the keys of the app's [tool.flwr.app.config] (docs/guide.md: Settings){hint}"


def _schema_problems(err: ValidationError, raw: Mapping[str, Any]) -> list[str]:
    problems = []
    for problem in err.errors():
        where = _describe_location(tuple(problem["loc"]), raw)
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            table = {"experiment": ExperimentSection, "arms": ArmSpec}.get(str(problem["loc"][0]), ExperimentSpec)
            if len(problem["loc"]) == 1:
                table = ExperimentSpec
            keys = ", ".join(_dashed(name) for name in table.model_fields)
            message = f"unknown key; accepted: {keys} (docs/experiments.md)"
        if problem["type"] == "missing":
            message = "required key missing"
        given = problem.get("input")
        scalar = isinstance(given, str | int | float | bool) or (isinstance(given, list) and len(given) <= 10)
        shown = f" = {given!r}" if scalar and problem["type"] != "missing" else ""
        problems.append(f"{where}{shown}: {message}")
    return problems


def _config_problems(
    spec: ExperimentSpec, app_defaults: Mapping[str, Any], rounds: int | None
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Check the run-config part of every arm; return the problems and the merged configs."""
    from fedweigh.methods.registry import METHODS
    from fedweigh.preflight import check_run
    from fedweigh.settings import SettingsError

    problems: list[str] = []
    base = flatten(spec.base)
    for key in sorted(base):
        if key in RESERVED_KEYS:
            problems.append(f"base: {key} is set by the experiment runner (use [[arms]] strategy / [experiment] seeds)")
        elif key not in app_defaults:
            problems.append(f"base: unknown run-config key {key!r}; {_accepted_keys(key, app_defaults)}")
    configs: dict[str, dict[str, Any]] = {}
    known_strategies = sorted(METHODS)
    for arm in spec.arms:
        label = f"arm {arm.name!r}"
        if arm.strategy not in known_strategies:
            problems.append(f"{label}: strategy = {arm.strategy!r}: unknown; accepted: {', '.join(known_strategies)}")
            continue
        overrides = flatten(arm.overrides)
        bad = False
        for key in sorted(overrides):
            if key in RESERVED_KEYS:
                problems.append(f"{label}: overrides.{key} is set by the experiment runner")
                bad = True
            elif key not in app_defaults:
                problems.append(
                    f"{label}: overrides: unknown run-config key {key!r}; {_accepted_keys(key, app_defaults)}"
                )
                bad = True
        merged = {k: v for k, v in {**base, **overrides}.items() if k in app_defaults and k not in RESERVED_KEYS}
        merged["strategy"] = arm.strategy
        if rounds is not None:
            merged["num-server-rounds"] = rounds
        configs[arm.name] = merged
        if bad:
            continue
        try:
            check_run({**app_defaults, **merged, "seed": spec.experiment.seeds[0]})
        except SettingsError as err:
            problems.extend(f"{label}: {problem}" for problem in err.problems)
        except ValueError as err:
            problems.append(f"{label}: {err}")
    return problems, configs


def load_experiment(
    source: str | Path | Mapping[str, Any],
    app_defaults: Mapping[str, Any],
    *,
    seeds: list[int] | None = None,
    rounds: int | None = None,
    settings: Mapping[str, Any] | None = None,
    arms: list[str] | None = None,
) -> Experiment:
    """Read and check an experiment file (or its parsed content).

    Parameters
    ----------
    source : str | Path | Mapping
        Path of a TOML file, or the already parsed table.
    app_defaults : Mapping[str, Any]
        The app's flat ``[tool.flwr.app.config]`` (:func:`fedweigh.launch.load_app_config`):
        the run-config keys that exist and their defaults.
    seeds : list[int], optional
        Replace the file's seeds (``--seeds``).
    rounds : int, optional
        Replace every arm's ``num-server-rounds`` (``--rounds``, for a quick look).
    settings : Mapping, optional
        Run-config values set for every run (``--set KEY=VALUE``): they replace
        ``[base]`` and any arm's override of the same key, and are checked like
        the file's own.
    arms : list[str], optional
        Keep only these arms (``--arms``), e.g. to add seeds to the main arms
        of a grid; the report then covers the arms kept.

    Raises
    ------
    ExperimentError
        Listing every problem of the file, each naming the arm and the setting.
    """
    path: Path | None = None
    if isinstance(source, Mapping):
        raw = dict(source)
    else:
        path = Path(source)
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ExperimentError(f"experiment file {path} does not exist") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise ExperimentError(
                f"experiment file {path} is not valid TOML: {err}; accepted: a UTF-8 TOML file (docs/experiments.md)"
            ) from None
        except OSError as err:  # a folder, no permission, ...
            raise ExperimentError(f"experiment file {path} cannot be read: {err.strerror or err}") from None
    label = str(path) if path else "experiment"
    if seeds is not None:
        raw.setdefault("experiment", {})
        if isinstance(raw["experiment"], Mapping):
            raw["experiment"] = {**raw["experiment"], "seeds": list(seeds)}
    if settings:
        unknown = [f"{key}={value!r}" for key, value in settings.items() if key not in app_defaults]
        if unknown:
            raise ExperimentError(
                f"--set {', '.join(unknown)}: unknown run-config key; accepted: the keys of the app's "
                "[tool.flwr.app.config] (docs/guide.md: Settings)"
            )
        raw["base"] = {**raw.get("base", {}), **settings} if isinstance(raw.get("base", {}), Mapping) else raw["base"]
        if isinstance(raw.get("arms"), list):
            raw["arms"] = [
                {**arm, "overrides": {**arm["overrides"], **settings}}
                if isinstance(arm, Mapping) and isinstance(arm.get("overrides"), Mapping)
                else arm
                for arm in raw["arms"]
            ]
    listed = raw.get("arms") if isinstance(raw.get("arms"), list) else []
    file_arms = [arm.get("name") for arm in listed if isinstance(arm, Mapping)]
    if arms is not None and isinstance(raw.get("arms"), list):
        unknown = [name for name in arms if name not in file_arms]
        if unknown or not arms:
            raise ExperimentError(
                f"{label}: --arms = {','.join(arms)!r}: unknown arm(s) {', '.join(unknown) or '(none given)'}; "
                f"accepted: comma-separated names of the file's arms: {', '.join(map(str, file_arms))}"
            )
        raw["arms"] = [arm for arm in raw["arms"] if isinstance(arm, Mapping) and arm.get("name") in arms]
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1):
        raise ExperimentError(f"{label}: --rounds = {rounds!r}: accepted: an integer >= 1")
    try:
        spec = ExperimentSpec.model_validate(raw)
    except ValidationError as err:
        lines = "\n".join(f"  - {problem}" for problem in _schema_problems(err, raw))
        raise ExperimentError(f"invalid experiment file {label}:\n{lines}") from None
    problems, configs = _config_problems(spec, app_defaults, rounds)
    reference = spec.experiment.reference_arm
    if reference and reference not in file_arms:  # checked against the whole file, so --arms may leave it out
        problems.insert(
            0,
            f'experiment: reference-arm = {reference!r}: not an arm of the file; accepted: "" (no paired table) '
            f"or one of {', '.join(map(str, file_arms))}",
        )
    for arm, other in spec.experiment.paired_comparisons:  # against the whole file too
        unknown = [name for name in (arm, other) if name not in file_arms]
        if unknown:
            problems.insert(
                0,
                f"experiment: paired-comparisons = [{arm!r}, {other!r}]: {', '.join(map(repr, unknown))} not an arm "
                f"of the file; accepted: pairs of {', '.join(map(str, file_arms))}",
            )
    if problems:
        lines = "\n".join(f"  - {problem}" for problem in problems)
        raise ExperimentError(f"invalid experiment file {label}:\n{lines}")
    return Experiment(spec=spec, path=path, arm_configs=configs, settings=dict(settings or {}))
