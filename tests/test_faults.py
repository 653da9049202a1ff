"""Fault injection: every strategy survives every fault, in one process and in a real simulation.

A run with ``[faults]`` makes a seeded share of each round's sampled clients
misbehave (:mod:`fedweigh.faults`). Whatever they do, a round must close with
the healthy clients, leave each faulty one out with its reason in the log and
in ``metrics.jsonl``, count the exclusions, and keep the global model finite.
The one fault that passes every check is ``scaled`` (a finite model times
1e6): it is accepted, and bounded by ``update-norm-bound`` when that is on
(``test_robust.py``).
"""

from __future__ import annotations

import logging
import math
import re

import numpy as np
import pytest
import torch
from fault_reasons import REASON
from hypothesis import given, settings
from hypothesis import strategies as st
from loopback import run_in_process

from fedweigh.faults import EXTRA_TENSOR, FaultPlan, corrupt_arrays, corrupt_metrics, invalid_value
from fedweigh.methods.catalog import SIGNALS
from fedweigh.methods.fedoui.protocol import OUI
from fedweigh.methods.flood.protocol import OOD_SCORE
from fedweigh.methods.registry import METHODS
from fedweigh.methods.ufl.protocol import UNCERTAINTY
from fedweigh.options import FAULT_KINDS
from fedweigh.protocol import MODEL_ROUND, NUM_EXAMPLES, TRAIN_LOSS
from fedweigh.results import read_metrics
from fedweigh.settings import validate

LOGGER = "flwr.fedweigh"  # where the strategies log who was left out
NODES = 8
FAULTY_PER_ROUND = 5  # fraction 0.625 of 8: every one of the 15 kinds once in 3 rounds, 3 healthy clients a round
ROUNDS = math.ceil(len(FAULT_KINDS) / FAULTY_PER_ROUND)
ROUND_TIMEOUT = 3.0  # a client's own time in the loopback federation; the stalled one replies a second after
EVERY_FAULT = {
    "num-server-rounds": ROUNDS,
    "fraction-train": 1.0,
    "local-epochs": 1,
    "seed": 4,
    "round-timeout": ROUND_TIMEOUT,
    "faults.kinds": "all",
    "faults.fraction": FAULTY_PER_ROUND / NODES,
}
SERVER_DATA = {"server-data": "id", "server-data-size": 60}
OWN_SETTINGS = {"feddle": {**SERVER_DATA, "feddle.search-epochs": 1}, "fedft": SERVER_DATA}
# center trains on the server's data alone: it sends no client anything, so no client can misbehave
CLIENT_STRATEGIES = sorted(name for name in METHODS if name != "center")


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("faults")


# -- the plan and the corruptions, as pure functions ---------------------------------------------------


@given(
    seed=st.integers(0, 2**31),
    rnd=st.integers(1, 500),
    partitions=st.lists(st.integers(0, 999), min_size=0, max_size=40, unique=True),
    fraction=st.floats(0.0, 1.0),
)
@settings(derandomize=True, deadline=None, database=None, max_examples=200)
def test_fault_plan_picks_the_fraction_of_the_sampled_clients_whatever_their_order(seed, rnd, partitions, fraction):
    plan = FaultPlan(seed, FAULT_KINDS, fraction)
    assigned = plan.assign(rnd, partitions)
    assert len(assigned) == min(len(partitions), math.floor(fraction * len(partitions) + 0.5))
    assert all(0 <= position < len(partitions) and kind in FAULT_KINDS for position, kind in assigned.items())
    shuffled = list(reversed(partitions))
    again = plan.assign(rnd, shuffled)
    assert {partitions[p]: k for p, k in assigned.items()} == {shuffled[p]: k for p, k in again.items()}


def test_the_kinds_take_turns_so_a_few_rounds_commit_every_one():
    plan = FaultPlan(4, FAULT_KINDS, FAULTY_PER_ROUND / NODES)
    committed = [kind for rnd in range(1, ROUNDS + 1) for kind in plan.assign(rnd, list(range(NODES))).values()]
    assert sorted(committed) == sorted(FAULT_KINDS)


