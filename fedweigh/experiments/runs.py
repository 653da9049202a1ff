"""What a finished (or interrupted) run of a grid left behind, and its accuracy scores.

Per run, from the central test accuracy ``acc_1 .. acc_T`` of its rounds:

* **final** = ``acc_T``;
* **best** = ``max_t acc_t`` (selected on test data, so optimistic);
* **mean** = ``mean_t acc_t`` (the FedNolowe paper's tables report this);
* **AUC** = trapezoid of ``acc_1 .. acc_T`` with unit spacing, divided by
  ``T - 1`` (the FedOUI paper's definition; a mean-like number in [0, 1]);
  for ``T = 1`` it is ``acc_1``;
* **last** = the mean over the last :data:`LAST_ROUNDS` rounds (all of them
  in a shorter run; FLood's paper reports the mean over its last 50 of 2,000);
* **late-max** = the best of the accuracies at rounds ``T, T − 10, ..., T −
  40`` (those that exist): the Feddle paper evaluates every 10 rounds and
  reports the best of the last five evaluations.

With ``final-uncertainty`` on, summary.json also holds the tail of u of the
final model on the test set (p95, share above 1), carried as they are.
Beside them, from the same rounds: the macro-F1 and the weighted F1 (final
and mean over rounds), the top-5 accuracy (final and mean; on tasks with at
least 5 classes), the test loss (final and mean over rounds), and the
accuracy's **rolling std**: the sample std (ddof = 1) of each window of
:data:`ROLLING_WINDOW` consecutive evaluations, averaged over the windows (the
FedNolowe paper's "± Std with rolling window = 5"; :func:`rolling_std`). From
every round: the mean over rounds of the clients' train loss, weighted by n_k
and unweighted (the FedNolowe paper's training loss is the unweighted one).

:func:`collect_results` reads every planned run's folder into a
:class:`RunResult`; the report (:mod:`fedweigh.experiments.report`) and the
plots (:mod:`fedweigh.experiments.plots`) both start from those. Each run
also carries which clients it trained, round by round, as a fingerprint
(:class:`ClientSequence`) that ``results.csv`` keeps, so a report that reads
an earlier ``results.csv`` can still check that its arms were paired.

Example
-------
>>> scores = run_scores([0.2, 0.4, 0.3])
>>> scores.final, scores.best, round(scores.mean, 4), round(scores.auc, 4)
(0.3, 0.4, 0.3, 0.325)
>>> run_scores([0.9] + [0.1] * 9 + [0.5] + [0.2] * 9 + [0.3]).late_max  # rounds 21, 11, 1
0.9
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fedweigh.experiments.grid import PlannedRun, read_run_record
from fedweigh.protocol import TRAIN_LOSS
from fedweigh.results import (
    CONFIG_FILE,
    FINAL_U_TAIL,
    METRICS_FILE,
    SUMMARY_FILE,
    TOP5_ACCURACY,
    TRAIN_LOSS_UNWEIGHTED,
    WEIGHTED_F1,
    read_metrics,
)

FINISHED = "finished"  # a run's status when its folder holds every round it plans (results.csv's `status`)

COLLAPSE_SHARE = 0.9
"""A collapsed model predicts its most frequent class for at least this share of the test set, on average."""
COLLAPSE_ROUNDS = 5
"""... over this many rounds in a row (the whole run, if it is shorter).

