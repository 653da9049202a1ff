"""PNG plots of an experiment, drawn with matplotlib's object API (no pyplot, no display).

* ``accuracy.png``: central test accuracy per round, one line per arm (mean
  over seeds) with a band of ± one standard deviation over seeds;
* ``weights-<arm>.png``: the aggregation weight of every client (rows) in
  every round (columns) of the arm's first seed; blank where a client was
  not sampled or was left out;
* ``oui-<arm>.png`` (FedOUI): the histogram of the clients' OUI values over
  all rounds and seeds with the Beta density of the median per-round fit
  (``beta-alpha``, ``beta-beta``), and the fitted parameters per round;
* ``uncertainty-<arm>.png`` (UFL): the percentiles ``u-p50 .. u-p99`` of the
  per-sample uncertainty, averaged over the round's clients;
* ``signals-<arm>.png``: every other signal a strategy records, per round:
  per-client signals as the mean over clients with a min-max band,
  round-level numeric diagnostics as a line (e.g. energy scores, Feddle's
  coefficients, FedOUI's typicality scores).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedweigh.experiments.runs import RunResult
from fedweigh.experiments.spec import Experiment
from fedweigh.protocol import REPLY_KEYS, TIMING_KEYS

__all__ = [
    "NOT_SIGNALS",
    "client_series",
    "curve_label",
    "diagnostic_series",
    "draw_all",
    "plot_accuracy",
    "plot_oui",
    "plot_signals",
    "plot_uncertainty",
    "plot_coefficients",
    "plot_weights",
    "signal_keys",
]

NOT_SIGNALS = frozenset({"partition", "node", "num_examples", "weight", "staleness", *REPLY_KEYS, *TIMING_KEYS})
"""Client-record keys that are bookkeeping or wall time, not a strategy's signal (``train_loss`` is one only for
loss rules)."""

UNCERTAINTY_PERCENTILES = ("u-p50", "u-p90", "u-p95", "u-p99")
OUI_KEYS = ("oui",)
BETA_KEYS = ("beta-alpha", "beta-beta")
MAX_PANELS = 12
MAX_WEIGHT_ROWS = 100
DPI = 110


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _save(figure: Figure, path: Path) -> Path:
    for axes in figure.get_axes():
        if axes.get_xlabel() == "round":
            axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI, format="png")
    return path


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def curve_label(arm: str, seeds: Sequence[int]) -> str:
    """The legend entry of an arm's accuracy curve, naming the seeds it averages.

    A report that reads some runs from an earlier ``results.csv`` draws each
    arm over the seeds whose rounds it has, which need not be the same for
    every arm.

    >>> curve_label("fedasl", [2, 1])
    'fedasl (seeds 1, 2)'
    >>> curve_label("fedavg", [3])
    'fedavg (seed 3)'
    """
    ordered = sorted(set(seeds))
    return f"{arm} (seed{'s' if len(ordered) > 1 else ''} {', '.join(map(str, ordered))})"


def plot_accuracy(results: Sequence[RunResult], path: Path, arms: Sequence[str] | None = None) -> Path:
    """Accuracy per round for each arm: mean over seeds, band of ± one std."""
    figure = Figure(figsize=(7.5, 4.5))
    axes = figure.add_subplot()
    order = list(arms) if arms else sorted({r.run.arm for r in results})
    for arm in order:
        runs = [r for r in results if r.run.arm == arm and r.rows]
        if not runs:
            continue
        evaluated = [{row["round"]: row["accuracy"] for row in r.rows if row.get("accuracy") is not None} for r in runs]
        rounds = np.array(sorted(set.intersection(*(set(points) for points in evaluated))), dtype=np.int64)
        if rounds.size == 0:
            continue
        curves = np.array([[points[r] for r in rounds] for points in evaluated], dtype=np.float64)
        mean = np.nanmean(curves, axis=0)
        (line,) = axes.plot(rounds, mean, label=curve_label(arm, [r.run.seed for r in runs]), linewidth=1.8)
        if len(runs) > 1:
            std = np.nanstd(curves, axis=0, ddof=1)
            axes.fill_between(rounds, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
    axes.set_xlabel("round")
    axes.set_ylabel("central test accuracy")
    axes.set_title("Accuracy per round (mean ± std over seeds)")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    return _save(figure, path)


def weight_matrix(result: RunResult, num_partitions: int | None = None) -> tuple[list[int], np.ndarray]:
    """``(partitions, W)`` with ``W[i, t]`` the weight of partition i in round t+1 (NaN: not aggregated).

    Rows are all ``num_partitions`` clients when given (at most
    :data:`MAX_WEIGHT_ROWS`), else the clients aggregated at least once.
    """
    seen = {int(c["partition"]) for row in result.rows for c in row.get("clients", [])}
    if num_partitions is not None and num_partitions <= MAX_WEIGHT_ROWS:
        seen |= set(range(num_partitions))
    partitions = sorted(seen)
    index = {p: i for i, p in enumerate(partitions)}
    matrix = np.full((len(partitions), len(result.rows)), np.nan)
    for t, row in enumerate(result.rows):
        for client in row.get("clients", []):
            matrix[index[int(client["partition"])], t] = float(client.get("weight", np.nan))
    return partitions, matrix


def plot_weights(result: RunResult, path: Path, num_partitions: int | None = None) -> Path:
    """Aggregation weight of each client (row) in each round (column)."""
    partitions, matrix = weight_matrix(result, num_partitions)
    height = min(12.0, 2.0 + 0.18 * max(len(partitions), 1))
    figure = Figure(figsize=(8.0, height))
    axes = figure.add_subplot()
    image = axes.imshow(
        np.ma.masked_invalid(matrix),
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        extent=(0.5, matrix.shape[1] + 0.5, len(partitions) - 0.5, -0.5),
    )
    if len(partitions) <= 40:
        axes.set_yticks(range(len(partitions)), [str(p) for p in partitions], fontsize="small")
    axes.set_xlabel("round")
    axes.set_ylabel("client (partition)")
    axes.set_title(f"{result.run.arm}, seed {result.run.seed}: aggregation weights (blank: not aggregated)")
    figure.colorbar(image, ax=axes, label="weight")
    figure.tight_layout()
    return _save(figure, path)


def client_series(results: Iterable[RunResult], key: str) -> dict[int, list[float]]:
    """Round -> the values of client signal ``key`` over all clients of all the runs."""
    series: dict[int, list[float]] = {}
    for result in results:
        for row in result.rows:
            for client in row.get("clients", []):
                value = _number(client.get(key))
                if value is not None:
                    series.setdefault(int(row["round"]), []).append(value)
    return series


def diagnostic_series(results: Iterable[RunResult], key: str) -> dict[int, list[float]]:
    """Round -> the values of round-level diagnostic ``key`` over the runs."""
    series: dict[int, list[float]] = {}
    for result in results:
        for row in result.rows:
            value = _number(row.get("diagnostics", {}).get(key))
            if value is not None:
                series.setdefault(int(row["round"]), []).append(value)
    return series


def signal_keys(results: Sequence[RunResult], required: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """``(client keys, diagnostic keys)`` with numeric values: the signals worth plotting.

    Client keys are the strategy's ``required`` signals plus every numeric
    key that is not bookkeeping (:data:`NOT_SIGNALS`).
    """
    required = list(required)
    client_keys: set[str] = set()
    diagnostic_keys: set[str] = set()
    for result in results:
        for row in result.rows:
            for client in row.get("clients", []):
                client_keys.update(k for k, v in client.items() if _number(v) is not None)
            diagnostic_keys.update(k for k, v in row.get("diagnostics", {}).items() if _number(v) is not None)
    chosen = [k for k in required if k in client_keys]
    chosen += sorted(k for k in client_keys - NOT_SIGNALS if k not in chosen and _varies(client_series(results, k)))
    return chosen, sorted(k for k in diagnostic_keys if _varies(diagnostic_series(results, k)))


def _varies(series: Mapping[int, list[float]]) -> bool:
    """False for a constant (a setting echoed back, like a probe size): nothing to plot."""
    values = {v for per_round in series.values() for v in per_round}
    return len(values) > 1


def plot_oui(results: Sequence[RunResult], path: Path) -> Path:
    """OUI histogram over all rounds with the median fitted Beta; the fit per round."""
    from scipy import stats

    values = [v for per_round in client_series(results, "oui").values() for v in per_round]
    alphas = diagnostic_series(results, "beta-alpha")
    betas = diagnostic_series(results, "beta-beta")
    figure = Figure(figsize=(10.0, 4.0))
    left, right = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    left.hist(values, bins=min(30, max(5, len(values) // 4)), range=(0.0, 1.0), density=True, alpha=0.6, label="OUI")
    all_alpha = [v for vs in alphas.values() for v in vs]
    all_beta = [v for vs in betas.values() for v in vs]
    if all_alpha and all_beta:
        a, b = float(np.median(all_alpha)), float(np.median(all_beta))
        grid = np.linspace(0.001, 0.999, 400)
        left.plot(grid, stats.beta.pdf(grid, a, b), color="black", label=f"Beta({a:.2f}, {b:.2f}), median fit")
    left.set_xlabel("OUI")
    left.set_ylabel("density")
    left.set_title(f"{results[0].run.arm}: OUI over {len(values)} client-rounds")
    left.legend(fontsize="small")
    for name, series in (("alpha", alphas), ("beta", betas)):
        rounds = sorted(series)
        right.plot(rounds, [np.median(series[r]) for r in rounds], marker=".", label=name)
    right.set_yscale("log")
    right.set_xlabel("round")
    right.set_title("fitted Beta parameters (median over seeds)")
    right.grid(True, alpha=0.3)
    right.legend(fontsize="small")
    figure.tight_layout()
    return _save(figure, path)


def plot_uncertainty(results: Sequence[RunResult], path: Path) -> Path:
    """Percentiles of the per-sample uncertainty, mean over the round's clients."""
    figure = Figure(figsize=(7.5, 4.5))
    axes = figure.add_subplot()
    for key in UNCERTAINTY_PERCENTILES:
        series = client_series(results, key)
        if series:
            rounds = sorted(series)
            axes.plot(rounds, [np.mean(series[r]) for r in rounds], marker=".", label=key.removeprefix("u-"))
    axes.set_xlabel("round")
    axes.set_ylabel("uncertainty u")
    axes.set_title(f"{results[0].run.arm}: per-sample uncertainty percentiles (mean over clients)")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    return _save(figure, path)


