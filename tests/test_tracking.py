"""Experiment tracking (TensorBoard, MLflow) and the progress line of runs.

Real runs in process (``loopback``: the real ServerApp and ClientApp, two
rounds on digits) with each tracker, read back with TensorBoard's own event
reader and MLflow's client and compared with the run's metrics.jsonl; an
experiment grid driven by the runner; the missing-package check; trackers
that fail while the run goes on.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO
from loopback import run_in_process
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedweigh.benchmarks.common import run_timed
from fedweigh.cli import main
from fedweigh.experiments.runner import run_experiment
from fedweigh.experiments.spec import load_experiment
from fedweigh.launch.progress import PendingRun, RunsProgress
from fedweigh.launch.runconfig import load_app_config, prepare_run_config
from fedweigh.preflight import check_run
from fedweigh.results import CENTRAL_METRICS, read_metrics
from fedweigh.settings import SettingsError, validate
from fedweigh.tracking import (
    DEFAULT_EXPERIMENT,
    MLFLOW_RUN_FILE,
    TensorBoardTracker,
    TrackedRun,
    Trackers,
    local_store,
    scalar_series,
)

DEFAULTS = load_app_config(REPO)
SMALL = {"num-server-rounds": 2, "fraction-train": 0.5, "local-epochs": 1, "seed": 3}
FEDDLE = {"server-data": "id", "server-data-size": 60, "feddle.search-epochs": 1}


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tracked")


def tracked_run(output_dir: Path, name: str, **config) -> Path:
    return run_in_process({**SMALL, "output-dir": str(output_dir), "run-name": name, **config})


def tensorboard_series(folder: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def expected_series(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for name, value in scalar_series(row, CENTRAL_METRICS).items():
            series.setdefault(name, []).append((row["round"], value))
    return series


def assert_same_points(written: list[tuple[int, float]], expected: list[tuple[int, float]], what: str = "") -> None:
    """The same steps, and values equal up to TensorBoard's float32."""
    assert [step for step, _ in written] == [step for step, _ in expected], what
    assert [value for _, value in written] == pytest.approx([value for _, value in expected], rel=1e-6), what


def mlflow_run(store_dir: Path, name: str, experiment: str = DEFAULT_EXPERIMENT):
    client = MlflowClient(tracking_uri=local_store(store_dir))
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r} in {store_dir}"
    runs = [run for run in client.search_runs([found.experiment_id]) if run.info.run_name == name]
    assert len(runs) == 1, f"{len(runs)} MLflow runs named {name!r}"
    return client, runs[0]


# ------------------------------------------------------------------ the series of a row


@pytest.mark.parametrize(
    ("strategy", "config", "names"),
    [
        ("fedoui", {}, ["signals/oui/partition-", "diagnostics/beta-alpha", "diagnostics/beta-beta"]),
        ("ufl", {}, ["signals/uncertainty/partition-", "weights/partition-"]),
        ("flood", {}, ["signals/ood-score/partition-", "diagnostics/asw-lambda", "clients/ood-share/partition-"]),
        ("feddle", FEDDLE, ["diagnostics/atlas-size", "diagnostics/coefficients/0", "diagnostics/search-loss-after"]),
    ],
)
def test_every_number_the_issue_names_has_a_series(output_dir, strategy, config, names):
    (row, *_) = read_metrics(tracked_run(output_dir, f"series-{strategy}", strategy=strategy, **config))
    series = scalar_series(row, CENTRAL_METRICS)
    for name in names:
        assert any(key.startswith(name) for key in series), f"{strategy}: no {name}* in {sorted(series)}"
    for name in ("central/accuracy", "central/loss", "round/train_loss_mean", "round/seconds", "bytes/sent"):
        assert name in series
    for key in ("weighted_f1", "top5_accuracy", "train_loss_unweighted"):  # the FedNolowe paper's metrics too
        assert key in row and (series.get(f"central/{key}") == row[key] or series.get(f"round/{key}") == row[key])
    assert series["central/accuracy"] == row["accuracy"] and series["round/train_loss_mean"] == row["train_loss"]
    assert series["bytes/received"] == sum(client["bytes_received"] for client in row["clients"])
    client = row["clients"][0]
    assert series[f"signals/train_loss/partition-{client['partition']}"] == client["train_loss"]


def test_only_finite_numbers_become_series():
    row = {
        "round": 4,
        "accuracy": None,
        "loss": float("inf"),
        "train_loss": float("nan"),
        "aggregated": True,
        "clients": [{"partition": -1, "node": 77, "weight": 0.5, "note": "text", "staleness": 0}],
        "diagnostics": {"fit-method": "moments", "mixing": [0.25, None]},
    }
    series = scalar_series(row, CENTRAL_METRICS)
    assert "central/accuracy" not in series and "central/loss" not in series
    assert "round/train_loss_mean" not in series and "round/aggregated" not in series
    assert series["weights/node-77"] == 0.5 and series["clients/staleness/node-77"] == 0.0
    assert series["diagnostics/mixing/0"] == 0.25 and "diagnostics/mixing/1" not in series
    assert not any("note" in name or "fit-method" in name for name in series)


