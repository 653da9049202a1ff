"""Where a run leaves its results, and how it is resumed.

Each run writes one folder, ``<output-dir>/<run-name>/``::

    config.json        the resolved settings (defaults filled in), the train
                       instruction every client receives, and versions
    metrics.jsonl      one JSON object per round: central accuracy, top-5
                       accuracy, loss, macro- and weighted F1, the clients'
                       train loss (weighted by n_k, and unweighted), round
                       seconds, the sampled
                       partitions, each client's weight and signals, the
                       clients left out and why, the rule's diagnostics
    checkpoint.pt      the latest round's global model and strategy state
    model.pt           the final global model (a PyTorch state_dict)
    summary.json       final and best accuracy, final loss, rounds, the rounds
                       not aggregated, seconds
    resumes.jsonl      one line per resumption: after which round, when, and
                       the settings that differ from config.json's
    tensorboard/       with tracking = "tensorboard": the rounds as TensorBoard events
    mlflow-run.json    with tracking = "mlflow": the MLflow run that mirrors this folder

Every row of metrics.jsonl also goes to the run's trackers as it is written
(:mod:`fedweigh.tracking`).

A run started with ``resume-from=<run folder>`` continues in that folder from
its checkpoint; because client sampling and client seeds depend only on (seed,
round, partition), it ends exactly where the uninterrupted run would have.
Only settings that do not shape the run may differ from the checkpoint's run
(:data:`fedweigh.run_folder.RESUME_MAY_CHANGE`; :func:`fedweigh.preflight.check_run`
refuses the others before anything starts), and ``config.json`` stays as the
run's first segment wrote it. A folder that holds a run is never written by
another run.
The checkpoint is replaced atomically (:meth:`Checkpoint.save`), in the
background while the next round runs (:class:`CheckpointWriter`), so a server
killed at any moment leaves a whole one (the last round's or the one before),
and read with ``weights_only=True`` (:meth:`Checkpoint.load`), so a file that
is not one is refused with a message, never unpickled. What it cannot hold is state kept on the clients:
``persist-optimizer-state`` keeps each client's optimizer in its node's
Flower context, which a new run (the resumed one) starts empty, so such a run
resumes with fresh client optimizers and does not end exactly where the
uninterrupted one does.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import math
import os
import platform
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedweigh.protocol import TIMING_KEYS, TRAIN_LOSS
from fedweigh.run_folder import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    MODEL_FILE,
    RESUMES_FILE,
    ROUNDS_NOT_AGGREGATED,
    SUMMARY_FILE,
    read_config,
)
from fedweigh.settings import flatten
from fedweigh.tracking import RunStatus, TrackedRun, Trackers

logger = logging.getLogger("flwr.fedweigh")


CLIENT_NUM_EXAMPLES = "num_examples"
"""metrics.jsonl: a client entry's training sample count n_k (each entry also holds its ``train_loss``)."""
WEIGHTED_F1 = "weighted_f1"
"""metrics.jsonl: the global model's test F1 averaged over the classes by support (scikit-learn's
``average="weighted"``; the FedNolowe paper's F1), beside ``macro_f1``."""
TOP5_ACCURACY = "top5_accuracy"
"""metrics.jsonl: the share of test samples whose label is among the model's 5 largest logits (absent with
fewer than 5 classes)."""
TRAIN_LOSS_UNWEIGHTED = "train_loss_unweighted"
"""metrics.jsonl: the unweighted mean of the aggregated clients' train losses (the FedNolowe paper's "training
loss"), beside ``train_loss``, the same losses weighted by the clients' sample counts n_k."""
FINAL_U_P95, FINAL_U_ABOVE_1 = "final_u_p95", "final_u_above_1"
FINAL_U_TAIL = (FINAL_U_P95, FINAL_U_ABOVE_1)
"""summary.json's tail of u of the final model on the test set (``final-uncertainty``): p95 and the share above 1."""
CENTRAL_METRICS = ("accuracy", "loss", "macro_f1", WEIGHTED_F1, TOP5_ACCURACY, "prediction_share")
"""metrics.jsonl: the fields of the server's central evaluation (rounds that evaluate), as the trackers group them."""

WAIT_SECONDS = "wait_seconds"
"""metrics.jsonl: the round's wait for its train replies, from the instructions handed to the grid to their
aggregation (``seconds`` less this is the server's own work: sampling, aggregation, evaluation, recording)."""
EVALUATE_SECONDS = "evaluate_seconds"
"""metrics.jsonl: the central evaluation's part of the round's ``seconds`` (rounds that evaluate)."""
SEARCH_SECONDS = "search-seconds"
"""metrics.jsonl, Feddle's diagnostics: the round's coefficient search (head fit and loss measurements included)."""
TIMING_FIELDS = ("seconds", WAIT_SECONDS, EVALUATE_SECONDS, SEARCH_SECONDS, *TIMING_KEYS)
"""The fields of metrics.jsonl and summary.json that measure wall time; everything else is determined
by the run config and seed (on CPU)."""


