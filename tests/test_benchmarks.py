"""Benchmark code paths on toy inputs (no timing is asserted)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from conftest import REPO
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedweigh.benchmarks.aggregation import run_case
from fedweigh.benchmarks.bare import bare_federated_run
from fedweigh.benchmarks.cli import (
    OVERHEAD_SETTINGS,
    overhead_settings,
    parse_overhead_settings,
    render_table,
    run_benchmark,
)
from fedweigh.benchmarks.common import TimedRun, markdown_table, parse_node_query
from fedweigh.benchmarks.overhead import round_breakdown
from fedweigh.benchmarks.ray_floor import ray_round_trip
from fedweigh.benchmarks.scale import revisit_share
from fedweigh.launch.runconfig import load_app_config
from fedweigh.strategies.averaging import all_finite


@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=6), elements=st.floats(width=32)))
def test_all_finite_agrees_with_isfinite(values):
    assert all_finite({"w": values, "n": np.array(3)}) == bool(np.isfinite(values).all())


def test_aggregation_case_runs_on_a_small_model():
    for side in ("fedweigh", "flower"):
        result = run_case(3, side, "strategy", repeat=1, model="mlp")
        assert result["k"] == 3 and len(result["seconds"]) == 1 and result["parameters"] > 0


def test_bare_loop_trains_and_evaluates_every_round():
    config = {**load_app_config(REPO), "num-server-rounds": 2, "partitioner": "iid", "output-dir": "unused"}
    result = bare_federated_run(config, num_partitions=4)
    assert len(result["accuracies"]) == 2 and all(0.0 < a <= 1.0 for a in result["accuracies"])
    assert all(r["train_seconds"] > 0 and r["evaluate_seconds"] > 0 for r in result["rounds"])
    # the training thread's CPU time is part of training's wall time (one torch thread), beyond clock granularity
    assert all(0 < r["train_cpu_seconds"] <= r["train_seconds"] + 0.01 for r in result["rounds"])


def test_tables_render_every_benchmark_report():
    overhead = {
        "settings": [
            {
                "setting": "s",
                "rounds": 3,
                "bare_seconds": 10.0,
                "simulation_seconds": 20.0,
                "ratio": 2.0,
                "round_ratio": 1.1,
                "per_round_overhead_seconds": 0.2,
                "fixed_overhead_seconds": 9.0,
                "rounds_to_target": 30.0,
                "same_accuracies": True,
            }
        ]
    }
    assert "| s | 3 | 10.0 | 20.0 | 2.00x | 1.10x | 0.20 | 9.0 | 30 | yes |" in render_table("overhead", overhead)
    overhead["peer"] = {
        "rounds": 30,
        "fedweigh_seconds": 30.0,
        "vanilla_seconds": 40.0,
        "ratio": 0.75,
        "fedweigh_round_seconds": 0.7,
        "vanilla_round_seconds": 0.8,
        "round_ratio": 0.875,
    }
    assert "| 30 | 30.0 | 40.0 | 0.75x | 0.700 | 0.800 | 0.88x |" in render_table("overhead", overhead)
    overhead["settings"][0]["round_breakdown"] = round_breakdown(*_timed_rounds())
    overhead["settings"][0]["ray_floor"] = {"default": {"median_ms": 9.5}, "inline_8mib": {"median_ms": 7.25}}
    parts = "600 / 550 | 500 / 520 | 100 / 20 | 50 / 0 | 200 / 200 | 50 / 30 | 1000 / 800"
    assert f"| s (3) | {parts} | 2.0 | 25.0 | 9.5 | 7.2 |" in render_table("overhead", overhead)


def _timed_rounds() -> tuple[TimedRun, list[dict[str, float]]]:
    """A simulation of 3 rounds, 2 clients each, and a bare loop; round 1 (start-up) differs wildly on purpose."""
    clients = [{"train-seconds": 0.3, "train-cpu-seconds": 0.25, "client-seconds": 0.35, "bytes_sent": 2_000_000}] * 2
    rows = [{"round": 1, "seconds": 9.0, "wait_seconds": 8.0, "evaluate_seconds": 0.5, "clients": clients}] + [
        {"round": r, "seconds": 1.0, "wait_seconds": 0.75, "evaluate_seconds": 0.2, "clients": clients} for r in (2, 3)
    ]
    bare = [
        {
            "seconds": 5.0,
            "train_seconds": 4.0,
            "train_cpu_seconds": 3.0,
            "aggregate_seconds": 0.5,
            "evaluate_seconds": 0.5,
        }
    ] + [
        {
            "seconds": 0.8,
            "train_seconds": 0.55,
            "train_cpu_seconds": 0.52,
            "aggregate_seconds": 0.03,
            "evaluate_seconds": 0.2,
        }
    ] * 2
    return TimedRun("finished:completed", None, 20.0, rows=rows), bare


def test_the_round_breakdown_splits_each_side_into_parts_that_add_up_to_its_round():
    split = round_breakdown(*_timed_rounds())
    sim, bare = split["simulation"], split["bare"]
    expected_sim = {"training": 0.6, "client_other": 0.1, "transport": 0.05, "evaluation": 0.2, "server_other": 0.05}
    assert sim == pytest.approx({**expected_sim, "training_cpu": 0.5, "round": 1.0})
    expected_bare = {"training": 0.55, "client_other": 0.02, "transport": 0.0, "evaluation": 0.2, "server_other": 0.03}
    assert bare == pytest.approx({**expected_bare, "training_cpu": 0.52, "round": 0.8})
    for side in (sim, bare):
        parts = ("training", "client_other", "transport", "evaluation", "server_other")
        assert sum(side[part] for part in parts) == pytest.approx(side["round"])
    assert split["difference"]["round"] == pytest.approx(0.2)
    assert split["messages_per_round"] == 2 and split["message_bytes"] == 2_000_000
    assert split["transport_ms_per_message"] == pytest.approx(25.0)


def test_the_overhead_settings_a_user_may_name_are_the_ones_the_benchmark_runs():
    assert list(dict.fromkeys(s.name for s in overhead_settings(quick=False))) == list(OVERHEAD_SETTINGS)
    assert {s.name for s in overhead_settings(quick=True)} <= set(OVERHEAD_SETTINGS)
    # the in-process settings are their Ray settings but for the backend
    by_name = {s.name: s for s in overhead_settings(quick=False)}
    ray, in_process = by_name["fedoui-cifar10"], by_name["fedoui-cifar10-in-process"]
    assert {k: v for k, v in in_process.run_config.items() if k != "simulation-backend"} == ray.run_config
    with pytest.raises(
        argparse.ArgumentTypeError,
        match=r"--settings = 'fedoui-cifar10,cifar': unknown setting\(s\) "
        r"cifar; accepted: .*fedoui-cifar10-in-process",
    ):
        parse_overhead_settings("fedoui-cifar10,cifar")


def test_the_ray_floor_times_a_payload_through_an_actor_and_back():
    floor = ray_round_trip(64 * 1024, trips=3)
    assert floor["bytes"] == 64 * 1024 and floor["trips"] == 3
    assert 0 < floor["min_ms"] <= floor["median_ms"]


def test_the_peer_apps_get_the_same_work():
    """Every setting the vanilla peer receives goes to fedweigh's side with the same value, and both apps know it."""
    from fedweigh.benchmarks.overhead import VANILLA_APP, peer_settings
    from fedweigh.settings import validate

    ours, theirs = peer_settings(rounds=7)
    assert all(ours[key] == value for key, value in theirs.items())
    assert set(theirs) <= set(load_app_config(VANILLA_APP))
    settings = validate({**load_app_config(REPO), **ours})
    assert settings.fraction_train == 1.0 and not settings.augment and settings.num_server_rounds == 7
    methods = {"setting": "s", "strategies": [{"strategy": "fedavg", "status": "ok", "round_seconds": 1.0}]}
    assert "| fedavg | 1.00 |" in render_table("methods", methods)
    scale = {"clients": [{"clients": 100, "status": "ok", "peak_pss_mb": 900.0, "round_seconds": 0.5}]}
    assert "| 100 |" in render_table("scale", scale)
    assert markdown_table(["a"], [[1]]) == "| a |\n|---|\n| 1 |"


