"""Every strategy and every aggregation rule, end to end: the real ServerApp and ClientApp, in one process.

The runs go through :mod:`loopback` (messages serialised as on the wire, no
SuperLink, no Ray), a second or less each, so every strategy, every rule with
every strategy, and the new run options are run end to end on every change.
Real ``flwr run`` simulations are in ``test_simulation.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from loopback import run_in_process

from fedweigh.methods.registry import METHODS, RULES
from fedweigh.preflight import parse_settings
from fedweigh.results import Checkpoint, read_metrics
from fedweigh.rules.base import RoundSignals, complement_share_weights

STRATEGIES = sorted(METHODS)
WEIGHTED = [name for name in STRATEGIES if METHODS[name].update.uses_weights]
SMALL = {"num-server-rounds": 2, "fraction-train": 0.5, "seed": 3}
SERVER_DATA = {"server-data": "id", "server-data-size": 60}
OWN_SETTINGS = {  # the strategies that train on the server's own data get some (60 of the 360 test images)
    "feddle": {**SERVER_DATA, "feddle.search-epochs": 1},
    "center": {**SERVER_DATA, "center.epochs": 10},
    "fedft": SERVER_DATA,
    "fedbuff": {"fedbuff.buffer-size": 2},  # a buffer the round's 2 clients fill: a step every round
}
SIGNAL_OF = {
    "fedoui": "oui",
    "fedalign": "alignment",
    "ufl": "uncertainty",
    "ufl-fedavg": "uncertainty",
    "flood": "ood-score",
    "feddisco": "label-discrepancy",
}


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("in-process")


def run(output_dir, name: str, node_seed: int = 0, **config) -> tuple[list[dict], dict]:
    folder = run_in_process({**SMALL, "output-dir": str(output_dir), "run-name": name, **config}, node_seed=node_seed)
    return read_metrics(folder), json.loads((folder / "config.json").read_text())


@pytest.fixture(scope="module")
def strategy_runs(output_dir):
    # each run gets other node ids, as separate runs on a SuperLink do
    return {
        name: run(output_dir, name, node_seed=index, strategy=name, **OWN_SETTINGS.get(name, {}))[0]
        for index, name in enumerate(STRATEGIES)
    }


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_trains_and_records_its_signals(strategy_runs, strategy):
    rows = strategy_runs[strategy]
    assert len(rows) == 2 and all(row["aggregated"] for row in rows)
    assert rows[-1]["accuracy"] > 0.15  # better than chance (0.1) on digits after 2 rounds
    for row in rows:
        if strategy in WEIGHTED:
            assert sum(client["weight"] for client in row["clients"]) == pytest.approx(1.0)
        else:  # its server update uses no rule weights, so none is recorded
            assert all("weight" not in client for client in row["clients"])
        assert row["diagnostics"]["learning-rate"] == 0.05
    if strategy == "center":  # trained on the server's 60 images alone: no client was sent anything
        assert all(row["sampled"] == [] and row["clients"] == [] for row in rows)
        assert [row["diagnostics"]["server-epochs"] for row in rows] == [5, 5]
    if strategy == "fedbuff":
        assert [(row["diagnostics"]["server-steps"], row["diagnostics"]["buffered"]) for row in rows] == [(1, 0)] * 2
    if strategy == "feddle":
        for row in rows:
            assert row["diagnostics"]["search-loss-after"] < row["diagnostics"]["search-loss-before"]
            assert row["diagnostics"]["atlas-size"] == min(2 * len(row["sampled"]), len(row["sampled"]) * row["round"])
    if signal := SIGNAL_OF.get(strategy):
        assert all(signal in client for row in rows for client in row["clients"])


def test_every_strategy_sees_the_same_clients_whatever_the_node_ids(strategy_runs):
    sequences = {name: [row["sampled"] for row in rows] for name, rows in strategy_runs.items() if name != "center"}
    assert len({json.dumps(sequence) for sequence in sequences.values()}) == 1, sequences


def expected_weights(settings_config: dict, row: dict) -> np.ndarray:
    """The rule's weights recomputed from what the round recorded of each client."""
    settings = parse_settings(settings_config)
    rule = RULES[settings.aggregation].build(settings)
    clients = row["clients"]
    sizes = np.array([c["num_examples"] for c in clients], dtype=float)
    values = {
        key: np.array([c[key] for c in clients], dtype=float)
        for key in (*rule.signals, "alignment")
        if key in clients[0]
    }
    return rule(RoundSignals(sizes, values)).weights


