"""Experiment tracking: every round's record, as it is written, also goes to TensorBoard and MLflow.

``tracking`` names the trackers (``none`` by default; ``tensorboard``,
``mlflow``, or both comma-separated). The ServerApp's
:class:`~fedweigh.results.RunRecorder` hands each tracker the row it appends
to ``metrics.jsonl``; :func:`scalar_series` turns that row into scalars with
stable names, one series per name, the round as the step:

==============================  ===============================================
name                            value
==============================  ===============================================
``central/<key>``               ``accuracy``, ``loss``, ``macro_f1``,
                                ``weighted_f1``, ``top5_accuracy``,
                                ``prediction_share`` (evaluated rounds only)
``round/seconds``               the round's wall time
``round/train_loss_mean``       the clients' mean train loss (sample-weighted)
``round/clients``, ...          replies aggregated; ``left_out``, ``excluded``,
                                ``in_flight`` counts
``round/<key>``                 every other number of the row
                                (``train_loss_unweighted``)
``bytes/sent``, ``bytes/received``  the model bytes sent to / received from the
                                round's clients
``weights/partition-<p>``       the client's aggregation weight
``signals/<signal>/partition-<p>``  its signals (``train_loss``, ``oui``,
                                ``uncertainty``, ``uncertainty-mean``,
                                ``ood-score``: FLood's energy score)
``clients/<key>/partition-<p>`` every other number of its entry (the rule's
                                per-client score, ``staleness``, ...)
``diagnostics/<key>``           every number of the round's diagnostics: the
                                learning rate, FLood's λ(t) (``asw-lambda``),
                                FedOUI's fitted Beta (``beta-alpha``,
                                ``beta-beta``), Feddle's ``atlas-size`` and
                                search losses; a list (Feddle's
                                ``coefficients``) as ``diagnostics/<key>/<i>``
==============================  ===============================================

Only finite numbers are logged (a round without evaluation has no
``central/*`` point). A client without a partition id is named
``node-<id>``.

* **TensorBoard** (:class:`TensorBoardTracker`, through
  ``torch.utils.tensorboard``): event files in ``tensorboard-dir``, by
  default ``<run folder>/tensorboard``; the run's settings as text. An
  experiment grid gives each run ``<grid>/tensorboard/<arm>-seed<k>``, so
  ``tensorboard --logdir <grid>/tensorboard`` overlays them.
* **MLflow** (:class:`MLflowTracker`): one MLflow run per run folder, named
  after it, its settings as params, the series as metrics with
  ``step = round``, ended ``FINISHED``, ``FAILED`` or ``KILLED``. The store
  is ``tracking-uri``, by default the SQLite file ``mlflow.db`` beside the
  run folders (MLflow 3 refuses its plain ``mlruns`` file store unless told
  otherwise, and recommends SQLite); the experiment is
  ``tracking-experiment`` (``fedweigh``; a grid's own name).

A resumed run (``resume-from``) continues its tracking: TensorBoard hides
the events of the rounds after the checkpoint (``purge_step``), as
``metrics.jsonl`` drops those rows; the MLflow run is reopened (its id is
kept in the run folder, :data:`MLFLOW_RUN_FILE`) and the rounds after the
checkpoint are logged again, so a round that was recorded but not yet
checkpointed when the server stopped has two points at its step (MLflow
cannot delete points). A run started afresh in a folder replaces that
folder's earlier MLflow run (deleted, as its rows are).

A tracker that fails while the run goes on (a full disk, an unreachable
server) is switched off with one warning; training and the run folder are
not touched (:class:`Trackers`). A tracker whose package is missing is
refused before training (:func:`tracking_problems`, called by the
preflight). Clients never track: only the ServerApp imports this module.

Example
-------
>>> row = {"round": 2, "seconds": 1.5, "accuracy": 0.8, "loss": None, "train_loss": 0.4,
...        "clients": [{"partition": 3, "num_examples": 10, "train_loss": 0.4, "weight": 1.0, "oui": 0.5,
...                     "bytes_sent": 100, "bytes_received": 100}],
...        "diagnostics": {"beta-alpha": 2.0, "fit-method": "moments", "coefficients": [0.1, -0.2]}}
>>> series = scalar_series(row, central=("accuracy", "loss"))
>>> series["central/accuracy"], "central/loss" in series, series["weights/partition-3"]
(0.8, False, 1.0)
>>> series["signals/oui/partition-3"], series["diagnostics/coefficients/1"], series["bytes/sent"]
(0.5, -0.2, 100.0)
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from fedweigh.methods.catalog import SIGNALS
from fedweigh.settings import Settings, flatten

logger = logging.getLogger("flwr.fedweigh")

RunStatus = Literal["FINISHED", "FAILED", "KILLED"]
"""How a tracked run ended (MLflow's names)."""

TENSORBOARD_FOLDER = "tensorboard"
"""The event folder inside a run folder (and an experiment grid's folder)."""
LOCAL_STORE = "mlflow.db"
"""MLflow's local store (SQLite) in the output dir, when ``tracking-uri`` is empty."""
MLFLOW_RUN_FILE = "mlflow-run.json"
"""Written in the run folder: the MLflow store and run id a resumed run continues."""
DEFAULT_EXPERIMENT = "fedweigh"
"""MLflow's experiment when ``tracking-experiment`` is empty."""

PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow-skinny")}
"""Tracker to (the module it imports, the package that provides it)."""

_IDENTITY_KEYS = ("partition", "node")
_ROUND_FIELDS_NAMED = {"round", "seconds", "train_loss", "excluded"}  # the step, or a series named in the table
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-./ :]")