def test_revisits_count_clients_that_trained_before_in_the_run():
    assert revisit_share([[1, 2], [2, 3], [1, 4]]) == 0.333  # 2 of 6 trainings: client 2 in round 2, 1 in round 3
    assert revisit_share([[1, 2], [3, 4]]) == 0.0 and revisit_share([]) == 0.0


def test_the_node_query_line_is_parsed():
    assert parse_node_query("INFO :  [fedweigh] asked 1000 nodes for their partition in 61.25s") == (1000, 61.25)
    engine = "INFO :  [fedweigh] learned the partition of 10000 nodes from the simulation engine in 0.03s"
    assert parse_node_query(engine) == (10000, 0.03)
    assert parse_node_query("INFO :  [fedweigh] round 1/2") is None


def test_allocator_benchmark_trains_and_evaluates_the_setting_and_renders_its_cases():
    from fedweigh.benchmarks.allocator import CASES, train_passes

    for thread in (False, True):
        measured = train_passes(rounds=1, repeats=2, keep=True, thread=thread)
        assert measured["main_thread"] is not thread  # the thread cases run where a simulation's apps run
        for key in ("train_seconds", "evaluate_seconds"):
            assert len(measured[key]) == 2 and all(s > 0 for s in measured[key])
        for key in ("minor_faults", "evaluate_minor_faults"):
            assert len(measured[key]) == 2 and all(f >= 0 for f in measured[key])
    cases = [
        {
            **case._asdict(),
            "train_seconds": [1.0, 2.0],
            "median_train_seconds": 1.5,
            "vs_plain_default": 1.0,
            "median_minor_faults": 1234.0,
            "median_evaluate_seconds": 0.5,
            "evaluate_vs_plain_default": 1.25,
            "median_evaluate_minor_faults": 56789.0,
        }
        for case in CASES
    ]
    table = render_table("allocator", {"setting": "s", "rounds": 2, "repeats": 2, "cases": cases})
    assert (
        "| ray | main | default | kept (fedweigh) | 1.00 / 2.00 | 1.50 | 1.00x | 1,234 | 0.50 | 1.25x | 56,789 |"
        in table
    )
    assert "| plain | worker | 1 | kept (fedweigh) |" in table
    assert table.count("\n| plain |") == 4
    earlier = [
        {k: v for k, v in case.items() if "evaluate" not in k and k not in {"thread", "arena"}} for case in cases
    ]
    old = render_table("allocator", {"setting": "s", "rounds": 2, "repeats": 2, "cases": earlier[:1]})
    assert "| plain | main | default | glibc default | 1.00 / 2.00 | 1.50 | 1.00x | 1,234 | – | – | – |" in old


