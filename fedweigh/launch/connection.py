"""Flower's connection file: ``$FLWR_HOME/config.toml`` and the connection to our SuperLink.

``flwr run <app> <connection>`` looks the connection up in
``$FLWR_HOME/config.toml``. :func:`write_connection` adds or updates one entry
and leaves every other connection, comment and the ``default`` key alone.
"""

from __future__ import annotations

import copy
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedweigh.launch.runconfig import SimulationError, format_toml_value

DEFAULT_CONNECTION = "fedweigh-sim"

# Flower's default config.toml (flwr.cli.constant.DEFAULT_FLOWER_CONFIG_TOML): used
# when the file does not exist yet, so `flwr` keeps its usual connections.
_DEFAULT_FLOWER_CONFIG_TOML = """[superlink]
default = "local"

[superlink.supergrid]
address = "api.flower.ai"

[superlink.local]
address = ":local:"
"""

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def resolve_flwr_home(app_dir: Path, env: Mapping[str, str] | None = None) -> Path:
    """Return ``$FLWR_HOME`` if set, else ``<app_dir>/.flwr`` (always absolute)."""
    env = os.environ if env is None else env
    if env.get("FLWR_HOME"):
        return Path(env["FLWR_HOME"]).expanduser().resolve()
    return (Path(app_dir).expanduser().resolve() / ".flwr").resolve()


def merge_connection(config: Mapping[str, Any], name: str, address: str, insecure: bool = True) -> dict[str, Any]:
    """Return a copy of a parsed ``config.toml`` with connection ``name`` set.

    Other connections, the ``default`` key and any other top-level tables are kept.
    """
    merged = copy.deepcopy(dict(config))
    superlink = merged.setdefault("superlink", {})
    if not isinstance(superlink, dict):
        raise SimulationError("`superlink` in the Flower config is not a table")
    entry = superlink.get(name)
    entry = dict(entry) if isinstance(entry, dict) else {}
    entry["address"] = address
    entry["insecure"] = insecure
    superlink[name] = entry
    return merged


def update_connection_text(text: str | None, name: str, address: str, insecure: bool = True) -> str | None:
    """Return new ``config.toml`` text with connection ``name``, or None if unchanged.

    ``text=None`` means the file does not exist yet (Flower's default is used as a
    base).  A missing connection is appended as a new table so that comments and
    formatting of the existing file survive; a differing one forces a rewrite.
    """
    if not _BARE_KEY.match(name):
        raise ValueError(f"connection name must match [A-Za-z0-9_-]+: {name!r}")
    base = _DEFAULT_FLOWER_CONFIG_TOML if text is None else text
    try:
        current = tomllib.loads(base)
    except tomllib.TOMLDecodeError as err:
        raise SimulationError(f"Flower config is not valid TOML: {err}") from err
    existing = current.get("superlink", {}).get(name)
    wanted = {"address": address, "insecure": insecure}
    if isinstance(existing, dict) and all(existing.get(k) == v for k, v in wanted.items()):
        return None if text is not None else base

    if existing is None:
        block = (
            f"\n[superlink.{name}]\naddress = {format_toml_value(address)}\ninsecure = {format_toml_value(insecure)}\n"
        )
        candidate = base.rstrip("\n") + "\n" + block
        try:
            if tomllib.loads(candidate) == merge_connection(current, name, address, insecure):
                return candidate
        except tomllib.TOMLDecodeError:
            pass  # e.g. `superlink` is an inline table: fall back to a rewrite

    import tomli_w  # dependency of flwr; only needed for the rare rewrite

    return tomli_w.dumps(merge_connection(current, name, address, insecure))


def write_connection(flwr_home: Path, name: str, address: str, insecure: bool = True) -> Path:
    """Create/update connection ``name`` in ``<flwr_home>/config.toml``."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    text = path.read_text(encoding="utf-8") if path.exists() else None
    new = update_connection_text(text, name, address, insecure)
    if new is not None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(path)
    return path
