"""The repository's compose files on a Docker engine, as docs/deployment.md's container walkthrough runs them.

Used by ``tests/test_containers.py`` and the deployment benchmark's container
way (``fedweigh benchmark deployment``); it works from a checkout of the
repository. A :class:`Project` is the walkthrough's folder: certificates and
keys made by ``deploy/``'s scripts and handed to the images' user ``app``
(uid :data:`APP_UID`), the operator's ``FLWR_HOME`` with a connection
``docker`` to 127.0.0.1:9093 trusted through the CA, and copies of results. A
:class:`Stack` is one Compose project of the repository's compose files, used
unchanged, run with ``--project-directory`` set to the project's folder (so
its relative mounts, ``./deploy/...``, are the project's, never the
repository's). The images must exist (``deploy/build-images.sh -a``): a stack
is brought up, never built. ``docker compose`` (v2) is used where it exists,
``docker-compose`` (v1) otherwise. Every wait polls a log, a file or the CLI
with a deadline (:func:`fedweigh.launch.virtual_federation.poll_until`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from fedweigh.launch.commands import ANSI, parse_run_id, parse_run_status
from fedweigh.launch.runconfig import build_run_config_arg
from fedweigh.launch.virtual_federation import DEPLOY, REPO, poll_until

APP_UID = 49999
"""The user ``app`` of Flower's images (and of deploy/build-images.sh's stand-ins)."""
SUPERNODES = ("supernode-1", "supernode-2", "supernode-3")
"""The sites of docker-compose.yml."""
CONNECTION = "docker"
FLOWER_VERSION = re.search(r"^ARG FLWR_VERSION=(\S+)$", (REPO / "Dockerfile").read_text(), re.M).group(1)
"""The Flower version of the images (the Dockerfile's)."""
BIN = Path(sys.executable).parent


def run(argv: Sequence[str | Path], *, timeout: float = 300, check: bool = True, **kwargs: Any) -> Any:
    """A command, its output captured; with ``check``, a failure raises with that output."""
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result


def compose_command() -> list[str] | None:
    """``docker compose`` (Compose v2) where it exists, else ``docker-compose`` (v1), else None."""
    for candidate in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(candidate[0]):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                if subprocess.run([*candidate, "version"], capture_output=True, timeout=60).returncode == 0:
                    return candidate
    return None


def engine_problem() -> str | None:
    """Why no stack can run here (no docker, no engine, no Compose, not root), or None."""
    if not shutil.which("docker"):
        return "no docker command"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60, check=False)
    if info.returncode != 0:
        return f"no Docker engine answers `docker info`: {info.stderr.strip()[-300:]}"
    if compose_command() is None:
        return "neither `docker compose` nor `docker-compose` is installed"
    if os.geteuid() != 0:
        return f"the private keys must be handed to uid {APP_UID} (chown), which needs root"
    return None


def build_images(torch_index_url: str | None = None) -> str:
    """``deploy/build-images.sh -a`` (``-t torch_index_url`` when given): its report, a line per image."""
    argv: list[str | Path] = [DEPLOY / "build-images.sh", "-a"]
    if torch_index_url is not None:
        argv += ["-t", torch_index_url]
    return str(run(argv, timeout=3600).stdout)


