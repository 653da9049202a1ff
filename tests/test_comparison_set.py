"""FLood's comparison set, server side: FedAvgM, FedNova and FedDisco against hand-computed values.

Each is a method package (``fedweigh/methods/{fedavgm,fednova,feddisco}``); the
hyperparameters are FLood's Table I (FedAvgM ρ = 0.1; FedDisco a = 0.5, b = 1;
FedNova none). Every strategy runs end to end with every rule in
``test_end_to_end.py``; here are the numbers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedweigh.client.steps import StepContext
from fedweigh.components import batch_transform, new_model
from fedweigh.data.tensors import ImageTensors
from fedweigh.methods.fedavgm.server import ServerMomentum
from fedweigh.methods.feddisco.client import LabelDiscrepancyStep, label_discrepancy
from fedweigh.methods.feddisco.server import DiscrepancyRule, disco_weights
from fedweigh.methods.fednova.server import NormalizedAveraging, effective_steps, local_steps
from fedweigh.methods.registry import METHODS, plan_run
from fedweigh.rules.base import RoundSignals
from fedweigh.settings import SettingsError, validate
from fedweigh.strategies import FedAvgM, FedDisco, FedNova
from fedweigh.strategies.build import build_strategy
from fedweigh.strategies.updates import RoundUpdate

pytestmark = pytest.mark.unit


def round_of(server_round, global_model, models, weights, num_examples=None, model_rounds=None, start_models=None):
    count = len(models)
    return RoundUpdate(
        server_round=server_round,
        global_model=global_model,
        models=models,
        model_rounds=model_rounds or [server_round] * count,
        weights=np.asarray(weights, dtype=np.float64),
        num_examples=np.asarray(num_examples or [10] * count, dtype=np.float64),
        start_models=start_models or {},
    )


def w(*values):
    return {"w": np.array(values, dtype=np.float32)}


# ---------------------------------------------------------------------------
# FedAvgM
# ---------------------------------------------------------------------------


def test_fedavgm_steps_with_the_velocity_of_the_mean_updates():
    step = ServerMomentum(momentum=0.1, lr=1.0)
    first = step(round_of(1, w(0.0, 0.0), [w(1.0, 2.0), w(3.0, 0.0)], [0.5, 0.5]))  # Δ = (2, 1), v = Δ
    assert first["w"].tolist() == [2.0, 1.0]
    second = step(round_of(2, first, [w(4.0, 1.0)], [1.0]))  # Δ = (2, 0), v = 0.1 (2, 1) + (2, 0) = (2.2, 0.1)
    assert np.allclose(second["w"], [4.2, 1.1]) and second["w"].dtype == np.float32


def test_fedavgm_without_momentum_is_fedavg_and_its_velocity_survives_a_restart():
    plain = ServerMomentum(momentum=0.0)
    for _ in range(2):
        assert np.allclose(plain(round_of(1, w(1.0), [w(2.0), w(5.0)], [0.25, 0.75]))["w"], [4.25])
    before = ServerMomentum(momentum=0.5, lr=0.5)
    before(round_of(1, w(0.0), [w(2.0)], [1.0]))
    after = ServerMomentum(momentum=0.5, lr=0.5)
    after.load_state(before.state())
    assert np.array_equal(
        before(round_of(2, w(1.0), [w(1.0)], [1.0]))["w"], after(round_of(2, w(1.0), [w(1.0)], [1.0]))["w"]
    )


def test_fedavgm_takes_the_mean_of_integer_buffers():
    step = ServerMomentum(momentum=0.9)
    model = {"w": np.zeros(1, np.float32), "count": np.array(4, np.int64)}
    clients = [{"w": np.ones(1, np.float32), "count": np.array(6, np.int64)}] * 2
    assert int(step(round_of(1, model, clients, [0.5, 0.5]))["count"]) == 6


# ---------------------------------------------------------------------------
# FedNova
# ---------------------------------------------------------------------------


def test_fednova_counts_steps_as_the_loop_takes_them():
    assert local_steps(25, epochs=2, batch_size=10) == 6  # 3 batches (10, 10, 5) an epoch
    assert effective_steps(3, 0.0) == 3.0
    assert effective_steps(3, 0.5) == pytest.approx(1 + 1.5 + 1.75)  # Σ_t Σ_{j<t} ρ^j: the momentum's reach


def test_fednova_normalises_each_update_by_its_steps():
    # n = 10 and 40 with E = 1, B = 10: τ = 1 and 4; d = ½(0 − 2)/1 + ½(0 − 4)/4 = −1.5; τ_eff = 2.5
    nova = NormalizedAveraging(epochs=1, batch_size=10, momentum=0.0)
    update = round_of(1, w(0.0), [w(2.0), w(4.0)], [0.5, 0.5], num_examples=[10, 40])
    assert np.allclose(nova(update)["w"], [3.75]) and update.diagnostics["local-steps"] == [1, 4]
    same_steps = round_of(1, w(1.0), [w(2.0), w(4.0)], [0.25, 0.75], num_examples=[20, 20])
    assert np.allclose(NormalizedAveraging(2, 10, 0.9)(same_steps)["w"], [3.5])  # equal steps: FedAvg


def test_fednova_reads_the_recipe_of_the_run_and_of_the_library():
    nova = build_strategy(validate({"strategy": "fednova", "local-epochs": 2, "batch-size": 16, "momentum": 0.5}))
    assert (nova.update.epochs, nova.update.batch_size, nova.update.momentum) == (2, 16, 0.5)
    adam = build_strategy(validate({"strategy": "fednova", "optimizer": "adam"}))
    assert adam.update.momentum == 0.0  # Adam has no momentum form: a_k = τ_k
    assert FedNova(local_epochs=3, batch_size=8).update.batch_size == 8
    with pytest.raises(SettingsError, match="batch-size = 0"):
        FedNova(batch_size=0)


# ---------------------------------------------------------------------------
# FedDisco
# ---------------------------------------------------------------------------


def test_feddisco_weights_by_share_and_discrepancy():
    # shares 0.75 and 0.25; Table I (a 0.5, b 1): 1.75 and 1.0
    assert np.allclose(disco_weights(np.array([30.0, 10.0]), np.array([0.0, 0.5]), 0.5, 1.0), [1.75 / 2.75, 1 / 2.75])
    # a client whose discrepancy outweighs its share and b gets nothing; all nothing: uniform
    assert disco_weights(np.array([1.0, 1.0]), np.array([0.0, 4.0]), 0.5, 0.0).tolist() == [1.0, 0.0]
    assert disco_weights(np.array([1.0, 1.0]), np.array([4.0, 4.0]), 0.5, 0.0).tolist() == [0.5, 0.5]
    rule = DiscrepancyRule(a=0.5, b=0.1)
    outcome = rule(RoundSignals(np.array([30.0, 10.0]), {"label-discrepancy": np.array([0.0, 0.5])}))
    assert np.allclose(outcome.weights, [0.85 / 0.95, 0.1 / 0.95])


def test_feddisco_discrepancy_of_a_client_s_labels():
    assert label_discrepancy(torch.tensor([0, 1, 2, 3]), 4) == {"label-discrepancy": 0.0}
    # (1, 0, 0, 0) against (¼, ¼, ¼, ¼): sqrt(9/16 + 3/16)
    assert label_discrepancy(torch.tensor([2, 2]), 4)["label-discrepancy"] == pytest.approx(np.sqrt(0.75))
    with pytest.raises(ValueError, match="num_classes = 2"):
        label_discrepancy(torch.tensor([0, 3]), 2)


def test_feddisco_s_client_step_reads_the_classes_off_the_model():
    settings = validate({"dataset": "digits", "model": "mlp"})
    model = new_model(settings)
    data = ImageTensors(torch.zeros(6, 1, 8, 8, dtype=torch.uint8), torch.tensor([0, 0, 0, 1, 1, 1]))
    context = StepContext(model, data, batch_transform(settings), torch.device("cpu"), 0, 0, 0, 1)
    expected = np.sqrt(2 * 0.4**2 + 8 * 0.1**2)  # (½, ½, 0, ..., 0) against a tenth each
    assert LabelDiscrepancyStep().after_training(context)["label-discrepancy"] == pytest.approx(expected)
    assert isinstance(model, nn.Module) and model.training  # the step leaves the mode as it was


def test_feddisco_asks_for_its_signal_and_is_a_rule_for_any_strategy():
    assert FedDisco().recipe["client-steps"] == ["label-discrepancy"]
    plan = plan_run(validate({"strategy": "fedprox", "aggregation": "feddisco"}))
    assert plan.rule.name == "feddisco" and plan.comma_list == ["label-discrepancy"]
    with pytest.raises(SettingsError, match="feddisco.a = -1"):
        FedDisco(a=-1.0)


def test_the_comparison_set_has_flood_s_table_i_defaults():
    settings = validate({})
    assert settings.fedavgm.server_momentum == 0.1 and (settings.feddisco.a, settings.feddisco.b) == (0.5, 1.0)
    assert {"fedavgm", "fednova", "feddisco"} <= set(METHODS)
    assert FedAvgM().update.momentum == 0.1