def test_gpu_benchmark_refuses_a_machine_without_a_gpu_before_running_anything(monkeypatch):
    from fedweigh.benchmarks.common import BenchmarkError
    from fedweigh.benchmarks.gpu import gpu_overhead

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(BenchmarkError, match="needs a CUDA GPU.*benchmark overhead"):
        gpu_overhead(sim=None, quick=True)


def test_gpu_cases_are_the_cpu_settings_with_a_gpu_share_and_render_with_it():
    from fedweigh.benchmarks.common import fedoui_cifar10, resnet18_cifar10
    from fedweigh.benchmarks.gpu import SHARED_GPU, gpu_cases

    cases = gpu_cases(quick=False)
    assert [(s.name, share) for s, share in cases] == [
        ("fedoui-cifar10", 1.0),
        ("fedoui-cifar10-in-process", 1.0),
        ("resnet18-cifar10", 1.0),
        ("resnet18-cifar10-in-process", 1.0),
        ("resnet18-cifar10", SHARED_GPU),
        ("fedoui-cifar10-polling", 1.0),
    ]
    assert cases[0][0] == fedoui_cifar10(60) and cases[2][0] == resnet18_cifar10(20)
    assert cases[1][0].run_config == {**fedoui_cifar10(60).run_config, "simulation-backend": "in-process"}
    assert cases[3][0].run_config == {**resnet18_cifar10(20).run_config, "simulation-backend": "in-process"}
    assert cases[5][0].run_config == {**fedoui_cifar10(60).run_config, "event-driven-simulation": False}
    row = {
        "setting": "resnet18-cifar10",
        "gpus_per_client": 0.2,
        "rounds": 20,
        "bare_seconds": 24.1,
        "simulation_seconds": 68.4,
        "ratio": 2.83,
        "round_ratio": 2.92,
        "per_round_overhead_seconds": 0.931,
        "fixed_overhead_seconds": 11.9,
        "rounds_to_target": None,
        "same_accuracies": False,
    }
    case = {"model": "vit-b16", "fine_tuning": "lora", "trainable_parameters": 302602, "message_bytes": 2**20}
    case |= {"fewer_bytes_than_full": 284.0, "step_seconds_mean": 0.0747, "step_seconds_std": 0.0043}
    case |= {"peak_rss_mb": 9000.0, "peak_gpu_mb": 3011.0}
    report = {"settings": [row], "fine_tuning": {"device": "cuda", "batch_size": 32, "cases": [case]}}
    table = render_table("gpu-overhead", report)
    assert "| resnet18-cifar10 | 0.2 | 20 | 24.1 | 68.4 | 2.83x | 2.92x | 0.931 | 11.9 | never | NO |" in table
    assert "GPU step s (batch 32)" in table and "| 0.0747 ± 0.0043 | 3011 |" in table