# ------------------------------------------------------------------ each tracker, read back


def test_a_two_round_run_writes_its_rows_to_tensorboard(output_dir):
    folder = tracked_run(output_dir, "tb-fedoui", strategy="fedoui", tracking="tensorboard")
    rows = read_metrics(folder)
    written = tensorboard_series(folder / "tensorboard")
    expected = expected_series(rows)
    assert len(rows) == 2 and set(written) == set(expected)
    for tag, points in expected.items():
        assert_same_points(written[tag], points, tag)
    events = EventAccumulator(str(folder / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    assert "settings/text_summary" in events.Tags()["tensors"]
    assert not (folder / MLFLOW_RUN_FILE).exists()


def test_a_two_round_run_writes_its_rows_and_settings_to_mlflow(output_dir):
    folder = tracked_run(output_dir, "ml-flood", strategy="flood", tracking="mlflow")
    rows = read_metrics(folder)
    client, run = mlflow_run(output_dir, "ml-flood")  # the default store: mlflow.db beside the run folders
    assert run.info.status == "FINISHED" and not (folder / "tensorboard").exists()
    params = run.data.params
    assert params["strategy"] == "flood" and params["flood.q"] == "0.7" and params["num-server-rounds"] == "2"
    assert params["output-dir"] == str(output_dir) and params["tracking"] == "mlflow"
    expected = expected_series(rows)
    assert set(run.data.metrics) == set(expected)
    for key in ("central/accuracy", "diagnostics/asw-lambda", "round/seconds", *list(expected)[-3:]):
        history = sorted((metric.step, metric.value) for metric in client.get_metric_history(run.info.run_id, key))
        assert history == expected[key], key


def test_a_resumed_run_continues_both_trackers_without_repeating_rounds(output_dir):
    folder = tracked_run(output_dir, "resumed", strategy="fedavg", tracking="tensorboard,mlflow")
    _, first = mlflow_run(output_dir, "resumed")
    resumed = {"strategy": "fedavg", "tracking": "tensorboard,mlflow", "num-server-rounds": 3}
    run_in_process({**SMALL, **resumed, "resume-from": str(folder)})
    rows = read_metrics(folder)
    assert [row["round"] for row in rows] == [1, 2, 3]
    assert_same_points(
        tensorboard_series(folder / "tensorboard")["central/accuracy"], expected_series(rows)["central/accuracy"]
    )
    client, run = mlflow_run(output_dir, "resumed")  # the same MLflow run, reopened and finished again
    assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "central/accuracy")
    assert sorted((m.step, m.value) for m in history) == expected_series(rows)["central/accuracy"]


def test_tensorboard_hides_the_rounds_a_resumed_run_logs_again(tmp_path):
    run = TrackedRun("r", tmp_path, {"seed": 1})
    first = TensorBoardTracker(tmp_path / "events")
    first.start(run)
    for step in (1, 2, 3):  # rounds 2 and 3 were logged, but the checkpoint holds round 1
        first.log(step, {"central/accuracy": step / 10})
    first.finish("KILLED")
    again = TensorBoardTracker(tmp_path / "events")
    again.start(TrackedRun("r", tmp_path, {"seed": 1}, resumed_round=1))
    again.log(2, {"central/accuracy": 0.25})
    again.finish("FINISHED")
    assert_same_points(tensorboard_series(tmp_path / "events")["central/accuracy"], [(1, 0.1), (2, 0.25)])


# ------------------------------------------------------------------ an experiment grid


class InProcessSimulation:
    """The experiment runner's simulation, each run in process: the runner's own run configs, no SuperLink."""

    port = 0

    def run(self, run_config, num_supernodes, on_line, **_):
        prepared = prepare_run_config(run_config, DEFAULTS, Path.cwd())  # as LocalSimulation does
        folder = run_in_process(prepared, num_nodes=num_supernodes)
        for row in read_metrics(folder):
            on_line(f"[fedweigh] round {row['round']}/{prepared['num-server-rounds']}  accuracy 0.5  loss 1.0  0.1s")
        return SimpleNamespace(status="finished:completed", details="", run_id=1)


def test_a_grids_runs_land_in_one_tensorboard_folder_and_one_mlflow_experiment(tmp_path):
    table = {
        "experiment": {"name": "overlay", "seeds": [1, 2], "num-supernodes": 4},
        "base": {"num-server-rounds": 2, "fraction-train": 0.5, "local-epochs": 1, "tracking": "tensorboard,mlflow"},
        "arms": [{"name": "fedavg", "strategy": "fedavg"}, {"name": "fednolowe", "strategy": "fednolowe"}],
    }
    experiment = load_experiment(table, DEFAULTS)
    outcome = run_experiment(
        experiment, tmp_path, REPO, DEFAULTS, port=0, out=io.StringIO(), simulation=InProcessSimulation()
    )
    names = ["fedavg-seed1", "fednolowe-seed1", "fedavg-seed2", "fednolowe-seed2"]
    assert outcome.failed == () and [plan.run.name for plan in outcome.plans] == names
    assert sorted(path.name for path in (tmp_path / "tensorboard").iterdir()) == sorted(names)
    for name in names:
        rows = read_metrics(tmp_path / "runs" / name)
        written = tensorboard_series(tmp_path / "tensorboard" / name)
        assert_same_points(written["central/accuracy"], expected_series(rows)["central/accuracy"], name)
        assert not (tmp_path / "runs" / name / "tensorboard").exists()
    client = MlflowClient(tracking_uri=local_store(tmp_path))  # the grid's store: <grid>/mlflow.db
    experiments = [found.name for found in client.search_experiments()]
    assert "overlay" in experiments and DEFAULT_EXPERIMENT not in experiments
    runs = client.search_runs([client.get_experiment_by_name("overlay").experiment_id])
    assert sorted(run.info.run_name for run in runs) == sorted(names)
    assert {run.info.status for run in runs} == {"FINISHED"}
    assert {run.data.params["strategy"] for run in runs} == {"fedavg", "fednolowe"}


# ------------------------------------------------------------------ before training: the setting and the package


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("wandb", "unknown tracker 'wandb'"),
        ("none,mlflow", "not a choice of trackers"),
        ("", "not a choice of trackers"),
        ("mlflow,mlflow", "not a choice of trackers"),
    ],
)
def test_a_bad_tracking_value_names_the_setting_and_what_is_accepted(value, fragment):
    with pytest.raises(SettingsError) as caught:
        validate({"tracking": value})
    (problem,) = caught.value.problems
    assert problem.startswith(f"tracking = {value!r}: {fragment}")
    assert "accepted: none, tensorboard, mlflow, or both comma-separated (tensorboard,mlflow)" in problem