CHECKPOINT_FORMAT = "fedweigh-checkpoint"
"""The ``format`` entry of every checkpoint this app writes: a file without it is not one of ours."""
CHECKPOINT_VERSION = 2
"""The layout version this code writes and the newest it reads (0: the unmarked files of earlier versions;
2: the global model's arrays stored as tensors, which ``torch.save`` writes about 15x faster than numpy arrays)."""
_CHECKPOINT_KEYS = {"round", "arrays", "strategy_state"}
_ACCEPTED = (
    f"accepted: the folder of an earlier run of this app, with the {CHECKPOINT_FILE} it wrote "
    f"(format {CHECKPOINT_FORMAT!r}, version {CHECKPOINT_VERSION} or older)"
)
_SAFE_NUMPY_TYPES = (
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.longlong,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.ulonglong,
    np.float16,
    np.float32,
    np.float64,
    np.longdouble,
    np.complex64,
    np.complex128,
)


def _safe_globals() -> list[Any]:
    """What ``torch.load(weights_only=True)`` may build besides tensors and plain values: numeric numpy data.

    A checkpoint holds numpy arrays (the global models) and scalars (rule
    state); these rebuild them and nothing else: an object array or any
    other class in the file is refused, so loading never runs code from it.
    """
    from numpy._core.multiarray import _reconstruct, scalar

    return [_reconstruct, scalar, np.ndarray, np.dtype, *{type(np.dtype(kind)) for kind in _SAFE_NUMPY_TYPES}]


def _unchangeable(array: np.ndarray) -> np.ndarray:
    """``array`` itself when read-only, else a copy."""
    array = np.asarray(array)
    return array if not array.flags.writeable else array.copy()


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``array``'s memory (a copy of a read-only one, which torch will not share)."""
    array = np.asarray(array)
    return torch.from_numpy(array if array.flags.writeable else array.copy())


@dataclass
class Checkpoint:
    """The state a run needs to continue after round ``round``: the global model and the strategy's state.

    The file is a ``torch.save``'d dict marked ``format`` =
    :data:`CHECKPOINT_FORMAT`, ``version`` = :data:`CHECKPOINT_VERSION`,
    holding tensors, numeric numpy arrays and plain Python values only, so
    that :meth:`load` can read it with ``weights_only=True``. The global
    model's arrays are stored as tensors sharing their memory and read back
    as numpy arrays (files of versions 0 and 1 hold numpy arrays).
    """

    round: int
    arrays: dict[str, np.ndarray]
    strategy_state: dict[str, Any]

    def snapshot(self) -> Checkpoint:
        """A copy that later changes to this one's arrays or state cannot reach.

        Read-only arrays (the decoded global model: views of a message's
        immutable bytes) are shared; writable ones are copied, and the
        strategy state is deep-copied.
        """
        arrays = {name: _unchangeable(array) for name, array in self.arrays.items()}
        return Checkpoint(self.round, arrays, copy.deepcopy(self.strategy_state))

    def encode(self) -> bytes:
        """The file's bytes: ``torch.save`` of the marked payload."""
        payload = {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "round": self.round,
            "arrays": {name: _as_tensor(array) for name, array in self.arrays.items()},
            "strategy_state": self.strategy_state,
        }
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        return buffer.getvalue()

    def save(self, path: Path) -> None:
        """Write atomically: a crash at any point leaves the previous checkpoint or this one, whole.

        The payload goes to a temporary file in the same folder (so that the
        rename cannot cross file systems), which is flushed and fsync'ed
        before ``os.replace`` puts it in place; the folder is fsync'ed after,
        so that the rename itself survives a power cut. A failed write removes
        its temporary file; those of writers that were killed (a crashed
        server) are removed before writing.
        """
        write_atomically(Path(path), self.encode())

    @classmethod
    def load(cls, path: Path, setting: str = "resume-from") -> Checkpoint:
        """Read a checkpoint :meth:`save` wrote; anything else is a ``ValueError`` naming ``setting`` and the file.

        The file is read with ``weights_only=True`` (numeric numpy data
        allow-listed), so a foreign or tampered file cannot run code; a
        truncated one, random bytes, a file of another program (a model's
        ``state_dict``, say) or of a newer fedweigh are refused with what was
        found and what is accepted. Unmarked files of earlier versions (the
        same three entries, no ``format``) are read as version 0.
        """
        path = Path(path)

        def refused(why: str) -> ValueError:
            return ValueError(f"setting {setting} = {str(path.parent)!r}: {path} {why}; {_ACCEPTED}")

        try:
            with torch.serialization.safe_globals(_safe_globals()):
                payload = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise refused("does not exist") from None
        except Exception as err:  # noqa: BLE001 - whatever torch makes of a bad file, one clear message
            raise refused(_unreadable(path, err)) from err
        if not isinstance(payload, dict):
            raise refused(f"holds a {type(payload).__name__}, not a fedweigh checkpoint")
        version = payload.get("format") == CHECKPOINT_FORMAT and payload.get("version")
        if version is False and set(payload) == _CHECKPOINT_KEYS:
            version = 0  # written before checkpoints were marked
        if version is False:
            raise refused(f"is not a fedweigh checkpoint: it holds {_describe(payload)}")
        if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= CHECKPOINT_VERSION:
            raise refused(f"is a fedweigh checkpoint of version {version!r}, which this version cannot read")
        round_, arrays, state = (payload.get(key) for key in ("round", "arrays", "strategy_state"))
        if not isinstance(round_, int) or isinstance(round_, bool) or round_ < 0:
            raise refused(f"is a damaged fedweigh checkpoint: round = {round_!r}")
        if not isinstance(arrays, dict) or not all(
            isinstance(k, str) and isinstance(v, np.ndarray | torch.Tensor) for k, v in arrays.items()
        ):
            raise refused("is a damaged fedweigh checkpoint: its arrays are not named arrays or tensors")
        if not isinstance(state, dict):
            raise refused(f"is a damaged fedweigh checkpoint: its strategy state is a {type(state).__name__}")
        arrays = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in arrays.items()}
        return cls(round=round_, arrays=arrays, strategy_state=state)