@pytest.mark.parametrize("strategy", WEIGHTED)
@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_rule_with_every_strategy(output_dir, strategy, rule):
    config = {"strategy": strategy, "aggregation": rule, "num-server-rounds": 1, **OWN_SETTINGS.get(strategy, {})}
    rows, _ = run(output_dir, f"{strategy}-{rule}", **config)
    (row,) = rows
    assert row["aggregated"] and np.isfinite(row["accuracy"])
    recorded = [client["weight"] for client in row["clients"]]
    np.testing.assert_allclose(recorded, expected_weights(config, row), rtol=1e-9, atol=1e-12)


def test_fedprox_training_with_fednolowe_weights(output_dir):
    """The issue's check: strategy=fedprox aggregation=fednolowe."""
    rows, config = run(output_dir, "fedprox-fednolowe-weights", strategy="fedprox", aggregation="fednolowe")
    for row in rows:
        losses = np.array([client["train_loss"] for client in row["clients"]])
        np.testing.assert_allclose([c["weight"] for c in row["clients"]], complement_share_weights(losses))
    assert config["instruction"]["proximal-mu"] == 0.01 and "client-steps" not in config["instruction"]
    # the clients did train with the term: without it (same clients, same weights rule), another model
    plain_rows, plain_config = run(
        output_dir, "fedprox-fednolowe-mu0", strategy="fedprox", aggregation="fednolowe", **{"fedprox.proximal-mu": 0.0}
    )
    assert plain_config["instruction"]["proximal-mu"] == 0.0
    assert [r["sampled"] for r in plain_rows] == [r["sampled"] for r in rows]
    with_term = torch.load(output_dir / "fedprox-fednolowe-weights" / "model.pt")
    without = torch.load(output_dir / "fedprox-fednolowe-mu0" / "model.pt")
    assert any(not torch.equal(with_term[key], without[key]) for key in with_term)


def test_ufl_loss_with_fedoui_weights(output_dir):
    rows, config = run(output_dir, "ufl-fedoui-weights", strategy="ufl", aggregation="fedoui")
    assert config["instruction"]["client-steps"] == ["ufl", "oui"]
    for row in rows:
        assert all("uncertainty" in c and "oui" in c for c in row["clients"])
        assert row["diagnostics"]["fit-method"] in ("moments", "mle", "empirical")


def test_flood_records_lambda_the_learning_rate_phi_weights_and_the_pseudo_ood_fraction(output_dir):
    config = {"strategy": "flood", "flood.halt-round": 2, "flood.a": 2.0, "lr-decay": 0.5, "num-server-rounds": 3}
    rows, recorded = run(output_dir, "flood-lambda", **config)
    assert [row["diagnostics"]["asw-lambda"] for row in rows] == pytest.approx([0.0, 2.0, 4.0])  # a(1 - cos(pi t/T))
    assert [row["diagnostics"]["learning-rate"] for row in rows] == [0.05, 0.025, 0.0125]
    assert recorded["instruction"]["client-steps"] == ["asw", "ood-score"]
    for row in rows:
        for client in row["clients"]:
            assert np.isfinite(client["ood-score"]) and client["asw-lambda"] == row["diagnostics"]["asw-lambda"]
            assert 0.0 <= client["pseudo-ood-fraction"] < 0.7
        np.testing.assert_allclose(
            [c["weight"] for c in row["clients"]], expected_weights(config | {"aggregation": "dac"}, row)
        )


def test_dac_plugs_into_another_strategy_without_asw(output_dir):
    rows, recorded = run(output_dir, "fedprox-dac-weights", strategy="fedprox", aggregation="dac")
    assert recorded["instruction"]["client-steps"] == ["ood-score"] and recorded["instruction"]["proximal-mu"] == 0.01
    assert all("ood-score" in c and "pseudo-ood-fraction" not in c for row in rows for c in row["clients"])
    assert all("asw-lambda" not in row["diagnostics"] for row in rows)