# --------------------------------------------------------------------------- the series


def scalar_series(row: Mapping[str, Any], central: Sequence[str]) -> dict[str, float]:
    """A metrics.jsonl row as named scalars (the table in the module's docstring); finite numbers only.

    ``central`` names the row's central-evaluation fields (``central/<key>``;
    :data:`fedweigh.results.CENTRAL_METRICS`); any other top-level number of
    the row not named in the table goes to ``round/<key>``.
    """
    series: dict[str, float] = {}

    def put(name: str, value: Any) -> None:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            series[_UNSAFE.sub("_", name)] = float(value)

    for key in central:
        put(f"central/{key}", row.get(key))
    put("round/seconds", row.get("seconds"))
    put("round/train_loss_mean", row.get("train_loss"))
    for key, value in row.items():
        if key not in _ROUND_FIELDS_NAMED and key not in central:
            put(f"round/{key}", value)
    clients = row.get("clients") or []
    for name, items in (("clients", clients), ("left_out", row.get("left_out")), ("in_flight", row.get("in_flight"))):
        put(f"round/{name}", len(items or ()))
    put("round/excluded", row.get("excluded"))
    if clients:
        put("bytes/sent", sum(client.get("bytes_sent", 0) for client in clients))
        put("bytes/received", sum(client.get("bytes_received", 0) for client in clients))
    for client in clients:
        who = _client_name(client)
        for key, value in client.items():
            if key == "weight":
                put(f"weights/{who}", value)
            elif key in SIGNALS:
                put(f"signals/{key}/{who}", value)
            elif key not in _IDENTITY_KEYS:
                put(f"clients/{key}/{who}", value)
    for key, value in (row.get("diagnostics") or {}).items():
        if isinstance(value, list | tuple):
            for index, item in enumerate(value):
                put(f"diagnostics/{key}/{index}", item)
        else:
            put(f"diagnostics/{key}", value)
    return series


def _client_name(client: Mapping[str, Any]) -> str:
    partition = client.get("partition", -1)
    return f"partition-{partition}" if isinstance(partition, int) and partition >= 0 else f"node-{client.get('node')}"


# --------------------------------------------------------------------------- trackers


@dataclass(frozen=True)
class TrackedRun:
    """What a tracker is told when a run starts.

    Attributes
    ----------
    name : str
        The run folder's name (``<arm>-seed<k>`` in an experiment grid).
    run_dir : Path
        The run folder.
    settings : Mapping
        The resolved settings, as ``config.json`` holds them (tables nested).
    resumed_round : int
        The checkpoint's round a resumed run continues after; 0 for a fresh run.
    """

    name: str
    run_dir: Path
    settings: Mapping[str, Any]
    resumed_round: int = 0


class Tracker(Protocol):
    """Somewhere a run's series go besides metrics.jsonl."""

    name: str

    def start(self, run: TrackedRun) -> None:
        """Open (or, for a resumed run, reopen) the run."""

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """One round's scalars, at ``step`` = the round."""

    def finish(self, status: RunStatus) -> None:
        """Close the run, saying how it ended."""


class TensorBoardTracker:
    """Event files in ``log_dir`` through ``torch.utils.tensorboard``, flushed every round."""

    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.writer: Any = None

    def start(self, run: TrackedRun) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step hides the events of earlier attempts from this round on: the rounds after a checkpoint
        # that a resumed run logs again, or a whole earlier run in a folder started afresh
        self.writer = SummaryWriter(str(self.log_dir), purge_step=run.resumed_round + 1)
        if not run.resumed_round:
            text = json.dumps(flatten(run.settings), indent=1, default=str)
            self.writer.add_text("settings", "    " + text.replace("\n", "\n    "), 0)
            self.writer.flush()

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def finish(self, status: RunStatus) -> None:
        if self.writer is not None:
            self.writer.close()