class CheckpointWriter:
    """Each round's checkpoint, written off the round's path.

    :meth:`save` takes a :meth:`~Checkpoint.snapshot` in the caller (the
    next round's changes to the model or the strategy's state do not reach
    it) and leaves the encoding, the write, its fsyncs and the rename
    (:meth:`Checkpoint.save`'s guarantees) to one background thread, so that
    the next round starts while they run (``fedweigh benchmark checkpoint``:
    about 7 ms a round for the FedOUI CNN, 100 ms for ResNet-18 on the
    project's machine, against under 1 ms for the snapshot). Writes run one
    at a time, in round order; a save first waits for the previous round's
    write, so at most one is pending. A server killed while a write runs leaves the previous
    round's checkpoint, whole: a resume from it repeats that one round (its
    metrics row is dropped, :meth:`RunRecorder.begin`). A failed write is
    raised by the next :meth:`save` or by :meth:`close`, which waits for the
    last write.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedweigh-checkpoint")
        self._pending: Future[None] | None = None

    def save(self, checkpoint: Checkpoint) -> None:
        """Snapshot ``checkpoint`` now; write it once the previous write is done, in the background."""
        snapshot = checkpoint.snapshot()
        self.flush()
        self._pending = self._thread.submit(snapshot.save, self.path)

    def flush(self) -> None:
        """Wait until the last saved checkpoint is on disk (raising its write's error)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """:meth:`flush`, then end the thread."""
        try:
            self.flush()
        finally:
            self._thread.shutdown(wait=True)


def write_atomically(path: Path, data: bytes) -> None:
    """:meth:`Checkpoint.save`'s atomic write of ``data`` to ``path``."""
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):
        leftover.unlink(missing_ok=True)
    partial = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    # os.open with 0o666 (umask applied), not mkstemp's 0o600: the checkpoint is as readable as any result file
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX; a no-op where folders cannot be opened, e.g. Windows)."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _unreadable(path: Path, err: Exception) -> str:
    """Why ``torch.load`` could not read ``path``, in a few words.

    ``torch.save`` writes a zip archive: a file that starts like one but cannot
    be read is a truncated or damaged PyTorch file; anything else is not one.
    """
    if path.is_dir():
        return "is a folder, not a file"
    if isinstance(err, EOFError) or (path.is_file() and path.stat().st_size == 0):
        return "is empty (a write that never finished?)"
    text = str(err)
    if found := re.search(r"GLOBAL ([\w.]+)", text):
        return (
            f"holds Python objects ({found.group(1)}) that a fedweigh checkpoint never holds; "
            "not loaded, since unpickling them could run code"
        )
    detail = text.split("WeightsUnpickler error:", 1)[-1].strip().split("\n", 1)[0].split(". ", 1)[0][:160]
    if isinstance(err, PermissionError):
        return f"cannot be read: {err.strerror}"
    try:
        with path.open("rb") as handle:
            zipped = handle.read(4) == b"PK\x03\x04"
    except OSError:
        zipped = False
    if zipped:
        return f"is truncated or damaged (a PyTorch file that cannot be read whole: {type(err).__name__}: {detail})"
    return f"is not a PyTorch file, or is damaged ({type(err).__name__}: {detail})"


