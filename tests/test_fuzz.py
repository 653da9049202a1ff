"""Property-based tests: whatever a user writes either runs or stops before training with one clear message.

Hypothesis draws run configs (known keys, nested tables, unknown keys; values
valid, out of range, of the wrong type, empty, huge, NaN, random text),
experiment files (valid TOML with random keys, values and types, missing
sections, invalid TOML) and ``dataset`` values. The properties:

* the preflight check (:func:`fedweigh.preflight.check_run`, what ``fedweigh
  simulate``, the experiment runner and the ServerApp call before anything
  trains) accepts a run config or raises a ``SettingsError`` each of whose
  problems names a setting the user wrote and says what is accepted; never
  another exception;
* the command line's own path (``--run-config`` text, the app's defaults)
  does the same, and a value it can write it reads back unchanged;
* a config it accepts runs end to end (the real ServerApp and ClientApp in
  this process, :mod:`loopback`) without an exception;
* an experiment file loads, or the ``ExperimentError`` names the file and the key;
* a ``dataset`` value is accepted or refused naming ``dataset``.

Bad data files (truncated, corrupt, damaged inside, without a label column,
with negative labels, images of mixed sizes) are tested one by one, for the
``dataset`` setting and for a site's own ``data-dir``. Every case the fuzzing
found is kept: one that crashed or was reported unclearly as an ``@example``,
one that was accepted and then failed mid-run in
:func:`test_configs_that_failed_mid_run_are_refused_before_training`. The runs
are deterministic (``derandomize``), so CI sees the same configurations every
time.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import datasets
import numpy as np
import pyarrow.parquet as pq
import pytest
import tomli_w
from conftest import REPO, SHARED_DATASETS
from flwr.app import Context, RecordDict
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from loopback import run_in_process
from PIL import Image

from fedweigh import client_app
from fedweigh.client.registry import STEP_CLASSES
from fedweigh.components import settings_from
from fedweigh.experiments.spec import ExperimentError, load_experiment
from fedweigh.launch.runconfig import build_run_config_arg, load_app_config, parse_run_config, prepare_run_config
from fedweigh.methods.registry import METHODS, RULES
from fedweigh.models import model_names
from fedweigh.preflight import check_run
from fedweigh.results import read_metrics
from fedweigh.settings import PARTITIONERS, Settings, SettingsError
from fedweigh.strategies.updates import WeightedMean

APP = load_app_config(REPO)
NODES = 4
FUZZ = settings(derandomize=True, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


# --- what a clear refusal is ------------------------------------------------------------------------------------


def names_one_of(message: str, keys: Iterable[str]) -> bool:
    """Whether ``message`` names one of ``keys`` as written (not as part of a longer name)."""
    return any(re.search(rf"(?<![\w.-]){re.escape(key)}(?![\w-])", message) for key in keys if key)


def says_what_is_accepted(message: str) -> bool:
    """``accepted: ...``, or pydantic's ``Input should be ...``."""
    return "accepted" in message or "should be" in message


def refusal(run_config: Mapping[str, Any], num_partitions: int | None = NODES) -> list[str]:
    """The problems :func:`check_run` reports (empty: accepted); any exception but SettingsError propagates."""
    try:
        accepted = check_run(run_config, num_partitions)
    except SettingsError as err:
        assert err.problems, "a SettingsError without a problem"
        note("refused")
        return err.problems
    assert_usable(accepted)
    note("accepted")
    return []


def note(outcome: str) -> None:
    """Count ``outcome`` in Hypothesis' statistics (``--hypothesis-show-statistics``), inside a property only."""
    with contextlib.suppress(InvalidArgument):  # outside a property there is nothing to count
        event(outcome)


def assert_usable(accepted: Settings) -> None:
    """An accepted run holds finite numbers and 64-bit integers only."""
    for key, value in _leaves(accepted.model_dump(by_alias=True)):
        if isinstance(value, float):
            assert math.isfinite(value), f"{key} = {value!r} was accepted"
        if isinstance(value, int) and not isinstance(value, bool):
            assert -(2**63) <= value < 2**63, f"{key} = {value!r} was accepted"


