"""The one check before training: names, combinations, the data split; every problem in one message."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from fedweigh.methods.catalog import STEPS
from fedweigh.methods.registry import METHODS, RULES, plan_run
from fedweigh.preflight import catalog, check_run, combination_problems, parse_settings
from fedweigh.results import CHECKPOINT_FILE, Checkpoint
from fedweigh.run_folder import RESUME_MAY_CHANGE, recorded_settings
from fedweigh.settings import SettingsError, validate
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

    monkeypatch.setitem(METHODS, "fedprox", dataclasses.replace(METHODS["fedprox"], update=IgnoresWeights))
    settings = parse_settings({"strategy": "fedprox", "aggregation": "fednolowe"})
    (problem,) = combination_problems(settings)
    assert "aggregation = 'fednolowe' cannot be combined with strategy = 'fedprox'" in problem
    assert "does not use aggregation weights" in problem
    assert combination_problems(parse_settings({"strategy": "fedprox"})) == []  # its own rule is fine


def test_every_problem_is_listed_at_once():
    problems = problems_of({"dirichlet-alpha": 0.0, "model": "nope", "aggregation": "nope"})
    assert len(problems) == 3


SERVER_DATA = {name: {"server-data": "id"} for name, m in METHODS.items() if m.update.server_data}
WEIGHTED = sorted(name for name, method in METHODS.items() if method.update.uses_weights)
UNWEIGHTED = sorted(set(METHODS) - set(WEIGHTED))


def test_the_asynchronous_and_server_side_methods_ignore_rule_weights():
    assert UNWEIGHTED == ["center", "fedasync", "fedbuff", "feddle", "fedma-simplified", "fedmr"]
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
    assert plan.rule.name == rule
    for signal in RULES[rule].build(settings).signals:  # the rule's signals are produced by a planned step
        producer = [name for name, spec in STEPS.items() if signal in spec.produces]
        assert producer == [] or producer[0] in plan.comma_list


# ---------------------------------------------------------------------------
# the run folder: never written by another run; a resume checked before anything starts
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 2-round FedAvg run on digits with seed 7 (real ServerApp and ClientApp, in process), on 4 nodes."""
    from loopback import run_in_process

    out = tmp_path_factory.mktemp("runs")
    return run_in_process({**RUN, "output-dir": str(out), "run-name": "x"}, num_nodes=4)


RUN = {"num-server-rounds": 2, "local-epochs": 1, "seed": 7}


def resumed_config(folder, **changes) -> dict:
    """The settings ``folder``'s run was made with, resuming it, with ``changes``."""
    return {**recorded_settings(folder), "resume-from": str(folder), "num-server-rounds": 3, **changes}


def folder_copy(folder, tmp_path):
    """A copy of a run folder that a test may damage."""
    return Path(shutil.copytree(folder, tmp_path / folder.name))


@pytest.mark.sim
def test_a_folder_that_holds_a_run_is_never_written_by_another(finished_run):
    """``run-name = x`` a second time replaced all five files of outputs/x (metrics.jsonl: 3 rows to 1)."""
    from loopback import run_in_process

    before = {path.name: path.read_bytes() for path in finished_run.iterdir() if path.is_file()}
    config = {**RUN, "seed": 9, "num-server-rounds": 1, "output-dir": str(finished_run.parent), "run-name": "x"}
    (message,) = problems_of(config)
    assert message == (
        f"run-name = 'x': {finished_run} already holds a run (config.json, metrics.jsonl, checkpoint.pt, model.pt, "
        f"summary.json), which this run would overwrite; accepted: another run-name, or resume-from = "
        f"{str(finished_run)!r} to continue that run"
    )
    with pytest.raises(SettingsError):  # the ServerApp refuses too (plain `flwr run`)
        run_in_process(config)
    assert {path.name: path.read_bytes() for path in finished_run.iterdir() if path.is_file()} == before


@pytest.mark.sim
def test_a_resume_may_change_only_what_does_not_shape_the_run(finished_run):
    changes = {"tracking": "tensorboard", "round-timeout": 30.0, "evaluate-every": 2, "device": "cpu"}
    settings = check_run(resumed_config(finished_run, **changes), 4)
    assert settings.num_server_rounds == 3 and settings.round_timeout == 30.0
    assert set(changes) | {"num-server-rounds", "output-dir", "run-name", "resume-from"} <= RESUME_MAY_CHANGE