def test_tracker_names_come_in_one_order():
    assert validate({"tracking": "mlflow, tensorboard"}).tracker_names == ("tensorboard", "mlflow")
    assert validate({}).tracker_names == () and validate({}).tracking == "none"


@pytest.mark.parametrize(
    ("tracking", "module", "package"),
    [("mlflow", "mlflow", "mlflow-skinny"), ("tensorboard,mlflow", "tensorboard", "tensorboard")],
)
def test_a_tracker_whose_package_is_missing_fails_before_training(tmp_path, monkeypatch, tracking, module, package):
    monkeypatch.setitem(sys.modules, module, None)  # what `import mlflow` meets where it is not installed
    with pytest.raises(SettingsError) as caught:
        check_run({"tracking": tracking})
    (problem,) = caught.value.problems
    assert f"tracking = {tracking!r}" in problem and f"package {package} is not installed" in problem
    assert 'pip install -e ".[tracking]"' in problem and f"pip install {package}" in problem
    with pytest.raises(SettingsError, match=f"package {package} is not installed"):
        tracked_run(tmp_path, "never", tracking=tracking)
    assert not (tmp_path / "never").exists()  # the ServerApp stopped before it wrote or sent anything


def test_simulate_names_a_missing_tracker_package_before_starting_anything(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    # port 1: a SuperLink there could not start, so getting the message proves nothing was started
    assert main(["simulate", "--app", str(REPO), "--port", "1", "-c", "tracking='mlflow'"]) == 2
    assert "package mlflow-skinny is not installed" in capsys.readouterr().err


# ------------------------------------------------------------------ trackers that fail while the run goes on


class Broken:
    """A tracker whose log fails from round ``fails_at`` on, as a full disk or a lost server makes it."""

    name = "broken"

    def __init__(self, fails_at: int) -> None:
        self.fails_at, self.logged, self.finished = fails_at, [], []

    def start(self, run):
        pass

    def log(self, step, scalars):
        if step >= self.fails_at:
            raise OSError(28, "No space left on device")
        self.logged.append(step)

    def finish(self, status):
        self.finished.append(status)


def test_a_failing_tracker_is_switched_off_once_and_the_others_go_on(tmp_path, caplog):
    broken, events = Broken(fails_at=2), TensorBoardTracker(tmp_path / "events")
    trackers = Trackers([broken, events])
    trackers.start(TrackedRun("r", tmp_path, {}))
    with caplog.at_level("WARNING", logger="flwr.fedweigh"):
        for step in (1, 2, 3):
            trackers.log_round({"round": step, "accuracy": step / 10}, CENTRAL_METRICS)
        trackers.finish("FINISHED")
    assert broken.logged == [1] and broken.finished == ["FAILED"]  # released, never told the run finished
    warnings = [record.getMessage() for record in caplog.records if "tracking: broken failed" in record.getMessage()]
    assert len(warnings) == 1 and "No space left on device" in warnings[0] and "goes on" in warnings[0]
    assert [step for step, _ in tensorboard_series(tmp_path / "events")["central/accuracy"]] == [1, 2, 3]


def test_a_tracker_that_cannot_start_leaves_the_run_whole(output_dir, tmp_path, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")  # TensorBoard cannot make its event folder here
    with caplog.at_level("WARNING", logger="flwr.fedweigh"):
        folder = tracked_run(
            output_dir, "blocked", strategy="fedavg", tracking="tensorboard,mlflow", **{"tensorboard-dir": str(blocked)}
        )
    assert "tracking: tensorboard failed" in caplog.text
    rows = read_metrics(folder)
    assert [row["round"] for row in rows] == [1, 2] and (folder / "summary.json").is_file()
    client, run = mlflow_run(output_dir, "blocked")  # the other tracker got every round
    assert run.info.status == "FINISHED"
    assert len(client.get_metric_history(run.info.run_id, "central/accuracy")) == 2


def test_a_run_that_fails_ends_its_mlflow_run_failed(output_dir, monkeypatch):
    from fedweigh.strategies.base import WeightedFedAvg

    def crash(*_, **__):
        raise RuntimeError("the federation went away")

    monkeypatch.setattr(WeightedFedAvg, "start", crash)
    with pytest.raises(RuntimeError, match="went away"):
        tracked_run(output_dir, "crashed", strategy="fedavg", tracking="mlflow")
    _, run = mlflow_run(output_dir, "crashed")
    assert run.info.status == "FAILED"


# ------------------------------------------------------------------ the progress line


def test_one_runs_progress_shows_the_round_and_time_left():
    now = [0.0]
    out = io.StringIO()
    progress = RunsProgress([PendingRun("fedavg-1", 5)], label="simulate", out=out, clock=lambda: now[0])
    progress.start_run(progress.runs[0])
    assert progress.seconds_left() is None and progress.line() == "[simulate] fedavg-1: round 0/5 | left ~?"
    for round_number, at in ((1, 20.0), (2, 23.0), (3, 26.0)):  # round 1 carries the start-up: not a round's time
        now[0] = at
        progress.on_line(f"INFO :      [fedweigh] round {round_number}/5  accuracy 0.6  loss 1.0  2.9s")
    assert progress.mean_round_seconds() == pytest.approx(3.0)
    assert progress.seconds_left() == pytest.approx(2 * 3.0)
    assert out.getvalue().splitlines()[-1] == "[simulate] fedavg-1: round 3/5 acc 0.6000 | left ~6s"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_lines_are_echoed_above_the_live_line():
    terminal, log = Terminal(), io.StringIO()
    progress = RunsProgress([PendingRun("run", 2)], label="simulate", out=terminal, clock=lambda: 0.0)
    progress.start_run(progress.runs[0])
    handle = progress.echo_and_watch(log)
    handle("INFO : [fedweigh] round 1/2  accuracy 0.5  loss 1.0  1.0s")
    assert log.getvalue() == "INFO : [fedweigh] round 1/2  accuracy 0.5  loss 1.0  1.0s\n"
    # cleared before the log line, drawn again after it, and updated in place
    assert terminal.getvalue().endswith("\r\x1b[2K[simulate] run: round 1/2 acc 0.5000 | left ~1s")
    assert "\n" not in terminal.getvalue()


def test_a_benchmark_run_shows_its_progress(capsys, tmp_path):
    class Simulation:
        def run(self, run_config, on_line, **_):
            for number in (1, 2):
                on_line(f"[fedweigh] round {number}/2  accuracy 0.7  loss 1.0  0.5s")
            return SimpleNamespace(status="finished:completed", ok=True, results_dir=None, timings={"total_s": 1.0})

    timed = run_timed(Simulation(), {"run-name": "bench", "num-server-rounds": 2}, num_supernodes=2)
    assert timed.ok and timed.round_marks.keys() == {1, 2}
    err = capsys.readouterr().err
    assert "[benchmark] bench: round 2/2 acc 0.7000" in err and "[benchmark] bench: done | left ~0s" in err
