"""Bad run configs fail before training with one message naming setting, value and what is accepted."""

from __future__ import annotations

import pytest
from conftest import SHARED_DATASETS

from fedweigh.preflight import parse_settings
from fedweigh.run_folder import shaping_differences
from fedweigh.settings import SettingsError


def test_defaults_parse():
    settings = parse_settings({})
    assert settings.strategy == "fedavg" and settings.dataset == "digits" and settings.fedprox.proximal_mu == 0.01


def test_nested_tables_arrive_dotted():
    settings = parse_settings({"strategy": "fedprox", "fedprox.proximal-mu": 0.1})
    assert settings.fedprox.proximal_mu == 0.1


def test_local_dataset_folder_is_accepted():
    folder = str(SHARED_DATASETS / "cifar10")
    assert parse_settings({"dataset": folder}).dataset == folder


@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        ({"dirichlet-alpha": 0.0}, ["dirichlet-alpha", "0.0", "greater than 0"]),
        ({"dirichlet-alpha": -1.0}, ["dirichlet-alpha", "-1.0", "greater than 0"]),
        ({"fraction-train": 0.0}, ["fraction-train", "0.0", "greater than 0"]),
        ({"fraction-train": 1.5}, ["fraction-train", "1.5", "less than or equal to 1"]),
        ({"model": "resnet50"}, ["model", "resnet50", "accepted", "lenet5"]),
        ({"strategy": "fedsomething"}, ["strategy", "fedsomething", "accepted", "fedavg"]),
        ({"dataset": "/nonexistent/cifar"}, ["dataset", "/nonexistent/cifar", "digits"]),
        ({"num-server-rounds": "ten"}, ["num-server-rounds", "ten", "integer"]),
        ({"partitioner": "zipf"}, ["partitioner", "zipf", "dirichlet"]),
        ({"device": "tpu"}, ["device", "tpu", "cuda"]),
        ({"learning-rte": 0.1}, ["learning-rte", "unknown setting"]),
        ({"fedprox.proximal-mu": -1.0}, ["fedprox.proximal-mu", "-1.0", "greater than or equal to 0"]),
    ],
)
def test_bad_setting_is_named_with_value_and_accepted(config, fragments):
    with pytest.raises(SettingsError) as caught:
        parse_settings(config)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_every_problem_is_listed_at_once():
    with pytest.raises(SettingsError) as caught:
        parse_settings({"dirichlet-alpha": 0.0, "model": "nope"})
    assert "dirichlet-alpha" in str(caught.value) and "model" in str(caught.value)


def test_client_steps_compose_methods_with_one_setting():
    from fedweigh.strategies.build import build_strategy

    strategy = build_strategy(parse_settings({"strategy": "fedoui", "client-steps": "ufl"}))
    assert strategy.rule.name == "oui-beta"
    assert strategy.recipe["client-steps"] == ["oui", "ufl"]
    assert strategy.recipe["ufl.alpha"] == 0.2 and strategy.recipe["oui.probe-size"] == 32
    # a step the strategy already has is not added twice
    assert build_strategy(parse_settings({"strategy": "ufl", "client-steps": "ufl"})).recipe["client-steps"] == ["ufl"]


def test_unknown_client_step_is_rejected():
    with pytest.raises(SettingsError, match="client-steps = 'bogus'.*accepted: .*ufl"):
        parse_settings({"client-steps": "bogus"})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"local-epochs": True}, "local-epochs = True: a boolean where a number is expected; accepted: an integer"),
        ({"learning-rate": False}, "learning-rate = False: a boolean where a number is expected; accepted: a number"),
        ({"seed": "3"}, "seed = '3': a string where a number is expected; accepted: an integer, unquoted"),
        ({"fedprox.proximal-mu": True}, "fedprox.proximal-mu = True: a boolean where a number is expected"),
        ({"augment": 1}, "augment = 1: not a boolean; accepted: true or false"),
        ({"augment": "yes"}, "augment = 'yes': not a boolean; accepted: true or false"),
    ],
)
def test_a_value_of_another_type_is_refused_not_converted(config, message):
    """``local-epochs=true`` ran with 1 epoch: pydantic turned the boolean into 1."""
    with pytest.raises(SettingsError) as refused:
        parse_settings(config)
    assert refused.value.problems[0].startswith(message), refused.value.problems


def test_an_integer_is_a_number():
    settings = parse_settings({"learning-rate": 1, "lr-decay": 1, "local-epochs": 2})
    assert (settings.learning_rate, settings.lr_decay, settings.local_epochs) == (1.0, 1.0, 2)


def test_shaping_differences_leave_out_what_a_resumed_run_may_change():
    recorded = {"seed": 7, "model-hidden": "", "num-server-rounds": 3, "tracking": "none", "gone": 1}
    current = {"seed": 7, "model-hidden": "32", "num-server-rounds": 9, "tracking": "mlflow", "new": 2}
    assert shaping_differences(recorded, current) == [("model-hidden", "", "32")]
    assert shaping_differences({"x": (1.0, 2.0), "y": float("inf")}, {"x": [1.0, 2.0], "y": None}) == []


def test_the_app_config_and_the_settings_model_hold_every_default_once_and_the_same():
    """pyproject.toml's [tool.flwr.app.config] (what `flwr run` accepts) and the settings model (what is checked)
    name the same settings with the same defaults, of the same types: neither can drift from the other."""
    from conftest import REPO

    from fedweigh.launch.runconfig import load_app_config
    from fedweigh.settings import Settings, flatten

    app, model = load_app_config(REPO), flatten(Settings().model_dump(by_alias=True))
    assert sorted(set(app) - set(model)) == [] and sorted(set(model) - set(app)) == []
    assert {key: (value, type(value)) for key, value in app.items()} == {
        key: (model[key], type(model[key])) for key in app
    }