@pytest.mark.sim
def test_a_resume_with_other_settings_names_each_one_before_anything_starts(finished_run):
    """``seed=7 num-server-rounds=4 model-hidden='32' resume-from=outputs/x``: size mismatch in every client, six
    tracebacks, the original config.json overwritten; now one message naming the setting that differs."""
    problems = problems_of(resumed_config(finished_run, **{"model-hidden": "32", "seed": 9, "fedprox.proximal-mu": 1}))
    assert problems == [
        f"fedprox.proximal-mu = 1.0, but the run in {finished_run} was made with fedprox.proximal-mu = 0.01, and a "
        "resumed run keeps every setting that shapes it; accepted: fedprox.proximal-mu = 0.01 (or a new run, "
        "without resume-from)",
        f"model-hidden = '32', but the run in {finished_run} was made with model-hidden = '', and a resumed run "
        "keeps every setting that shapes it; accepted: model-hidden = '' (or a new run, without resume-from)",
        f"seed = 9, but the run in {finished_run} was made with seed = 7, and a resumed run keeps every setting that "
        "shapes it; accepted: seed = 7 (or a new run, without resume-from)",
    ]


@pytest.mark.sim
@pytest.mark.parametrize("damage", ["truncated", "state_dict", "all-rounds", "no-config", "other-model"])
def test_a_checkpoint_that_cannot_be_resumed_is_refused_with_one_line(finished_run, tmp_path, damage):
    """Refused late before (SuperLink and Ray up, a Flower traceback, exit code 700); now by the check itself."""
    folder = folder_copy(finished_run, tmp_path)
    checkpoint = folder / CHECKPOINT_FILE
    config = resumed_config(folder)
    expected = {
        "truncated": f"resume-from = {str(folder)!r}: {checkpoint} is truncated or damaged",
        "state_dict": f"resume-from = {str(folder)!r}: {checkpoint} is not a fedweigh checkpoint: it holds a dict of "
        "4 tensors (a model's state_dict?)",
        "all-rounds": f"resume-from = {str(folder)!r}: the run there already holds 2 rounds, and num-server-rounds = 2;"
        " accepted: num-server-rounds above 2 to run more rounds",
        "no-config": f"resume-from = {str(folder)!r}: {folder / 'config.json'} is missing or unreadable",
        "other-model": f"resume-from = {str(folder)!r}: its checkpoint's model does not fit model = 'mlp' (shapes "
        "fc1.weight (64, 32) not (64, 64))",
    }[damage]
    if damage == "truncated":
        checkpoint.write_bytes(checkpoint.read_bytes()[:10000])
    elif damage == "state_dict":
        checkpoint.write_bytes((folder / "model.pt").read_bytes())
    elif damage == "all-rounds":
        config["num-server-rounds"] = 2
    elif damage == "no-config":
        (folder / "config.json").unlink()
    else:
        saved = Checkpoint.load(checkpoint)
        saved.arrays["fc1.weight"] = np.zeros((64, 32), dtype=np.float32)
        saved.save(checkpoint)
    (message,) = problems_of(config)
    assert message.startswith(expected), message


@pytest.mark.sim
def test_a_resume_on_a_federation_of_another_size_is_refused(finished_run):
    (message,) = problems_of(resumed_config(finished_run), 6)
    assert message == (
        f"resume-from = {str(finished_run)!r}: the run there was split into 4 partitions, one per node, and this "
        "federation has 6; accepted: a federation of 4 nodes (fedweigh simulate --num-supernodes 4), as the run had"
    )


# ---------------------------------------------------------------------------
# combinations that lose rounds or hang
# ---------------------------------------------------------------------------


def test_more_round_replies_than_a_round_samples_is_refused():
    """``round-deadline=5.0 min-round-replies=20`` on 10 nodes sampling 5 was accepted."""
    (message,) = problems_of({"round-deadline": 5.0, "min-round-replies": 20}, 10)
    assert message == (
        "min-round-replies = 20 is more than the 5 clients a round samples (fraction-train = 0.5 of 10 nodes, at "
        "least min-train-nodes = 2), so no round could close at its round-deadline = 5.0 s; accepted: "
        "min-round-replies <= 5"
    )
    check_run({"round-deadline": 5.0, "min-round-replies": 5}, 10)
    check_run({"min-round-replies": 20}, 10)  # without a deadline it is not used


@pytest.mark.parametrize("kinds", ["stall", "all", "nan,stall"])
def test_stall_faults_need_a_round_timeout_that_does_not_hold_each_round_for_an_hour(kinds):
    (message,) = problems_of({"faults.kinds": kinds, "faults.fraction": 0.3})
    assert "round-timeout = 3600.0 s: every round with a stalling client would wait that long" in message
    assert message.endswith("accepted: round-timeout <= 600 with stall faults (e.g. round-timeout = 30)")
    check_run({"faults.kinds": kinds, "faults.fraction": 0.3, "round-timeout": 30.0})
    check_run({"faults.kinds": "nan", "faults.fraction": 0.3})
