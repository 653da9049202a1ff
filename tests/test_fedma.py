"""``fedma-simplified``: the FedNolowe authors' "FedMa" (spec §7), rows matched to the first client's, uniform mean."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loopback import run_in_process

from fedweigh.methods.fedma_simplified.server import FedMASimplified, match_rows, matched_mean
from fedweigh.methods.registry import METHODS, UPDATES
from fedweigh.preflight import check_run
from fedweigh.results import read_metrics
from fedweigh.settings import SettingsError
from fedweigh.strategies.updates import RoundUpdate


def test_a_client_whose_units_are_a_permutation_is_matched_back():
    rng = np.random.default_rng(0)
    reference = {"conv.weight": rng.normal(size=(4, 2, 3, 3)), "conv.bias": rng.normal(size=4)}
    order = np.array([2, 0, 3, 1])
    permuted = {"conv.weight": reference["conv.weight"][order], "conv.bias": reference["conv.bias"][order]}
    merged, moved = matched_mean([reference, permuted])
    np.testing.assert_allclose(merged["conv.weight"], reference["conv.weight"])  # matched: the same filters
    np.testing.assert_allclose(merged["conv.bias"], (reference["conv.bias"] + permuted["conv.bias"]) / 2)  # not
    assert moved == 4


def test_identical_clients_give_the_uniform_mean_and_move_nothing():
    rng = np.random.default_rng(1)
    start = rng.normal(size=(5, 3))  # the round's global model: every client trains a little away from it
    models = [{"fc.weight": start + 1e-3 * rng.normal(size=(5, 3)), "fc.bias": rng.normal(size=5)} for _ in "abc"]
    merged, moved = matched_mean(models)  # small perturbations of one model: matching is the identity
    assert moved == 0
    for name in ("fc.weight", "fc.bias"):
        np.testing.assert_allclose(merged[name], np.mean([m[name] for m in models], axis=0))


def test_the_first_client_is_the_reference():
    a = {"w": np.array([[0.0], [10.0]])}
    b = {"w": np.array([[9.0], [1.0]])}
    assert matched_mean([a, b])[0]["w"].ravel().tolist() == [0.5, 9.5]  # b's rows follow a's order
    assert matched_mean([b, a])[0]["w"].ravel().tolist() == [9.5, 0.5]  # a's rows follow b's


def test_skipped_layers_and_one_dimensional_tensors_are_averaged_without_matching():
    a = {"fc3.weight": np.array([[0.0], [10.0]]), "fc2.weight": np.array([[0.0], [10.0]])}
    b = {"fc3.weight": np.array([[10.0], [0.0]]), "fc2.weight": np.array([[10.0], [0.0]])}
    merged, moved = matched_mean([a, b], skip_layers=["fc3"])
    assert merged["fc3.weight"].ravel().tolist() == [5.0, 5.0] and merged["fc2.weight"].ravel().tolist() == [0.0, 10.0]
    assert moved == 2


def test_integer_buffers_are_averaged_and_rounded():
    a = {"bn.num_batches_tracked": np.array(10, dtype=np.int64)}
    b = {"bn.num_batches_tracked": np.array(13, dtype=np.int64)}
    merged, _ = matched_mean([a, b])
    assert merged["bn.num_batches_tracked"].dtype == np.int64 and int(merged["bn.num_batches_tracked"]) == 12


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 5))
def test_the_matching_is_the_least_total_distance(seed, rows):
    rng = np.random.default_rng(seed)
    reference, other = rng.normal(size=(rows, 3)), rng.normal(size=(rows, 3))
    order = match_rows(reference, other)
    assert sorted(order.tolist()) == list(range(rows))

    def total(permutation) -> float:
        return float(np.linalg.norm(reference - other[list(permutation)], axis=1).sum())

    best = min(total(p) for p in itertools.permutations(range(rows)))
    assert total(order) == pytest.approx(best)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.permutations(range(6)))
def test_reordering_a_clients_units_does_not_change_the_result(seed, permutation):
    rng = np.random.default_rng(seed)
    models = [{"w": rng.normal(size=(6, 4))} for _ in range(3)]
    shuffled = [models[0], models[1], {"w": models[2]["w"][list(permutation)]}]
    np.testing.assert_allclose(matched_mean(shuffled)[0]["w"], matched_mean(models)[0]["w"])


def test_the_update_ignores_the_rules_weights_and_records_the_rows_moved():
    a = {"w": np.array([[0.0], [10.0]])}
    b = {"w": np.array([[10.0], [0.0]])}
    update = RoundUpdate(
        server_round=1,
        global_model=a,
        models=[a, b],
        model_rounds=[1, 1],
        weights=np.array([0.9, 0.1]),
        num_examples=np.array([90.0, 10.0]),
    )
    assert FedMASimplified()(update)["w"].ravel().tolist() == [0.0, 10.0]
    assert update.diagnostics["rows-moved"] == 2
    assert UPDATES["fedma-simplified"] is FedMASimplified and not FedMASimplified.uses_weights
    assert METHODS["fedma-simplified"].update.name == "fedma-simplified"


def test_a_skip_layer_the_model_lacks_is_refused_before_training():
    config = {"strategy": "fedma-simplified", "model": "mlp", "fedma-simplified.skip-layers": "fc2, fc9"}
    with pytest.raises(SettingsError, match=r"skip-layers = 'fc2, fc9' names fc9, not a layer of model = 'mlp'"):
        check_run(config)
    assert check_run({**config, "fedma-simplified.skip-layers": "fc2"}).fedma_simplified.skip_layers == "fc2"


def test_a_rule_cannot_be_chosen_for_it():
    with pytest.raises(SettingsError, match="does not use aggregation weights"):
        check_run({"strategy": "fedma-simplified", "aggregation": "fednolowe"})


def test_a_run_with_it_trains_and_records_the_matching(tmp_path):
    config = {"strategy": "fedma-simplified", "num-server-rounds": 2, "fraction-train": 0.5, "seed": 3}
    rows = read_metrics(run_in_process({**config, "output-dir": str(tmp_path), "run-name": "fedma"}))
    assert all(row["aggregated"] and "rows-moved" in row["diagnostics"] for row in rows)
    assert rows[-1]["accuracy"] > 0.15  # better than chance on digits