Under strong label skew a single round's model can predict one class and the
next round's recover (FedAvg with 5 of 20 Dirichlet-0.1 clients does, its
5-round means stay near 0.75-0.8); a collapsed model stays there, up to a
stray round.
"""


def _cell_fields(pattern: re.Pattern[str], text: str, column: str, accepted: str) -> tuple[str, ...] | None:
    """The fields of a ``results.csv`` cell that a ``__str__`` wrote; None for an empty cell.

    Raises
    ------
    ValueError
        When ``pattern`` does not match all of ``text``, naming the column, the text and ``accepted``.
    """
    if not text:
        return None
    match = pattern.fullmatch(text)
    if match is None:
        raise ValueError(f"{column} {text!r}: accepted: empty, or {accepted}")
    return match.groups()


@dataclass(frozen=True)
class Collapse:
    """When a run's global model collapsed to predicting one class.

    Attributes
    ----------
    round : int
        The first round of the first :data:`COLLAPSE_ROUNDS`-round window
        whose models predicted one class for at least :data:`COLLAPSE_SHARE`
        of the test set on average.
    accuracy : float
        Its accuracy then.
    lam : float or None
        FLood's λ(t) in that round, when the run had one.
    recovered : bool
        Whether the run's last window was no longer collapsed.
    """

    round: int
    accuracy: float
    lam: float | None
    recovered: bool

    def __str__(self) -> str:
        lam = "" if self.lam is None else f", λ = {self.lam:.4g}"
        return (
            f"round {self.round} (accuracy {self.accuracy:.4f}{lam}); {'recovered' if self.recovered else 'to the end'}"
        )

    @classmethod
    def parse(cls, text: str) -> Collapse | None:
        """The collapse a ``results.csv`` cell holds (its ``str()``, rounded as written); None for an empty cell.

        Raises
        ------
        ValueError
            For any other text, naming it and the accepted form.
        """
        fields = _cell_fields(
            _COLLAPSE_TEXT, text, "collapse", "'round R (accuracy A[, λ = L]); recovered' (or '; to the end')"
        )
        if fields is None:
            return None
        number, accuracy, lam, ending = fields
        return cls(int(number), float(accuracy), None if lam is None else float(lam), ending == "recovered")


_COLLAPSE_TEXT = re.compile(r"round (\d+) \(accuracy ([^,)]+)(?:, λ = ([^)]+))?\); (recovered|to the end)")
"""What :meth:`Collapse.__str__` writes, for :meth:`Collapse.parse`."""


SAMPLING_SETTINGS = ("fraction-train", "min-train-nodes", "delay-std")
"""Settings that change which clients a round samples: arms differing in them are not paired.

(Simulated delays decide which clients are in flight, and so not sampled.)
"""

_DIGEST_LENGTH = 16  # hex digits of SHA-256 kept: 64 bits, no chance collision between the runs of one report


@dataclass(frozen=True)
class ClientSequence:
    """Which clients a run trained, round by round, in a form a ``results.csv`` cell can carry.

    Two runs with equal :attr:`sampling` trained the same clients in their
    first :attr:`rounds` rounds exactly when their :attr:`digest` is equal.

    Attributes
    ----------
    sampling : str
        The run's :data:`SAMPLING_SETTINGS`, as ``key=value`` pairs (values as JSON).
    rounds : int
        How many rounds the digest covers.
    digest : str
        The first 16 hex digits of the SHA-256 of the rounds' ``sampled`` partition lists, as compact JSON.

    >>> rows = [{"sampled": [3, 7]}, {"sampled": [1, 3]}]
    >>> sequence = ClientSequence.of(rows, {"fraction-train": 0.5, "min-train-nodes": 2})
    >>> sequence.rounds, sequence.sampling
    (2, 'fraction-train=0.5 min-train-nodes=2 delay-std=null')
    >>> ClientSequence.parse(str(sequence)) == sequence
    True
    """

    sampling: str
    rounds: int
    digest: str

    @classmethod
    def of(cls, rows: Sequence[dict[str, Any]], settings: dict[str, Any]) -> ClientSequence | None:
        """The fingerprint of these rounds' ``sampled`` lists; None when no round sampled a client (Center)."""
        sampled = [row.get("sampled") for row in rows]
        if not any(sampled):
            return None
        text = json.dumps(sampled, separators=(",", ":"))
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:_DIGEST_LENGTH]
        sampling = " ".join(f"{key}={json.dumps(settings.get(key))}" for key in SAMPLING_SETTINGS)
        return cls(sampling, len(rows), digest)

    def __str__(self) -> str:
        return f"{self.digest} over {self.rounds} rounds ({self.sampling})"

    @classmethod
    def parse(cls, text: str) -> ClientSequence | None:
        """The fingerprint a ``results.csv`` cell holds (its ``str()``); None for an empty cell; a ValueError
        naming any other text and the accepted form."""
        form = f"'<{_DIGEST_LENGTH} hex digits> over R rounds (<settings>)'"
        accepted = f"{NO_CLIENTS!r}, {CLIENTS_UNRECORDED!r} or {form}"
        fields = _cell_fields(_CLIENTS_TEXT, text, "clients", accepted)
        if fields is None:
            return None
        digest, rounds, sampling = fields
        return cls(sampling, int(rounds), digest)


