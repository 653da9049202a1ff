"""The one check before training: names, combinations, the data split; every problem in one message."""

from __future__ import annotations

import pytest

from fedweigh.methods import METHODS, plan_run
from fedweigh.preflight import catalog, check_run, combination_problems, parse_settings
from fedweigh.protocol import STEPS
from fedweigh.rules.registry import RULES
from fedweigh.settings import SettingsError, validate
from fedweigh.strategies.registry import UPDATES
from fedweigh.strategies.updates import ServerUpdate


def problems_of(config, num_partitions=None) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        check_run(config, num_partitions)
    return caught.value.problems


def test_more_partitions_than_samples_fails_before_training():
    check_run({"dataset": "digits", "partitioner": "iid"}, 10)  # fine
    (message,) = problems_of({"dataset": "digits", "partitioner": "iid"}, 2000)  # digits has 1,437 training images
    assert "dataset = 'digits'" in message and "2000 partitions" in message and "accepted" in message


def test_the_catalog_names_every_registry():
    names = catalog()
    assert sorted(names.strategies) == sorted(METHODS) and sorted(names.rules) == sorted(RULES)
    assert sorted(names.steps) == sorted(STEPS) and "mlp" in names.models and "width" in names.models["resnet8"]


def test_without_a_catalog_names_are_not_checked_but_types_are():
    assert validate({"strategy": "anything"}).strategy == "anything"  # a ClientApp does not check names
    with pytest.raises(SettingsError, match="strategy = 'anything': unknown strategy; accepted: .*fedavg"):
        parse_settings({"strategy": "anything"})


@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        ({"aggregation": "fedbogus"}, ["aggregation = 'fedbogus'", "unknown aggregation rule", "fednolowe", "uagg"]),
        (
            {"model-width": 16},
            ["model = 'mlp' has no option model-width", "accepted for this model: model-dropout, model-hidden"],
        ),
        ({"model": "resnet8", "model-hidden": "64"}, ["model-hidden", "accepted for this model: model-width"]),
        ({"model-hidden": "64,x"}, ["model-hidden = '64,x'", "comma-separated positive layer sizes"]),
        ({"model-dropout": 1.0}, ["model-dropout = 1.0", "less than 1"]),
        ({"lr-decay": 0.0}, ["lr-decay = 0.0", "greater than 0"]),
        ({"lr-decay": 1.5}, ["lr-decay = 1.5", "less than or equal to 1"]),
        ({"optimizer": "rmsprop"}, ["optimizer = 'rmsprop'", "'sgd' or 'adam'"]),
        ({"adam-beta1": 1.0}, ["adam-beta1 = 1.0", "less than 1"]),
        ({"partition-seed": -2}, ["partition-seed = -2", "greater than or equal to -1"]),
        ({"max-staleness": -1}, ["max-staleness = -1", "greater than or equal to 0"]),
        ({"uagg.signal": "max"}, ["uagg.signal = 'max'", "'sum' or 'mean'"]),
        ({"oui.probe-size": 1}, ["oui.probe-size = 1", "greater than or equal to 2"]),
    ],
)
def test_each_new_option_names_its_bad_value(config, fragments):
    message = "\n".join(problems_of(config))
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_a_step_that_cannot_run_on_the_model_names_the_settings_that_asked_for_it():
    (problem,) = problems_of(
        {"model": "resnet8", "strategy": "fedprox", "aggregation": "fedoui", "oui.probe-layer": "fc1"}
    )
    assert problem.startswith("aggregation = 'fedoui' runs the client step 'oui'")
    assert "model = 'resnet8'" in problem and "oui.probe-layer = 'fc1' is not a submodule" in problem
    # the same layer is fine on a model that has it
    check_run({"model": "mlp", "aggregation": "fedoui", "oui.probe-layer": "fc1"})
    (problem,) = problems_of({"strategy": "fedoui", "model": "resnet8", "oui.probe-layer": "fc1"})
    assert problem.startswith("strategy = 'fedoui' runs the client step 'oui'")


def test_an_aggregation_the_server_update_cannot_use_is_refused(monkeypatch):
    class IgnoresWeights(ServerUpdate):
        name = "ignores-weights"
        uses_weights = False

    monkeypatch.setitem(UPDATES, "mean", IgnoresWeights)
    settings = parse_settings({"strategy": "fedprox", "aggregation": "fednolowe"})
    (problem,) = combination_problems(settings)
    assert "aggregation = 'fednolowe' cannot be combined with strategy = 'fedprox'" in problem
    assert "does not use aggregation weights" in problem
    assert combination_problems(parse_settings({"strategy": "fedprox"})) == []  # its own rule is fine


