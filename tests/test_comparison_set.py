"""FLood's comparison set against hand-computed values: FedAvgM, FedNova, FedDisco (server side), FedDecorr and
MOON (client side).

Each is a method package (``fedweigh/methods/<method>``); the hyperparameters
are FLood's Table I (FedAvgM ρ = 0.1; FedDisco a = 0.5, b = 1; FedDecorr
β = 0.1; MOON μ = 1, τ = 0.5; FedNova none). Every strategy runs end to end with every rule in
``test_end_to_end.py``; here are the numbers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from rounds import round_of
from torch import nn

from fedweigh.client.steps import StepContext
from fedweigh.client.training import train_locally
from fedweigh.components import batch_transform, new_model
from fedweigh.data.tensors import ImageTensors
from fedweigh.methods.fedavgm.server import ServerMomentum
from fedweigh.methods.feddecorr.client import Decorrelation, DecorrelationStep, decorrelation_loss
from fedweigh.methods.feddisco.client import LabelDiscrepancyStep, label_discrepancy
from fedweigh.methods.feddisco.server import DiscrepancyRule, disco_weights
from fedweigh.methods.fednova.server import NormalizedAveraging, effective_steps, local_steps
from fedweigh.methods.moon.client import PREVIOUS, Contrast, ContrastStep, moon_loss
from fedweigh.methods.registry import METHODS, plan_run
from fedweigh.preflight import combination_problems, parse_settings
from fedweigh.protocol import TrainRecipe
from fedweigh.rules.base import RoundSignals
from fedweigh.settings import SettingsError, validate
from fedweigh.strategies import MOON, FedAvgM, FedDecorr, FedDisco, FedNova
from fedweigh.strategies.build import build_strategy

pytestmark = pytest.mark.unit


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
    assert (FedNova().update.epochs, FedNova().update.momentum) == (3, 0.9)  # the run config's defaults
    kept = parse_settings({"strategy": "fednova", "persist-optimizer-state": True})
    assert "persist-optimizer-state = true" in " ".join(combination_problems(kept))
    assert combination_problems(parse_settings({"strategy": "fednova"})) == []
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
    with pytest.raises(ValueError, match="num_classes = 0"):
        label_discrepancy(torch.tensor([], dtype=torch.int64), 0)


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


# ---------------------------------------------------------------------------
# FedDecorr and MOON: terms in the client's loss
# ---------------------------------------------------------------------------


def digits_client(**config):
    settings = validate({"dataset": "digits", "model": "mlp", **config})
    model = new_model(settings)
    generator = torch.Generator().manual_seed(0)
    data = ImageTensors(
        torch.randint(0, 17, (24, 1, 8, 8), dtype=torch.uint8, generator=generator), torch.arange(24) % 10
    )
    return settings, model, data


def test_feddecorr_penalises_correlated_feature_dimensions():
    correlated = torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])
    assert float(decorrelation_loss(correlated)) == pytest.approx(8 / 2 / 3)  # C_01 = C_10 = 2, over B = 3
    independent = torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])
    assert float(decorrelation_loss(independent)) == pytest.approx(0.0, abs=1e-12)
    assert float(decorrelation_loss(correlated[:1])) == 0.0  # one sample: no term
    assert float(Decorrelation(0.1)(correlated, correlated)) == pytest.approx(0.1 * 8 / 6)
    features = correlated.clone().requires_grad_(True)
    decorrelation_loss(features).backward()
    assert features.grad is not None and torch.isfinite(features.grad).all()


def test_moon_pulls_towards_the_global_features_and_away_from_the_previous():
    r = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    toward, away = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    expected = float(np.log1p(np.exp(-2.0)))  # each sample: cos 1 and 0 at τ = 0.5, −log(e²/(e² + 1))
    assert float(moon_loss(r, toward, away, 0.5)) == pytest.approx(expected)
    assert float(moon_loss(r, away, toward, 0.5)) == pytest.approx(float(np.log1p(np.exp(2.0))))


def test_a_loss_term_changes_training_and_none_leaves_it_as_it_was():
    settings, model, data = digits_client()
    recipe = TrainRecipe(local_epochs=1, batch_size=8)
    runs = {}
    for name, terms in (("plain", ()), ("again", ()), ("decorr", (Decorrelation(10.0),))):
        trained = new_model(settings)
        trained.load_state_dict(model.state_dict())
        generator = torch.Generator().manual_seed(1)
        train_locally(
            trained, data, recipe, batch_transform(settings), torch.device("cpu"), generator, loss_terms=terms
        )
        runs[name] = trained.state_dict()
    assert all(torch.equal(runs["plain"][k], runs["again"][k]) for k in runs["plain"])
    assert any(not torch.equal(runs["plain"][k], runs["decorr"][k]) for k in runs["plain"])
    assert not model.get_submodule(model.classifier_layer)._forward_pre_hooks  # the capture is removed


def test_moon_s_step_keeps_the_last_local_model_in_the_node_state():
    settings, model, data = digits_client()
    state = RecordDict()
    config = {"moon.mu": 1.0, "moon.temperature": 0.5}
    context = StepContext(model, data, batch_transform(settings), torch.device("cpu"), 0, 0, 0, 1, config, state)
    step = ContrastStep()
    first = step.loss_term(context)
    assert isinstance(first, Contrast)  # first round: the previous model is the global one
    frozen_global = first.frozen[0][0].state_dict()
    assert all(torch.equal(frozen_global[name], value) for name, value in model.state_dict().items())
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)  # "trained"
    step.after_training(context)
    assert isinstance(state[PREVIOUS], ArrayRecord)
    kept = state[PREVIOUS].to_torch_state_dict()
    assert all(torch.equal(kept[name], value) for name, value in model.state_dict().items() if name in kept)
    second = step.loss_term(context)  # the next round starts from what was kept
    previous = second.frozen[1][0].state_dict()
    assert all(torch.equal(previous[name], value) for name, value in kept.items())
    assert not any(p.requires_grad for p in second.frozen[1][0].parameters())  # frozen
    inputs = batch_transform(settings)(data.images[:4], train=False, generator=None)
    assert torch.isfinite(second(torch.randn(4, second.features(0, inputs).shape[1]), inputs))
    ContrastStep().after_training(StepContext(model, data, batch_transform(settings), torch.device("cpu"), 0, 0, 0, 1))


def test_the_client_side_methods_ask_for_their_steps_with_table_i_defaults():
    assert FedDecorr().recipe == {"client-steps": ["feddecorr"], "feddecorr.beta": 0.1}
    assert MOON().recipe == {"client-steps": ["moon"], "moon.mu": 1.0, "moon.temperature": 0.5}
    app = build_strategy(validate({"strategy": "moon", "client-steps": "asw", "aggregation": "dac"}))
    assert app.recipe["client-steps"] == ["moon", "ood-score", "asw"]  # FLood's plug-in (spec §4): ASW and DAC
    assert (
        DecorrelationStep().loss_term(
            StepContext(nn.Linear(1, 1), None, None, None, 0, 0, 0, 1, {"feddecorr.beta": 0.0})
        )
        is None
    )
    with pytest.raises(SettingsError, match="moon.temperature = 0"):
        MOON(temperature=0.0)