def plot_signals(
    results: Sequence[RunResult], path: Path, client_keys: Sequence[str], diagnostic_keys: Sequence[str]
) -> Path:
    """One panel per signal: client signals as mean with min-max band, diagnostics as lines."""
    panels = [("client", k) for k in client_keys] + [("round", k) for k in diagnostic_keys]
    panels = panels[:MAX_PANELS]
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(4.2 * columns, 3.0 * rows))
    for index, (kind, key) in enumerate(panels, start=1):
        axes = figure.add_subplot(rows, columns, index)
        series = client_series(results, key) if kind == "client" else diagnostic_series(results, key)
        rounds = sorted(series)
        mean = [float(np.mean(series[r])) for r in rounds]
        axes.plot(rounds, mean, marker=".", linewidth=1.5)
        if kind == "client":
            low = [min(series[r]) for r in rounds]
            high = [max(series[r]) for r in rounds]
            axes.fill_between(rounds, low, high, alpha=0.2, linewidth=0)
        axes.set_title(f"{key} ({'clients: mean, min-max' if kind == 'client' else 'per round'})", fontsize="small")
        axes.set_xlabel("round", fontsize="small")
        axes.grid(True, alpha=0.3)
    figure.suptitle(f"{results[0].run.arm}: signals")
    figure.tight_layout()
    return _save(figure, path)


