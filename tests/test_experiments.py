"""The experiment runner: file validation, grid and resume logic, table and plots, one real grid."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO
from hypothesis import given
from hypothesis import strategies as st

from fedweigh.cli import main
from fedweigh.experiments.grid import (
    RUN_RECORD_FILE,
    Action,
    expand_grid,
    inspect_run,
    plan_grid,
    read_run_record,
    record_segment,
    settings_differences,
)
from fedweigh.experiments.paired import mean_std
from fedweigh.experiments.plots import draw_all, weight_matrix
from fedweigh.experiments.report import write_report
from fedweigh.experiments.runner import run_experiment
from fedweigh.experiments.runs import accuracy_auc, collect_results, run_scores
from fedweigh.experiments.sampling import SamplingMismatchError
from fedweigh.experiments.spec import ExperimentError, load_experiment, parse_reported
from fedweigh.launch.progress import RunsProgress, parse_round_line
from fedweigh.launch.runconfig import load_app_config
from fedweigh.launch.simulation import RunOutcome
from fedweigh.protocol import TRAIN_LOSS
from fedweigh.results import CHECKPOINT_FILE, CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, Checkpoint
from fedweigh.results import TOP5_ACCURACY as TOP5
from fedweigh.results import TRAIN_LOSS_UNWEIGHTED as UNWEIGHTED_LOSS
from fedweigh.results import WEIGHTED_F1 as WEIGHTED
from fedweigh.run_folder import run_files

DEFAULTS = load_app_config(REPO)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def experiment_table(**changes):
    table = {
        "experiment": {"name": "demo", "seeds": [1, 2], "num-supernodes": 4},
        "base": {"num-server-rounds": 3, "fraction-train": 0.5},
        "arms": [
            {"name": "fedavg", "strategy": "fedavg", "paper": {"final": "0.50 ± 0.02", "auc": 0.4}},
            {"name": "fedoui", "strategy": "fedoui", "overrides": {"fedoui": {"window": 2}}},
        ],
    }
    table.update(changes)
    return table


def failure(table) -> str:
    with pytest.raises(ExperimentError) as caught:
        load_experiment(table, DEFAULTS)
    return str(caught.value)


# ------------------------------------------------------------------ validation


def test_a_valid_file_gives_each_arm_its_merged_run_config():
    experiment = load_experiment(experiment_table(), DEFAULTS)
    assert experiment.arm_configs["fedavg"] == {"num-server-rounds": 3, "fraction-train": 0.5, "strategy": "fedavg"}
    assert experiment.arm_configs["fedoui"]["fedoui.window"] == 2
    assert experiment.arms[0].paper["final"] == (0.50, 0.02) and experiment.arms[0].paper["auc"] == (0.4, None)


def test_unknown_arm_key_names_the_arm_and_the_key():
    table = experiment_table()
    table["arms"][1]["colour"] = "red"
    message = failure(table)
    assert "arm 'fedoui'" in message and "colour" in message and "unknown key" in message


def test_unknown_strategy_names_the_arm_and_lists_the_accepted_ones():
    table = experiment_table()
    table["arms"][0]["strategy"] = "fedmagic"
    message = failure(table)
    assert "arm 'fedavg'" in message and "'fedmagic'" in message and "fedprox" in message


def test_bad_run_config_value_inside_an_arm_names_the_arm_and_the_setting():
    table = experiment_table()
    table["arms"][1]["overrides"] = {"oui": {"probe-size": 1}, "learning-rate": -0.1}
    message = failure(table)
    assert "arm 'fedoui': oui.probe-size = 1" in message
    assert "arm 'fedoui': learning-rate = -0.1" in message


def test_arms_vary_the_aggregation_rule_like_any_other_setting():
    table = experiment_table()
    table["arms"].append({"name": "fedprox-nolowe", "strategy": "fedprox", "overrides": {"aggregation": "fednolowe"}})
    experiment = load_experiment(table, DEFAULTS)
    assert experiment.arm_configs["fedprox-nolowe"]["aggregation"] == "fednolowe"
    table["arms"][-1]["overrides"] = {"aggregation": "median", "oui": {"probe-layer": "conv9"}}
    message = failure(table)
    assert "arm 'fedprox-nolowe': aggregation = 'median': unknown aggregation rule" in message
    # a combination that cannot run is refused per arm too
    table["arms"][-1]["overrides"] = {"aggregation": "fedoui", "oui": {"probe-layer": "conv9"}}
    message = failure(table)
    assert "arm 'fedprox-nolowe': aggregation = 'fedoui' runs the client step 'oui'" in message


def test_unknown_or_reserved_run_config_keys_are_refused():
    message = failure(experiment_table(base={"num-server-rounds": 2, "lerning-rate": 0.1, "seed": 3}))
    assert "unknown run-config key 'lerning-rate'" in message
    assert "seed is set by the experiment runner" in message


def test_every_problem_is_listed_at_once():
    table = experiment_table(experiment={"name": "bad name", "seeds": [1, 1], "extra": True})
    table["arms"].append({"name": "fedavg", "strategy": "fedavg"})
    message = failure(table)
    for part in ("experiment.name", "experiment.seeds", "experiment.extra", "arm names must be distinct"):
        assert part in message


def test_command_line_overrides_of_seeds_and_rounds():
    experiment = load_experiment(experiment_table(), DEFAULTS, seeds=[7], rounds=1)
    assert experiment.seeds == [7]
    assert all(config["num-server-rounds"] == 1 for config in experiment.arm_configs.values())


def test_arms_keeps_only_the_named_arms_and_names_the_accepted_ones():
    experiment = load_experiment(experiment_table(), DEFAULTS, arms=["fedoui"])
    assert [arm.name for arm in experiment.arms] == ["fedoui"]
    assert list(experiment.arm_configs) == ["fedoui"]
    with pytest.raises(ExperimentError, match=r"unknown arm\(s\) fedprox; accepted: .*fedavg, fedoui"):
        load_experiment(experiment_table(), DEFAULTS, arms=["fedavg", "fedprox"])


def test_set_overrides_base_and_arm_overrides_and_is_checked():
    table = experiment_table()
    table["arms"][1]["overrides"]["fraction-train"] = 0.75
    experiment = load_experiment(table, DEFAULTS, settings={"fraction-train": 1.0, "learning-rate": 0.05})
    assert [config["fraction-train"] for config in experiment.arm_configs.values()] == [1.0, 1.0]
    assert all(config["learning-rate"] == 0.05 for config in experiment.arm_configs.values())
    assert experiment.arm_configs["fedoui"]["fedoui.window"] == 2  # the arm's other overrides stay
    assert experiment.settings == {"fraction-train": 1.0, "learning-rate": 0.05}
    with pytest.raises(ExperimentError, match=r"--set lerning-rate=0\.1: unknown run-config key"):
        load_experiment(experiment_table(), DEFAULTS, settings={"lerning-rate": 0.1})
    with pytest.raises(ExperimentError, match=r"arm 'fedavg': fraction-train = 2"):
        load_experiment(experiment_table(), DEFAULTS, settings={"fraction-train": 2})


def test_a_grid_whose_data_cannot_be_split_fails_before_any_run(tmp_path, capsys):
    table = experiment_table(
        experiment={"name": "split", "seeds": [1], "num-supernodes": 30},
        base={"dataset": "digits", "partitioner": "iid", "train-subset": 20, "num-server-rounds": 1},
    )
    experiment = load_experiment(table, DEFAULTS)
    with pytest.raises(ExperimentError) as caught:
        run_experiment(experiment, tmp_path, REPO, DEFAULTS, port=1, out=io.StringIO())  # port 1: nothing may start
    message = str(caught.value)
    assert "fedavg-seed1: dataset = 'digits' with 30 partitions" in message
    assert "fedoui-seed1" in message and "nothing was run" in message
    assert not (tmp_path / "runs").exists()

    path = tmp_path / "split.toml"
    path.write_text(
        '[experiment]\nname = "split"\nseeds = [1]\nnum-supernodes = 30\n'
        '[base]\ndataset = "digits"\npartitioner = "iid"\ntrain-subset = 20\n'
        '[[arms]]\nname = "a"\nstrategy = "fedavg"\n'
    )
    assert main(["experiment", "run", str(path), "--output-dir", str(tmp_path / "o"), "--dry-run"]) == 2
    assert "a-seed1: dataset = 'digits' with 30 partitions" in capsys.readouterr().err


def test_set_on_the_command_line_gets_its_own_output_folder(tmp_path, capsys):
    path = tmp_path / "grid.toml"
    path.write_text('[experiment]\nname = "grid"\nseeds = [1]\n[[arms]]\nname = "a"\nstrategy = "fedavg"\n')
    code = main(["experiment", "run", str(path), "--set", "fraction-train=0.2", "--dry-run"])
    assert code == 0
    assert "grid-fraction-train0.2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["experiment", "run", str(path), "--set", "fraction-train", "--dry-run"])
    assert "--set = 'fraction-train': accepted: KEY=VALUE" in capsys.readouterr().err


def test_an_invalid_file_fails_before_anything_runs(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text('[experiment]\nname = "x"\nseeds = [1]\n[[arms]]\nname = "a"\nstrategy = "nope"\n')
    output = tmp_path / "out"
    code = main(["experiment", "run", str(path), "--output-dir", str(output)])
    assert code == 2 and not output.exists()
    assert "arm 'a': strategy = 'nope'" in capsys.readouterr().err


def test_a_file_that_is_not_toml_is_named(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[experiment\n")
    with pytest.raises(ExperimentError, match="broken.toml is not valid TOML"):
        load_experiment(path, DEFAULTS)


@pytest.mark.parametrize("path", sorted((REPO / "experiments").glob("*.toml")), ids=lambda path: path.name)
def test_every_experiment_file_is_valid(path):
    experiment = load_experiment(path, DEFAULTS)
    assert experiment.arms and experiment.seeds


def test_the_fednolowe_files_run_the_papers_baselines():
    for name in ("mnist", "mnist_cpu", "fmnist", "cifar10"):
        experiment = load_experiment(REPO / "experiments" / f"fednolowe_{name}.toml", DEFAULTS)
        arms = {arm.name: arm for arm in experiment.arms}
        assert set(arms) == {"fedavg", "fedprox", "fedprox-nk", "fedasl", "uniform", "fednolowe", "fedma-simplified"}
        assert arms["fedprox"].overrides["aggregation"] == "uniform"  # the paper's FedProx: the plain mean
        assert "aggregation" not in arms["fedprox-nk"].overrides  # FedProx's own: weighted by sample count
        assert arms["fedprox"].overrides["fedprox.proximal-mu"] == arms["fedprox-nk"].overrides["fedprox.proximal-mu"]


def test_the_smoke_experiment_file_is_valid():
    experiment = load_experiment(REPO / "experiments" / "smoke_digits.toml", DEFAULTS)
    assert [arm.name for arm in experiment.arms] == ["fedavg", "fedoui"] and experiment.seeds == [1]


@given(st.floats(0, 1), st.floats(0, 1))
def test_reported_numbers_read_back_what_was_written(mean, std):
    assert parse_reported(f"{mean!r} ± {std!r}") == (mean, std)
    assert parse_reported(f"{mean!r}+-{std!r}") == (mean, std)
    assert parse_reported({"mean": mean, "std": std}) == (mean, std)


def test_unreadable_reported_number_is_an_error():
    with pytest.raises(ValueError, match="cannot read 'about 0.2'"):
        parse_reported("about 0.2")


# ------------------------------------------------------------------ grid and resume


def planned(tmp_path, **changes):
    experiment = load_experiment(experiment_table(**changes), DEFAULTS)
    return experiment, expand_grid(experiment, tmp_path, DEFAULTS)


def test_grid_is_seed_major_with_deterministic_names_and_configs(tmp_path):
    _, runs = planned(tmp_path)
    assert [run.name for run in runs] == ["fedavg-seed1", "fedoui-seed1", "fedavg-seed2", "fedoui-seed2"]
    last = runs[-1]
    assert last.run_dir == tmp_path / "runs" / "fedoui-seed2" and last.rounds == 3
    assert last.run_config["seed"] == 2 and last.run_config["strategy"] == "fedoui"
    assert last.run_config["run-name"] == "fedoui-seed2" and last.run_config["output-dir"] == str(tmp_path / "runs")


def write_run(folder: Path, accuracies, sampled=None, rounds=None, checkpoint=None, settings=None, clients=None):
    """A fake run folder as the ServerApp leaves it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps({"settings": settings or {"seed": 1, "fraction-train": 0.5}}))
    rows = []
    for index, accuracy in enumerate(accuracies, start=1):
        row_clients = clients(index) if clients else [{"partition": 0, "weight": 1.0, "num_examples": 10}]
        rows.append(
            {
                "round": index,
                "accuracy": accuracy,
                "loss": 1.0 / index,
                "sampled": (sampled or {}).get(index, [0, 1]),
                "clients": row_clients,
                "diagnostics": {},
            }
        )
    (folder / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    if rounds is not None:
        summary = {"final_accuracy": accuracies[-1], "rounds": rounds, "seconds": 3.0}
        (folder / SUMMARY_FILE).write_text(json.dumps(summary))
    if checkpoint is not None:
        Checkpoint(checkpoint, {"w": np.zeros(2, dtype=np.float32)}, {}).save(folder / CHECKPOINT_FILE)


def test_runs_are_started_skipped_or_resumed_from_their_folder(tmp_path):
    _, runs = planned(tmp_path)
    write_run(runs[0].run_dir, [0.1, 0.2, 0.3], rounds=3, checkpoint=3)  # finished
    write_run(runs[1].run_dir, [0.1, 0.2], checkpoint=2)  # interrupted after round 2
    write_run(runs[2].run_dir, [0.1, 0.2, 0.3], checkpoint=3)  # last round checkpointed, never finished
    plans = plan_grid(runs)
    assert [plan.action for plan in plans] == [Action.SKIP, Action.RESUME, Action.START, Action.START]
    resume = plans[1]
    assert resume.done_rounds == 2 and resume.remaining_rounds == 1
    assert resume.run_config["resume-from"] == str(runs[1].run_dir)
    assert "resume-from" not in plans[3].run_config and plans[0].remaining_rounds == 0


def test_a_finished_run_with_fewer_rounds_is_extended(tmp_path):
    _, runs = planned(tmp_path)
    write_run(runs[0].run_dir, [0.1, 0.2], rounds=2, checkpoint=2)
    plan = inspect_run(runs[0])
    assert plan.action is Action.RESUME and plan.done_rounds == 2 and "extending" in plan.note


def test_a_folder_holding_more_rounds_is_refused(tmp_path):
    _, runs = planned(tmp_path)
    write_run(runs[0].run_dir, [0.1] * 5, rounds=5, checkpoint=5)
    with pytest.raises(ExperimentError, match="fedavg-seed1.*holds 5 rounds.*asks for 3"):
        plan_grid(runs)


def test_a_folder_recorded_with_other_settings_is_refused(tmp_path):
    _, runs = planned(tmp_path)
    write_run(runs[0].run_dir, [0.1], settings={"seed": 1, "learning-rate": 0.1, "run-name": "x"})
    expected = {"seed": 1, "learning-rate": 0.05, "run-name": "fedavg-seed1"}
    with pytest.raises(ExperimentError, match=r"fedavg-seed1.*learning-rate: 0.1 in the folder, 0.05 now"):
        plan_grid(runs, {runs[0].name: expected})
    assert settings_differences({"run-name": "a", "fedoui": {"window": 1}}, {"run-name": "b"}) == []


def test_wall_time_segments_accumulate(tmp_path):
    _, runs = planned(tmp_path)
    record_segment(runs[0].run_dir, runs[0], {"status": "interrupted", "wall_seconds": 4.0})
    record_segment(runs[0].run_dir, runs[0], {"status": "finished:completed", "wall_seconds": 6.5})
    record = read_run_record(runs[0].run_dir)
    assert record["arm"] == "fedavg" and [s["wall_seconds"] for s in record["segments"]] == [4.0, 6.5]
    write_run(runs[0].run_dir, [0.1, 0.2, 0.3], rounds=3)
    assert collect_results(runs[:1])[0].wall_seconds == pytest.approx(10.5)


def test_progress_shows_runs_round_and_time_left(tmp_path):
    _, runs = planned(tmp_path)
    write_run(runs[0].run_dir, [0.1, 0.2, 0.3], rounds=3)
    plans = plan_grid(runs)
    now = [0.0]
    out = io.StringIO()
    progress = RunsProgress(plans, out=out, clock=lambda: now[0])
    progress.start_run(plans[1])
    for round_number, at in ((1, 30.0), (2, 32.0), (3, 34.0)):
        now[0] = at
        progress.on_line(f"INFO :      [fedweigh] round {round_number}/3  accuracy 0.5  loss 1.0  1.9s")
    assert progress.mean_round_seconds() == pytest.approx(2.0)
    assert "runs 1/4 done | fedoui-seed1: round 3/3 acc 0.5000" in out.getvalue()
    now[0] = 35.0
    progress.finish_run(ok=True)
    # two runs of 3 rounds left: 6 rounds x 2 s + 2 x the 29 s of fixed cost seen in the first run
    assert progress.seconds_left() == pytest.approx(6 * 2.0 + 2 * 29.0)
    assert parse_round_line("[ROUND 2/3]") is None


def test_time_left_counts_the_rounds_between_lines_when_only_every_few_rounds_print(tmp_path):
    _, runs = planned(tmp_path)
    plans = plan_grid(runs)
    now = [0.0]
    progress = RunsProgress(plans, out=io.StringIO(), clock=lambda: now[0])
    progress.start_run(plans[0])
    for round_number, at in ((10, 30.0), (20, 50.0), (30, 70.0)):  # evaluate-every = 10: 2 s a round
        now[0] = at
        progress.on_line(f"INFO :      [fedweigh] round {round_number}/30  accuracy 0.5  loss 1.0  1.9s")
    assert progress.mean_round_seconds() == pytest.approx(2.0)


# ------------------------------------------------------------------ report and plots


def test_scores_follow_the_spec_definitions():
    scores = run_scores([0.1, 0.3, 0.2, 0.4])
    assert scores.final == 0.4 and scores.best == 0.4 and scores.mean == pytest.approx(0.25)
    assert scores.auc == pytest.approx(((0.1 + 0.3) / 2 + (0.3 + 0.2) / 2 + (0.2 + 0.4) / 2) / 3)  # trapezoid/(T-1)
    assert accuracy_auc([0.3]) == 0.3
    mean, std = mean_std([0.2, 0.4, 0.6])
    assert mean == pytest.approx(0.4) and std == pytest.approx(0.2)  # ddof = 1
    assert mean_std([0.5]) == (0.5, None)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=30))
