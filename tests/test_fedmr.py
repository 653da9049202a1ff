"""FedMR (Hu et al., arXiv 2208.07677) against hand-computed values: local models kept per client slot, their
mean as the global model, each tensor recombined among them by its own permutation (the authors' code).

Every strategy runs end to end, deterministically and with an exact resume in
``test_end_to_end.py``, ``test_determinism.py`` and ``test_resume.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import rounds
from flwr.app import ConfigRecord

from fedweigh.arrays import decode, encode
from fedweigh.methods.fedmr.server import Recombination, recombine
from fedweigh.preflight import combination_problems, parse_settings
from fedweigh.protocol import ARRAYS
from fedweigh.settings import SettingsError
from fedweigh.strategies import FedMR

pytestmark = pytest.mark.unit


def model(w, b):
    return {"w": np.array([w], dtype=np.float32), "b": np.array([b], dtype=np.float32)}


def test_each_tensor_is_shuffled_by_its_own_permutation():
    models = [model(float(i), 10.0 * i) for i in range(4)]
    shuffled = recombine(models, np.random.default_rng(7))
    rng = np.random.default_rng(7)
    order_w, order_b = rng.permutation(4), rng.permutation(4)
    assert [float(m["w"][0]) for m in shuffled] == [float(i) for i in order_w]
    assert [float(m["b"][0]) for m in shuffled] == [10.0 * i for i in order_b]
    assert not np.array_equal(order_w, order_b)  # a model's weight and bias come from different clients


def test_two_rounds_of_the_server_by_hand():
    server = Recombination(first_stage_rounds=0, seed=3)
    start = model(0.0, 0.0)
    sent = [server.instruction_arrays(client, start, 1)[ARRAYS] for client in ("p4", "p9")]
    assert all(np.array_equal(m["w"], start["w"]) for m in sent)  # the first round: the initial model twice
    update = rounds.round_of(1, start, [model(1.0, 2.0), model(3.0, 6.0)], clients=["p4", "p9"])
    mean = server(update)
    assert mean["w"].tolist() == [2.0] and mean["b"].tolist() == [4.0]  # the uniform mean, whatever the weights
    assert update.diagnostics == {"recombined": True, "local-models": 2}
    rng = np.random.default_rng([3, 1])
    order_w, order_b = rng.permutation(2), rng.permutation(2)
    expected = [(1.0 + 2.0 * float(order_w[i]), 2.0 + 4.0 * float(order_b[i])) for i in range(2)]
    assert [(float(m["w"][0]), float(m["b"][0])) for m in server.local_models] == expected
    # round 2: the slots go to the sampled clients in order; one client's reply is missing, its slot stays
    second = [server.instruction_arrays(client, mean, 2)[ARRAYS] for client in ("p1", "p2")]
    assert [(float(m["w"][0]), float(m["b"][0])) for m in second] == expected
    server(rounds.round_of(2, mean, [model(5.0, 5.0)], clients=["p2"]))
    kept = sorted(float(m["w"][0]) for m in server.local_models)
    assert kept == sorted([expected[0][0], 5.0])


def test_the_first_stage_sends_everyone_the_mean():
    server = Recombination(first_stage_rounds=1)
    for client in ("p0", "p1"):
        server.instruction_arrays(client, model(0.0, 0.0), 1)
    server(rounds.round_of(1, model(0.0, 0.0), [model(1.0, 1.0), model(3.0, 5.0)], clients=["p0", "p1"]))
    assert [(float(m["w"][0]), float(m["b"][0])) for m in server.local_models] == [(2.0, 3.0), (2.0, 3.0)]


def test_a_round_that_aggregated_nothing_leaves_no_assignment_behind():
    server = Recombination()
    for client in ("p0", "p1"):
        server.instruction_arrays(client, model(0.0, 0.0), 1)  # round 1: no reply comes back
    server.instruction_arrays("p7", model(0.0, 0.0), 2)
    assert server.slot_of == {"p7": 0} and len(server.local_models) == 2


def test_the_local_models_cross_a_restart():
    server = Recombination(seed=1)
    for client in ("p0", "p1"):
        server.instruction_arrays(client, model(0.0, 0.0), 1)
    server(rounds.round_of(1, model(0.0, 0.0), [model(1.0, 1.0), model(3.0, 5.0)], clients=["p0", "p1"]))
    server.instruction_arrays("p5", model(2.0, 3.0), 2)
    restored = Recombination(seed=1)
    restored.load_state(server.state())
    assert restored.slot_of == {"p5": 0} and restored.sending_round == 2
    assert all(
        np.array_equal(a[name], b[name])
        for a, b in zip(restored.local_models, server.local_models, strict=True)
        for name in a
    )


def test_each_client_is_sent_its_local_model_in_place_of_the_global_one():
    strategy = FedMR(fraction_train=1.0, min_train_nodes=2)
    strategy.directory.partition_of.update({11: 0, 12: 1})
    strategy.update.local_models = [model(1.0, 1.0), model(2.0, 2.0)]
    messages = strategy._instructions([11, 12], 1, encode(model(9.0, 9.0)), ConfigRecord({}))
    assert [decode(m.content[ARRAYS])["w"].tolist() for m in messages] == [[1.0], [2.0]]
    assert strategy.update.slot_of == {"p0": 0, "p1": 1}


def test_fedmr_needs_a_synchronous_run_and_its_own_weights():
    late = combination_problems(parse_settings({"strategy": "fedmr", "delay-std": 2.0, "max-staleness": 10}))
    assert any("strategy = 'fedmr' with delay-std = 2.0" in problem for problem in late)
    weighted = combination_problems(parse_settings({"strategy": "fedmr", "aggregation": "dac"}))
    assert any("fedmr" in problem and "aggregation" in problem for problem in weighted)
    bounded = combination_problems(parse_settings({"strategy": "fedmr", "update-norm-bound": 1.5}))
    assert any("strategy = 'fedmr' with update-norm-bound = 1.5" in problem for problem in bounded)
    assert combination_problems(parse_settings({"strategy": "fedmr"})) == []
    assert FedMR().update.first_stage_rounds == 0 and FedMR(first_stage_rounds=5).update.first_stage_rounds == 5
    with pytest.raises(SettingsError, match="fedmr.first-stage-rounds = -1"):
        FedMR(first_stage_rounds=-1)


def test_three_local_models_recombined_round_after_round_by_the_seeded_permutations():
    server = Recombination(seed=14)
    trained = [model(1.0, 10.0), model(2.0, 20.0), model(3.0, 30.0)]
    for client in ("p0", "p1", "p2"):
        server.instruction_arrays(client, model(0.0, 0.0), 1)
    server(rounds.round_of(1, model(0.0, 0.0), trained, clients=["p0", "p1", "p2"]))
    rng = np.random.default_rng([14, 1])
    order_w, order_b = rng.permutation(3), rng.permutation(3)
    assert [float(m["w"][0]) for m in server.local_models] == [1.0 + i for i in order_w]
    assert [float(m["b"][0]) for m in server.local_models] == [10.0 * (1 + i) for i in order_b]
    assert [1.0 + i for i in order_w] != [1.0, 2.0, 3.0]  # this seed moves models: the check can fail
    first = [dict(m) for m in server.local_models]
    for client in ("p5", "p6", "p7"):  # round 2: trained as sent, then recombined by round 2's permutations
        server.instruction_arrays(client, model(0.0, 0.0), 2)
    server(rounds.round_of(2, model(0.0, 0.0), first, clients=["p5", "p6", "p7"]))
    rng = np.random.default_rng([14, 2])
    again_w, again_b = rng.permutation(3), rng.permutation(3)
    assert [float(m["w"][0]) for m in server.local_models] == [float(first[i]["w"][0]) for i in again_w]
    assert [float(m["b"][0]) for m in server.local_models] == [float(first[i]["b"][0]) for i in again_b]


def test_a_round_whose_mean_is_not_finite_keeps_the_local_models():
    server = Recombination()
    for client in ("p0", "p1"):
        server.instruction_arrays(client, model(0.0, 0.0), 1)
    kept = [dict(m) for m in server.local_models]
    update = rounds.round_of(1, model(0.0, 0.0), [model(np.inf, 1.0), model(1.0, 1.0)], clients=["p0", "p1"])
    assert not np.isfinite(server(update)["w"]).all()
    assert all(np.array_equal(a["w"], b["w"]) for a, b in zip(server.local_models, kept, strict=True))
    unknown = rounds.round_of(2, model(0.0, 0.0), [model(1.0, 1.0)], clients=["p9"])
    server(unknown)
    assert unknown.diagnostics["fedmr-unmatched"] == 1