class MLflowTracker:
    """One MLflow run per run folder, through ``MlflowClient`` (no global active run)."""

    name = "mlflow"
    _BATCH = 1000  # MLflow's limit of metrics per log_batch call
    _PARAM_BATCH = 100  # ... of params
    _PARAM_LENGTH = 6000  # ... of a param value's characters

    def __init__(self, tracking_uri: str, experiment: str, artifact_location: str | None = None) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.artifact_location = artifact_location
        self.client: Any = None
        self.run_id: str | None = None

    def start(self, run: TrackedRun) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = (
            found.experiment_id
            if found is not None
            else self.client.create_experiment(self.experiment, artifact_location=self.artifact_location)
        )
        record = run.run_dir / MLFLOW_RUN_FILE
        earlier = _read_json(record)
        same_store = earlier.get("tracking_uri") == self.tracking_uri and earlier.get("run_id")
        if run.resumed_round and same_store:
            self.run_id = str(earlier["run_id"])
            self.client.update_run(self.run_id, status="RUNNING")
            self.client.set_tag(self.run_id, "fedweigh.resumed-after-round", str(run.resumed_round))
            return
        if same_store:  # an earlier run in this folder, whose rows the folder no longer holds
            self.client.delete_run(str(earlier["run_id"]))
        created = self.client.create_run(experiment_id, run_name=run.name, tags={"fedweigh.run-dir": str(run.run_dir)})
        self.run_id = created.info.run_id
        record.write_text(json.dumps({"tracking_uri": self.tracking_uri, "run_id": self.run_id}, indent=2))
        params = [Param(key, str(value)[: self._PARAM_LENGTH]) for key, value in flatten(run.settings).items()]
        for chunk in _chunks(params, self._PARAM_BATCH):
            self.client.log_batch(self.run_id, params=chunk)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in scalars.items()]
        for chunk in _chunks(metrics, self._BATCH):
            self.client.log_batch(self.run_id, metrics=chunk)

    def finish(self, status: RunStatus) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status=status)


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    return (items[start : start + size] for start in range(0, len(items), size))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class Trackers:
    """The run's trackers as one; a tracker that raises is switched off with one warning, the run goes on."""

    def __init__(self, trackers: Iterable[Tracker] = ()) -> None:
        self.active: list[Tracker] = list(trackers)

    def start(self, run: TrackedRun) -> None:
        self._each("start", lambda tracker: tracker.start(run))

    def log_round(self, row: Mapping[str, Any], central: Sequence[str]) -> None:
        """A metrics.jsonl row, at step = its round (``central``: its central-evaluation fields)."""
        if self.active:
            step, scalars = int(row["round"]), scalar_series(row, central)
            self._each("log", lambda tracker: tracker.log(step, scalars))

    def finish(self, status: RunStatus) -> None:
        """End every tracker's run; later calls do nothing."""
        self._each("finish", lambda tracker: tracker.finish(status))
        self.active = []

    def _each(self, what: str, action: Callable[[Tracker], None]) -> None:
        for tracker in list(self.active):
            try:
                action(tracker)
            except Exception as err:  # noqa: BLE001 - tracking must never stop or corrupt the run
                self.active.remove(tracker)
                logger.warning(
                    "[fedweigh] tracking: %s failed (%s: %s); it is off for the rest of this run, which goes on "
                    "(metrics.jsonl holds every round)",
                    tracker.name,
                    type(err).__name__,
                    err,
                )
                if what != "finish":
                    _close_quietly(tracker)


def _close_quietly(tracker: Tracker) -> None:
    """Release what a failed tracker still holds, as far as it can be (it failed already: errors are ignored)."""
    with contextlib.suppress(Exception):
        tracker.finish("FAILED")


def _artifact_location(uri: str) -> str | None:
    """A SQLite store's artifact folder: ``mlartifacts`` beside its database (MLflow's own default is
    ``./mlruns`` in the server process's working directory); None (the server's choice) for any other store.

    >>> _artifact_location("sqlite:////data/grid/mlflow.db"), _artifact_location("http://host:5000")
    ('file:///data/grid/mlartifacts', None)
    """
    database = Path(uri.removeprefix("sqlite:///"))
    return (
        (database.parent / "mlartifacts").as_uri() if uri.startswith("sqlite:///") and database.is_absolute() else None
    )


def local_store(folder: Path) -> str:
    """MLflow's local store in ``folder``: ``sqlite:///<folder>/mlflow.db`` (absolute)."""
    return f"sqlite:///{Path(folder).expanduser().resolve() / LOCAL_STORE}"


def open_trackers(settings: Settings, run_dir: Path) -> Trackers:
    """The trackers ``tracking`` names, configured for ``run_dir`` (nothing is opened before :meth:`start`)."""
    trackers: list[Tracker] = []
    if "tensorboard" in settings.tracker_names:
        given = settings.tensorboard_dir
        trackers.append(TensorBoardTracker(Path(given).expanduser() if given else run_dir / TENSORBOARD_FOLDER))
    if "mlflow" in settings.tracker_names:
        uri = settings.tracking_uri or local_store(run_dir.parent)
        trackers.append(MLflowTracker(uri, settings.tracking_experiment or DEFAULT_EXPERIMENT, _artifact_location(uri)))
    return Trackers(trackers)


def tracking_problems(settings: Settings) -> list[str]:
    """Trackers ``tracking`` names whose package is not installed here, each with what to install."""
    problems = []
    for name in settings.tracker_names:
        module, package = PACKAGES[name]
        try:
            importlib.import_module(module)
        except ImportError:
            others = [f"'{other}'" for other in ("none", *settings.tracker_names) if other != name]
            problems.append(
                f"tracking = {settings.tracking!r} logs to {name}, whose package {package} is not installed; "
                f'accepted: install it (pip install -e ".[tracking]", or pip install {package}), '
                f"or tracking = {' or '.join(others)}"
            )
    return problems