def test_fine_tuning_step_is_measured_on_the_device_asked_for():
    from fedweigh.benchmarks.finetuning import measure

    case = measure("resnet18-imagenet", "head", steps=1, batch_size=2, device="cpu")
    assert case["device"] == "cpu" and case["peak_gpu_mb"] is None and case["steps_timed"] == 1
    assert case["trainable_parameters"] == 512 * 10 + 10 and case["step_seconds_mean"] > 0


def test_checkpoint_benchmark_times_every_way_and_renders_them(tmp_path):
    from fedweigh.benchmarks.checkpoint import MODELS, WAYS, checkpoint_cost

    report = checkpoint_cost(saves=2, gap=0.0, folder=tmp_path)
    assert [(r["model"], r["way"]) for r in report["cases"]] == [(m, w) for m, _, _ in MODELS for w in WAYS]
    assert all(r["median_seconds"] > 0 and r["state_mb"] > 1 for r in report["cases"])
    assert list(tmp_path.iterdir()) == []  # its files are gone
    assert "| fedoui-cnn | 2.1 | tensors, background |" in render_table("checkpoint", report)


def test_gpu_benchmark_hands_on_each_finished_case_before_the_next(monkeypatch):
    """A GPU lease can end mid-benchmark: what was measured is passed on after each case."""
    from fedweigh.benchmarks import gpu

    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    ran = []

    def fake_case(setting, sim, gpus_per_client, cpus_per_client):
        ran.append((setting.name, gpus_per_client))
        return {"setting": setting.name, "gpus_per_client": gpus_per_client, "cpus_per_client": cpus_per_client}

    monkeypatch.setattr(gpu, "federation_overhead", fake_case)
    monkeypatch.setattr(gpu, "finetuning_cost", lambda quick, device, batch_size: {"device": device, "cases": []})
    monkeypatch.setattr("fedweigh.benchmarks.common.machine_description", lambda: {"load_average_1m": 0.0})
    seen: list[tuple] = []  # what each call held when it was made (the JSON is written at once)

    def progress(partial):
        seen.append((partial["partial"], partial["benchmark"], [case["setting"] for case in partial["settings"]]))

    report = run_benchmark("gpu-overhead", quick=True, progress=progress)
    names = [case["setting"] for case in report["settings"]]
    assert seen == [(True, "gpu-overhead", names[:done]) for done in range(1, len(names) + 1)]
    assert "partial" not in report
    assert ran == [(s.name, share) for s, share in gpu.gpu_cases(quick=True)]
    assert report["fine_tuning"]["device"] == "cuda"


def test_the_bare_loop_refuses_what_the_server_app_refuses_before_training():
    """An empty partition: the ServerApp's data check, not a failure inside a client's training."""
    from fedweigh.settings import SettingsError

    config = {**load_app_config(REPO), "partitioner": "dirichlet", "dirichlet-alpha": 0.01, "output-dir": "unused"}
    with pytest.raises(SettingsError, match=r"with 300 partitions .* leaves partitions \[0, .* empty"):
        bare_federated_run(config, num_partitions=300)