class Project:
    """The walkthrough's folder: certificates, keys, data, the operator's FLWR_HOME, copies of the results."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tag = secrets.token_hex(3)
        self.home = folder / "home"
        self.env = {**os.environ, "FLWR_HOME": str(self.home), "FLWR_DISABLE_UPDATE_CHECK": "1"}

    @property
    def certificates(self) -> Path:
        return self.folder / "deploy" / "certificates"

    @property
    def keys(self) -> Path:
        return self.folder / "deploy" / "keys"

    @property
    def data(self) -> Path:
        """Mounted read-only at /app/data in every container that runs app code."""
        return self.folder / "deploy" / "data"

    def prepare(self, extra_keys: Sequence[str] = ()) -> None:
        """``make-certificates.sh -c 3``, ``make-supernode-keys.sh -c 3`` (and ``extra_keys``), the private keys
        handed to uid :data:`APP_UID`, and the operator's connection ``docker``."""
        run([DEPLOY / "make-certificates.sh", "-o", self.certificates, "-c", "3"])
        run([DEPLOY / "make-supernode-keys.sh", "-o", self.keys, "-c", "3"])
        if extra_keys:
            run([DEPLOY / "make-supernode-keys.sh", "-o", self.keys, *extra_keys])
        self.data.mkdir(parents=True, exist_ok=True)
        private = [self.certificates / "server.key", *self.certificates.glob("supernode-?.key")]
        private += [self.keys / name for name in (*SUPERNODES, *extra_keys)]
        for path in private:  # readable by the images' user app (the walkthrough's chown)
            os.chown(path, APP_UID, APP_UID)
        self.home.mkdir(exist_ok=True)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "127.0.0.1:9093"\n'
            f'root-certificates = "{self.certificates / "ca.crt"}"\n'
        )

    def flwr(self, *args: str, timeout: float = 120) -> Any:
        """The ``flwr`` CLI on this host, run from the repository."""
        return run([BIN / "flwr", *args], timeout=timeout, check=False, env=self.env, cwd=REPO)

    def register(self, name: str) -> int:
        """``flwr supernode register <keys>/<name>.pub docker``; returns the node id."""
        result = self.flwr("supernode", "register", str(self.keys / f"{name}.pub"), CONNECTION, "--format", "json")
        data = json.loads(result.stdout[result.stdout.find("{") :] or "{}")
        if not data.get("success"):
            raise RuntimeError(f"registering {name} failed: {result.stdout}{result.stderr}")
        return int(data["node-id"])

    def node_states(self) -> dict[int, str]:
        """``flwr supernode list docker``: node id to status."""
        result = self.flwr("supernode", "list", CONNECTION, "--format", "json")
        data = json.loads(result.stdout[result.stdout.find("{") :] or "{}")
        return {int(node["node-id"]): str(node["status"]) for node in data.get("nodes", [])}


