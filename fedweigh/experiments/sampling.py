"""Whether a comparison is paired: every arm of a seed trained the same clients, round by round.

Client sampling is seeded by (seed, round) over partitions
(:mod:`fedweigh.strategies.sampling`), so arms of one seed with the same
sampling settings must have trained the same clients in every round.
:func:`check_sampling` reads what the runs recorded and names the first
difference; the report says so at its top and raises
:class:`SamplingMismatchError` after writing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fedweigh.experiments.runs import RunResult

EARLIER_MARK = "earlier report"
"""How the report marks a run taken from an earlier report's results.csv (its folder is gone)."""


class SamplingMismatchError(RuntimeError):
    """Arms of one seed trained different clients: the comparison is not paired."""


@dataclass(frozen=True)
class SamplingCheck:
    """Whether every arm of a seed trained the same clients, round by round.

    ``ok`` is False when two runs of a seed trained different clients;
    ``compared`` says whether any two runs could be compared at all, and
    ``unrecorded`` names the runs left out because an earlier report did not
    record their clients.
    """

    ok: bool
    lines: tuple[str, ...]
    compared: bool
    unrecorded: tuple[str, ...]

    @property
    def verdict(self) -> str:
        """The summary's one-line answer: it never says "identical" about runs it did not compare."""
        if not self.ok:
            return "NOT identical across arms"
        if not self.compared:
            return "not checked"
        return "identical across the arms compared" if self.unrecorded else "identical across arms"


def check_sampling(results: Sequence[RunResult]) -> SamplingCheck:
    """Compare which clients every arm of each seed trained, round by round.

    Arms whose sampling settings (:data:`~fedweigh.experiments.runs.SAMPLING_SETTINGS`)
    differ are compared only within their own group. Runs with their rounds
    at hand are compared round by round (a difference names its round); a
    run read from an earlier ``results.csv`` by the fingerprint that file
    recorded (:class:`~fedweigh.experiments.runs.ClientSequence`). Runs that
    are not finished, runs that sample no client at all (Center trains on the
    server's data alone) and rows of files written before the fingerprint
    existed are left out, and named.
    """
    ok, compared, lines = True, False, []
    for seed in sorted({r.run.seed for r in results if r.finished}):
        groups: dict[str, list[RunResult]] = {}
        for result in results:
            if result.run.seed == seed and result.finished and (sequence := result.clients()) is not None:
                groups.setdefault(sequence.sampling, []).append(result)
        for members in groups.values():
            if len(members) < 2:
                continue
            compared = True
            reference = next((r for r in members if r.rows), members[0])  # a difference can then name its round
            differences = [
                difference
                for other in members
                if other is not reference and (difference := _sampling_difference(reference, other))
            ]
            if differences:
                ok = False
                lines += [f"seed {seed}, {difference}" for difference in differences]
            else:
                rounds = min(sequence.rounds for r in members if (sequence := r.clients()) is not None)
                arms = ", ".join(r.run.arm + (f" ({EARLIER_MARK})" if r.source is not None else "") for r in members)
                lines.append(f"seed {seed}: the same clients in all {rounds} rounds for {arms}")
    if not lines:
        lines.append("no seed has two finished runs whose clients are known: nothing to compare")
    unrecorded = tuple(r.run.name for r in results if r.finished and r.clients_unrecorded)
    if unrecorded:
        lines.append(
            f"not checked, read from an earlier report that did not record their clients: {', '.join(unrecorded)}"
        )
    return SamplingCheck(ok, tuple(lines), compared, unrecorded)


def _sampling_difference(reference: RunResult, other: RunResult) -> str | None:
    """Where two runs of one seed and sampling group trained different clients; None where they did not."""
    if reference.rows and other.rows:
        for index in range(min(len(reference.rows), len(other.rows))):
            left, right = reference.rows[index].get("sampled"), other.rows[index].get("sampled")
            if left != right:
                return f"round {index + 1}: {reference.run.arm} sampled {left}, {other.run.arm} sampled {right}"
        return None
    theirs, mine = reference.clients(), other.clients()
    if theirs is None or mine is None:  # check_sampling groups only runs that have them
        return None
    rounds = min(theirs.rounds, mine.rounds)
    left, right = reference.clients(rounds), other.clients(rounds)
    if left is None or right is None:
        return (
            f"{reference.run.arm} and {other.run.arm}: clients recorded over {theirs.rounds} and {mine.rounds} "
            "rounds; an earlier report's fingerprint covers all its rounds only, so they cannot be compared"
        )
    if left.digest != right.digest:
        return (
            f"{reference.run.arm} and {other.run.arm} (from {other.source or reference.source}) trained "
            f"different clients within the first {rounds} rounds (fingerprints {left.digest}, {right.digest})"
        )
    return None