def _describe(payload: Mapping[Any, Any]) -> str:
    """A few words on a dict that is not a checkpoint: its size, kind and first keys."""
    keys = list(payload)
    shown = ", ".join(repr(key) for key in keys[:4]) + (", ..." if len(keys) > 4 else "")
    if keys and all(isinstance(value, torch.Tensor) for value in payload.values()):
        return f"a dict of {len(keys)} tensors (a model's state_dict?): {shown}"
    return f"a dict with keys {shown}" if keys else "an empty dict"


def round_train_loss(clients: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """The train loss of a round's aggregated clients: weighted by n_k, and unweighted (None without clients).

    ``Σ n_k L_k / Σ n_k`` under ``train_loss``, ``Σ L_k / K`` under
    :data:`TRAIN_LOSS_UNWEIGHTED`; each client entry holds ``train_loss`` and ``num_examples``.

    >>> round_train_loss([{"train_loss": 1.0, "num_examples": 30}, {"train_loss": 2.0, "num_examples": 10}])
    {'train_loss': 1.25, 'train_loss_unweighted': 1.5}
    """
    if not clients:
        return {TRAIN_LOSS: None, TRAIN_LOSS_UNWEIGHTED: None}
    losses = np.array([client[TRAIN_LOSS] for client in clients], dtype=np.float64)
    sizes = np.array([client[CLIENT_NUM_EXAMPLES] for client in clients], dtype=np.float64)
    return {TRAIN_LOSS: float(np.average(losses, weights=sizes)), TRAIN_LOSS_UNWEIGHTED: float(losses.mean())}


def default_run_name(strategy: str) -> str:
    """``<strategy>-<UTC time>``, e.g. ``fedavg-20261122-101500``."""
    return f"{strategy}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


def resolve_run_dir(output_dir: str, run_name: str, resume_from: str, strategy: str) -> Path:
    """The folder of this run: the resumed one, or ``output-dir/run-name``."""
    if resume_from:
        folder = Path(resume_from).expanduser()
        if not (folder / CHECKPOINT_FILE).is_file():
            raise ValueError(
                f"setting resume-from = {resume_from!r}: no {CHECKPOINT_FILE} there; "
                "accepted: the folder of an earlier run of this app"
            )
        return folder
    return Path(output_dir).expanduser() / (run_name or default_run_name(strategy))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunRecorder:
    """Writes a run's folder as the run goes, and hands every round's row to the run's trackers."""

    def __init__(self, run_dir: Path, trackers: Trackers | None = None) -> None:
        self.run_dir = run_dir
        self.trackers = trackers or Trackers()
        self.started = time.perf_counter()
        self.last_mark = self.started
        self.accuracies: dict[int, float] = {}
        self.not_aggregated: set[int] = set()  # rounds whose global model stayed as it was
        self.last_round = 0

    def begin(
        self,
        settings: Mapping[str, Any],
        resumed_round: int,
        instruction: Mapping[str, Any] | None = None,
        num_partitions: int | None = None,
    ) -> None:
        """Create the folder, write the config (a fresh run) or note the resumption, drop rounds after it.

        ``instruction`` is the train config every client receives (its
        per-round values, such as the learning rate, are in each round's
        record); ``num_partitions`` the federation's size. A resumed run
        (``resumed_round`` > 0) keeps ``config.json`` as its first segment
        wrote it and appends a line to ``resumes.jsonl``: the round it
        continues after, when, the federation's size and every setting that
        differs from ``config.json``'s.
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = {
            "settings": dict(settings),
            "instruction": dict(instruction or {}),
            "num_partitions": num_partitions,
            "resumed_from_round": resumed_round,
            "versions": _versions(),
        }
        if resumed_round:
            self._note_resumption(config)
        else:
            (self.run_dir / CONFIG_FILE).write_text(json.dumps(_jsonable(config), indent=2))
        metrics = self.run_dir / METRICS_FILE
        kept = []
        if resumed_round and metrics.exists():
            for line in metrics.read_text().splitlines():
                row = json.loads(line)
                if row["round"] <= resumed_round:
                    kept.append(line)
                    self._note_row(row)
        metrics.write_text("".join(line + "\n" for line in kept))
        self.trackers.start(TrackedRun(self.run_dir.name, self.run_dir, config["settings"], resumed_round))
        self.last_mark = time.perf_counter()  # round 1's seconds are the round's, not the trackers' start-up

    def _note_resumption(self, config: Mapping[str, Any]) -> None:
        """Append this resumption to ``resumes.jsonl`` (config.json stays the run's own)."""
        first = read_config(self.run_dir) or {}
        before, now = flatten(_jsonable(first.get("settings") or {})), flatten(_jsonable(config["settings"]))
        changed = {key: {"was": before.get(key), "now": now[key]} for key in now if before.get(key) != now[key]}
        line = {
            "after_round": config["resumed_from_round"],
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "num_partitions": config["num_partitions"],
            "changed": changed,
            "versions": config["versions"],
        }
        with (self.run_dir / RESUMES_FILE).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(_jsonable(line)) + "\n")

    def _note_row(self, row: Mapping[str, Any]) -> None:
        """What the summary needs of a round's row: its accuracy, and whether it was aggregated."""
        self.last_round = max(self.last_round, int(row["round"]))
        if row.get("accuracy") is not None:
            self.accuracies[row["round"]] = row["accuracy"]
        if row.get("aggregated") is False:
            self.not_aggregated.add(int(row["round"]))

    def record_round(self, row: dict[str, Any], num_rounds: int) -> None:
        """Append one round to metrics.jsonl and print a progress line."""
        now = time.perf_counter()
        row = {"round": row["round"], "seconds": round(now - self.last_mark, 3), **row}
        self.last_mark = now
        written = _jsonable(row)
        with (self.run_dir / METRICS_FILE).open("a") as handle:
            handle.write(json.dumps(written) + "\n")
        self.trackers.log_round(written, central=CENTRAL_METRICS)
        self._note_row(row)
        if row.get("accuracy") is None:  # not an evaluation round (evaluate-every)
            logger.info("[fedweigh] round %d/%d  %.1fs", row["round"], num_rounds, row["seconds"])
            return
        logger.info(
            "[fedweigh] round %d/%d  accuracy %.4f  loss %.4f  %.1fs",
            row["round"],
            num_rounds,
            row["accuracy"],
            row.get("loss", float("nan")),
            row["seconds"],
        )

    def finish(
        self,
        state_dict: Mapping[str, torch.Tensor],
        final: Mapping[str, float],
        extra: Mapping[str, float] | None = None,
    ) -> dict[str, Any]:
        """Write the final model and summary.json (with ``extra``, e.g. :data:`FINAL_U_TAIL`); return the summary."""
        torch.save(dict(state_dict), self.run_dir / MODEL_FILE)
        summary = {
            "final_accuracy": final.get("accuracy"),
            "final_loss": final.get("loss"),
            "best_accuracy": max(self.accuracies.values()) if self.accuracies else None,
            "rounds": self.last_round,
            ROUNDS_NOT_AGGREGATED: sorted(self.not_aggregated),
            "seconds": round(time.perf_counter() - self.started, 2),
            "run_dir": str(self.run_dir),
            **(extra or {}),
        }
        (self.run_dir / SUMMARY_FILE).write_text(json.dumps(_jsonable(summary), indent=2))
        self.trackers.finish("FINISHED")
        return summary

    def fail(self, error: BaseException) -> None:
        """The run stopped with ``error``: end the trackers' runs as ``KILLED`` (interrupted) or ``FAILED``."""
        status: RunStatus = "KILLED" if isinstance(error, KeyboardInterrupt | SystemExit) else "FAILED"
        self.trackers.finish(status)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl."""
    path = Path(run_dir) / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def without_timing(value: Any) -> Any:
    """``value`` (a metrics row, a summary, or a list of them) without its :data:`TIMING_FIELDS`, at any depth.

    Two runs of one config and seed on CPU give equal results under it.

    >>> without_timing({"round": 1, "seconds": 2.5, "clients": [{"partition": 0, "train-seconds": 1.0}]})
    {'round': 1, 'clients': [{'partition': 0}]}
    """
    if isinstance(value, dict):
        return {key: without_timing(item) for key, item in value.items() if key not in TIMING_FIELDS}
    if isinstance(value, list):
        return [without_timing(item) for item in value]
    return value


def _versions() -> dict[str, str]:
    """The versions config.json records: Python, PyTorch, Flower and Flower Datasets."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "flwr": _version("flwr"),
        "flwr-datasets": _version("flwr-datasets"),
    }


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"
