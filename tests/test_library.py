"""The library face: the methods as strategies constructed in code, and their client halves as functions.

A library strategy is the run-config app's strategy for the same settings
(one implementation); its options are the run config's tables, with their
defaults and their messages. The client functions compute, from a user's
model and tensors, exactly what fedweigh's own ClientApp steps compute from
the same inputs; the reply helper and the mods put it where the strategy
reads it. The example app runs them end to end (``test_example.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from torch import nn

from fedweigh.client import (
    Instruction,
    asw_sample_weights,
    energy_scores,
    ood_score_signal,
    oui_mod,
    oui_signal,
    train_reply,
    ufl_weights,
)
from fedweigh.client.steps import StepContext
from fedweigh.components import batch_transform, new_model
from fedweigh.data.tensors import ImageTensors
from fedweigh.methods.fedoui.client import OUIProbe, probe_indices
from fedweigh.methods.fedoui.protocol import FedOUISettings, OUIProbeSettings
from fedweigh.methods.flood.client import ASWWeighting, OODScoreStep, score_function
from fedweigh.methods.flood.protocol import FLoodSettings
from fedweigh.methods.flood.server import PseudoOODWeight
from fedweigh.methods.ufl.client import UFLStep
from fedweigh.methods.ufl.protocol import UFLSettings
from fedweigh.protocol import SERVER_ROUND, table_entries
from fedweigh.settings import SettingsError, validate
from fedweigh.strategies import DAC, UFL, FedAsync, FedBuff, Feddle, FedNolowe, FedOUI, FedProx, FLood, aggregation
from fedweigh.strategies.build import build_strategy

# ---------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------


def test_each_strategy_is_the_apps_for_the_same_settings():
    """The run-config app builds its strategy through the same classes: one implementation."""
    for cls, config in [
        (FedOUI, {"strategy": "fedoui", "fedoui.window": 3}),
        (FedNolowe, {"strategy": "fednolowe"}),
        (UFL, {"strategy": "ufl", "ufl.alpha": 0.5}),
        (FLood, {"strategy": "flood", "flood.halt-round": 7}),
        (FedProx, {"strategy": "fedprox", "fedprox.proximal-mu": 0.1}),
    ]:
        app = build_strategy(validate(config))
        assert type(app) is cls and app.rule.name == cls(**_options(config)).rule.name
        library = cls(**_options(config))
        assert app.checked_signals == library.checked_signals
        assert [s(4) for s in library.schedules] == [s(4) for s in app.schedules[1:]]  # the app adds the lr decay


def _options(config: dict) -> dict:
    return {key.split(".")[1].replace("-", "_"): value for key, value in config.items() if "." in key}


def test_the_defaults_are_the_run_configs():
    fedoui, ufl, flood = FedOUI(), UFL(), FLood()
    assert fedoui.rule.epsilon == FedOUISettings().epsilon and fedoui.rule.window == FedOUISettings().window
    assert fedoui.recipe["oui.probe-size"] == OUIProbeSettings().probe_size
    assert ufl.recipe["ufl.mc-passes"] == UFLSettings().mc_passes and ufl.rule.signals == ("uncertainty",)
    assert flood.recipe["client-steps"] == ["asw", "ood-score"] and flood.recipe["flood.q"] == FLoodSettings().q
    assert (fedoui.fraction_train, fedoui.min_train_nodes, fedoui.fraction_evaluate) == (1.0, 2, 1.0)  # Flower's


def test_options_reach_the_rule_the_instruction_and_the_schedule():
    assert FedOUI(window=4, epsilon=0.01).rule.window == 4
    assert UFL(signal="mean").rule.signals == ("uncertainty-mean",)
    flood = FLood(a=10.0, halt_round=4)
    assert [s(3) for s in flood.schedules] == [PseudoOODWeight(10.0, 4)(3)]
    assert FedProx(proximal_mu=0.25).recipe["proximal-mu"] == 0.25
    assert "proximal-mu" not in FedOUI().recipe and "local-epochs" not in FedOUI().recipe  # the user's loop decides


def test_a_bad_option_gets_the_run_configs_message_naming_every_problem():
    with pytest.raises(SettingsError) as refused:
        FedOUI(epsilon=0.7, probe_size=1, fraction_train=0.0)
    assert refused.value.problems == [
        "fraction-train = 0.0: Input should be greater than 0",
        "fedoui.epsilon = 0.7: Input should be less than 0.5",
        "oui.probe-size = 1: Input should be greater than or equal to 2",
    ]
    with pytest.raises(SettingsError, match="flood.schedule = 'steps': Input should be 'cosine'"):
        FLood(schedule="steps")
    with pytest.raises(SettingsError, match="window = True: a boolean where a number is expected"):
        FedOUI(window=True)


def test_any_strategy_takes_another_aggregation_and_asks_for_its_signals():
    combined = FedProx(aggregation=DAC(alpha=1.0))
    assert combined.rule.name == "dac" and combined.recipe["client-steps"] == ["ood-score"]
    assert "flood.temperature" in combined.recipe  # the step's options travel with it
    assert FedNolowe(aggregation=aggregation("uagg", signal="mean")).recipe["client-steps"] == ["ufl"]
    with pytest.raises(SettingsError, match="aggregation = 'median': unknown aggregation rule; accepted: dac"):
        aggregation("median")
    with pytest.raises(SettingsError, match=r"dac.alpha = -1.0: Input should be greater than or equal to 0"):
        DAC(alpha=-1.0)


def test_without_sample_by_partition_nodes_are_never_asked_anything():
    assert not FedOUI().directory.ask and FedOUI(sample_by_partition=True).directory.ask
    # test_example.py runs the example app, which answers no query, for two rounds with every method


# ---------------------------------------------------------------------------
# client functions: what fedweigh's own ClientApp computes, from a user's tensors
# ---------------------------------------------------------------------------


@pytest.fixture
def client_data():
    """Digits-like images (8x8, 1 channel), their fedweigh transform and the MLP, as a ClientApp has them."""
    settings = validate({"model": "mlp", "dataset": "digits"})
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 17, (150, 1, 8, 8), dtype=torch.uint8, generator=generator)
    data = ImageTensors(images, torch.randint(0, 10, (150,), generator=generator))
    torch.manual_seed(3)
    return settings, data, batch_transform(settings), new_model(settings)


def step_context(settings, data, transform, model, config) -> StepContext:
    return StepContext(
        model, data, transform, torch.device("cpu"), seed=11, run_seed=1, partition_id=2, server_round=3, config=config
    )


def test_oui_signal_is_the_oui_step_on_the_same_probe(client_data):
    settings, data, transform, model = client_data
    config = table_entries("oui", settings.oui)
    expected = OUIProbe().after_training(step_context(settings, data, transform, model, config))["oui"]
    probe = transform(data.images[probe_indices(len(data), settings.oui.probe_size, 1, 2)], train=False)
    assert oui_signal(model, probe, layer=model.probe_layer) == {"oui": expected}


def test_ufl_weights_are_the_ufl_step_on_the_same_inputs(client_data):
    settings, data, transform, model = client_data
    config = table_entries("ufl", settings.ufl)
    step_weights, step_signals = UFLStep().before_training(step_context(settings, data, transform, model, config))
    inputs = transform(data.images, train=False)
    weights, signals = ufl_weights(model, inputs, data.labels, seed=11)
    assert torch.equal(weights, step_weights.weights)
    step_signals.pop("mc-seconds")
    assert signals == step_signals and signals["uncertainty"] > 0


def test_asw_and_ood_score_are_flood_steps_on_the_same_logits(client_data):
    settings, data, transform, model = client_data
    logits = torch.randn(32, 10, generator=torch.Generator().manual_seed(5))
    labels = torch.zeros(32, dtype=torch.int64)
    expected = ASWWeighting(score_function(settings.flood), settings.flood.q, 7.0)(logits, labels, torch.arange(32))
    assert torch.equal(asw_sample_weights(logits, 7.0), expected)
    assert torch.equal(energy_scores(logits), score_function(settings.flood)(logits))
    config = table_entries("flood", settings.flood)
    phi = OODScoreStep().after_training(step_context(settings, data, transform, model, config))["ood-score"]
    assert ood_score_signal(model, transform(data.images, train=False))["ood-score"] == pytest.approx(phi, rel=1e-12)


# ---------------------------------------------------------------------------
# the instruction, the reply, the mod
# ---------------------------------------------------------------------------


@pytest.fixture
def train_message():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    config = ConfigRecord({SERVER_ROUND: 4, **FLood(halt_round=5).recipe, "asw-lambda": 3.5, "oui.probe-size": 4})
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": config})
    return Message(content, dst_node_id=7, message_type="train"), model


def test_an_instruction_says_what_the_strategy_asks_for(train_message):
    message, _ = train_message
    instruction = Instruction.of(message)
    assert instruction.server_round == 4 and instruction.steps == ("asw", "ood-score") and instruction.asks("asw")
    assert instruction.asw_lambda == 3.5 and instruction.flood.q == FLoodSettings().q and instruction.proximal_mu == 0
    assert instruction.oui.probe_size == 4 and not instruction.asks("oui")


def test_a_reply_carries_what_the_strategy_checks(train_message):
    message, model = train_message
    reply = train_reply(message, model, num_examples=12, train_loss=0.5, signals={"ood-score": 1.5}, partition_id=3)
    metrics = dict(reply.content["metrics"])
    assert metrics == {"num-examples": 12, "train_loss": 0.5, "model-round": 4, "partition-id": 3, "ood-score": 1.5}
    assert list(reply.content["arrays"].to_torch_state_dict()) == list(model.state_dict())


def test_the_oui_mod_adds_the_oui_of_the_replys_model_when_asked(train_message):
    message, model = train_message
    probe = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))

    def handler(received: Message, context: Context) -> Message:
        return Message(
            RecordDict(
                {
                    "arrays": ArrayRecord(model.state_dict()),
                    "metrics": MetricRecord({"num-examples": 1, "train_loss": 0.1}),
                }
            ),
            reply_to=received,
        )

    mod = oui_mod(lambda: nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2)), probe, layer="0")
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    assert "oui" not in mod(message, context, handler).content["metrics"]  # FLood asks for no OUI
    message.content["config"]["client-steps"] = ["oui"]
    metrics = mod(message, context, handler).content["metrics"]
    assert metrics["oui"] == oui_signal(model, probe[:4], layer="0")["oui"]  # oui.probe-size = 4 of the 6
    assert np.isfinite(metrics["oui"])


# ---------------------------------------------------------------------------
# the asynchronous methods and Feddle
# ---------------------------------------------------------------------------


def test_fedbuff_and_fedasync_take_their_options_and_asynchrony():
    from fedweigh.methods.fedbuff.server import BufferedStep

    buffered = FedBuff(buffer_size=3, server_lr=0.5, round_deadline=5.0, min_round_replies=2, max_staleness=4)
    assert isinstance(buffered.update, BufferedStep) and (buffered.update.buffer_size, buffered.update.server_lr) == (
        3,
        0.5,
    )
    assert buffered.deadline is not None and (buffered.deadline.seconds, buffered.deadline.min_replies) == (5.0, 2)
    assert type(FedBuff(buffer_size=0).update).__name__ == "FallbackStep"  # a step a round on what arrived
    mixing = FedAsync(alpha=0.6, a=1.0, delay_std=2.0, max_staleness=6)
    assert (mixing.update.alpha, mixing.update.a, mixing.delay_std, mixing.deadline) == (0.6, 1.0, 2.0, None)
    assert type(build_strategy(validate({"strategy": "fedbuff"}))) is FedBuff
    with pytest.raises(SettingsError, match="delay-std = -1.0: Input should be greater than or equal to 0"):
        FedAsync(delay_std=-1.0)


def test_feddle_searches_with_the_users_model_on_the_server_images():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 4))
    images = torch.randint(0, 256, (20, 3, 2, 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    strategy = Feddle(model=model, server_images=images, server_labels=torch.arange(20) % 4, search_epochs=2)
    update = strategy.update
    assert update.searches and update.model is model and update.options.epochs == 2 and len(update.data) == 20
    assert update.data.kind == "id" and update.data.num_classes == 4
    assert torch.equal(update.data.transform(images[:2]), images[:2].float() / 255.0)  # the default preprocessing
    assert not Feddle(model=model).update.searches  # no server data: the fallback step
    with pytest.raises(SettingsError, match="kind = 'other'"):
        Feddle(model=model, kind="other")