_CLIENTS_TEXT = re.compile(rf"([0-9a-f]{{{_DIGEST_LENGTH}}}) over (\d+) rounds \((.*)\)")
"""What :meth:`ClientSequence.__str__` writes, for :meth:`ClientSequence.parse`."""

NO_CLIENTS = "none"
"""The ``clients`` cell of a finished run that trained no client (Center trains on the server's data alone)."""
CLIENTS_UNRECORDED = "unrecorded"
"""The ``clients`` cell of a finished run whose clients are not known: it was read from a ``results.csv`` that
did not record them. Kept as such, so that a report built on this one does not mistake it for a run that
trained no client."""


def recorded_clients(cell: str | None) -> tuple[ClientSequence | None, bool]:
    """``(fingerprint, unrecorded)`` from the ``clients`` cell of a finished run's ``results.csv`` row.

    ``None`` (the file has no such column), an empty cell (written before
    :data:`NO_CLIENTS` and :data:`CLIENTS_UNRECORDED` existed, when an empty
    cell could mean either) and :data:`CLIENTS_UNRECORDED` all mean the
    clients are not known; :data:`NO_CLIENTS` that the run trained none.

    >>> recorded_clients(NO_CLIENTS), recorded_clients(""), recorded_clients(None)
    ((None, False), (None, True), (None, True))
    """
    if cell is None or cell in ("", CLIENTS_UNRECORDED):
        return None, True
    if cell == NO_CLIENTS:
        return None, False
    return ClientSequence.parse(cell), False


def find_collapse(rows: Sequence[dict[str, Any]]) -> Collapse | None:
    """The first window of rounds whose models predicted one class for (almost) everything, if any.

    >>> share = [0.2, 1.0, 0.3, 0.95, 0.99, 1.0, 0.8, 0.92, 0.97, 1.0]  # round 2 alone is no collapse
    >>> rows = [{"round": r, "accuracy": 0.1, "prediction_share": s, "diagnostics": {"asw-lambda": 10.0 * r}}
    ...         for r, s in enumerate(share, start=1)]
    >>> str(find_collapse(rows))
    'round 4 (accuracy 0.1000, λ = 40); to the end'
    """
    shares = [row.get("prediction_share") for row in rows]
    if not rows or not all(isinstance(share, int | float) for share in shares):
        return None
    width = min(COLLAPSE_ROUNDS, len(rows))

    def collapsed(start: int) -> bool:
        return float(np.mean(shares[start : start + width])) >= COLLAPSE_SHARE

    for start in range(len(rows) - width + 1):
        if collapsed(start):
            row = rows[start]
            lam = (row.get("diagnostics") or {}).get("asw-lambda")
            return Collapse(int(row["round"]), float(row["accuracy"]), lam, not collapsed(len(rows) - width))
    return None


ROLLING_WINDOW = 5
"""Evaluations per window of the rolling std: the FedNolowe paper's "rolling window = 5" (spec §9, A9)."""

_FINAL_AND_MEAN = ("macro_f1", WEIGHTED_F1, TOP5_ACCURACY)
"""Test metrics of metrics.jsonl scored by their final value and their mean over the evaluations."""
_TRAIN_LOSSES = (TRAIN_LOSS, TRAIN_LOSS_UNWEIGHTED)
"""The round train losses of metrics.jsonl, scored by their mean over the rounds that recorded one."""
ROLLING_STD_ACCURACY = "rolling_std_accuracy"

OTHER_SCORES = (
    "final_macro_f1",
    "mean_macro_f1",
    "mean_loss",
    *(f"{kind}_{key}" for key in _FINAL_AND_MEAN[1:] for kind in ("final", "mean")),
    ROLLING_STD_ACCURACY,
    *(f"mean_{key}" for key in _TRAIN_LOSSES),
    *FINAL_U_TAIL,
)
"""Scores of a run besides accuracy (columns of ``results.csv``)."""