def _leaves(table: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for key, value in table.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def assert_clear(problems: list[str], keys: Iterable[str]) -> None:
    keys = list(keys)
    for problem in problems:
        assert names_one_of(problem, keys), f"names none of {keys}: {problem}"
        assert says_what_is_accepted(problem), f"does not say what is accepted: {problem}"
        assert "Traceback" not in problem


def test_the_helpers_tell_a_clear_refusal_from_an_unclear_one():
    assert names_one_of("fedoui.window = 0: Input should be greater than or equal to 1", ["fedoui.window"])
    assert not names_one_of("partition-seed = -2: ...", ["seed"])  # a longer name is not the setting
    assert not names_one_of("model = 'mlp' cannot be built: Overflow when unpacking long long", ["seed"])
    assert says_what_is_accepted("x = 1: unknown setting; accepted: ...") and not says_what_is_accepted("x = 1: bad")


# --- run configs --------------------------------------------------------------------------------------------------

WORDS = sorted(
    {*METHODS, *RULES, *STEP_CLASSES, *model_names()}
    | {*PARTITIONERS, "sgd", "adam", "cpu", "auto", "id", "digits", "off", "bf16"}
    | {"lora", "head", "full", "energy", "sum", "mean", "all", "nan", "scaled", "128,64", "fc1", "0", ""}
)
ODD = st.sampled_from(
    [float("nan"), float("inf"), -float("inf"), 1e300, -1e-300, 2**63 - 1, -(2**63), 2**64, 10**30, -1, 0]
    + ["", " ", "nan", "inf", "-1", "1e400", "true", "None", "x" * 300, "9" * 40, "a'b\"c", "tab\there", "a\nb"]
)
UNKNOWN_KEYS = [
    "bogus",
    "num_server_rounds",
    "num-server-round",
    "fedoui",
    "fedoui.bogus",
    "fedprox.proximal-mu.x",
    "strategy.x",
    ".x",
    "a..b",
    "zz.top",
]


def choices(key: str) -> tuple[Any, ...]:
    """The values a setting declares (a ``Literal``), or none."""
    node: Any = Settings
    for part in key.split("."):
        field = getattr(node, "model_fields", {}).get(part.replace("-", "_"))
        if field is None:
            return ()
        node = field.annotation
    return get_args(node) if get_origin(node) is Literal else ()


def values_for(key: str, wild: bool = True) -> st.SearchStrategy[Any]:
    """Values of the key's own type, mostly in range (with extremes); with ``wild``, also anything at all."""
    default = APP.get(key)
    if isinstance(default, bool):
        near: st.SearchStrategy[Any] = st.booleans()
    elif isinstance(default, int):
        near = st.integers(-2, 64) if wild else st.integers(1, 8) | st.just(default)
    elif isinstance(default, float):
        extremes = st.sampled_from([0.0, default, 0.5, 1.0, 1e-9, 1e9, 1e300])
        usual = st.floats(-1.0, 4.0, allow_nan=False) if wild else st.floats(0.0, 0.99)  # most options are in [0, 1)
        near = st.one_of(usual, usual, extremes)
    else:
        near = st.sampled_from(choices(key) or WORDS)
    if not wild:
        return near
    anything = ODD | st.text(max_size=12) | st.integers() | st.floats() | st.booleans()
    return st.one_of(near, near, anything)


@st.composite
def run_config_overrides(draw: st.DrawFn, max_keys: int = 4) -> dict[str, Any]:
    keys = st.sampled_from(sorted(APP))
    key_list = draw(
        st.lists(st.one_of(keys, keys, keys, st.sampled_from(UNKNOWN_KEYS)), min_size=1, max_size=max_keys, unique=True)
    )
    return {key: draw(values_for(key)) for key in key_list}


EXPENSIVE = {  # the settings that decide a run's cost (or need what the loopback lacks): drawn by cheap_runs alone
    *("num-server-rounds", "local-epochs", "train-subset", "test-subset", "dataset", "server-data", "server-data-size"),
    *("model", "model-width", "model-hidden", "model-input-size", "model-pretrained", "model-weights"),
    *("fine-tuning", "mixed-precision", "device", "output-dir", "run-name", "resume-from", "round-timeout"),
    *("round-deadline", "min-round-replies", "faults.kinds", "faults.fraction", "oui.probe-size"),
    *("ufl.mc-passes", "center.epochs", "fedft.epochs", "feddle.search-epochs", "feddle.atlas-size"),
}
"""``round-deadline``: the loopback grid answers in ``send_and_receive`` only; ``faults.kinds``: ``stall`` waits."""
FREE = sorted(set(APP) - EXPENSIVE)


@settings(FUZZ, max_examples=60)
@given(overrides=run_config_overrides())
@example({"seed": 2**64})  # overflowed in torch.manual_seed; reported as "model = 'mlp' cannot be built"
@example({"seed": 1e300})  # a float that is a whole number became a 301-digit seed
@example({"model-hidden": "1" * 30})  # a TypeError out of torch: a traceback
@example({"weight-decay": float("inf")})  # accepted; every client then trained NaNs
@example({"fedprox.proximal-mu": float("nan"), "strategy": "fedprox"})  # the same
@example({"dirichlet-alpha": float("inf")})  # the same, for the split
@example({".x": 1, "a..b": 2})  # reported as " = {'x': 1}" and "a = {'': {'b': 2}}"
@example({"zz.top": 1})  # reported as "zz = {'top': 1}"
@example({"strategy.x": 1})  # "strategy.x: strategy is not a table", without what is accepted
@example({"test-subset": 5000})  # named "test_subset", not the setting's name
@example({"model": "lenet5"})  # "lenet5 needs image_size >= 16", without what is accepted
def test_any_run_config_is_accepted_or_refused_naming_the_setting(overrides):
    assert_clear(refusal({**APP, **overrides}), overrides)


@pytest.mark.parametrize(
    ("overrides", "setting", "what_happened"),
    [
        ({"model-hidden": "100000000000"}, "model-hidden", "the ServerApp failed to allocate 10 TB"),
        ({"model": "resnet8", "model-width": 2**20}, "model-width", "the same, 1 PB"),
        (
            {"model": "resnet18-imagenet", "model-input-size": 100000},
            "model-input-size",
            "5 TB per image at the client",
        ),
        ({"strategy": "fedoui", "oui.probe-size": 2**40}, "oui.probe-size", "the clients' probe batch could not fit"),
        ({"min-train-nodes": NODES + 1}, "min-train-nodes", "the run waited an hour for nodes, then failed"),
        ({"dataset": "nobody/nothing"}, "dataset", "a ConnectionError out of the datasets library"),
        ({"learning-rate": 1e300}, "learning-rate", "every client: value cannot be converted to type float"),
        ({"weight-decay": 1e300}, "weight-decay", "the same"),
        ({"learning-rate": 1e38, "optimizer": "adam"}, "learning-rate", "the same: Adam's step is lr / (1 - beta1)"),
        ({"strategy": "center", "server-data": "id", "center.learning-rate": 1e38}, "center.learning-rate", "the same"),
        ({"strategy": "fedft", "server-data": "id", "fedft.learning-rate": 1e300}, "fedft.learning-rate", "the same"),
    ],
)
def test_configs_that_failed_mid_run_are_refused_before_training(overrides, setting, what_happened):
    """Each one the check accepted before, and then the run failed as ``what_happened`` says."""
    problems = refusal({**APP, **overrides}, NODES)
    assert problems, f"accepted: {overrides}"
    assert_clear(problems, [setting])


def same_value(read: Any, written: Any) -> bool:
    if isinstance(written, float) and math.isnan(written):
        return isinstance(read, float) and math.isnan(read)
    return read == written and type(read) is type(written)


@settings(FUZZ, max_examples=30)
@given(overrides=run_config_overrides(max_keys=3))
@example({"run-name": "a\x01b"})  # written unescaped into the TOML that flwr run parses, which then failed
@example({"model-hidden": "64,64", "run-name": 'it\'s "quoted"'})  # both quotes: flwr's parser cannot take them
def test_the_command_line_refuses_a_bad_config_before_any_superlink_starts(overrides):
    """``fedweigh simulate --run-config "..."``: written, read back, prepared, then checked, as the CLI does."""
    try:
        text = build_run_config_arg(overrides)
    except ValueError as err:  # a value the --run-config syntax cannot carry
        assert_clear([str(err)], overrides)
        return
    read = parse_run_config([text])
    assert read.keys() == overrides.keys() and all(same_value(read[k], overrides[k]) for k in read), text
    try:
        prepared = prepare_run_config(read, APP, REPO)
    except ValueError as err:  # unknown keys
        assert_clear([str(err)], overrides)
        return
    assert_clear(refusal({**APP, **prepared}), overrides)


# --- end to end ---------------------------------------------------------------------------------------------------

FAULTS = [("", 0.0), ("", 0.0), ("nan,scaled", 0.5), ("exception", 0.5), ("signal-nan,old-round,duplicate", 0.5)]
BREAKERS = [  # one setting that does not fit the rest: the check must refuse it, naming it
    ("min-train-nodes", NODES + 1),
    ("model", "lenet5"),  # needs 16x16 images; the digits are 8x8
    ("model-hidden", "0"),
    ("server-data-size", 5000),  # more than the test split holds
    ("delay-std", 3.0),  # with max-staleness 0 below
    ("trimmed-mean", 0.2),  # only for strategies whose server update is the mean
    ("aggregation", "fedoui"),  # not for strategies whose update ignores weights
    ("server-data", ""),  # for the strategies that train on it
]


@st.composite
def cheap_runs(draw: st.DrawFn) -> dict[str, Any]:
    """Small runs on the digits: at most 2 rounds of 1 local epoch on a few hundred images, small models.

    Drawn to fit together; one in five has one setting that does not (:data:`BREAKERS`), and up to two
    other settings take any value of their type, mostly in range.
    """
    strategy = draw(st.sampled_from(sorted(METHODS)))
    update = METHODS[strategy].update
    kinds, fraction = draw(st.sampled_from(FAULTS))
    staleness = draw(st.integers(0, 2))
    config = {
        "strategy": strategy,
        "aggregation": draw(st.sampled_from(["", "", *sorted(RULES)])) if update.uses_weights else "",
        "num-server-rounds": draw(st.integers(1, 2)),
        "local-epochs": 1,
        "train-subset": draw(st.sampled_from([120, 300])),
        "test-subset": draw(st.sampled_from([0, 100])),
        "partitioner": draw(st.sampled_from(PARTITIONERS)),
        "dirichlet-alpha": draw(st.floats(1e-3, 1e3)),
        "fraction-train": draw(st.floats(0.1, 1.0)),
        "fraction-evaluate": draw(st.sampled_from([0.0, 0.0, 0.5])),
        "min-train-nodes": draw(st.integers(1, NODES)),
        "model": draw(st.sampled_from(["mlp", "mlp", "feddle-cnn"])),
        "optimizer": draw(st.sampled_from(["sgd", "adam"])),
        "learning-rate": draw(st.sampled_from([0.01, 0.05, 0.1]) | st.floats(1e-4, 50.0)),  # 50 diverges to NaN
        "batch-size": draw(st.sampled_from([1, 7, 32, 2**40])),
        "persist-optimizer-state": draw(st.booleans()),
        "max-staleness": staleness,
        "delay-std": draw(st.sampled_from([0.0, 1.0])) if staleness else 0.0,
        "evaluate-every": draw(st.integers(1, 3)),
        "server-data": "id" if update.server_data else draw(st.sampled_from(["", "id"])),
        "server-data-size": draw(st.sampled_from([30, 60])),
        "update-norm-bound": draw(st.sampled_from([0.0, 0.0, 1.5])),
        "trimmed-mean": draw(st.sampled_from([0.0, 0.2])) if update is WeightedMean else 0.0,
        "rare-clients": draw(st.sampled_from([0.0, 0.0, 0.25])),
        "noisy-clients": draw(st.sampled_from([0.0, 0.5])),
        "faults.kinds": kinds,
        "faults.fraction": fraction,
        "fedoui.window": draw(st.integers(1, 3)),
        "oui.probe-size": draw(st.sampled_from([2, 16, 500])),
        "ufl.mc-passes": draw(st.integers(1, 3)),
        "feddle.search-epochs": 1,
        "fedbuff.buffer-size": draw(st.integers(0, 3)),
        "center.epochs": draw(st.integers(1, 3)),
        "flood.a": draw(st.sampled_from([200.0, 1e30])),
        "device": "cpu",
    }
    if config["model"] == "mlp":
        config["model-hidden"] = draw(st.sampled_from(["", "16,16"]))
    if draw(st.integers(0, 4)) == 0:
        key, value = draw(st.sampled_from(BREAKERS))
        config.update({key: value, "max-staleness": 0} if key == "delay-std" else {key: value})
    for key in draw(st.lists(st.sampled_from(FREE), max_size=2, unique=True)):
        config[key] = draw(values_for(key, wild=False))
    return config


@pytest.fixture(scope="module")
def run_folders(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzzed-runs"), itertools.count()


@settings(FUZZ, max_examples=15)
@given(config=cheap_runs())
def test_a_config_the_check_accepts_runs_to_the_end(config, run_folders):
    problems = refusal({**APP, **config}, NODES)  # as fedweigh simulate does, before it starts anything
    if problems:
        assert_clear(problems, config)
        return
    output, numbers = run_folders
    folder = run_in_process({**config, "output-dir": str(output), "run-name": f"run-{next(numbers)}"}, NODES)
    rows = read_metrics(folder)
    assert [row["round"] for row in rows] == list(range(1, config["num-server-rounds"] + 1))
    failures = [why for row in rows for why in row["left_out"].values() if "ClientApp failed" in why]
    assert all("fault injection" in why for why in failures), failures  # no client crashed by itself
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["final_accuracy"] is None or 0.0 <= summary["final_accuracy"] <= 1.0


# --- experiment files ---------------------------------------------------------------------------------------------

VALID_EXPERIMENT = {
    "experiment": {"name": "fuzz", "seeds": [1, 2], "num-supernodes": 4},
    "base": {"dataset": "digits", "num-server-rounds": 2, "fedoui": {"window": 2}},
    "arms": [
        {"name": "fedavg", "strategy": "fedavg", "paper": {"final": "0.5 ± 0.1"}},
        {"name": "fedoui", "strategy": "fedoui", "overrides": {"oui": {"probe-size": 16}}},
    ],
}
PLACES = [
    ("experiment",),
    ("experiment", "name"),
    ("experiment", "seeds"),
    ("experiment", "num-supernodes"),
    ("experiment", "gpus-per-client"),
    ("base",),
    ("base", "model"),
    ("base", "seed"),
    ("base", "learning-rate"),
    ("base", "fedoui"),
    ("base", "fedoui", "window"),
    ("arms",),
    ("arms", 0),
    ("arms", 1, "name"),
    ("arms", 0, "strategy"),
    ("arms", 1, "overrides"),
    ("arms", 1, "overrides", "oui", "probe-size"),
    ("arms", 0, "paper"),
    ("arms", 0, "paper", "final"),
    ("arms", 0, "paper", "best"),
]
TOML_SCALARS = st.one_of(
    st.text(max_size=8),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.booleans(),
    st.sampled_from(["fedoui", "mlp", "0.5 ± 0.1", "", "digits", "resnet8", "x y"]),
)
TOML_VALUES = st.recursive(
    TOML_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(min_size=1, max_size=6), inner, max_size=3),
    max_leaves=6,
)


def edited(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of ``document`` with the value at ``path`` replaced (deleted when ``value`` is ``...``)."""
    document = json.loads(json.dumps(document))  # a deep copy
    node = document
    for part in path[:-1]:
        if isinstance(node, dict) and isinstance(part, str):
            node = node.setdefault(part, {})
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return document
    last = path[-1]
    if isinstance(node, dict) and isinstance(last, str):
        if value is ...:
            node.pop(last, None)
        else:
            node[last] = value
    elif isinstance(node, list) and isinstance(last, int) and last < len(node):
        if value is ...:
            node.pop(last)
        else:
            node[last] = value
    return document


@st.composite
def experiment_files(draw: st.DrawFn) -> tuple[bytes, list[tuple[Any, ...]]]:
    """The text of an experiment file and the paths that were changed (empty for a file that is not TOML)."""
    document: Any = VALID_EXPERIMENT
    paths = draw(st.lists(st.sampled_from(PLACES) | st.tuples(st.text(min_size=1, max_size=6)), max_size=3))
    for path in paths:
        document = edited(document, path, draw(st.just(...) | TOML_VALUES))
    text = tomli_w.dumps(document).encode()
    damage = draw(st.sampled_from(["none", "none", "none", "truncate", "junk", "bytes"]))
    if damage == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    elif damage == "junk":
        text += b"\n= = [\n"
    elif damage == "bytes":
        text = draw(st.binary(max_size=40))
    return text, [] if damage != "none" else paths


def names_the_changed_key(problem: str, paths: list[tuple[Any, ...]]) -> bool:
    names = [name for path in paths for part in path if isinstance(part, str) for name in (part, repr(part))]
    arms = any(path[0] == "arms" for path in paths)
    return names_one_of(problem, names) or (arms and "arm" in problem)


@pytest.fixture(scope="module")
def experiment_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("experiment-files"), itertools.count()


@settings(FUZZ, max_examples=40)
@given(drawn=experiment_files())
@example(drawn=(tomli_w.dumps(edited(VALID_EXPERIMENT, ("arms", 0), 5)).encode(), [("arms", 0)]))  # AttributeError
@example(  # TypeError out of the paper's numbers, a traceback
    drawn=(tomli_w.dumps(edited(VALID_EXPERIMENT, ("arms", 0, "paper", "final"), {"mean": [1]})).encode(), [])
)
@example(drawn=(b"\xff\xfe[experiment]", []))  # UnicodeDecodeError, a traceback
def test_an_experiment_file_loads_or_the_error_names_the_file_and_the_key(drawn, experiment_folder):
    text, changed = drawn
    folder, numbers = experiment_folder
    path = folder / f"experiment-{next(numbers)}.toml"
    path.write_bytes(text)
    try:
        load_experiment(path, APP)
        note("loaded")
    except ExperimentError as err:
        note("refused" if changed else "refused: not TOML, or damaged")
        message = str(err)
        assert str(path) in message, message
        problems = [line.removeprefix("  - ") for line in message.split("\n")[1:]]
        for problem in problems if changed else []:
            assert names_the_changed_key(problem, changed), f"{problem!r} names none of {changed}"


def test_an_experiment_path_that_is_a_folder_is_named(tmp_path):
    with pytest.raises(ExperimentError, match=f"experiment file {re.escape(str(tmp_path))} cannot be read"):
        load_experiment(tmp_path, APP)  # was an IsADirectoryError


# --- the dataset setting ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """Folders and files a ``dataset`` value may point at, none of them a dataset."""
    root = tmp_path_factory.mktemp("places")
    (root / "empty").mkdir()
    (root / "train-only").mkdir()
    (root / "train-only" / "train.parquet").write_bytes(b"PAR1")
    (root / "a-file.txt").write_text("not a dataset")
    return {
        "empty folder": str(root / "empty"),
        "folder with train.parquet only": str(root / "train-only"),
        "a file": str(root / "a-file.txt"),
        "a parquet file": str(root / "train-only" / "train.parquet"),
        "missing": str(root / "nowhere"),
        "the repository": str(REPO),
    }


@settings(FUZZ, max_examples=40)
@given(
    value=st.one_of(
        st.text(max_size=20),
        st.sampled_from(["digits", " digits ", "", ".", "..", "~", "/", "owner/name", "./x", "a/b/c", "digits/"]),
        st.sampled_from(["empty folder", "folder with train.parquet only", "a file", "a parquet file", "missing"]),
        st.just("the repository"),
    )
)
@example(value="nobody/nothing")  # a Hub id that cannot be reached: a ConnectionError out of datasets
def test_any_dataset_value_is_accepted_or_refused_naming_dataset(value, places):
    value = places.get(value, value)
    problems = refusal({**APP, "dataset": value}, None)
    assert problems or value.strip() == "digits", f"dataset = {value!r} was accepted"
    assert_clear(problems, ["dataset"])
    assert all(problem.startswith("dataset = ") for problem in problems), problems


# --- bad data files -----------------------------------------------------------------------------------------------

SITE_ROWS = 60


def png(size: int, value: int = 0) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((size, size), value, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def image_split(sizes: list[int], labels: list[int] | None = None, with_label: bool = True) -> datasets.Dataset:
    """Encoded grayscale images (the Hub's layout) of the given sizes, with labels 0..9 unless told."""
    columns: dict[str, Any] = {
        "image": [{"bytes": png(size, 7 * k % 256), "path": None} for k, size in enumerate(sizes)]
    }
    features = {"image": datasets.Image()}
    if with_label:
        columns["label"] = labels if labels is not None else [k % 10 for k in range(len(sizes))]
        features["label"] = datasets.Value("int64")
    return datasets.Dataset.from_dict(columns, features=datasets.Features(features))


@pytest.fixture(scope="module")
def real_split(tmp_path_factory) -> Path:
    """A real split file: the local MNIST copy's test split, or the digits written the same way."""
    shared = SHARED_DATASETS / "mnist" / "test.parquet"
    if shared.is_file():
        return shared
    path = tmp_path_factory.mktemp("real") / "test.parquet"
    image_split([8] * 360).to_parquet(str(path))
    return path


@pytest.fixture(scope="module", autouse=True)
def private_arrow_cache(tmp_path_factory):
    """The Arrow caches of these bad folders stay out of the shared Hugging Face cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf-cache"))
        yield


def damaged_folder(root: Path, damage: str, real_split: Path) -> tuple[Path, str]:
    """A dataset folder whose train.parquet has ``damage``; returns it and the fragment its message must hold."""
    folder = root / damage
    folder.mkdir()
    train, test = folder / "train.parquet", folder / "test.parquet"
    image_split([28] * SITE_ROWS).to_parquet(str(test))
    whole = real_split.read_bytes()
    if damage == "truncated":
        train.write_bytes(whole[: len(whole) // 2])
        return folder, "truncated, corrupt or not parquet"
    if damage == "corrupt":
        train.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
        return folder, "truncated, corrupt or not parquet"
    if damage == "damaged-inside":  # the footer intact, the data before it not
        train.write_bytes(whole[:100] + bytes(len(whole) // 2 - 100) + whole[len(whole) // 2 :])
        return folder, "corrupt"
    if damage == "no-label":
        image_split([28] * SITE_ROWS, with_label=False).to_parquet(str(train))
        return folder, "no label column"
    if damage == "negative-labels":
        image_split([28] * SITE_ROWS, labels=[-1] * SITE_ROWS).to_parquet(str(train))
        return folder, "-1"
    if damage == "mixed-sizes":
        image_split([28] * 5 + [20] + [28] * (SITE_ROWS - 6)).to_parquet(str(train))
        return folder, "20x20"
    if damage == "huge-label":  # was: "model = 'lenet5' needs about 2,898.3 GiB to train"
        labels = [k % 10 for k in range(SITE_ROWS)]
        labels[5] = 2_000_000_000
        image_split([28] * SITE_ROWS, labels=labels).to_parquet(str(train))
        return folder, "row 5 of the label column 'label' holds 2000000000; accepted: integer labels 0..K-1 with K"
    raise AssertionError(damage)


DAMAGES = ["truncated", "corrupt", "damaged-inside", "no-label", "negative-labels", "mixed-sizes", "huge-label"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_bad_file_in_the_dataset_folder_stops_the_run_before_training(damage, tmp_path, real_split):
    folder, fragment = damaged_folder(tmp_path, damage, real_split)
    (problem,) = refusal({**APP, "dataset": str(folder)}, NODES)
    assert problem.startswith(f"dataset = {str(folder)!r}: {folder / 'train.parquet'}"), problem
    assert fragment in problem and "accepted" in problem and "Traceback" not in problem


@pytest.mark.parametrize(("damage", "name_it_mnist"), [*((damage, False) for damage in DAMAGES), ("mixed-sizes", True)])
def test_a_bad_file_in_a_sites_own_folder_is_named_by_the_site(damage, name_it_mnist, tmp_path, real_split):
    folder, fragment = damaged_folder(tmp_path, damage, real_split)
    if name_it_mnist:  # published statistics: its images are decoded first when the partition loads
        shutil.move(folder, tmp_path / "mnist")
        folder = tmp_path / "mnist"
    run_config = {**APP, "device": "cpu", "dataset": str(folder.parent / "good")}
    good = folder.parent / "good"
    good.mkdir()
    for split in ("train", "test"):
        image_split([28] * SITE_ROWS).to_parquet(str(good / f"{split}.parquet"))
    context = Context(
        run_id=1, node_id=7, node_config={"data-dir": str(folder)}, state=RecordDict(), run_config=run_config
    )
    with pytest.raises(ValueError) as raised:
        client_app.local_data(settings_from(run_config), context)
    message = str(raised.value)
    assert str(folder / "train.parquet") in message and fragment in message and "accepted" in message, message


def test_a_column_in_one_split_only_is_named_with_both_files(tmp_path):
    """Was: "cannot be loaded (DatasetGenerationError: An error occurred while generating the dataset)"."""
    image_split([28] * SITE_ROWS).to_parquet(str(tmp_path / "train.parquet"))
    image_split([28] * SITE_ROWS).add_column("extra", list(range(SITE_ROWS))).to_parquet(str(tmp_path / "test.parquet"))
    (problem,) = refusal({**APP, "dataset": str(tmp_path), "model": "lenet5"})
    assert problem == (
        f"dataset = {str(tmp_path)!r}: the column 'extra' is in {tmp_path / 'test.parquet'} only; accepted: the same "
        "columns in both splits"
    )


def test_parquet_written_with_plain_pyarrow_is_read_as_encoded_images(tmp_path):
    """An MNIST-like parquet without the datasets library's schema metadata (every image 28x28) was refused as
    "the arrays in column 'image' differ in shape": its images are the struct of bytes and path an Image feature
    is stored as. It is checked, split and decoded as images, end to end."""
    for split in ("train", "test"):
        table = image_split([28] * SITE_ROWS).data.table
        pq.write_table(table.replace_schema_metadata(None), tmp_path / f"{split}.parquet")
    assert pq.read_schema(tmp_path / "train.parquet").metadata is None
    config = {"dataset": str(tmp_path), "model": "lenet5", "num-server-rounds": 1, "local-epochs": 1}
    assert refusal({**APP, **config}) == []
    folder = run_in_process({**config, "output-dir": str(tmp_path / "out"), "run-name": "plain"})
    assert len(read_metrics(folder)) == 1 and read_metrics(folder)[0]["clients"]
