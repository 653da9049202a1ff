"""SCAFFOLD (Karimireddy et al., arXiv 1910.06378) against hand-computed values.

The server keeps ``c`` and every client's ``c_i`` and sends ``c − c_i``; the
client applies ``−η_l (c − c_i)`` after each optimizer step and reports
``K · η_l``; option II gives ``c_i⁺``. Every strategy runs end to end with
every rule in ``test_end_to_end.py``, and resumes exactly (synchronous and
with late replies) in ``test_resume.py``.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
import rounds
import torch
from flwr.app import ArrayRecord, ConfigRecord, MessageType
from torch import nn

from fedweigh.arrays import decode, encode
from fedweigh.client.steps import StepContext
from fedweigh.client.training import train_locally
from fedweigh.components import batch_transform, new_model
from fedweigh.data.tensors import ImageTensors
from fedweigh.methods.registry import METHODS
from fedweigh.methods.scaffold.client import ControlCorrection, CorrectionStep, corrected_parameters
from fedweigh.methods.scaffold.protocol import CORRECTION, STEP_SIZE
from fedweigh.methods.scaffold.server import ControlVariates, client_variate, control_step
from fedweigh.preflight import combination_problems, parse_settings
from fedweigh.protocol import TrainRecipe, recipe_key
from fedweigh.settings import SettingsError, validate
from fedweigh.strategies import DAC, SCAFFOLD
from fedweigh.strategies.build import build_strategy

pytestmark = pytest.mark.unit


def w(*values):
    return {"w": np.array(values, dtype=np.float32)}


def round_of(server_round, global_model, models, clients, step_sizes, num_clients, **kwargs):
    reports = [{STEP_SIZE: size} for size in step_sizes]
    return rounds.round_of(
        server_round, global_model, models, clients=clients, num_clients=num_clients, reports=reports, **kwargs
    )


def test_option_ii_and_the_control_step_by_hand():
    # x = 1, y = 0.2 after K η = 0.4, sent c − c_i = 0.5: c_i⁺ = 0.8 / 0.4 − 0.5 = 1.5
    assert client_variate(w(1.0), w(0.2), w(0.5), 0.4)["w"].tolist() == pytest.approx([1.5])
    # c = 1 with Δc = 1.5 and −0.5 over N = 4 clients: 1 + 1 / 4
    assert control_step(w(1.0), [w(1.5), w(-0.5)], 4)["w"].tolist() == [1.25]
    assert control_step({}, [w(2.0)], 2)["w"].tolist() == [1.0]  # a tensor c lacks starts at zero


def test_two_rounds_of_the_server_by_hand():
    server = ControlVariates()
    # round 1: everything zero, so both clients are sent c − c_i = 0
    assert server.instruction_arrays("p0", w(1.0), 1)[CORRECTION]["w"].tolist() == [0.0]
    assert server.instruction_arrays("p1", w(1.0), 1)[CORRECTION]["w"].tolist() == [0.0]
    first = round_of(1, w(1.0), [w(0.0), w(0.5)], ["p0", "p1"], [0.5, 0.25], num_clients=4)
    assert server(first)["w"].tolist() == [0.25]  # the weighted mean
    # c_0 = (1 − 0)/0.5 = 2, c_1 = (1 − 0.5)/0.25 = 2; c = 0 + (2 + 2)/4 = 1
    assert server.variates["p0"]["w"].tolist() == [2.0] and server.variates["p1"]["w"].tolist() == [2.0]
    assert server.control["w"].tolist() == [1.0] and server.sent == {}
    assert first.diagnostics["control-norm"] == 1.0
    # round 2: p0 is sent c − c_0 = −1, p2 (new) c − 0 = 1
    assert server.instruction_arrays("p0", w(0.25), 2)[CORRECTION]["w"].tolist() == [-1.0]
    assert server.instruction_arrays("p2", w(0.25), 2)[CORRECTION]["w"].tolist() == [1.0]
    second = round_of(2, w(0.25), [w(0.0), w(0.25)], ["p0", "p2"], [0.25, 0.5], num_clients=4)
    server(second)
    # c_0⁺ = 0.25/0.25 − (−1) = 2 (Δ 0); c_2⁺ = 0/0.5 − 1 = −1 (Δ −1); c = 1 + (0 − 1)/4
    assert server.variates["p0"]["w"].tolist() == [2.0] and server.variates["p2"]["w"].tolist() == [-1.0]
    assert server.control["w"].tolist() == [0.75]
    # c stays the mean of the N = 4 clients' c_i (p3 has none yet: zero)
    assert sum(v["w"] for v in server.variates.values()).tolist() == [4 * 0.75]


def test_a_late_reply_uses_the_model_and_the_correction_it_was_sent():
    server = ControlVariates()
    server.control, server.variates["p0"] = w(1.0), w(3.0)
    assert server.instruction_arrays("p0", w(2.0), 2)[CORRECTION]["w"].tolist() == [-2.0]
    server.control = w(5.0)  # c moved on while the reply was on its way
    late = round_of(3, w(4.0), [w(1.0)], ["p0"], [0.5], num_clients=2, model_rounds=[2], start_models={2: w(2.0)})
    assert server(late)["w"].tolist() == [3.0]  # rebased: 4 + (1 − 2)
    assert server.variates["p0"]["w"].tolist() == [4.0]  # (2 − 1)/0.5 − (−2): its own start and correction
    assert server.control["w"].tolist() == [5.5]  # 5 + (4 − 3)/2


def test_the_server_learning_rate_scales_the_model_step_only():
    server = ControlVariates(server_lr=0.5)
    server.instruction_arrays("p0", w(1.0), 1)
    update = round_of(1, w(1.0), [w(0.0)], ["p0"], [1.0], num_clients=1)
    assert server(update)["w"].tolist() == [0.5] and server.control["w"].tolist() == [1.0]


def test_a_reply_whose_instruction_is_unknown_changes_no_variate():
    server = ControlVariates()
    update = round_of(1, w(1.0), [w(0.0)], ["p9"], [1.0], num_clients=1)
    assert server(update)["w"].tolist() == [0.0]
    assert server.variates == {} and server.control == {} and update.diagnostics["scaffold-unmatched"] == 1


def test_the_state_crosses_a_restart():
    server = ControlVariates()
    server.instruction_arrays("p0", w(1.0), 1)
    server(round_of(1, w(1.0), [w(0.0)], ["p0"], [0.5], num_clients=2))
    server.instruction_arrays("p1", w(0.0), 2)  # on its way at the checkpoint
    restored = ControlVariates()
    restored.load_state(server.state())
    assert restored.control["w"].tolist() == [1.0] and restored.variates["p0"]["w"].tolist() == [2.0]
    assert restored.sent["p1"][0] == 2 and restored.sent["p1"][1]["w"].tolist() == [1.0]


def test_with_sgd_the_variate_is_the_mean_gradient_of_the_steps():
    # Option II with plain SGD: x − y = η Σ_k (g_k + c − c_i), so c_i⁺ = (x − y)/(K η) − (c − c_i) = mean_k g_k
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    start = {name: value.detach().clone() for name, value in layer.named_parameters()}
    sent = {name: torch.randn_like(value) for name, value in start.items()}
    correction = ControlCorrection(layer, sent, learning_rate=0.1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    gradients = {name: torch.zeros_like(value) for name, value in start.items()}
    inputs, labels = torch.randn(4, 5, 3), torch.tensor([[0, 1, 1, 0, 1]] * 4)
    for batch, target in zip(inputs, labels, strict=True):
        optimizer.zero_grad()
        nn.functional.cross_entropy(layer(batch), target).backward()
        for name, parameter in layer.named_parameters():
            gradients[name] += parameter.grad / 4
        before = {name: parameter.detach().clone() for name, parameter in layer.named_parameters()}
        optimizer.step()
        correction()
        for name, parameter in layer.named_parameters():  # the paper's step: y − η (g + c − c_i)
            expected = before[name] - 0.1 * (parameter.grad + sent[name])
            assert torch.allclose(parameter.detach(), expected, atol=1e-7), name
    report = correction.report()
    assert report == {STEP_SIZE: pytest.approx(0.4)} and correction.steps == 4
    trained = {name: value.detach().numpy() for name, value in layer.named_parameters()}
    variate = client_variate(
        {n: v.numpy() for n, v in start.items()}, trained, {n: v.numpy() for n, v in sent.items()}, report[STEP_SIZE]
    )
    for name, mean_gradient in gradients.items():
        assert np.allclose(variate[name], mean_gradient.numpy(), atol=1e-5), name


def test_the_client_step_corrects_every_step_of_fedweigh_s_loop():
    settings = validate({"dataset": "digits", "model": "mlp"})
    model = new_model(settings)
    data = ImageTensors(torch.randint(0, 17, (24, 1, 8, 8), dtype=torch.uint8), torch.arange(24) % 10)
    recipe = TrainRecipe(local_epochs=2, batch_size=8, learning_rate=0.05)
    config = {recipe_key(name): value for name, value in asdict(recipe).items()}
    trained = {}
    for label, value in (("plain", None), ("zero", 0.0), ("shifted", 1.0)):
        copy = new_model(settings)
        copy.load_state_dict(model.state_dict())
        hooks, step = [], CorrectionStep()
        if value is not None:
            correction = {name: np.full(tuple(p.shape), value, np.float32) for name, p in copy.named_parameters()}
            records = {CORRECTION: encode(correction)}
            context = StepContext(
                copy, data, batch_transform(settings), torch.device("cpu"), 0, 0, 0, 1, config, records=records
            )
            hooks = [step.after_each_step(context)]
        generator = torch.Generator().manual_seed(1)
        train_locally(copy, data, recipe, batch_transform(settings), torch.device("cpu"), generator, after_step=hooks)
        trained[label] = copy.state_dict()
        if value is not None:
            assert step.after_training(context) == {STEP_SIZE: pytest.approx(6 * 0.05)}  # 2 epochs of 3 batches
    assert all(torch.equal(trained["plain"][k], trained["zero"][k]) for k in trained["plain"])  # c = c_i: FedAvg's
    assert any(not torch.equal(trained["plain"][k], trained["shifted"][k]) for k in trained["plain"])


def test_a_missing_or_foreign_correction_is_refused_with_its_name():
    layer = nn.Linear(2, 1, bias=False)
    with pytest.raises(ValueError, match="no ArrayRecord 'scaffold-correction'"):
        ControlCorrection.from_instruction(layer, {}, 0.1)
    with pytest.raises(ValueError, match=r"scaffold-correction\['weight'\] has shape \(3,\)"):
        ControlCorrection(layer, {"weight": torch.zeros(3)}, 0.1)
    with pytest.raises(ValueError, match="learning_rate = 0"):
        ControlCorrection(layer, {"weight": torch.zeros(1, 2)}, 0)
    normed = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    everything = {name: torch.zeros_like(value, dtype=torch.float32) for name, value in normed.state_dict().items()}
    with pytest.raises(ValueError, match=r"names 3 tensors that are not trainable parameters .*'1.running_mean'"):
        ControlCorrection(normed, everything, 0.1)
    with pytest.raises(ValueError, match=r"lacks 1 that are \['0.bias'\]"):
        ControlCorrection(normed, {n: everything[n] for n in ("0.weight", "1.weight", "1.bias")}, 0.1)
    assert corrected_parameters(normed) == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_each_client_gets_its_own_correction_in_its_instruction():
    strategy = SCAFFOLD(fraction_train=1.0, min_train_nodes=2)
    strategy.directory.partition_of.update({11: 0, 12: 1})
    strategy.update.variates["p1"] = w(2.0)
    arrays = encode(w(0.0))
    messages = strategy._instructions([11, 12], 1, arrays, ConfigRecord({}))
    assert [m.metadata.dst_node_id for m in messages] == [11, 12]
    assert all(m.metadata.message_type == MessageType.TRAIN for m in messages)
    corrections = [decode(m.content[CORRECTION])["w"].tolist() for m in messages]
    assert corrections == [[0.0], [-2.0]]  # c − c_i with c = 0
    assert isinstance(messages[0].content["arrays"], ArrayRecord)


def test_scaffold_as_the_run_config_and_the_library_build_it():
    assert METHODS["scaffold"].steps == ("scaffold",)
    assert SCAFFOLD().recipe == {"client-steps": ["scaffold"]} and SCAFFOLD().update.server_lr == 1.0
    app = build_strategy(validate({"strategy": "scaffold", "client-steps": "asw", "aggregation": "dac"}))
    assert app.recipe["client-steps"] == ["scaffold", "ood-score", "asw"]  # FLood's plug-in: ASW and DAC
    assert SCAFFOLD(aggregation=DAC()).rule.name == "dac"
    assert build_strategy(validate({"strategy": "scaffold", "scaffold.server-lr": 0.5})).update.server_lr == 0.5
    with pytest.raises(SettingsError, match="scaffold.server-lr = 0"):
        SCAFFOLD(server_lr=0.0)
    adam = combination_problems(parse_settings({"strategy": "scaffold", "optimizer": "adam"}))
    assert "strategy = 'scaffold' with optimizer = 'adam'" in " ".join(adam)
    assert combination_problems(parse_settings({"strategy": "scaffold"})) == []


def test_a_reply_for_another_round_s_model_changes_no_variate():
    server = ControlVariates()
    server.instruction_arrays("p0", w(1.0), 3)
    update = round_of(4, w(1.0), [w(0.0)], ["p0"], [1.0], num_clients=1, model_rounds=[2], start_models={2: w(1.0)})
    server(update)
    assert server.variates == {} and update.diagnostics["scaffold-unmatched"] == 1 and server.sent == {}


def test_a_round_whose_control_variate_is_not_finite_changes_nothing():
    server = ControlVariates()
    server.control, server.variates["p0"] = w(1.0), w(0.5)
    server.instruction_arrays("p0", w(1.0), 1)
    update = round_of(1, w(1.0), [w(0.0)], ["p0"], [1e-320], num_clients=1)  # K·η so small c_i overflows
    server(update)
    assert server.control["w"].tolist() == [1.0] and server.variates["p0"]["w"].tolist() == [0.5]
    assert "not finite" in update.diagnostics["scaffold-kept"]


def test_the_run_config_s_variates_are_the_trainable_parameters_not_batchnorm_s_statistics():
    settings = validate({"strategy": "scaffold", "dataset": "digits", "model": "resnet8"})
    server = build_strategy(settings).update
    with torch.device("cpu"):
        names = corrected_parameters(new_model(settings))
    assert server.parameters == names and not any("running" in name for name in names)
    state = {name: value.numpy() for name, value in new_model(settings).state_dict().items()}
    sent = server.instruction_arrays("p0", state, 1)[CORRECTION]
    assert list(sent) == names and all(sent[name].dtype == state[name].dtype for name in names)
    assert SCAFFOLD(parameters=["w"]).update.parameters == ["w"] and SCAFFOLD().update.parameters is None