class Stack:
    """One Compose project of the repository's compose ``files``, run from the project's folder.

    ``timed(step)`` wraps each step of :meth:`bring_up` and :meth:`down` (the
    test times them); by default it does nothing.
    """

    def __init__(
        self,
        project: Project,
        variant: str,
        files: Sequence[str],
        timed: Callable[[str], AbstractContextManager[Any]] = lambda _: contextlib.nullcontext(),
    ) -> None:
        self.project, self.variant, self.name = project, variant, f"fw{project.tag}{variant}"
        compose = compose_command()
        if compose is None:
            raise RuntimeError("neither `docker compose` nor `docker-compose` is installed")
        files_args = [arg for file in files for arg in ("-f", str(REPO / file))]
        self.compose = [*compose, "-p", self.name, "--project-directory", str(project.folder), *files_args]
        self.timed = timed
        self.node_ids: dict[str, int] = {}
        self.is_up = False

    def __call__(self, *args: str, timeout: float = 600, check: bool = True) -> Any:
        """``docker compose <args>`` for this stack."""
        return run([*self.compose, *args], timeout=timeout, check=check, env=self.project.env)

    def container(self, service: str) -> str:
        ids = self("ps", "-q", service).stdout.split()
        if len(ids) != 1:
            raise RuntimeError(f"{self.name}: {service} has containers {ids}")
        return ids[0]

    def logs(self, service: str) -> str:
        """The service's container log (every run of the container), without colour codes."""
        result = run(["docker", "logs", self.container(service)], check=False)
        return ANSI.sub("", result.stdout + result.stderr)

    def wait_log(self, service: str, pattern: str, timeout: float, since: int = 0) -> re.Match[str]:
        regex = re.compile(pattern)
        return poll_until(lambda: regex.search(self.logs(service), since), timeout, f"{service}: /{pattern}/", 0.5)

    def running(self, service: str) -> bool:
        state = run(["docker", "inspect", "--format", "{{.State.Running}}", self.container(service)]).stdout
        return str(state).strip() == "true"

    def outputs_file(self, path: str) -> bytes | None:
        """A file of the outputs volume, read in the ServerApp's SuperExec container (None if absent)."""
        result = subprocess.run(
            ["docker", "exec", self.container("superexec-serverapp"), "cat", f"/app/outputs/{path}"],
            capture_output=True,
            timeout=60,
        )
        return result.stdout if result.returncode == 0 else None

    def rounds_recorded(self, run_name: str) -> list[dict[str, Any]]:
        text = (self.outputs_file(f"{run_name}/metrics.jsonl") or b"").decode()
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def copy_outputs(self, run_name: str) -> Path:
        """``docker cp`` of the run's folder from the outputs volume to the project's folder."""
        target = self.project.folder / "outputs" / self.name
        target.mkdir(parents=True, exist_ok=True)
        run(["docker", "cp", f"{self.container('superexec-serverapp')}:/app/outputs/{run_name}", target])
        return target / run_name

    def bring_up(self) -> None:
        """The walkthrough: the SuperLink and the ServerApp's SuperExec, the three keys registered, every site."""
        with self.timed(f"{self.variant}: up -d superlink superexec-serverapp"):
            self("up", "-d", "superlink", "superexec-serverapp")
            self.is_up = True
            self.wait_log("superlink", r"Uvicorn running on https://0\.0\.0\.0:9093", timeout=180)
        with self.timed(f"{self.variant}: flwr supernode register (3 keys)"):
            for name in SUPERNODES:
                self.node_ids[name] = self.project.register(name)
        with self.timed(f"{self.variant}: up -d (all services), SuperNodes connected"):
            self("up", "-d")
            for name in SUPERNODES:
                self.wait_log(name, r"SuperNode ID: \d+", timeout=300)

    def down(self) -> None:
        """``down -v``: containers, networks and the outputs volume (once)."""
        if self.is_up:
            with self.timed(f"{self.variant}: down -v"):
                self("down", "-v", "--remove-orphans")
            self.is_up = False

    def submit(self, config: Mapping[str, object], log: Path) -> subprocess.Popen[bytes]:
        """``flwr run . docker --stream --run-config ...`` from the repository, as the operator would."""
        argv = [BIN / "flwr", "run", ".", CONNECTION, "--stream", "--run-config", build_run_config_arg(config)]
        with log.open("w") as out:
            return subprocess.Popen(
                [str(a) for a in argv], cwd=REPO, env=self.project.env, stdout=out, stderr=subprocess.STDOUT
            )

    def finish(self, process: subprocess.Popen[bytes], log: Path, timeout: float) -> tuple[str | None, str]:
        """Wait for the stream, then ask the SuperLink for the run's status: (status, details)."""
        process.wait(timeout=timeout)
        text = ANSI.sub("", log.read_text())
        run_id = next((rid for line in text.splitlines() if (rid := parse_run_id(line)) is not None), None)
        if run_id is None:
            raise RuntimeError(f"flwr run started no run:\n{text[-3000:]}")
        result = self.project.flwr("ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
        return parse_run_status(result.stdout + result.stderr, run_id)

    def completed(self, config: Mapping[str, object], timeout: float = 1200) -> Path:
        """Submit a run, insist that it completed, and copy its folder out of the outputs volume."""
        log = self.project.folder / f"{self.name}-{config['run-name']}.log"
        status, details = self.finish(self.submit(config, log), log, timeout)
        if status != "finished:completed":
            raise RuntimeError(f"{status} {details}\n{log.read_text()[-3000:]}")
        return self.copy_outputs(str(config["run-name"]))
