"""End to end: real ``flwr run`` simulations (Ray backend) on the offline digits data.

One SuperLink serves every run of this module; each run is a real Flower run,
exactly what ``fedweigh simulate`` does for a user.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import REPO

from fedweigh.launch.simulation import LocalSimulation
from fedweigh.results import read_metrics

STRATEGIES = ["fedavg", "fedprox", "fedoui", "fedalign", "fednolowe", "fedasl", "ufl", "ufl-fedavg"]
SMALL = {"num-server-rounds": 2, "fraction-train": 0.5, "seed": 3}


@pytest.fixture(scope="module")
def simulation(tmp_path_factory):
    home = tmp_path_factory.mktemp("flwr-home")
    with LocalSimulation(REPO, port=39291, flwr_home=home) as sim:
        yield sim


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("outputs")


def run(simulation, output_dir, name: str, **config):
    outcome = simulation.run(
        {**SMALL, "output-dir": str(output_dir), "run-name": name, **config}, num_supernodes=4, echo=False
    )
    assert outcome.ok, f"run {name} ended {outcome.status}"
    return outcome.results_dir


@pytest.fixture(scope="module")
def strategy_runs(simulation, output_dir):
    return {name: run(simulation, output_dir, name, strategy=name) for name in STRATEGIES}


def test_results_folder_is_complete(strategy_runs):
    folder = strategy_runs["fedavg"]
    for name in ("config.json", "metrics.jsonl", "checkpoint.pt", "model.pt", "summary.json"):
        assert (folder / name).is_file(), name
    config = json.loads((folder / "config.json").read_text())
    assert config["settings"]["strategy"] == "fedavg" and config["settings"]["num-server-rounds"] == 2
    rows = read_metrics(folder)
    assert [row["round"] for row in rows] == [1, 2]
    for row in rows:
        assert 0.0 <= row["accuracy"] <= 1.0 and row["loss"] > 0 and row["seconds"] > 0
        assert len(row["sampled"]) == 2 and len(row["clients"]) == 2
        assert sum(client["weight"] for client in row["clients"]) == pytest.approx(1.0)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["final_accuracy"] == rows[-1]["accuracy"] and summary["rounds"] == 2
    state = torch.load(folder / "model.pt")
    assert all(torch.isfinite(tensor).all() for tensor in state.values() if tensor.is_floating_point())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_trains_and_records_its_signals(strategy_runs, strategy):
    rows = read_metrics(strategy_runs[strategy])
    assert len(rows) == 2 and all(row["aggregated"] for row in rows)
    assert rows[-1]["accuracy"] > 0.15  # better than chance (0.1) on digits after 2 rounds
    signal = {"fedoui": "oui", "fedalign": "alignment", "ufl": "uncertainty", "ufl-fedavg": "uncertainty"}.get(strategy)
    if signal:
        assert all(signal in client for row in rows for client in row["clients"])


def test_every_strategy_sees_the_same_clients(strategy_runs):
    sequences = {name: [row["sampled"] for row in read_metrics(folder)] for name, folder in strategy_runs.items()}
    assert len({json.dumps(sequence) for sequence in sequences.values()}) == 1, sequences


def test_resumed_run_ends_where_the_uninterrupted_one_does(simulation, output_dir):
    straight = run(simulation, output_dir, "straight", **{"num-server-rounds": 3})
    first_part = run(simulation, output_dir, "interrupted", **{"num-server-rounds": 2})
    resumed = run(simulation, output_dir, "resumed", **{"num-server-rounds": 3, "resume-from": str(first_part)})
    assert resumed == first_part  # a resumed run continues in its own folder
    assert [row["round"] for row in read_metrics(resumed)] == [1, 2, 3]
    assert read_metrics(resumed)[-1]["accuracy"] == read_metrics(straight)[-1]["accuracy"]
    final_straight, final_resumed = torch.load(straight / "model.pt"), torch.load(resumed / "model.pt")
    for name, tensor in final_straight.items():
        assert torch.equal(tensor, final_resumed[name]), name
