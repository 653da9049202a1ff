"""Bad run configs fail before training with one message naming setting, value and what is accepted."""

from __future__ import annotations

import pytest
from conftest import SHARED_DATASETS

from fedweigh.preflight import parse_settings
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