def test_auc_lies_between_the_worst_and_best_round(accuracies):
    auc = accuracy_auc(accuracies)
    assert min(accuracies) - 1e-12 <= auc <= max(accuracies) + 1e-12


def fedoui_clients(round_number):
    rng = np.random.default_rng(round_number)
    ouis = rng.uniform(0.1, 0.4, size=3)
    return [
        {
            "partition": p,
            "weight": w,
            "num_examples": 10,
            "oui": float(o),
            "u-p50": 0.1 * round_number,
            "u-p90": 0.2,
            "u-p95": 0.3,
            "u-p99": 0.5,
            "energy": float(o) * 3,
        }
        for p, w, o in zip((0, 2, 3), (0.2, 0.3, 0.5), ouis, strict=True)
    ]


def synthetic_grid(tmp_path, second_arm_sampled=None):
    experiment, runs = planned(tmp_path)
    curves = {"fedavg": [[0.2, 0.3, 0.5], [0.3, 0.4, 0.6]], "fedoui": [[0.25, 0.35, 0.45], [0.3, 0.5, 0.65]]}
    for run in runs:
        sampled = second_arm_sampled if run.arm == "fedoui" else None
        write_run(run.run_dir, curves[run.arm][run.seed - 1], sampled=sampled, rounds=3, clients=fedoui_clients)
        rows = [json.loads(line) for line in (run.run_dir / METRICS_FILE).read_text().splitlines()]
        for row in rows:
            row["diagnostics"] = {"beta-alpha": 6.0 + row["round"], "beta-beta": 20.0, "fit-method": "mom"}
            row["macro_f1"] = row["accuracy"] - 0.05
        (run.run_dir / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
        record_segment(run.run_dir, run, {"status": "finished:completed", "wall_seconds": 30.0})
    return experiment, runs


def test_results_csv_and_summary_hold_the_scores_and_the_papers_numbers(tmp_path):
    experiment, runs = synthetic_grid(tmp_path)
    report = write_report(experiment, runs, tmp_path, plots=False)
    with report.results_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 4 and {row["status"] for row in rows} == {"finished"}
    first = rows[0]
    assert first["run_name"] == "fedavg-seed1" and float(first["final_accuracy"]) == pytest.approx(0.5)
    assert float(first["best_accuracy"]) == pytest.approx(0.5) and float(first["wall_seconds"]) == 30.0
    assert float(first["auc_accuracy"]) == pytest.approx((0.25 + 0.4) / 2)
    assert float(first["final_macro_f1"]) == pytest.approx(0.45)  # the CSV holds 6 decimals
    assert float(first["mean_macro_f1"]) == pytest.approx((0.15 + 0.25 + 0.45) / 3, abs=1e-6)
    assert float(first["mean_loss"]) == pytest.approx((1.0 + 1 / 2 + 1 / 3) / 3, abs=1e-6)  # write_run's loss: 1/round
    summary = report.summary_md.read_text()
    f1_mean, f1_std = mean_std([(0.15 + 0.25 + 0.45) / 3, (0.25 + 0.35 + 0.55) / 3])
    assert f"| fedavg | {f1_mean:.4f} ± {f1_std:.4f} | " in summary  # the macro-F1 and loss table
    final_mean, final_std = mean_std([0.5, 0.6])
    assert f"{final_mean:.4f} ± {final_std:.4f} (paper 0.5000 ± 0.0200)" in summary
    assert "(paper 0.4000)" in summary
    assert "Client sampling: identical across arms." in summary
    assert "--set" not in summary

    experiment.settings["fraction-train"] = 0.3  # as if run with --set fraction-train=0.3
    summary = write_report(experiment, runs, tmp_path, plots=False).summary_md.read_text()
    assert "over the file: `fraction-train = 0.3`." in summary
    assert "not necessarily for the values set with `--set`" in summary
    described, _ = planned(tmp_path, experiment={**experiment_table()["experiment"], "description": "at 50% a round"})
    assert write_report(described, runs, tmp_path, plots=False).summary_md.read_text().startswith("# demo\n\nat 50%")
    described.settings["fraction-train"] = 0.3  # the description says otherwise: it is labelled the file's
    summary = write_report(described, runs, tmp_path, plots=False).summary_md.read_text()
    assert "The experiment file's description: at 50% a round\n\nSet for every run on the command line" in summary


def test_results_csv_and_summary_hold_the_fednolowe_papers_metrics(tmp_path):
    experiment, runs = planned(tmp_path, base={"num-server-rounds": 6, "fraction-train": 0.5})
    accuracies = [0.1, 0.3, 0.2, 0.4, 0.5, 0.6]
    for run in runs:
        write_run(run.run_dir, accuracies, rounds=6)
        rows = [json.loads(line) for line in (run.run_dir / METRICS_FILE).read_text().splitlines()]
        for row in rows:
            row.update({WEIGHTED: row["accuracy"] / 2, TOP5: 0.9})
            row.update({TRAIN_LOSS: 1.0 / row["round"], UNWEIGHTED_LOSS: 2.0 / row["round"]})
        rows[2][TRAIN_LOSS] = rows[2][UNWEIGHTED_LOSS] = None  # a round that aggregated nothing
        (run.run_dir / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = write_report(experiment, runs, tmp_path, plots=False)
    with report.results_csv.open() as handle:
        first = next(csv.DictReader(handle))
    assert float(first["final_weighted_f1"]) == pytest.approx(0.3)
    assert float(first["mean_weighted_f1"]) == pytest.approx(np.mean(accuracies) / 2, abs=1e-6)
    assert float(first["mean_top5_accuracy"]) == pytest.approx(0.9)
    rolling = np.mean([np.std(accuracies[:5], ddof=1), np.std(accuracies[1:], ddof=1)])
    assert float(first["rolling_std_accuracy"]) == pytest.approx(rolling, abs=1e-6)
    loss = np.mean([1.0, 1 / 2, 1 / 4, 1 / 5, 1 / 6])  # round 3 recorded none
    assert float(first["mean_train_loss"]) == pytest.approx(loss, abs=1e-6)
    assert float(first["mean_train_loss_unweighted"]) == pytest.approx(2 * loss, abs=1e-6)
    summary = report.summary_md.read_text()
    assert "As the FedNolowe paper reports them" in summary and "accuracy, rolling std" in summary
    same = " ± 0.0000 | "  # both seeds wrote the same rounds
    row = f"| fedavg | {rolling:.4f}{same}{np.mean(accuracies) / 2:.4f}{same}0.3000{same}0.9000{same}{loss:.4f}{same}"
    assert row in summary


def test_a_report_of_runs_without_the_new_metrics_leaves_their_cells_empty(tmp_path):
    experiment, runs = planned(tmp_path)
    for run in runs:
        write_run(run.run_dir, [0.2, 0.3, 0.4], rounds=3)  # as runs recorded before these metrics existed
    report = write_report(experiment, runs, tmp_path, plots=False)
    with report.results_csv.open() as handle:
        first = next(csv.DictReader(handle))
    assert first["mean_weighted_f1"] == first["rolling_std_accuracy"] == first["mean_train_loss"] == ""
    assert float(first["mean_loss"]) > 0 and "As the FedNolowe paper reports them" not in report.summary_md.read_text()


def test_different_client_sampling_fails_the_report_loudly(tmp_path):
    experiment, runs = synthetic_grid(tmp_path, second_arm_sampled={2: [1, 3]})
    with pytest.raises(SamplingMismatchError, match="round 2: fedavg sampled \\[0, 1\\], fedoui sampled \\[1, 3\\]"):
        write_report(experiment, runs, tmp_path, plots=False)
    assert "WARNING: client sampling differs" in (tmp_path / "summary.md").read_text()


def test_unfinished_runs_are_listed_not_scored(tmp_path):
    experiment, runs = synthetic_grid(tmp_path)
    (runs[-1].run_dir / SUMMARY_FILE).unlink()
    report = write_report(experiment, runs, tmp_path, plots=False)
    assert "fedoui-seed2: incomplete (3/3 rounds)" in report.summary_md.read_text()
    assert "| fedoui | fedoui | 1/2 |" in report.summary_md.read_text()


def test_plots_are_valid_pngs_for_accuracy_weights_and_signals(tmp_path):
    experiment, runs = synthetic_grid(tmp_path)
    results = collect_results(runs)
    drawn = draw_all(experiment, results, tmp_path / "plots")
    names = {path.name for path in drawn}
    assert {"accuracy.png", "weights-fedavg.png", "oui-fedoui.png", "uncertainty-fedoui.png"} <= names
    assert "signals-fedoui.png" in names  # the energy scores fall to the generic plot
    for path in drawn:
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 1000
    partitions, matrix = weight_matrix(results[0], num_partitions=4)
    assert partitions == [0, 1, 2, 3] and np.isnan(matrix[1]).all() and matrix[3, 0] == pytest.approx(0.5)


# ------------------------------------------------------------------ one real grid


@pytest.mark.xdist_group("simulation")
def test_a_tiny_real_grid_end_to_end(shared_simulation, tmp_path):
    simulation = shared_simulation
    experiment = load_experiment(REPO / "experiments" / "smoke_digits.toml", DEFAULTS)
    out = io.StringIO()
    outcome = run_experiment(experiment, tmp_path, REPO, DEFAULTS, port=simulation.port, out=out, simulation=simulation)
    assert outcome.failed == () and [plan.action for plan in outcome.plans] == [Action.START, Action.START]
    assert "runs 2/2 done" in out.getvalue() and "fedoui-seed1: round 2/2" in out.getvalue()
    with (tmp_path / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["arm"], row["status"], row["rounds"]) for row in rows] == [
        ("fedavg", "finished", "2"),
        ("fedoui", "finished", "2"),
    ]
    assert all(0.15 < float(row["final_accuracy"]) <= 1 and float(row["wall_seconds"]) > 0 for row in rows)
    assert all(math.isfinite(float(row["auc_accuracy"])) for row in rows)
    assert "the same clients in all 2 rounds for fedavg, fedoui" in (tmp_path / "summary.md").read_text()
    for name in ("accuracy.png", "weights-fedoui.png", "oui-fedoui.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / "logs" / "fedavg-seed1.log").stat().st_size > 0
    assert (tmp_path / "runs" / "fedavg-seed1" / RUN_RECORD_FILE).is_file()

    again = run_experiment(
        experiment, tmp_path, REPO, DEFAULTS, port=simulation.port, out=io.StringIO(), simulation=simulation
    )
    assert [plan.action for plan in again.plans] == [Action.SKIP, Action.SKIP]  # nothing runs twice


def test_a_run_whose_model_collapsed_is_named_with_the_round_and_lambda(tmp_path):
    experiment, runs = synthetic_grid(tmp_path)
    folder = runs[1].run_dir  # fedoui-seed1
    rows = [json.loads(line) for line in (folder / METRICS_FILE).read_text().splitlines()]
    for row, share, lam in zip(rows, (0.9, 0.97, 0.95), (58.5786, 100.0, 200.0), strict=True):
        row["prediction_share"] = share
        row["diagnostics"]["asw-lambda"] = lam
    (folder / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = write_report(experiment, runs, tmp_path, plots=False)
    summary = report.summary_md.read_text()
    assert "Collapses (the global model predicted one class for at least 90% of the test set" in summary
    assert "- fedoui-seed1: round 1 (accuracy 0.2500, λ = 58.58); to the end" in summary
    with report.results_csv.open() as handle:
        collapses = {row["run_name"]: row["collapse"] for row in csv.DictReader(handle)}
    kept = tmp_path / "kept.csv"
    kept.write_bytes(report.results_csv.read_bytes())
    assert collapses["fedoui-seed1"].startswith("round 1") and collapses["fedavg-seed1"] == ""
    # a single round predicting one class is no collapse (strong label skew does that to FedAvg too)
    rows[2]["prediction_share"] = 0.5
    (folder / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert "Collapses" not in write_report(experiment, runs, tmp_path, plots=False).summary_md.read_text()
    # read back from the first report's results.csv once the folder is gone, the collapse is still named
    for file in folder.iterdir():
        file.unlink()
    again = write_report(experiment, runs, tmp_path / "again", plots=False, earlier=[kept]).summary_md.read_text()
    assert "- fedoui-seed1: round 1 (accuracy 0.2500, λ = 58.58); to the end" in again


def test_an_arm_evaluated_every_few_rounds_with_feddles_record_is_scored_and_plotted(tmp_path):
    experiment, runs = synthetic_grid(tmp_path)
    for run in runs[1::2]:  # the second arm: as a Feddle run, evaluated in rounds 2 and 3 only
        rows = [json.loads(line) for line in (run.run_dir / METRICS_FILE).read_text().splitlines()]
        for row in rows:
            row["diagnostics"] = {"coefficients": [0.5, -0.1, 0.2], "negative-coefficients": 1, "atlas-size": 3}
            for client in row["clients"]:
                client.pop("weight", None)  # Feddle's update uses no rule weights
        for key in ("accuracy", "loss", "macro_f1"):
            rows[0].pop(key)
        (run.run_dir / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    results = collect_results(runs)
    second = [r for r in results if r.run.arm == "fedoui"]
    assert all(r.finished for r in results)
    assert [r.scores.mean for r in second] == pytest.approx([(0.35 + 0.45) / 2, (0.5 + 0.65) / 2])
    assert second[0].scores.late_max == pytest.approx(0.45) and second[0].scores.rounds == 3
    names = {path.name for path in draw_all(experiment, results, tmp_path / "plots")}
    assert "coefficients-fedoui.png" in names and "weights-fedoui.png" not in names and "weights-fedavg.png" in names
    assert (tmp_path / "plots" / "coefficients-fedoui.png").read_bytes()[:8] == PNG_MAGIC
    # the late-max column shows only where a paper reports that score; results.csv always has it
    report = write_report(experiment, runs, tmp_path, plots=False)
    assert "best of last 5" not in report.summary_md.read_text()
    with report.results_csv.open() as handle:
        assert float(next(r for r in csv.DictReader(handle) if r["arm"] == "fedoui")["late_max_accuracy"]) == 0.45


class RecordingSimulation:
    """Stands in for the runner's simulation: notes what each run's folder held at submission, then writes a
    finished run there."""

    def __init__(self) -> None:
        self.found: dict[str, list[str]] = {}

    def run(self, run_config, **kwargs):
        folder = Path(run_config["output-dir"]) / run_config["run-name"]
        self.found[folder.name] = run_files(folder) if "resume-from" not in run_config else ["(resumed)"]
        write_run(folder, [0.1, 0.2, 0.3], rounds=3, checkpoint=3, settings={"seed": run_config["seed"]})
        return RunOutcome(1, "finished:completed", folder, dict(run_config))


def test_a_run_started_over_in_its_folder_sets_the_earlier_attempt_aside(tmp_path):
    """A folder that holds a run is never written by another run: the runner, starting a run over (its last
    attempt left no usable checkpoint), moves that attempt's files into ``set-aside-<time>/`` first."""
    experiment, runs = planned(tmp_path)
    write_run(runs[2].run_dir, [0.1, 0.2, 0.3], checkpoint=3, settings={"seed": 2})  # checkpointed, never finished
    earlier = {name: (runs[2].run_dir / name).read_bytes() for name in run_files(runs[2].run_dir)}
    simulation = RecordingSimulation()
    outcome = run_experiment(experiment, tmp_path, REPO, DEFAULTS, port=1, out=io.StringIO(), simulation=simulation)
    assert outcome.failed == ()
    assert simulation.found == {name: [] for name in ("fedavg-seed1", "fedoui-seed1", "fedavg-seed2", "fedoui-seed2")}
    (aside,) = runs[2].run_dir.glob("set-aside-*")
    assert {name: (aside / name).read_bytes() for name in run_files(aside)} == earlier
