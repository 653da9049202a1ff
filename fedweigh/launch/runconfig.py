"""Run-config values: the app's defaults, ``--run-config`` text, paths and run names.

Pure functions over the run config a ``flwr run`` submits: reading the app's
``[tool.flwr.app.config]`` defaults (:func:`load_app_config`), parsing
``--run-config`` arguments as ``flwr run`` does (:func:`parse_run_config`),
writing them back as TOML values (:func:`build_run_config_arg`), and
preparing a run's overrides: absolute paths, a fresh run name
(:func:`prepare_run_config`).

Example
-------
>>> parse_run_config(["strategy=fedoui seed=3 fedprox.proximal-mu=0.1"])
{'strategy': 'fedoui', 'seed': 3, 'fedprox.proximal-mu': 0.1}
>>> build_run_config_arg({"dataset": "../data/cifar10", "seed": 3})
"dataset='../data/cifar10' seed=3"
"""

from __future__ import annotations

import difflib
import math
import os
import re
import reprlib
import tomllib
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedweigh.run_folder import recorded_settings
from fedweigh.settings import flatten

# Run-config keys holding local paths that are made absolute when they exist
# relative to the current working directory (the apps run in other cwds).
PATH_KEYS_IF_EXISTING = ("dataset", "resume-from")
# Run-config keys naming folders a run writes into, made absolute when given (as output-dir always is).
WRITTEN_PATH_KEYS = ("tensorboard-dir",)

# Characters a TOML string cannot hold as they are (a tab it can).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

# flwr.common.config.parse_config_args splits `--run-config` with this pattern.
_KV = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")


class SimulationError(RuntimeError):
    """Raised when the app, its config, a SuperLink or a run cannot be set up."""


def format_toml_value(value: Any) -> str:
    """Format a run-config value as a TOML value that ``flwr --run-config`` accepts.

    Flower splits ``--run-config`` on whitespace with the pattern
    ``key=('...'|"..."|\\S+)`` and then parses each value as TOML.  Strings are
    therefore written as TOML literal strings ``'...'`` (no escapes, safe for
    Windows paths and spaces) or, if they contain a single quote, as basic strings.
    """
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalars
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        if _CONTROL.search(value):  # TOML strings cannot hold them unescaped, and escapes need '"'
            raise ValueError(
                "run-config strings cannot contain control characters such as newlines; accepted: one line of text"
            )
        if "'" not in value:
            return f"'{value}'"
        if '"' not in value:
            return '"' + value.replace("\\", "\\\\") + '"'
        raise ValueError(
            "run-config strings cannot contain both ' and \" (a flwr limitation); accepted: a string with one kind "
            "of quote at most"
        )
    raise TypeError(
        f"unsupported run-config value type {type(value).__name__}; accepted: a string, integer, float or boolean"
    )


def build_run_config_arg(run_config: Mapping[str, Any]) -> str:
    """Build the ``"k1=v1 k2='v 2'"`` string for ``flwr run --run-config``."""
    parts = []
    for key, value in run_config.items():
        if not key or any(c.isspace() for c in key) or "=" in key:
            raise ValueError(
                f"invalid run-config key: {key!r}; accepted: a setting's name, without spaces or '=' "
                "(docs/guide.md: Settings)"
            )
        try:
            parts.append(f"{key}={format_toml_value(value)}")
        except (ValueError, TypeError) as err:  # say which setting the value belongs to
            raise ValueError(f"{key} = {reprlib.repr(value)}: {err}") from None
    return " ".join(parts)


