"""Pieces every benchmark uses: the settings benchmarked, timed simulations, memory, reports.

Settings (run-config overrides of the app's defaults):

* :func:`fedoui_cifar10`: the FedOUI paper's CIFAR-10 setting (fedoui-cnn,
  3,000 / 1,000 train / test images, 20 clients, 5 per round, Dirichlet 0.1,
  batch 32, SGD lr 0.01 momentum 0.9, one local epoch);
* :func:`resnet18_cifar10`: the same with the CIFAR ResNet-18 (the GPU
  benchmark's heavier model);
* :func:`fednolowe_mnist`: the FedNolowe paper's MNIST setting (LeNet-5,
  50 clients, 10 % per round, Dirichlet 0.1, two local epochs, batch 32,
  SGD lr 0.01 momentum 0.9 weight decay 1e-3);
* :func:`digits_small`: a seconds-long setting on the bundled digits, for
  ``--quick`` runs and smoke tests.

The offline datasets are looked up in ``$FEDWEIGH_DATASETS`` or
``../shared/datasets`` next to the app.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedweigh.settings import IN_PROCESS_BACKEND

__all__ = [
    "APP_DIR",
    "BenchmarkError",
    "CpuSampler",
    "MemorySampler",
    "TimedRun",
    "dataset_folder",
    "digits_small",
    "fednolowe_mnist",
    "fedoui_cifar10",
    "machine_description",
    "markdown_table",
    "parse_node_query",
    "resnet18_cifar10",
    "run_timed",
    "tree_memory_bytes",
]

APP_DIR = Path(__file__).resolve().parents[2]


class BenchmarkError(RuntimeError):
    """A benchmark that cannot run here (e.g. its dataset is missing)."""


def dataset_folder(name: str) -> str:
    """Absolute path of an offline dataset folder (``cifar10``, ``mnist``, ...)."""
    roots = [Path(os.environ["FEDWEIGH_DATASETS"])] if os.environ.get("FEDWEIGH_DATASETS") else []
    roots.append(APP_DIR.parent / "shared" / "datasets")
    for root in roots:
        if (root / name / "train.parquet").is_file():
            return str((root / name).resolve())
    raise BenchmarkError(
        f"dataset folder {name!r} not found in {', '.join(map(str, roots))}; set FEDWEIGH_DATASETS to the folder "
        "holding cifar10/, mnist/ (see ../shared/datasets/README.md)"
    )


@dataclass(frozen=True)
class Setting:
    """A benchmarked configuration: run-config overrides and the federation size."""

    name: str
    run_config: dict[str, Any]
    num_supernodes: int

    def with_rounds(self, rounds: int) -> Setting:
        return Setting(self.name, {**self.run_config, "num-server-rounds": rounds}, self.num_supernodes)

    def polling(self) -> Setting:
        """The same run with Flower 1.41's own 0.1 s polling loops (``event-driven-simulation = false``)."""
        config = {**self.run_config, "event-driven-simulation": False}
        return Setting(f"{self.name}-polling", config, self.num_supernodes)

    def in_process(self) -> Setting:
        """The same run with the ClientApp in the simulation's own process (``simulation-backend = "in-process"``)."""
        config = {**self.run_config, "simulation-backend": IN_PROCESS_BACKEND}
        return Setting(f"{self.name}-in-process", config, self.num_supernodes)


def fedoui_cifar10(rounds: int = 5) -> Setting:
    """The FedOUI paper's CIFAR-10 setting (without its rare and noisy clients), FedAvg."""
    return Setting(
        "fedoui-cifar10",
        {
            "strategy": "fedavg",
            "dataset": dataset_folder("cifar10"),
            "model": "fedoui-cnn",
            "train-subset": 3000,
            "test-subset": 1000,
            "partitioner": "dirichlet",
            "dirichlet-alpha": 0.1,
            "fraction-train": 0.25,
            "min-train-nodes": 2,
            "local-epochs": 1,
            "batch-size": 32,
            "learning-rate": 0.01,
            "momentum": 0.9,
            "weight-decay": 0.0,
            "eval-batch-size": 256,
            "num-server-rounds": rounds,
        },
        num_supernodes=20,
    )


def resnet18_cifar10(rounds: int = 5) -> Setting:
    """:func:`fedoui_cifar10` with the CIFAR ResNet-18 (11.2 M parameters, 45 MB a message): where messages weigh."""
    base = fedoui_cifar10(rounds)
    return Setting("resnet18-cifar10", {**base.run_config, "model": "resnet18"}, base.num_supernodes)


def fednolowe_mnist(rounds: int = 5) -> Setting:
    """The FedNolowe paper's MNIST setting, FedAvg."""
    return Setting(
        "fednolowe-mnist",
        {
            "strategy": "fedavg",
            "dataset": dataset_folder("mnist"),
            "model": "lenet5",
            "partitioner": "dirichlet",
            "dirichlet-alpha": 0.1,
            "fraction-train": 0.1,
            "min-train-nodes": 2,
            "local-epochs": 2,
            "batch-size": 32,
            "learning-rate": 0.01,
            "momentum": 0.9,
            "weight-decay": 1e-3,
            "augment": False,
            "eval-batch-size": 512,
            "num-server-rounds": rounds,
        },
        num_supernodes=50,
    )