def _required_signals(arm_config: Mapping[str, Any]) -> list[str]:
    """The signals the arm's weighting rule consumes (empty when it cannot be built)."""
    import logging

    flower = logging.getLogger("flwr")
    level = flower.level
    flower.setLevel(logging.ERROR)  # building a strategy logs Flower's warnings about its settings
    try:
        from fedweigh.methods.registry import plan_run
        from fedweigh.preflight import parse_settings

        settings = parse_settings(arm_config)
        return list(plan_run(settings).rule.build(settings).signals)
    except Exception:  # plotting must not fail on a strategy that cannot be rebuilt here
        return []
    finally:
        flower.setLevel(level)


def plot_coefficients(runs: Sequence[RunResult], path: Path) -> Path:
    """Feddle's merging coefficients ĉ per round (first seed, every anchor) and the share of negative ones."""
    figure = Figure(figsize=(8.0, 5.5))
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    first = runs[0]
    for row in first.rows:
        values = (row.get("diagnostics") or {}).get("coefficients") or []
        if values:
            top.scatter([row["round"]] * len(values), values, s=4, color="tab:blue", alpha=0.35, linewidths=0)
    top.axhline(0.0, color="black", linewidth=0.6)
    top.set_ylabel("ĉ (normalised anchors)")
    top.set_title(f"Merging coefficients per round ({first.run.name})")
    for run in runs:
        points = [
            (row["round"], d["negative-coefficients"] / max(len(d["coefficients"]), 1))
            for row in run.rows
            if (d := row.get("diagnostics") or {}).get("coefficients")
        ]
        if points:
            xs, ys = zip(*points, strict=True)
            bottom.plot(xs, ys, linewidth=1.0, label=f"seed {run.run.seed}")
    bottom.set_ylabel("share < 0")
    bottom.set_xlabel("round")
    bottom.set_ylim(0, 1)
    bottom.grid(True, alpha=0.3)
    bottom.legend(fontsize="small")
    figure.tight_layout()
    return _save(figure, path)