def parse_run_config(args: Iterable[str] | None) -> dict[str, Any]:
    """Parse ``--run-config`` arguments like ``flwr run`` does, a bit more kindly.

    Accepts ``"k=v k2=v2"`` strings (values are TOML) or a single ``.toml`` file;
    keys stay flat (``fedprox.proximal-mu``).  Differences from ``flwr``: a bare word
    that is not valid TOML (``strategy=fedoui``) is taken as a string instead of
    being rejected, and leftover text (``note=a b`` -> ``b``), which ``flwr``
    silently drops, and a key given twice (``seed=1 seed=2``), of which ``flwr``
    keeps the last, raise ``ValueError``.
    """
    args = [a for a in (args or []) if a and a.strip()]
    if not args:
        return {}
    if len(args) == 1 and args[0].endswith(".toml"):
        with Path(args[0]).expanduser().open("rb") as fh:
            return flatten(tomllib.load(fh))
    out: dict[str, Any] = {}
    given: dict[str, str] = {}  # key -> the text that set it
    for arg in args:
        if arg.endswith(".toml"):
            raise ValueError("a .toml run-config file cannot be combined with k=v pairs")
        pos = 0
        for m in _KV.finditer(arg):
            junk = arg[pos : m.start()].strip()
            if junk:
                raise ValueError(
                    f"cannot parse {junk!r} in --run-config {arg!r} (quote strings with spaces: key='a b')"
                )
            pos = m.end()
            key, raw = m.group(1), m.group(2)
            if key in given:
                raise ValueError(
                    f"{key} is given twice in --run-config ({given[key]}, then {m.group(0)}); accepted: each "
                    "setting once"
                )
            given[key] = m.group(0)
            try:
                value = tomllib.loads(f"v = {raw}")["v"]
            except tomllib.TOMLDecodeError as err:
                if raw[:1] in "'\"":
                    raise ValueError(f"invalid TOML value for {key!r}: {raw}") from err
                value = raw  # lenient: bare words are strings (flwr would reject)
            if not isinstance(value, bool | int | float | str):
                value = raw  # dates, arrays: flwr run-config values are scalars
            out[key] = value
        junk = arg[pos:].strip()
        if junk:
            raise ValueError(f"cannot parse {junk!r} in --run-config {arg!r}")
    return out


def load_app_config(app_dir: Path) -> dict[str, Any]:
    """Return the flattened ``[tool.flwr.app.config]`` defaults of an app."""
    pyproject = Path(app_dir) / "pyproject.toml"
    try:
        with pyproject.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError as err:
        raise SimulationError(f"no pyproject.toml in {app_dir}") from err
    config = data.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {})
    return flatten(config)


def resolve_output_dir(value: str | os.PathLike[str] | None, cwd: Path) -> Path:
    """Absolute output dir: relative values are taken against ``cwd``."""
    raw = str(value) if value not in (None, "") else "outputs"
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = Path(cwd) / path
    return Path(os.path.normpath(path))


def resolve_dataset(value: Any, cwd: Path) -> Any:
    """Make a relative path that exists (relative to ``cwd``) absolute.

    Anything else (e.g. a dataset name like ``"digits"`` or a Hugging Face id like
    ``"uoft-cs/cifar10"`` that is not a local folder) is returned unchanged.
    """
    if not isinstance(value, str) or not value:
        return value
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path) if value.startswith("~") else value
    candidate = Path(cwd) / path
    if candidate.exists():
        return os.path.normpath(candidate)
    return value


def default_run_name(strategy: Any, now: datetime | None = None) -> str:
    """``<strategy>-<UTC timestamp>``, e.g. ``fedavg-20260101T120000Z``."""
    now = now or datetime.now(UTC)
    if now.tzinfo is not None:
        now = now.astimezone(UTC)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", str(strategy or "run")).strip("._") or "run"
    return f"{name}-{now:%Y%m%dT%H%M%SZ}"