def digits_small(rounds: int = 3) -> Setting:
    """A small, fast setting on the bundled digits."""
    return Setting(
        "digits-small",
        {
            "strategy": "fedavg",
            "dataset": "digits",
            "model": "mlp",
            "partitioner": "iid",
            "fraction-train": 0.5,
            "min-train-nodes": 2,
            "num-server-rounds": rounds,
        },
        num_supernodes=4,
    )


# --------------------------------------------------------------------------- memory


def _pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages (libraries, Ray's object store) split among their users."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def tree_pids(roots: int | Sequence[int]) -> list[int]:
    """``roots`` and every process below them (the launcher's process table and tree walk)."""
    from fedweigh.launch.processes import descendants, process_table

    table = process_table()
    found = [roots] if isinstance(roots, int) else list(roots)
    for root in list(found):
        found += [pid for pid, _ in descendants(root, table)]
    return found


def simulation_roots(sim: Any) -> list[int]:
    """The process trees a simulation runs in: its SuperLink's, and its shared Ray cluster's if any."""
    roots = [sim.process.pid] if sim.process is not None else [os.getpid()]
    ray = getattr(sim, "ray", None)
    if ray is not None:
        roots += ray.root_pids
    return roots


def tree_memory_bytes(roots: int | Sequence[int]) -> tuple[int, int]:
    """``(summed PSS in bytes, process count)`` of ``roots`` and everything below them (Linux).

    PSS, not RSS: summing RSS would count every shared page (torch's libraries,
    Ray's shared object store) once per process that maps it.
    """
    total, count = 0, 0
    for pid in tree_pids(roots):
        memory = _pss_bytes(pid)
        if memory:
            total += memory
            count += 1
    return total, count


class MemorySampler:
    """Samples the summed PSS of a process tree every ``interval`` seconds, in a thread.

    The peak of the samples is a lower bound of the true peak (a spike shorter
    than the interval can be missed).
    """

    def __init__(self, root: int | Sequence[int], interval: float = 0.5) -> None:
        self.root = root
        self.interval = interval
        self.samples: list[tuple[float, int, int]] = []  # (monotonic, bytes, processes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            if Path("/proc").is_dir():
                total, count = tree_memory_bytes(self.root)
                self.samples.append((time.monotonic(), total, count))
            self._stop.wait(self.interval)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak_between(self, start: float = 0.0, end: float = float("inf")) -> int:
        values = [b for t, b, _ in self.samples if start <= t <= end]
        return max(values) if values else 0

    @property
    def peak(self) -> int:
        return self.peak_between()


def _process_label(pid: int) -> str:
    """A short name for a process: Ray's title (``ray::ClientAppActor``), the script or the program."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [w.decode(errors="replace") for w in argv if w]
    if not words:
        return "?"
    if words[0].startswith("ray::"):
        return words[0].split()[0]
    program = Path(words[0]).name
    if program.startswith("python") and len(words) > 1:
        if words[1] == "-m" and len(words) > 2:
            return words[2]
        if words[1] == "-c":
            return "python -c"
        script = next((w for w in words[1:] if not w.startswith("-")), words[1])
        return Path(script).name[:40]
    return program[:40]


def _cpu_seconds(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class CpuSampler:
    """CPU seconds used by each process of a tree while it runs, grouped by process name.

    Processes are sampled every ``interval`` seconds; a process that exits
    loses at most its last interval. Processes alive at the start count
    from their usage then.
    """

    def __init__(self, root: int | Sequence[int], interval: float = 0.5) -> None:
        self.root = root
        self.interval = interval
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.labels: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _tree(self) -> list[int]:
        return tree_pids(self.root)

    def _sample(self, initial: bool = False) -> None:
        for pid in self._tree():
            used = _cpu_seconds(pid)
            if used is None:
                continue
            if pid not in self.labels:
                self.labels[pid] = _process_label(pid)
                self.first[pid] = used if initial else 0.0
            self.last[pid] = used

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> CpuSampler:
        if Path("/proc").is_dir():
            self._sample(initial=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
            self._sample()

    def by_name(self) -> dict[str, float]:
        """CPU seconds per process name, largest first."""
        totals: dict[str, float] = {}
        for pid, label in self.labels.items():
            totals[label] = totals.get(label, 0.0) + max(0.0, self.last.get(pid, 0.0) - self.first.get(pid, 0.0))
        return dict(sorted(((k, round(v, 2)) for k, v in totals.items()), key=lambda item: -item[1]))


# --------------------------------------------------------------------------- timed simulations

_MARKS = {
    "submitted": re.compile(r"Successfully started run"),
    "simulation_started": re.compile(r"Starting Flower Simulation"),
    "server_ready": re.compile(r"\[fedweigh\] results:"),
    "done": re.compile(r"\[fedweigh\] done:"),
}
_ROUND = re.compile(r"\[fedweigh\] round (\d+)/(\d+)")
_NODE_QUERY = re.compile(
    r"\[fedweigh\] (?:asked (\d+) nodes for their partition"
    r"|learned the partition of (\d+) nodes from the simulation engine) in ([0-9.]+)s"
)


def parse_node_query(line: str) -> tuple[int, float] | None:
    """``(nodes, seconds)`` from the ServerApp's log line on learning its nodes' partitions; None otherwise.

    Either line: the query message per node (a deployment), or the simulation engine's mapping.
    """
    match = _NODE_QUERY.search(line)
    return (int(match.group(1) or match.group(2)), float(match.group(3))) if match else None


@dataclass
class TimedRun:
    """One ``flwr run`` with the time (seconds since submission) of its milestones."""

    status: str
    results_dir: Path | None
    wall_seconds: float
    marks: dict[str, float] = field(default_factory=dict)
    round_marks: dict[int, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    node_queries: list[tuple[int, float]] = field(default_factory=list)  # (nodes asked, seconds)

    @property
    def ok(self) -> bool:
        return self.status == "finished:completed"

    def round_seconds(self) -> list[float]:
        """The ServerApp's seconds per round (metrics.jsonl)."""
        return [float(row["seconds"]) for row in self.rows]

    def train_seconds(self) -> list[float]:
        """Per round: the summed ``train-seconds`` the clients report."""
        from fedweigh.protocol import TRAIN_SECONDS

        return self.summed(TRAIN_SECONDS)

    def summed(self, key: str) -> list[float]:
        """Per round: the sum of the reply metric ``key`` over the round's clients (0 where none reports it)."""
        return [sum(float(c.get(key, 0.0)) for c in row.get("clients", [])) for row in self.rows]

    def round_field(self, key: str) -> list[float]:
        """Per round: metrics.jsonl's number ``key`` (e.g. ``wait_seconds``), 0 where a round has none."""
        return [float(row.get(key) or 0.0) for row in self.rows]

    def accuracies(self) -> list[float]:
        return [float(row["accuracy"]) for row in self.rows]

    def phases(self) -> dict[str, float]:
        """Wall-clock phases of the run, in seconds."""
        marks = self.marks
        out: dict[str, float] = {}

        def span(name: str, start: str | None, end: str | None) -> None:
            a = 0.0 if start is None else marks.get(start)
            b = self.wall_seconds if end is None else marks.get(end)
            if a is not None and b is not None:
                out[name] = round(b - a, 3)

        span("cli_submit", None, "submitted")
        span("simulation_process_start", "submitted", "simulation_started")
        span("server_and_clients_start", "simulation_started", "server_ready")
        span("rounds", "server_ready", "done")
        span("shutdown", "done", None)
        return out


def run_timed(
    sim: Any,
    run_config: Mapping[str, Any],
    num_supernodes: int,
    cpus_per_client: int = 1,
    on_line: Callable[[str], None] | None = None,
    show_progress: bool = True,
    gpus_per_client: float = 0.0,
) -> TimedRun:
    """Submit a run on ``sim`` (a started LocalSimulation), timing its milestones from the log.

    With ``show_progress``, a progress line (the round, time left) goes to stderr.
    """
    from fedweigh.launch.progress import PendingRun, RunsProgress
    from fedweigh.launch.runconfig import load_app_config
    from fedweigh.results import read_metrics

    rounds = run_config.get("num-server-rounds") or load_app_config(APP_DIR)["num-server-rounds"]
    run = PendingRun(str(run_config.get("run-name") or "run"), int(rounds))
    progress = RunsProgress([run], label="benchmark", out=sys.stderr) if show_progress else None

    marks: dict[str, float] = {}
    rounds: dict[int, float] = {}
    queries: list[tuple[int, float]] = []
    started = time.monotonic()

    def watch(line: str) -> None:
        now = time.monotonic() - started
        for name, pattern in _MARKS.items():
            if name not in marks and pattern.search(line):
                marks[name] = now
        if match := _ROUND.search(line):
            rounds[int(match.group(1))] = now
        if (query := parse_node_query(line)) is not None:
            queries.append(query)
        if progress is not None:
            progress.on_line(line)
        if on_line is not None:
            on_line(line)

    if progress is not None:
        progress.start_run(run)
    outcome = sim.run(
        dict(run_config),
        num_supernodes=num_supernodes,
        cpus_per_client=cpus_per_client,
        gpus_per_client=gpus_per_client,
        echo=False,
        on_line=watch,
    )
    if progress is not None:
        progress.finish_run(outcome.ok)
    wall = outcome.timings.get("total_s", time.monotonic() - started)
    rows = read_metrics(outcome.results_dir) if outcome.results_dir and outcome.results_dir.exists() else []
    return TimedRun(outcome.status, outcome.results_dir, wall, marks, rounds, dict(outcome.timings), rows, queries)


# --------------------------------------------------------------------------- reports


def machine_description() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_average_1m": round(load[0], 2) if load else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu,
    }


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table.

    >>> print(markdown_table(["a", "b"], [[1, 2.5]]))
    | a | b |
    |---|---|
    | 1 | 2.5 |
    """
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, payload: Mapping[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str), encoding="utf-8")
    return path
