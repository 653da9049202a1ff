"""A live progress line for runs submitted to a SuperLink: runs done, the current round, time left.

Every run's ServerApp logs one line per round
(:meth:`fedweigh.results.RunRecorder.record_round`); a launcher passes the
streamed log to :meth:`RunsProgress.on_line`, which shows::

    [experiment] runs 3/15 done | fedoui-seed2: round 12/50 acc 0.6123 | left ~41m07s
    [simulate] fedavg-20261122T101500Z: round 3/5 acc 0.7806 | left ~9s

On a terminal the line is redrawn in place; elsewhere (a log file, CI) each
update is a line of its own. The experiment runner, ``fedweigh simulate`` and
the benchmarks use it.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TextIO

__all__ = ["PendingRun", "PlannedRounds", "RoundLine", "RunsProgress", "format_duration", "parse_round_line"]

# RunRecorder.record_round logs "[fedweigh] round 3/10  accuracy 0.4123  loss 1.6620  2.1s".
_ROUND_LINE = re.compile(
    r"\[fedweigh\] round (\d+)/(\d+)\s+accuracy\s+(\S+)\s+loss\s+(\S+)\s+([0-9.]+)s",
)


@dataclass(frozen=True)
class RoundLine:
    """One parsed ``[fedweigh] round`` log line."""

    round: int
    total: int
    accuracy: float
    loss: float
    seconds: float


def parse_round_line(line: str) -> RoundLine | None:
    """Parse a run's progress line; None for any other line.

    >>> parse_round_line("INFO :      [fedweigh] round 3/10  accuracy 0.4123  loss 1.6620  2.1s")
    RoundLine(round=3, total=10, accuracy=0.4123, loss=1.662, seconds=2.1)
    >>> parse_round_line("INFO :      [ROUND 3/10]") is None
    True
    """
    match = _ROUND_LINE.search(line)
    if not match:
        return None
    return RoundLine(
        int(match.group(1)), int(match.group(2)), float(match.group(3)), float(match.group(4)), float(match.group(5))
    )


def format_duration(seconds: float | None) -> str:
    """``1h02m``, ``5m07s``, ``42s``; ``?`` when unknown.

    >>> format_duration(3725), format_duration(307), format_duration(42.4), format_duration(None)
    ('1h02m', '5m07s', '42s', '?')
    """
    if seconds is None:
        return "?"
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class PlannedRounds(Protocol):
    """A run as progress sees it (an experiment's :class:`~fedweigh.experiments.grid.RunPlan` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def rounds(self) -> int:
        """``num-server-rounds``."""
        ...

    @property
    def done_rounds(self) -> int:
        """Rounds already in its folder when it starts (a resumed run's checkpoint)."""
        ...

    @property
    def remaining_rounds(self) -> int:
        """Rounds still to run; 0 for a run that is done already (skipped)."""
        ...


@dataclass(frozen=True)
class PendingRun:
    """A run about to start: its name and rounds (``fedweigh simulate``, a benchmark's run)."""

    name: str
    rounds: int
    done_rounds: int = 0

    @property
    def remaining_rounds(self) -> int:
        return self.rounds - self.done_rounds


@dataclass
class RunsProgress:
    """Progress of a sequence of runs: runs done, the current run's round, time left.

    The time left is estimated from what was measured so far: the mean wall
    time of a round (from consecutive round lines, spread over the rounds
    between them when only every few rounds print one) times the rounds still to
    go, plus each remaining run's fixed cost (start-up and shut-down: a
    finished run's wall time minus its rounds).
    """

    runs: Sequence[PlannedRounds]
    label: str = "experiment"
    out: TextIO = field(default_factory=lambda: sys.stderr)
    clock: Callable[[], float] = time.monotonic
    done: int = 0
    failed: int = 0
    current: PlannedRounds | None = None
    current_round: int = 0
    last_accuracy: float | None = None
    round_seconds: list[float] = field(default_factory=list)
    reported_seconds: list[float] = field(default_factory=list)
    fixed_seconds: list[float] = field(default_factory=list)
    _run_started: float = 0.0
    _last_mark: float = 0.0
    _live: bool = False

    def __post_init__(self) -> None:
        self.total = len(self.runs)
        self.done = sum(1 for run in self.runs if run.remaining_rounds <= 0)
        self._live = bool(getattr(self.out, "isatty", lambda: False)())

    def start_run(self, run: PlannedRounds) -> None:
        self.current = run
        self.current_round = run.done_rounds
        self.last_accuracy = None
        self._run_started = self._last_mark = self.clock()
        self.show()

    def on_line(self, line: str) -> None:
        """Feed a log line of the current run; shows progress on round lines."""
        parsed = parse_round_line(line)
        if parsed is None or self.current is None:
            return
        now = self.clock()
        rounds = parsed.round - self.current_round  # more than one when rounds are evaluated every few
        if self.current_round > self.current.done_rounds and rounds > 0:  # the first line carries the start-up
            self.round_seconds.extend([(now - self._last_mark) / rounds] * rounds)
        self.reported_seconds.append(parsed.seconds)
        self._last_mark = now
        self.current_round = parsed.round
        self.last_accuracy = parsed.accuracy
        self.show()

    def echo(self, line: str, stream: TextIO) -> None:
        """Write a log line to ``stream`` above the live progress line, which is drawn again below it."""
        if self._live:
            self.out.write("\r\x1b[2K")
            self.out.flush()
        stream.write(line if line.endswith("\n") else line + "\n")
        stream.flush()
        if self._live and self.current is not None:
            self.out.write(self.line())
            self.out.flush()

    def echo_and_watch(self, stream: TextIO) -> Callable[[str], None]:
        """An ``on_line`` for a launcher: each log line echoed to ``stream`` (:meth:`echo`), then watched."""

        def handle(line: str) -> None:
            self.echo(line, stream)
            self.on_line(line)

        return handle

    def finish_run(self, ok: bool) -> None:
        wall = self.clock() - self._run_started
        if ok and self.current is not None:
            rounds_done = self.current_round - self.current.done_rounds
            per_round = self.mean_round_seconds() or 0.0
            self.fixed_seconds.append(max(0.0, wall - rounds_done * per_round))
        self.done += 1
        self.failed += 0 if ok else 1
        self.current = None
        self.show(final=True)

    def mean_round_seconds(self) -> float | None:
        """Mean wall time between round lines; the rounds' own times until two rounds were seen."""
        measured = self.round_seconds or self.reported_seconds
        return sum(measured) / len(measured) if measured else None

    def seconds_left(self) -> float | None:
        per_round = self.mean_round_seconds()
        if per_round is None:
            return None
        fixed = sum(self.fixed_seconds) / len(self.fixed_seconds) if self.fixed_seconds else 0.0
        pending = [run for run in self.runs if run.remaining_rounds > 0]
        started = self.done - (self.total - len(pending))
        future = pending[started + (1 if self.current else 0) :]
        left = sum(run.remaining_rounds for run in future) * per_round + len(future) * fixed
        if self.current is not None:
            left += (self.current.rounds - self.current_round) * per_round
            if self.current_round == self.current.done_rounds:  # still starting up
                left += max(0.0, fixed - (self.clock() - self._run_started))
        return left

    def line(self) -> str:
        failed = f", {self.failed} failed" if self.failed else ""
        parts = [f"runs {self.done}/{self.total} done{failed}"] if self.total > 1 else []
        if self.current is not None:
            text = f"{self.current.name}: round {self.current_round}/{self.current.rounds}"
            if self.last_accuracy is not None:
                text += f" acc {self.last_accuracy:.4f}"
            parts.append(text)
        elif self.total == 1:
            state = "failed" if self.failed else "done" if self.done else "waiting"
            parts.append(f"{self.runs[0].name}: {state}")
        parts.append(f"left ~{format_duration(self.seconds_left())}")
        return f"[{self.label}] " + " | ".join(parts)

    def show(self, final: bool = False) -> None:
        if self._live:
            self.out.write("\r\x1b[2K" + self.line() + ("\n" if final else ""))
        else:
            self.out.write(self.line() + "\n")
        self.out.flush()