def test_corrupted_arrays_break_exactly_what_their_fault_says():
    arrays = {"w": torch.ones(3, 2), "b": torch.zeros(2), "steps": torch.tensor(7)}
    assert (
        torch.isnan(corrupt_arrays("nan", arrays)["w"]).all() and torch.isinf(corrupt_arrays("inf", arrays)["w"]).all()
    )
    assert corrupt_arrays("wrong-dtype", arrays)["w"].dtype == torch.float64
    assert list(corrupt_arrays("missing-tensor", arrays)) == ["w", "b"]
    assert list(corrupt_arrays("extra-tensor", arrays)) == ["w", "b", "steps", EXTRA_TENSOR]
    scaled = corrupt_arrays("scaled", arrays, scale=1e6)
    assert scaled["w"].eq(1e6).all() and scaled["steps"].item() == 7  # integer buffers stay as they are
    for fault in ("stall", "signal-nan", "old-round", "duplicate"):
        assert all(
            torch.equal(a, b) for a, b in zip(corrupt_arrays(fault, arrays).values(), arrays.values(), strict=True)
        )
    assert arrays["w"].eq(1).all()  # the model the client holds is never touched


@pytest.mark.parametrize("fault", ["signal-missing", "signal-nan", "signal-negative", "signal-range"])
@pytest.mark.parametrize(
    ("steps", "metrics", "expected"),
    [
        ([], {TRAIN_LOSS: 0.4}, [TRAIN_LOSS]),  # FedAvg: the loss every reply carries
        (["oui"], {TRAIN_LOSS: 0.4, OUI: 0.3}, [OUI]),
        (["ufl"], {TRAIN_LOSS: 0.4, UNCERTAINTY: 2.0, "uncertainty-mean": 0.1}, [UNCERTAINTY, "uncertainty-mean"]),
    ],
)
def test_a_signal_fault_makes_the_client_s_own_signals_invalid(fault, steps, metrics, expected):
    metrics = {NUM_EXAMPLES: 50, **metrics}
    corrupted = corrupt_metrics(fault, metrics, steps, 3, 0)
    for name in expected:
        assert name not in corrupted or not SIGNALS[name].check(corrupted[name])
    assert corrupted[NUM_EXAMPLES] == 50
    untouched = set(metrics) - set(expected)
    assert all(corrupted[name] == metrics[name] for name in untouched)


def test_a_negative_ood_score_is_valid_so_the_negative_fault_falls_back_on_the_loss():
    corrupted = corrupt_metrics("signal-negative", {TRAIN_LOSS: 0.4, OOD_SCORE: 2.0}, ["asw", "ood-score"], 1, 0)
    assert corrupted[OOD_SCORE] == 2.0 and corrupted[TRAIN_LOSS] == -1.0
    assert (
        corrupt_metrics("signal-range", {TRAIN_LOSS: 0.4, OOD_SCORE: 2.0}, ["ood-score"], 1, 0)[OOD_SCORE] == math.inf
    )
    assert invalid_value("signal-missing", SIGNALS[OUI].check) is None


def test_old_round_is_one_round_older_than_max_staleness_accepts():
    assert corrupt_metrics("old-round", {MODEL_ROUND: 9}, [], 9, 3)[MODEL_ROUND] == 5


def test_fault_settings_are_checked_before_anything_runs():
    with pytest.raises(ValueError, match="faults.kinds = 'nan' with faults.fraction = 0.0 injects nothing"):
        validate({"faults.kinds": "nan"})
    with pytest.raises(ValueError, match=r"faults.kinds = 'explode': unknown fault explode; accepted: all, exception"):
        validate({"faults.kinds": "explode", "faults.fraction": 0.1})
    assert validate({"faults.kinds": "all", "faults.fraction": 0.1}).faults.kind_list == FAULT_KINDS


# -- every strategy through every fault, end to end ------------------------------------------------------


def check_survived(rows: list[dict], model: dict[str, torch.Tensor], caplog) -> dict[str, int]:
    """Every round closed with its healthy clients, every faulty one was left out (logged, counted); returns counts."""
    committed: dict[str, int] = {}
    for row in rows:
        faults, left_out = row["faults"], row["left_out"]
        accepted = {str(client["partition"]) for client in row["clients"]}
        healthy = {str(p) for p in row["sampled"]} - set(faults)
        assert row["aggregated"] and healthy <= accepted, (row["round"], healthy, accepted, left_out)
        for partition, kind in faults.items():
            committed[kind] = committed.get(kind, 0) + 1
            if kind == "scaled":  # finite, the right shapes and signals: nothing tells it apart
                assert partition in accepted and partition not in left_out
                continue
            assert re.search(REASON[kind], left_out.get(partition, "")), (row["round"], kind, left_out)
            assert (partition in accepted) == (kind == "duplicate")  # a duplicate's first copy counts
        assert set(left_out) == set(faults) - {p for p, k in faults.items() if k == "scaled"}
        assert row["excluded"] == len(left_out)
    assert all(torch.isfinite(t).all() for t in model.values() if t.is_floating_point())
    warned = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(warned) == sum(row["excluded"] for row in rows)
    return committed