def prepare_run_config(
    overrides: Mapping[str, Any],
    app_defaults: Mapping[str, Any],
    cwd: Path,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Return the run-config overrides to send, with paths and run name filled in.

    - unknown keys raise ``ValueError`` (Flower would only fail inside the run);
    - an int given for a float default is sent as float;
    - ``output-dir`` (if the app has it) is always sent, made absolute against
      ``cwd`` (default ``<cwd>/outputs``);
    - ``run-name`` (if the app has it) defaults to ``<strategy>-<UTC timestamp>``,
      with ``-2``, ``-3``, ... appended if that results folder already exists;
    - ``dataset``/``resume-from`` given as relative paths that exist are made absolute;
    - ``tensorboard-dir``, when given, is made absolute against ``cwd``.
    """
    cwd = Path(cwd)
    unknown = [key for key in overrides if key not in app_defaults]
    if unknown:
        raise ValueError("; ".join(unknown_key_message(key, app_defaults) for key in unknown))
    cfg: dict[str, Any] = {}
    for key, value in overrides.items():
        default = app_defaults[key]
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        cfg[key] = value

    for key in PATH_KEYS_IF_EXISTING:
        if key in cfg:
            cfg[key] = resolve_dataset(cfg[key], cwd)
    for key in WRITTEN_PATH_KEYS:
        if cfg.get(key):
            cfg[key] = str(resolve_output_dir(cfg[key], cwd))
    if cfg.get("resume-from"):
        cfg = _resumed(cfg, app_defaults, cwd)

    if "output-dir" in app_defaults:
        out = resolve_output_dir(cfg.get("output-dir", app_defaults["output-dir"]), cwd)
        cfg["output-dir"] = str(out)
        if "run-name" in app_defaults and not str(cfg.get("run-name") or ""):
            default_name = str(app_defaults.get("run-name") or "")
            if not default_name:
                strategy = cfg.get("strategy", app_defaults.get("strategy", "run"))
                base = default_run_name(strategy, now)
                default_name, n = base, 1
                while (out / default_name).exists():
                    n += 1
                    default_name = f"{base}-{n}"
            cfg["run-name"] = default_name
    elif "run-name" in app_defaults and not str(cfg.get("run-name") or ""):
        cfg["run-name"] = default_run_name(cfg.get("strategy", app_defaults.get("strategy", "run")), now)
    return cfg


def unknown_key_message(key: str, app_defaults: Mapping[str, Any]) -> str:
    """``unknown setting 'num-server-round'; did you mean num-server-rounds? ...``: the closest names, not all.

    >>> unknown_key_message("num-server-round", {"num-server-rounds": 5, "seed": 1})
    "unknown setting 'num-server-round' (did you mean num-server-rounds?); accepted: the keys of the app's \
[tool.flwr.app.config] (docs/guide.md: Settings)"
    """
    close = difflib.get_close_matches(key, list(app_defaults), n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    accepted = "the keys of the app's [tool.flwr.app.config] (docs/guide.md: Settings)"
    return f"unknown setting {key!r}{hint}; accepted: {accepted}"


def _resumed(cfg: dict[str, Any], app_defaults: Mapping[str, Any], cwd: Path) -> dict[str, Any]:
    """A resumed run's overrides: its own folder, and the settings it was made with where none are given.

    ``resume-from`` alone continues the run as it was (the folder's
    ``config.json`` fills in every setting not given here, those that differ
    from the app's defaults); the run name and output folder are the
    folder's. A ``run-name`` or ``output-dir`` naming another folder is
    refused (a resumed run continues in its own). Whether the settings given
    may differ from the run's is :func:`fedweigh.preflight.check_run`'s to say.
    """
    folder = Path(str(cfg["resume-from"])).expanduser()
    if not folder.is_absolute():
        folder = Path(os.path.normpath(cwd / folder))
    own = {"run-name": folder.name, "output-dir": str(folder.parent)}
    for key, value in own.items():
        given = cfg.get(key)
        if given in (None, ""):
            continue
        same = resolve_output_dir(given, cwd) == folder.parent if key == "output-dir" else str(given) == value
        if not same:
            raise ValueError(
                f"{key} = {given!r} with resume-from = {str(folder)!r}: a resumed run continues in its own folder; "
                f"accepted: no {key} (or {key} = {value!r})"
            )
    recorded = recorded_settings(folder) or {}
    filled = {
        key: value
        for key, value in recorded.items()
        if key in app_defaults and key not in cfg and value is not None and value != app_defaults[key]
    }
    place = {key: value for key, value in own.items() if key in app_defaults}
    return {**filled, **cfg, "resume-from": str(folder), **place}


def results_dir_for(run_config: Mapping[str, Any]) -> Path | None:
    """``<output-dir>/<run-name>`` of a prepared run config, if both are known."""
    if run_config.get("resume-from"):  # a resumed run continues in its own folder
        return Path(str(run_config["resume-from"]))
    out, name = run_config.get("output-dir"), run_config.get("run-name")
    if not out or not name:
        return None
    return Path(str(out)) / str(name)
