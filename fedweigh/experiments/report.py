"""The experiment's table: ``results.csv`` (one row per run) and ``summary.md`` (per arm).

Per run: the final, best, mean-over-rounds and AUC accuracy
(:mod:`fedweigh.experiments.runs`). Per arm: mean ± sample standard deviation (``ddof=1``) over seeds, with the
paper's reported numbers beside them when the experiment file gives them.

With ``reference-arm`` set, ``summary.md`` also compares every arm with it
seed by seed (:func:`~fedweigh.experiments.paired.paired_difference`): the mean of ``arm - reference`` over
the seeds both finished, its standard error and the win count. The pairs in
``paired-comparisons`` (the comparison a paper draws between two other arms,
say FedNolowe against FedProx) get the same table.

The report also checks what makes a comparison paired: for each seed, every
arm (with the same sampling settings) must have trained the same clients in
every round (:mod:`fedweigh.experiments.sampling`). If that does not hold,
``summary.md`` says so at the top and :func:`write_report` raises
:class:`~fedweigh.experiments.sampling.SamplingMismatchError` after writing.

Runs whose folders are gone can still be counted: ``fedweigh experiment
report --include-results <earlier results.csv>`` takes each planned run that
has no finished folder from that file (:func:`read_earlier_results`), and
``summary.md`` lists which ones it took.

"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from fedweigh.experiments.grid import PlannedRun
from fedweigh.experiments.paired import mean_std, paired_difference
from fedweigh.experiments.runs import (
    COLLAPSE_ROUNDS,
    COLLAPSE_SHARE,
    FINISHED,
    OTHER_SCORES,
    ROLLING_STD_ACCURACY,
    ROLLING_WINDOW,
    RunResult,
    collect_results,
)
from fedweigh.experiments.sampling import EARLIER_MARK, SamplingCheck, SamplingMismatchError, check_sampling
from fedweigh.experiments.spec import SCORE_NAMES, Experiment, ExperimentError, Reported
from fedweigh.protocol import TRAIN_LOSS
from fedweigh.results import FINAL_U_ABOVE_1, FINAL_U_P95, TOP5_ACCURACY, TRAIN_LOSS_UNWEIGHTED, WEIGHTED_F1

__all__ = [
    "CSV_COLUMNS",
    "ArmSummary",
    "read_earlier_results",
    "render_summary",
    "summarize_arms",
    "write_report",
    "write_results_csv",
]


RESULTS_CSV = "results.csv"


SUMMARY_MD = "summary.md"


_IDENTITY_COLUMNS = ("experiment", "arm", "strategy", "seed", "run_name", "status", "rounds")


_ACCURACY_COLUMNS = ("final_accuracy", "best_accuracy", "mean_accuracy", "auc_accuracy", "last10_accuracy")


CSV_COLUMNS = (
    *_IDENTITY_COLUMNS,
    *_ACCURACY_COLUMNS,
    "late_max_accuracy",
    "final_loss",
    *OTHER_SCORES,
    "collapse",
    "clients",
    "wall_seconds",
    "server_seconds",
    "run_dir",
)


def write_results_csv(results: Sequence[RunResult], path: Path, experiment: str) -> Path:
    """One row per run (see :data:`CSV_COLUMNS`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for result in results:
            writer.writerow(result.csv_row(experiment))
    return path


_EARLIER_COLUMNS = (*_IDENTITY_COLUMNS, *_ACCURACY_COLUMNS, "run_dir")
"""The columns an earlier ``results.csv`` must have (older reports lack some of the other scores)."""


def read_earlier_results(
    path: Path, experiment: Experiment, runs: Sequence[PlannedRun]
) -> dict[tuple[str, int], RunResult]:
    """The finished runs of this grid that an earlier report's ``results.csv`` holds, by ``(arm, seed)``.

    For a grid whose run folders are gone, or split over output dirs (seed 1
    run months ago, seed 2 now): the table and the paired differences take
    them as they were recorded. A row must be of the same experiment, and of
    the same strategy and number of rounds as the planned run it stands for;
    rows of runs not in this grid, and unfinished ones, are left out.

    Raises
    ------
    ExperimentError
        When the file cannot be read or is not this experiment's, naming the file, the value and what is accepted.
    """
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [column for column in _EARLIER_COLUMNS if column not in (reader.fieldnames or ())]
            rows = list(reader)
    except OSError as err:
        raise ExperimentError(f"--include-results {path}: cannot be read ({err.strerror})") from err
    if missing:
        raise ExperimentError(
            f"--include-results {path}: not a {RESULTS_CSV} of fedweigh's experiment report (no column "
            f"{', '.join(missing)})"
        )
    planned = {(run.arm, run.seed): run for run in runs}
    found: dict[tuple[str, int], RunResult] = {}
    problems = []
    for line, row in enumerate(rows, start=2):
        if row["experiment"] != experiment.name:
            problems.append(f"line {line}: a row of experiment {row['experiment']!r}; accepted: {experiment.name!r}")
            continue
        try:
            run = planned.get((row["arm"], int(row["seed"])))
            if run is None or row["status"] != FINISHED:
                continue
            if row["strategy"] != run.strategy or int(row["rounds"]) != run.rounds:
                problems.append(
                    f"{row['run_name']}: strategy {row['strategy']!r} over {row['rounds']} rounds; "
                    f"accepted: {run.strategy!r} over {run.rounds} rounds, as this grid plans it"
                )
                continue
            found[run.arm, run.seed] = RunResult.from_csv_row(run, row, path)
        except ValueError as err:  # a cell that is not a number
            problems.append(f"line {line}: {err}; accepted: the cells fedweigh's report writes")
    if problems:
        raise ExperimentError(f"--include-results {path}:\n" + "\n".join(f"  - {p}" for p in problems))
    return found


def _merge_earlier(results: Sequence[RunResult], earlier: Mapping[tuple[str, int], RunResult]) -> list[RunResult]:
    """Each run as its folder has it, or as an earlier report recorded it when its folder has no finished run."""
    return [result if result.finished else earlier.get((result.run.arm, result.run.seed), result) for result in results]


@dataclass(frozen=True)
class ArmSummary:
    """Mean ± std over seeds of one arm's scores."""

    arm: str
    strategy: str
    finished: int
    planned: int
    scores: dict[str, tuple[float, float | None]]
    others: dict[str, tuple[float, float | None]]
    wall_seconds: float | None
    paper: Mapping[str, Reported]


def summarize_arms(experiment: Experiment, results: Sequence[RunResult]) -> list[ArmSummary]:
    """Per arm, in the experiment file's order."""
    summaries = []
    for arm in experiment.arms:
        mine = [r for r in results if r.run.arm == arm.name]
        done = [r for r in mine if r.finished]
        scores = {name: mean_std([r.scores.get(name) for r in done]) for name in SCORE_NAMES} if done else {}
        others = {
            name: mean_std([r.others[name] for r in done])
            for name in OTHER_SCORES
            if done and all(name in r.others for r in done)
        }
        if done and all(isinstance(r.final_loss, int | float) for r in done):
            others["final_loss"] = mean_std([r.final_loss for r in done])
        walls = [r.wall_seconds for r in done if r.wall_seconds is not None]
        summaries.append(
            ArmSummary(
                arm=arm.name,
                strategy=arm.strategy,
                finished=len(done),
                planned=len(mine),
                scores=scores,
                others=others,
                wall_seconds=float(np.mean(walls)) if walls else None,
                paper=dict(arm.paper),
            )
        )
    return summaries


_HEADINGS = {
    "final": "final",
    "best": "best",
    "mean": "mean over rounds",
    "auc": "AUC",
    "last": "last 10 rounds",
    "late-max": "best of last 5 every 10",
}


PAIRED_SCORES = ("final", "mean")
"""The scores ``summary.md`` compares with the reference arm seed by seed."""


_PAIRED_EXPLANATION = (
    "mean ± standard error (sample std, ddof=1, / √pairs); wins / ties / losses count the seeds where the arm's "
    "accuracy is strictly greater, equal, smaller."
)


def _paired_table(first_heading: str, rows: Sequence[tuple[str, str, str]], per_seed) -> list[str]:
    """One markdown table of ``arm − other`` per ``(label, arm, other)`` row, for :data:`PAIRED_SCORES`."""
    header = [first_heading, "pairs", *(f"Δ {_HEADINGS[s]}, wins/ties/losses" for s in PAIRED_SCORES)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, arm, other in rows:
        differences = [paired_difference(per_seed(arm, s), per_seed(other, s)) for s in PAIRED_SCORES]
        if differences[0] is None:
            lines.append(f"| {label} | 0 | " + " | ".join("–" for _ in PAIRED_SCORES) + " |")
            continue
        cells = [f"{d} ({d.wins}/{d.ties}/{d.losses})" for d in differences if d is not None]
        lines.append(f"| {label} | {differences[0].pairs} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _paired_lines(experiment: Experiment, results: Sequence[RunResult]) -> list[str]:
    """The paired tables: every arm against ``reference-arm``, then the file's ``paired-comparisons``.

    Nothing for a table the file does not ask for; a comparison whose arm ``--arms`` left out is not shown.
    """

    def per_seed(arm: str, score: str) -> dict[int, float]:
        return {r.run.seed: r.scores.get(score) for r in results if r.run.arm == arm and r.scores is not None}

    section = experiment.spec.experiment
    lines: list[str] = []
    reference = section.reference_arm
    if reference and not per_seed(reference, "final"):
        lines += [f"Paired differences: the reference arm {reference} has no finished run.", ""]
    elif reference:
        lines += [
            f"Paired differences against {reference}, seed by seed (arm − {reference} on the same seed and "
            f"partition): {_PAIRED_EXPLANATION}",
            "",
        ]
        others = [(arm.name, arm.name, reference) for arm in experiment.arms if arm.name != reference]
        lines += _paired_table("arm", others, per_seed)
    kept = {arm.name for arm in experiment.arms}
    pairs = [(f"{arm} − {other}", arm, other) for arm, other in section.paired_comparisons if {arm, other} <= kept]
    if pairs:
        lines += [
            f"Paired differences the experiment file asks for (`paired-comparisons`), seed by seed on the same "
            f"seed and partition: {_PAIRED_EXPLANATION}",
            "",
            *_paired_table("arm − other", pairs, per_seed),
        ]
    return lines


_PAPER_METRICS = (
    (ROLLING_STD_ACCURACY, "accuracy, rolling std"),
    (f"mean_{WEIGHTED_F1}", "weighted F1, mean"),
    (f"final_{WEIGHTED_F1}", "weighted F1, final"),
    (f"mean_{TOP5_ACCURACY}", "top-5 accuracy, mean"),
    (f"mean_{TRAIN_LOSS}", "train loss (n_k-weighted), mean"),
    (f"mean_{TRAIN_LOSS_UNWEIGHTED}", "train loss (unweighted), mean"),
)
"""The FedNolowe paper's per-run metrics beside accuracy (:data:`OTHER_SCORES` names) and their headings."""


def _format_score(value: tuple[float, float | None] | None) -> str:
    if value is None:
        return "–"
    mean, std = value
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"


def render_summary(
    experiment: Experiment,
    summaries: Sequence[ArmSummary],
    sampling: SamplingCheck,
    results: Sequence[RunResult],
    plots: Sequence[Path] = (),
    output_dir: Path | None = None,
) -> str:
    """The text of ``summary.md``."""
    spec = experiment.spec.experiment
    rounds = sorted({r.run.rounds for r in results})
    lines = [f"# {spec.name}", ""]
    if experiment.settings:  # the file's description may name what the command line changed
        values = ", ".join(f"`{key} = {value}`" for key, value in experiment.settings.items())
        if spec.description:
            lines += [f"The experiment file's description: {spec.description.strip()}", ""]
        lines += [f"Set for every run on the command line (`--set`), over the file: {values}.", ""]
    elif spec.description:
        lines += [spec.description.strip(), ""]
    if not sampling.ok:
        lines += [
            "**WARNING: client sampling differs between arms of the same seed; the comparison is not paired.**",
            "",
        ]
    lines.append(
        f"Seeds {', '.join(map(str, experiment.seeds))}; {'/'.join(map(str, rounds))} rounds; "
        f"{spec.num_supernodes} simulated clients. Central test accuracy; mean ± sample std (ddof=1) over seeds."
    )
    lines.append("")
    has_paper = any(s.paper for s in summaries)
    # the paper-specific score (Feddle's best of the last 5 evaluations) only where a paper reports it;
    # results.csv has every score
    shown = [name for name in SCORE_NAMES if name != "late-max" or any(name in s.paper for s in summaries)]
    header = ["arm", "strategy", "runs", *(_HEADINGS[name] for name in shown), "wall s/run"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for summary in summaries:
        cells = [summary.arm, summary.strategy, f"{summary.finished}/{summary.planned}"]
        for name in shown:
            cell = _format_score(summary.scores.get(name))
            if name in summary.paper:
                cell += f" (paper {summary.paper[name]})"
            cells.append(cell)
        cells.append("–" if summary.wall_seconds is None else f"{summary.wall_seconds:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if any(summary.others for summary in summaries):
        lines.append("Macro-F1 and test loss (mean over rounds and final):")
        lines.append("")
        header = ["arm", "macro-F1, mean", "macro-F1, final", "loss, mean", "loss, final"]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for summary in summaries:
            names = ("mean_macro_f1", "final_macro_f1", "mean_loss", "final_loss")
            lines.append(f"| {summary.arm} | " + " | ".join(_format_score(summary.others.get(n)) for n in names) + " |")
        lines.append("")
    paper_metrics = [name for name, _ in _PAPER_METRICS if any(name in s.others for s in summaries)]
    if paper_metrics:
        lines.append(
            f"As the FedNolowe paper reports them (means over rounds; the accuracy's rolling std over windows of "
            f"{ROLLING_WINDOW} rounds; train loss of the aggregated clients, weighted by n_k and unweighted):"
        )
        lines.append("")
        header = ["arm", *(heading for name, heading in _PAPER_METRICS if name in paper_metrics)]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for summary in summaries:
            cells = (_format_score(summary.others.get(name)) for name in paper_metrics)
            lines.append(f"| {summary.arm} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += _paired_lines(experiment, results)
    if any(FINAL_U_P95 in summary.others for summary in summaries):
        lines += [
            "Tail of u = −log p̄(y) of the final global model on the test set (MC dropout, `final-uncertainty` "
            "passes): p95 and the share of samples with u > 1.",
            "",
            "| arm | p95(u) | share u > 1 |",
            "|---|---|---|",
        ]
        for summary in summaries:
            cells = (_format_score(summary.others.get(name)) for name in (FINAL_U_P95, FINAL_U_ABOVE_1))
            lines.append(f"| {summary.arm} | " + " | ".join(cells) + " |")
        lines.append("")
    if has_paper:
        source = f": {spec.paper_source}" if spec.paper_source else ""
        lines.append(f"(paper ...) = the numbers the paper reports{source}.")
        if experiment.settings:
            lines.append("They are for the file's own setting, not necessarily for the values set with `--set`.")
        lines.append("")
    lines.append(f"Client sampling: {sampling.verdict}.")
    lines += [f"- {line}" for line in sampling.lines]
    lines.append("")
    collapsed = [r for r in results if r.collapse is not None and not r.collapse.recovered]
    recovered = [r for r in results if r.collapse is not None and r.collapse.recovered]
    if collapsed or recovered:
        lines.append(
            f"Collapses (the global model predicted one class for at least {COLLAPSE_SHARE:.0%} of the test set, "
            f"on average over {COLLAPSE_ROUNDS} rounds in a row):"
        )
        lines += [f"- {r.run.name}: {r.collapse}" for r in collapsed]
        if recovered:  # a young model often predicts one class for a round or two; only lasting collapses matter
            first = sorted({r.collapse.round for r in recovered if r.collapse is not None})
            start = f"round {first[0]}" if len(first) == 1 else f"rounds {first[0]}-{first[-1]}"
            lines.append(
                f"- {len(recovered)} run(s) collapsed for a while (starting in {start}) and recovered: "
                + ", ".join(r.run.name for r in recovered)
            )
        lines.append("")
    recorded = [r for r in results if r.source is not None]
    if recorded:
        lines.append(
            "Read from earlier reports (their rounds are not here: they are in the tables and the paired "
            "differences, not in the plots; in the client-sampling check above where their file recorded the "
            f'clients\' fingerprint, marked "{EARLIER_MARK}" there):'
        )
        lines += [f"- {r.run.name}: {r.source}" for r in recorded]
        lines.append("")
    unfinished = [r for r in results if not r.finished]
    if unfinished:
        lines.append("Not in the table (not finished):")
        lines += [f"- {r.run.name}: {r.status}" for r in unfinished]
        lines.append("")
    if plots:
        lines.append("Plots:")
        for plot in plots:
            shown = plot.relative_to(output_dir) if output_dir and plot.is_relative_to(output_dir) else plot
            lines.append(f"- [{shown}]({shown})")
        lines.append("")
    lines.append(f"Per-run numbers: {RESULTS_CSV}. Generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Report:
    """Where the report went and what it found."""

    results_csv: Path
    summary_md: Path
    plots: tuple[Path, ...]
    results: tuple[RunResult, ...]
    sampling: SamplingCheck


def write_report(
    experiment: Experiment,
    runs: Sequence[PlannedRun],
    output_dir: Path,
    *,
    plots: bool = True,
    earlier: Sequence[Path] = (),
) -> Report:
    """Write ``results.csv``, the plots and ``summary.md`` into ``output_dir``.

    ``earlier``: ``results.csv`` files of earlier reports of this experiment;
    a planned run without a finished folder is taken from the first that
    holds it (:func:`read_earlier_results`).

    Raises
    ------
    SamplingMismatchError
        After writing everything, when arms of one seed sampled different clients.
    ExperimentError
        Before writing anything, when an ``earlier`` file is not this experiment's.
    """
    output_dir = Path(output_dir)
    recorded: dict[tuple[str, int], RunResult] = {}
    for path in earlier:
        recorded = read_earlier_results(path, experiment, runs) | recorded  # the first file wins
    results = _merge_earlier(collect_results(runs), recorded)
    output_dir.mkdir(parents=True, exist_ok=True)
    csv_path = write_results_csv(results, output_dir / RESULTS_CSV, experiment.name)
    sampling = check_sampling(results)
    drawn: list[Path] = []
    if plots and any(r.finished and r.rows for r in results):  # runs read from a results.csv have no rounds
        from fedweigh.experiments.plots import draw_all

        drawn = draw_all(experiment, [r for r in results if r.finished], output_dir / "plots")
    summary = render_summary(experiment, summarize_arms(experiment, results), sampling, results, drawn, output_dir)
    summary_path = output_dir / SUMMARY_MD
    summary_path.write_text(summary, encoding="utf-8")
    if not sampling.ok:
        raise SamplingMismatchError(
            "client sampling differs between arms of the same seed (see "
            f"{summary_path}):\n" + "\n".join(f"  - {line}" for line in sampling.lines)
        )
    return Report(csv_path, summary_path, tuple(drawn), tuple(results), sampling)