def test_learning_rate_decays_by_round(output_dir):
    rows, _ = run(output_dir, "decay", **{"learning-rate": 0.1, "lr-decay": 0.5, "num-server-rounds": 3})
    assert [row["diagnostics"]["learning-rate"] for row in rows] == [0.1, 0.05, 0.025]


def test_adam_clients_and_ufl_s_target_b_mlp(output_dir):
    config = {"strategy": "ufl", "optimizer": "adam", "learning-rate": 0.001, "model-hidden": "128,128"}
    rows, recorded = run(output_dir, "adam-target-b", **config, **{"model-dropout": 0.2})
    assert recorded["instruction"]["optimizer"] == "adam" and rows[-1]["aggregated"]
    assert all(c["uncertainty"] > 0 for row in rows for c in row["clients"])  # MC passes over the model's own dropout
    state = torch.load(output_dir / "adam-target-b" / "model.pt")
    assert [tuple(state[f"fc{i}.weight"].shape) for i in (1, 2, 3)] == [(128, 64), (128, 128), (10, 128)]


def test_a_partition_fixed_by_partition_seed_is_the_same_for_every_run_seed(output_dir):
    first, _ = run(
        output_dir, "pseed-a", seed=1, **{"partition-seed": 42, "num-server-rounds": 1, "fraction-train": 1.0}
    )
    second, _ = run(
        output_dir, "pseed-b", seed=2, **{"partition-seed": 42, "num-server-rounds": 1, "fraction-train": 1.0}
    )
    sizes = [sorted((c["partition"], c["num_examples"]) for c in rows[0]["clients"]) for rows in (first, second)]
    assert sizes[0] == sizes[1]


def test_a_client_that_fails_is_left_out_and_the_round_goes_on(output_dir, monkeypatch):
    from fedweigh import client_app

    original = client_app.train_locally
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("out of memory, say")
        return original(*args, **kwargs)

    monkeypatch.setattr(client_app, "train_locally", failing_once)
    rows, _ = run(output_dir, "one-fails", **{"num-server-rounds": 1, "min-train-nodes": 1})  # one reply is a quorum
    (row,) = rows
    (reason,) = row["left_out"].values()
    assert "out of memory, say" in reason and len(row["clients"]) == 1 and row["aggregated"]


def test_central_evaluation_every_few_rounds_and_after_the_last(output_dir):
    rows, _ = run(output_dir, "every-2", **{"num-server-rounds": 5, "evaluate-every": 2})
    assert [row["round"] for row in rows] == [1, 2, 3, 4, 5]
    assert [row["round"] for row in rows if "accuracy" in row] == [2, 4, 5]
    assert all(row["aggregated"] and row["clients"] for row in rows)  # every round trains and is recorded
    summary = json.loads((output_dir / "every-2" / "summary.json").read_text())
    assert summary["rounds"] == 5 and summary["final_accuracy"] == rows[-1]["accuracy"]


def test_feddle_with_out_of_distribution_server_data(output_dir):
    from conftest import SHARED_DATASETS

    mnist = str(SHARED_DATASETS / "mnist")
    config = {"strategy": "feddle", "server-data": mnist, "server-data-size": 200, "feddle.search-epochs": 2}
    rows, recorded = run(output_dir, "feddle-ood", **config, **{"num-server-rounds": 3})
    assert recorded["settings"]["server-data"] == mnist
    for row in rows:  # MNIST's 28x28 digits at the server, resized to the clients' 8x8; a head on its 10 classes
        report = row["diagnostics"]
        assert report["head-loss"] > 0 and report["search-steps"] == 2 * 4  # ceil(200 / 64) batches per pass
        assert report["search-loss-after"] <= report["search-loss-before"] + 1e-6
        assert report["new-anchors"] == len(row["clients"]) and "weight" not in row["clients"][0]
    assert rows[-1]["accuracy"] > 0.3  # the clients' task is learnt although the server never saw a digits label
    state = Checkpoint.load(output_dir / "feddle-ood" / "checkpoint.pt").strategy_state["update"]
    assert len(state["atlas"]["anchors"]) == 4 and state["head"]["weight"].shape == (10, 64)  # M = 2 x 2; fc1's 64