def rolling_std(values: Sequence[float], window: int = ROLLING_WINDOW) -> float:
    """Mean over the windows of ``window`` consecutive values of their sample std (ddof = 1); NaN if fewer.

    The same as ``pandas.Series(values).rolling(window).std().mean()``: a
    measure of round-to-round fluctuation, blind to a steady trend's level.

    >>> round(rolling_std([0.1, 0.3, 0.1, 0.3], window=2), 6)  # every window's std is sqrt(0.02)
    0.141421
    >>> rolling_std([0.5, 0.6], window=5)
    nan
    """
    if window < 2:
        raise ValueError(f"rolling_std: window = {window}; accepted: 2 or more (a sample std needs two values)")
    array = np.asarray(values, dtype=np.float64)
    if array.size < window:
        return float("nan")
    return float(np.lib.stride_tricks.sliding_window_view(array, window).std(axis=1, ddof=1).mean())


def _numbers(rows: Sequence[dict[str, Any]], key: str) -> list[float] | None:
    """The rows' values of ``key`` when every row holds a number, else None."""
    values = [row.get(key) for row in rows]
    return [float(v) for v in values] if values and all(isinstance(v, int | float) for v in values) else None


def other_scores(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Final and mean-over-rounds F1 and top-5 accuracy, mean test loss, the accuracy's rolling std.

    A score is left out when a row misses its metric (the rolling std also
    with fewer than :data:`ROLLING_WINDOW` rows).

    >>> other_scores([{"macro_f1": 0.4, "loss": 2.0}, {"macro_f1": 0.6, "loss": 1.0}])
    {'final_macro_f1': 0.6, 'mean_macro_f1': 0.5, 'mean_loss': 1.5}
    """
    scores: dict[str, float] = {}
    for key in _FINAL_AND_MEAN:
        if (values := _numbers(rows, key)) is not None:
            scores[f"final_{key}"], scores[f"mean_{key}"] = values[-1], float(np.mean(values))
    if (loss := _numbers(rows, "loss")) is not None:
        scores["mean_loss"] = float(np.mean(loss))
    accuracies = _numbers(rows, "accuracy")
    if accuracies is not None and len(accuracies) >= ROLLING_WINDOW:
        scores[ROLLING_STD_ACCURACY] = rolling_std(accuracies)
    return scores


def train_loss_scores(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean over the rounds that recorded one of the clients' train loss, n_k-weighted and unweighted.

    >>> rows = [{"train_loss": 1.0, "train_loss_unweighted": 2.0}, {"train_loss": None}, {"train_loss": 3.0}]
    >>> train_loss_scores(rows)  # a round without clients records none
    {'mean_train_loss': 2.0, 'mean_train_loss_unweighted': 2.0}
    """
    scores = {}
    for key in _TRAIN_LOSSES:
        values = [float(row[key]) for row in rows if isinstance(row.get(key), int | float)]
        if values:
            scores[f"mean_{key}"] = float(np.mean(values))
    return scores


def final_u_tail(summary: dict[str, Any]) -> dict[str, float]:
    """The tail of u of the final model that summary.json holds (``final-uncertainty``), if any.

    >>> final_u_tail({"final_u_p95": 1.9, "final_u_above_1": 0.4, "rounds": 3}), final_u_tail({"rounds": 3})
    ({'final_u_p95': 1.9, 'final_u_above_1': 0.4}, {})
    """
    return {key: float(summary[key]) for key in FINAL_U_TAIL if isinstance(summary.get(key), int | float)}


def accuracy_auc(accuracies: Sequence[float]) -> float:
    """Trapezoid over rounds ``1..T`` (unit spacing) divided by ``T - 1``; ``acc_1`` when ``T = 1``.

    >>> accuracy_auc([0.5, 0.5, 0.5]), accuracy_auc([0.0, 1.0]), accuracy_auc([0.7])
    (0.5, 0.5, 0.7)
    """
    values = np.asarray(accuracies, dtype=np.float64)
    if values.size == 0:
        raise ValueError("accuracy_auc needs at least one round")
    if values.size == 1:
        return float(values[0])
    return float(np.trapezoid(values) / (values.size - 1))


@dataclass(frozen=True)
class RunScores:
    """The accuracy scores of one run (see the module docstring)."""

    final: float
    best: float
    mean: float
    auc: float
    last: float
    rounds: int
    late_max: float = float("nan")

    def get(self, name: str) -> float:
        return float(getattr(self, name.replace("-", "_")))


LAST_ROUNDS = 10
"""The ``last`` score averages the accuracy of this many final rounds."""
LATE_EVALUATIONS, EVALUATION_EVERY = 5, 10
"""The ``late-max`` score: the best of this many evaluations, this many rounds apart, ending with the last round."""


def run_scores(accuracies: Sequence[float], rounds: Sequence[int] | None = None) -> RunScores:
    """The scores of the accuracies of rounds ``rounds`` (default ``1 .. T``; fewer when evaluate-every > 1).

    Means and the AUC are taken over the evaluations made; ``last`` over
    those of the last :data:`LAST_ROUNDS` rounds; ``late-max`` over those at
    ``T, T - 10, ..., T - 40``.

    >>> run_scores([0.2, 0.6, 0.4], rounds=[10, 20, 25]).late_max  # rounds 25 and 15 were asked for, 25 was made
    0.4
    """
    values = [float(a) for a in accuracies]
    if not values:
        raise ValueError("run_scores needs at least one round")
    made = list(rounds) if rounds is not None else list(range(1, len(values) + 1))
    if len(made) != len(values):
        raise ValueError(f"{len(values)} accuracies for {len(made)} rounds")
    final_round = made[-1]
    late = {final_round - k * EVALUATION_EVERY for k in range(LATE_EVALUATIONS)}
    return RunScores(
        final=values[-1],
        best=max(values),
        mean=float(np.mean(values)),
        auc=accuracy_auc(values),
        last=float(np.mean([v for r, v in zip(made, values, strict=True) if r > final_round - LAST_ROUNDS])),
        rounds=final_round,
        late_max=max(v for r, v in zip(made, values, strict=True) if r in late),
    )


@dataclass
class RunResult:
    """What one (arm, seed) run left in its folder."""

    run: PlannedRun
    status: str  # FINISHED, "incomplete (k/T rounds)", "missing"
    rows: list[dict[str, Any]] = field(default_factory=list)
    scores: RunScores | None = None
    final_loss: float | None = None
    others: dict[str, float] = field(default_factory=dict)  # OTHER_SCORES
    collapse: Collapse | None = None
    wall_seconds: float | None = None
    server_seconds: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    source: Path | None = None  # the results.csv it was read from (no per-round rows then); None: its folder
    recorded_clients: ClientSequence | None = None  # read from that results.csv, where it has them
    clients_unrecorded: bool = False  # read from a results.csv that did not record them (recorded_clients)

    @property
    def finished(self) -> bool:
        return self.scores is not None

    def clients(self, rounds: int | None = None) -> ClientSequence | None:
        """Which clients it trained in its first ``rounds`` rounds (all of them: None).

        From its rows; for a run read from an earlier ``results.csv``, what
        that file recorded, and only over the rounds it recorded. None where
        neither tells (a file written before the ``clients`` column, a run
        that sampled no client).
        """
        if self.rows:
            return ClientSequence.of(self.rows if rounds is None else self.rows[:rounds], self.settings)
        recorded = self.recorded_clients
        return recorded if recorded is not None and rounds in (None, recorded.rounds) else None

    @classmethod
    def from_csv_row(cls, run: PlannedRun, row: dict[str, str], source: Path) -> RunResult:
        """A finished run as a ``results.csv`` row recorded it: its scores, not its rounds.

        The inverse of :meth:`csv_row` for what the table and the paired
        differences need; ``rows`` stays empty, so the plots and the
        client-sampling check leave it out. ``run_dir`` is the row's.
        """

        def number(column: str) -> float | None:
            cell = row.get(column) or ""
            return float(cell) if cell else None

        def score(column: str) -> float:
            value = number(column)
            return float("nan") if value is None else value

        scores = RunScores(
            final=score("final_accuracy"),
            best=score("best_accuracy"),
            mean=score("mean_accuracy"),
            auc=score("auc_accuracy"),
            last=score("last10_accuracy"),
            rounds=int(row["rounds"]),
            late_max=score("late_max_accuracy"),
        )
        others = {name: value for name in OTHER_SCORES if (value := number(name)) is not None}
        recorded, unrecorded = recorded_clients(row.get("clients"))
        return cls(
            replace(run, run_dir=Path(row["run_dir"])),
            row["status"],
            scores=scores,
            final_loss=number("final_loss"),
            others=others,
            wall_seconds=number("wall_seconds"),
            server_seconds=number("server_seconds"),
            collapse=Collapse.parse(row.get("collapse") or ""),
            source=Path(source),
            recorded_clients=recorded,
            clients_unrecorded=unrecorded,
        )

    def _clients_cell(self) -> str:
        """What :func:`recorded_clients` reads back: the fingerprint, or why there is none."""
        if not self.finished:
            return ""
        if (clients := self.clients()) is not None:
            return str(clients)
        return CLIENTS_UNRECORDED if self.clients_unrecorded else NO_CLIENTS

    def csv_row(self, experiment: str) -> dict[str, Any]:
        scores = self.scores
        return {
            "experiment": experiment,
            "arm": self.run.arm,
            "strategy": self.run.strategy,
            "seed": self.run.seed,
            "run_name": self.run.name,
            "status": self.status,
            "rounds": scores.rounds if scores else len(self.rows),
            "final_accuracy": _cell(scores.final if scores else None),
            "best_accuracy": _cell(scores.best if scores else None),
            "mean_accuracy": _cell(scores.mean if scores else None),
            "auc_accuracy": _cell(scores.auc if scores else None),
            "last10_accuracy": _cell(scores.last if scores else None),
            "late_max_accuracy": _cell(scores.late_max if scores else None),
            "final_loss": _cell(self.final_loss),
            **{name: _cell(self.others.get(name)) for name in OTHER_SCORES},
            "collapse": "" if self.collapse is None else str(self.collapse),
            "clients": self._clients_cell(),
            "wall_seconds": _cell(self.wall_seconds, 2),
            "server_seconds": _cell(self.server_seconds, 2),
            "run_dir": str(self.run.run_dir),
        }


def _cell(value: float | None, digits: int = 6) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def collect_results(runs: Sequence[PlannedRun]) -> list[RunResult]:
    """Read every planned run's folder; runs not (fully) done are marked, not scored."""
    results = []
    for run in runs:
        folder = run.run_dir
        if not (folder / METRICS_FILE).is_file():
            results.append(RunResult(run, "missing"))
            continue
        rows = sorted(read_metrics(folder), key=lambda row: row["round"])
        summary = _read_json(folder / SUMMARY_FILE)
        config = _read_json(folder / CONFIG_FILE)
        record = read_run_record(folder) or {}
        evaluated = [row for row in rows if row.get("accuracy") is not None]  # every round, or every evaluate-every
        complete = (
            isinstance(summary, dict)
            and summary.get("rounds") == run.rounds
            and [row["round"] for row in rows] == list(range(1, run.rounds + 1))
            and bool(evaluated)
            and evaluated[-1]["round"] == run.rounds
            and all(isinstance(row["accuracy"], int | float) for row in evaluated)
        )
        segments = record.get("segments", [])
        wall = sum(float(s.get("wall_seconds") or 0.0) for s in segments) if segments else None
        result = RunResult(
            run,
            FINISHED if complete else f"incomplete ({len(rows)}/{run.rounds} rounds)",
            rows=rows,
            wall_seconds=wall,
            server_seconds=summary.get("seconds") if isinstance(summary, dict) else None,
            settings=config.get("settings", {}) if isinstance(config, dict) else {},
        )
        if complete:
            result.scores = run_scores([row["accuracy"] for row in evaluated], [row["round"] for row in evaluated])
            result.final_loss = rows[-1].get("loss")
            result.others = other_scores(evaluated) | train_loss_scores(rows) | final_u_tail(summary)
        result.collapse = find_collapse([row for row in rows if row.get("accuracy") is not None])
        results.append(result)
    return results
