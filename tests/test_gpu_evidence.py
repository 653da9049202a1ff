"""``fedweigh benchmark gpu-evidence``: its smoke mode on the CPU, its budget and its order (no timing asserted)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from conftest import REPO, Clock

from fedweigh.benchmarks.cli import add_benchmark_parser, render_table, run_benchmark
from fedweigh.benchmarks.common import BenchmarkError, write_json
from fedweigh.benchmarks.gpu_evidence import (
    Case,
    Context,
    Step,
    build_cases,
    gpu_evidence,
    load_arm,
    order_cases,
    run_cases,
)

CASES = {"overhead", "vit-lora", "flood", "fednolowe-round", "fednolowe", "feddle"}


def test_the_smoke_mode_runs_every_case_and_writes_the_report_after_each_step(shared_simulation, tmp_path):
    path, written = tmp_path / "gpu-evidence.json", []

    def write(report):
        write_json(path, report)
        written.append(json.loads(path.read_text(encoding="utf-8")))

    report = run_benchmark("gpu-evidence", quick=True, sim=shared_simulation, progress=write, runs_dir=tmp_path)
    assert {case["case"] for case in report["cases"]} == CASES
    on_gpu = [case.name for case in order_cases(build_cases(Context(None, quick=False, runs_dir=tmp_path)))]
    assert report["order"] == on_gpu  # the smoke run keeps the GPU run's order
    problems = [
        (c["case"], s["step"], s.get("reason")) for c in report["cases"] for s in c["steps"] if s["status"] != "done"
    ]
    assert not problems
    steps = sum(len(case["steps"]) for case in report["cases"])
    assert len(written) == steps  # the file after every step: a time limit keeps what was measured
    assert [sum(len(c["steps"]) for c in snapshot["cases"]) for snapshot in written] == list(range(1, steps + 1))
    assert all(snapshot["partial"] for snapshot in written)
    assert written[-1]["cases"] == report["cases"] and report["partial"] is False
    table = render_table("gpu-evidence", report)
    assert all(f"| {name} |" in table for name in CASES)


def _step(name, seconds, takes, clock, error=None):
    def run():
        clock.sleep(takes)
        if error is not None:
            raise error
        return {"headline": f"{name} took {takes}", "value": takes}

    return Step(name, seconds, run)


@pytest.mark.unit
def test_steps_that_do_not_fit_are_skipped_with_the_reason_and_the_rest_of_the_budget_goes_on():
    clock = Clock()
    cases = [
        # alike: the first step's 40 s raise the second's estimate from 30 to 40; both fit in 100
        Case("a", "", 1.0, "", (_step("a1", 30, 40, clock), _step("a2", 30, 45, clock)), alike=True),
        Case("b", "", 1.0, "", (_step("b1", 20, 1, clock), _step("b2", 1, 1, clock))),  # 15 s left: b1 does not fit
        Case("c", "", 1.0, "", (_step("c1", 5, 2, clock, RuntimeError("boom")),)),
        Case("d", "", 1.0, "", (_step("d1", 5, 0, clock, BenchmarkError("dataset folder 'cifar10' not found")),)),
    ]
    seen = []
    report = run_cases(cases, budget=100, progress=lambda r: seen.append(json.dumps(r)), clock=clock)
    by_case = {case["case"]: case for case in report["cases"]}
    assert [s["estimated_seconds"] for s in by_case["a"]["steps"]] == [30, 40]
    assert by_case["a"]["status"] == "done" and by_case["a"]["steps"][1]["result"] == {"value": 45}
    assert [s["status"] for s in by_case["b"]["steps"]] == ["skipped", "skipped"]
    assert by_case["b"]["steps"][0]["reason"] == "does not fit: estimated 20 s, 15 s of the budget left"
    assert by_case["b"]["steps"][1]["reason"] == "step 'b1' of this case did not fit"
    assert by_case["b"]["status"] == "skipped"
    assert by_case["c"]["status"] == "failed" and by_case["c"]["steps"][0]["reason"] == "RuntimeError: boom"
    assert by_case["d"]["status"] == "skipped" and "not found" in by_case["d"]["steps"][0]["reason"]
    assert len(seen) == 6 and report["elapsed_seconds"] == 87


@pytest.mark.unit
def test_cases_run_in_order_of_value_per_estimated_minute(tmp_path):
    cases = order_cases(build_cases(Context(None, quick=False, runs_dir=tmp_path)))
    rates = [case.value_per_minute for case in cases]
    assert rates == sorted(rates, reverse=True) and {case.name for case in cases} == CASES
    assert all(step.seconds > 0 for case in cases for step in case.steps)


@pytest.mark.unit
def test_the_budget_option_names_the_value_and_what_is_accepted(capsys):
    parser = argparse.ArgumentParser()
    add_benchmark_parser(parser.add_subparsers())
    for bad in ("-5", "soon", "inf"):
        with pytest.raises(SystemExit):
            parser.parse_args(["benchmark", "gpu-evidence", "--budget", bad])
        assert f"--budget = '{bad}': accepted: a number of seconds > 0, e.g. 720" in capsys.readouterr().err
    assert parser.parse_args(["benchmark", "gpu-evidence", "--budget", "600"]).budget == 600.0


@pytest.mark.unit
def test_without_a_gpu_only_the_smoke_mode_runs(monkeypatch, capsys):
    import torch

    from fedweigh.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BenchmarkError, match=r"gpu-evidence --quick"):
        gpu_evidence(sim=None, quick=False)
    assert main(["benchmark", "gpu-evidence"]) == 1  # refused before a SuperLink starts
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.unit
@pytest.mark.parametrize(
    ("file", "arm", "rounds"),
    [
        *[("flood_cifar10_gpu", arm, 200) for arm in ("fedavg", "flood", "asw-scale-control", "asw")],
        ("fednolowe_cifar10", "fedavg", 5),
        ("fednolowe_cifar10", "fednolowe", 100),
        *[("feddle_fmnist_200", arm, 200) for arm in ("feddle-id-s20", "fedbuff-s20")],
    ],
)
def test_every_experiment_step_is_valid_as_the_gpu_runs_it(file, arm, rounds, tmp_path):
    ctx = Context(None, quick=False, runs_dir=tmp_path)
    experiment = load_arm(ctx, f"experiments/{file}.toml", arm, rounds if rounds == 5 else None, 1.0)
    assert [a.name for a in experiment.arms] == [arm] and experiment.seeds == [1]
    assert (
        experiment.spec.experiment.gpus_per_client == 1.0 and experiment.arm_configs[arm]["num-server-rounds"] == rounds
    )
    assert Path(experiment.arm_configs[arm]["dataset"]).is_absolute()  # found where FEDWEIGH_DATASETS points


@pytest.mark.unit
def test_the_gpu_flood_file_is_the_cpu_file_with_t_and_the_rounds_four_times_longer():
    from fedweigh.experiments.spec import load_experiment
    from fedweigh.launch.runconfig import load_app_config

    defaults = load_app_config(REPO)
    cpu = load_experiment(REPO / "experiments" / "flood_cifar10.toml", defaults)
    gpu = load_experiment(REPO / "experiments" / "flood_cifar10_gpu.toml", defaults)
    for arm in ("fedavg", "flood", "asw", "asw-scale-control"):
        slow, fast = gpu.arm_configs[arm], cpu.arm_configs[arm]
        assert slow["num-server-rounds"] == 4 * fast["num-server-rounds"]
        assert slow["flood.halt-round"] == 4 * fast["flood.halt-round"]
        assert slow["lr-decay"] ** slow["num-server-rounds"] == pytest.approx(fast["lr-decay"] ** 50, rel=1e-3)
        unchanged = {"num-server-rounds", "flood.halt-round", "lr-decay"}
        assert {k: v for k, v in slow.items() if k not in unchanged} == {
            k: v for k, v in fast.items() if k not in unchanged
        }