def test_every_problem_is_listed_at_once():
    problems = problems_of({"dirichlet-alpha": 0.0, "model": "nope", "aggregation": "nope"})
    assert len(problems) == 3


SERVER_DATA = {name: {"server-data": "id"} for name, m in METHODS.items() if UPDATES[m.update].server_data}
WEIGHTED = sorted(name for name, method in METHODS.items() if UPDATES[method.update].uses_weights)
UNWEIGHTED = sorted(set(METHODS) - set(WEIGHTED))


def test_the_asynchronous_and_server_side_methods_ignore_rule_weights():
    assert UNWEIGHTED == ["center", "fedasync", "fedbuff", "feddle", "fedma-simplified"]
    assert sorted(SERVER_DATA) == ["center", "feddle", "fedft"]


@pytest.mark.parametrize("strategy", UNWEIGHTED)
def test_a_strategy_that_ignores_weights_refuses_an_aggregation_rule(strategy):
    (problem,) = problems_of({"strategy": strategy, "aggregation": "fednolowe", **SERVER_DATA.get(strategy, {})})
    assert f"aggregation = 'fednolowe' cannot be combined with strategy = {strategy!r}" in problem


@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        (
            {"strategy": "feddle"},
            ["strategy = 'feddle' trains on the server's own data, but server-data = ''", "feddle.search = false"],
        ),
        (
            {"strategy": "center", "server-data": "../shared/datasets/mnist"},
            ["strategy = 'center'", "accepted: server-data = 'id'"],
        ),
        ({"strategy": "fedft"}, ["strategy = 'fedft'", "server-data = ''"]),
        ({"delay-std": 20.0}, ["delay-std = 20.0", "max-staleness = 0", "max-staleness >= 1", "about 60"]),
        ({"server-data": "/no/such/folder"}, ["server-data = '/no/such/folder': no such folder", "'id' (held out"]),
        ({"feddle.eviction": "lru"}, ["feddle.eviction = 'lru'", "'importance' or 'fifo'"]),
        ({"round-deadline": -1.0}, ["round-deadline = -1.0", "greater than or equal to 0"]),
    ],
)
def test_asynchrony_and_server_data_problems_name_the_settings(config, fragments):
    message = "\n".join(problems_of(config))
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_feddle_without_its_search_needs_no_server_data_and_delays_need_a_staleness_bound():
    check_run({"strategy": "feddle", "feddle.search": False})
    check_run({"strategy": "fedbuff", "delay-std": 5.0, "max-staleness": 15})


def test_server_data_that_cannot_be_used_is_reported_with_the_data_check(tmp_path):
    import datasets

    unlabelled = tmp_path / "unlabelled"
    unlabelled.mkdir()
    table = datasets.Dataset.from_dict({"image": [[[0] * 8] * 8] * 3, "note": ["a", "b", "c"]})
    for split in ("train", "test"):
        table.to_parquet(str(unlabelled / f"{split}.parquet"))
    (problem,) = problems_of({"strategy": "feddle", "server-data": str(unlabelled)}, 4)
    assert problem.startswith(f"server-data = {str(unlabelled)!r}") and "no label column" in problem
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = datasets.Dataset.from_dict(
        {"image": [], "label": []},
        features=datasets.Features({"image": datasets.Array2D((8, 8), "uint8"), "label": datasets.Value("int64")}),
    )
    for split in ("train", "test"):
        nothing.to_parquet(str(empty / f"{split}.parquet"))
    (problem,) = problems_of({"strategy": "feddle", "server-data": str(empty)}, 4)
    expected = "its train split is empty; accepted: a dataset with labelled images"
    assert problem == f"server-data = {str(empty)!r}: {expected}"
    (problem,) = problems_of({"strategy": "feddle", "server-data": "id", "server-data-size": 360}, 4)
    assert "360 images cannot be held out of a test split of 360 images" in problem and "accepted: 1 to 359" in problem


@pytest.mark.parametrize("strategy", WEIGHTED)
@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_strategy_and_rule_pair_passes_the_check(strategy, rule):
    settings = check_run({"strategy": strategy, "aggregation": rule, **SERVER_DATA.get(strategy, {})})
    plan = plan_run(settings)
    assert plan.rule == rule
    for signal in RULES[rule].build(settings).signals:  # the rule's signals are produced by a planned step
        producer = [name for name, spec in STEPS.items() if signal in spec.produces]
        assert producer == [] or producer[0] in plan.step_names