def draw_all(experiment: Experiment, results: Sequence[RunResult], plots_dir: Path) -> list[Path]:
    """Every plot of the experiment's finished runs; returns the files written."""
    plots_dir = Path(plots_dir)
    arms = [arm.name for arm in experiment.arms]
    drawn = [plot_accuracy(results, plots_dir / "accuracy.png", arms)]
    for arm in experiment.arms:
        runs = sorted((r for r in results if r.run.arm == arm.name and r.rows), key=lambda r: r.run.seed)
        if not runs:
            continue
        name = _safe(arm.name)
        if any("weight" in c for row in runs[0].rows for c in row.get("clients", [])):  # its update uses weights
            drawn.append(
                plot_weights(runs[0], plots_dir / f"weights-{name}.png", experiment.spec.experiment.num_supernodes)
            )
        if any("coefficients" in (row.get("diagnostics") or {}) for row in runs[0].rows):
            drawn.append(plot_coefficients(runs, plots_dir / f"coefficients-{name}.png"))
        client_keys, diagnostic_keys = signal_keys(runs, _required_signals(experiment.arm_configs[arm.name]))
        covered: set[str] = set()
        if any(k in client_keys for k in OUI_KEYS):
            drawn.append(plot_oui(runs, plots_dir / f"oui-{name}.png"))
            covered.update(OUI_KEYS + BETA_KEYS)
        if any(k in client_keys for k in UNCERTAINTY_PERCENTILES):
            drawn.append(plot_uncertainty(runs, plots_dir / f"uncertainty-{name}.png"))
            covered.update(UNCERTAINTY_PERCENTILES)
        rest_clients = [k for k in client_keys if k not in covered]
        rest_diagnostics = [k for k in diagnostic_keys if k not in covered]
        if rest_clients or rest_diagnostics:
            drawn.append(plot_signals(runs, plots_dir / f"signals-{name}.png", rest_clients, rest_diagnostics))
    return drawn