@pytest.mark.parametrize("strategy", CLIENT_STRATEGIES)
def test_every_strategy_survives_every_fault(output_dir, strategy, caplog):
    config = {**EVERY_FAULT, "strategy": strategy, **OWN_SETTINGS.get(strategy, {})}
    with caplog.at_level(logging.WARNING, logger=LOGGER):  # whatever an earlier test did to Flower's log level
        folder = run_in_process({**config, "output-dir": str(output_dir), "run-name": strategy}, num_nodes=NODES)
    rows = read_metrics(folder)
    assert [row["round"] for row in rows] == list(range(1, ROUNDS + 1))
    committed = check_survived(rows, torch.load(folder / "model.pt"), caplog)
    assert committed == dict.fromkeys(FAULT_KINDS, 1)


def test_faults_of_delayed_clients_are_committed_when_their_update_arrives(output_dir):
    config = {
        **EVERY_FAULT,
        "faults.kinds": "nan,wrong-shape,signal-nan,exception",
        "faults.fraction": 0.25,
        "num-server-rounds": 6,
        "delay-std": 1.0,
        "max-staleness": 4,
    }
    folder = run_in_process({**config, "output-dir": str(output_dir), "run-name": "delayed"}, num_nodes=NODES)
    rows = read_metrics(folder)
    late = [c for row in rows for c in row["clients"] if c["staleness"] > 0]
    assert late, "no update arrived late: the test would not reach the delayed path"
    unresolved = set(rows[-1]["in_flight"])
    for row in rows:
        for partition, kind in row["faults"].items():
            # left out in the round its update arrives (its own round, or a later one), with its fault's reason
            arrival = next((r for r in rows[row["round"] - 1 :] if partition in r["left_out"]), None)
            if arrival is None:
                assert int(partition) in unresolved, (row["round"], partition, kind)
                continue
            assert re.search(REASON[kind], arrival["left_out"][partition]), (kind, arrival["left_out"])
            assert partition not in {str(c["partition"]) for c in arrival["clients"]}
    assert all(np.isfinite(row["accuracy"]) for row in rows)


def test_too_few_healthy_clients_skip_the_round_with_a_log_line(output_dir, caplog):
    config = {**EVERY_FAULT, "faults.kinds": "nan", "faults.fraction": 0.75, "num-server-rounds": 1}
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        folder = run_in_process({**config, "output-dir": str(output_dir), "run-name": "quorum"}, num_nodes=4)
    (row,) = read_metrics(folder)
    assert not row["aggregated"] and row["excluded"] == 3 and row["clients"] == []
    assert "round 1: skipped: 1 valid reply, fewer than min-train-nodes = 2" in caplog.text


@pytest.mark.xdist_group("simulation")
@pytest.mark.parametrize("backend", ["ray", "in-process"])
def test_faults_are_survived_in_a_real_simulation(shared_simulation, tmp_path, backend):
    """The same switch through ``flwr run``, with the ClientApps in Ray actors and in the simulation's own process
    (``simulation-backend``): the instruction names the fault, the ClientApp commits it. In-process, a ClientApp
    that raises is an error reply as on Ray, and the simulation goes on."""
    kinds = "exception,nan,duplicate,old-round"
    config = {
        "strategy": "fedoui",
        "num-server-rounds": 2,
        "fraction-train": 1.0,
        "seed": 4,
        "faults.kinds": kinds,
        "faults.fraction": 0.5,
        "simulation-backend": backend,
        "output-dir": str(tmp_path),
        "run-name": "faults",
    }
    outcome = shared_simulation.run(config, num_supernodes=4, echo=False)
    assert outcome.ok, f"{outcome.status}: {outcome.details}"
    rows = read_metrics(outcome.results_dir)
    committed = {kind for row in rows for kind in row["faults"].values()}
    assert committed == set(kinds.split(","))
    for row in rows:
        assert row["aggregated"] and len(row["faults"]) == 2
        for partition, kind in row["faults"].items():
            assert re.search(REASON[kind], row["left_out"][partition]), (kind, row["left_out"])
    assert all(torch.isfinite(t).all() for t in torch.load(outcome.results_dir / "model.pt").values())
