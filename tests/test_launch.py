"""Fast unit tests of the pure parts of fedweigh.launch (no SuperLink is started)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from fedweigh import cli
from fedweigh.launch.commands import (
    COMPLETED,
    build_federation_config,
    flwr_run_command,
    parse_run_id,
    parse_run_status,
    simulation_env,
    superlink_command,
)
from fedweigh.launch.connection import merge_connection, resolve_flwr_home, update_connection_text, write_connection
from fedweigh.launch.processes import descendants, process_table
from fedweigh.launch.progress import PendingRun, RunsProgress
from fedweigh.launch.runconfig import (
    build_run_config_arg,
    default_run_name,
    format_toml_value,
    load_app_config,
    parse_run_config,
    prepare_run_config,
    resolve_dataset,
    resolve_output_dir,
    results_dir_for,
)
from fedweigh.launch.simulation import RunOutcome
from fedweigh.results import Checkpoint
from fedweigh.run_folder import CHECKPOINT_FILE
from fedweigh.settings import nest

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

APP_DEFAULTS = {
    "strategy": "fedavg",
    "seed": 1,
    "learning-rate": 0.05,
    "output-dir": "outputs",
    "run-name": "",
    "resume-from": "",
    "dataset": "digits",
    "augment": True,
    "fedprox.proximal-mu": 0.01,
    "fedoui.window": 5,
    "num-server-rounds": 5,
}


# ---------------------------------------------------------------- config.toml


def test_merge_connection_keeps_other_entries():
    cfg = {
        "superlink": {
            "default": "mine",
            "mine": {"address": "10.0.0.1:9093", "root-certificates": "/c.pem"},
            "local": {"address": ":local:", "options": {"num-supernodes": 3}},
        },
        "other": {"x": 1},
    }
    merged = merge_connection(cfg, "fedweigh-sim", "127.0.0.1:39191")
    assert merged["superlink"]["fedweigh-sim"] == {
        "address": "127.0.0.1:39191",
        "insecure": True,
    }
    assert merged["superlink"]["default"] == "mine"
    assert merged["superlink"]["mine"] == cfg["superlink"]["mine"]
    assert merged["superlink"]["local"]["options"] == {"num-supernodes": 3}
    assert merged["other"] == {"x": 1}
    assert "fedweigh-sim" not in cfg["superlink"]  # input not mutated


def test_update_connection_text_creates_flower_default_when_missing():
    text = update_connection_text(None, "fedweigh-sim", "127.0.0.1:39191")
    parsed = tomllib.loads(text)
    assert parsed["superlink"]["default"] == "local"
    assert parsed["superlink"]["local"] == {"address": ":local:"}
    assert parsed["superlink"]["supergrid"]["address"] == "api.flower.ai"
    assert parsed["superlink"]["fedweigh-sim"] == {
        "address": "127.0.0.1:39191",
        "insecure": True,
    }


def test_update_connection_text_appends_and_keeps_comments():
    existing = (
        "# my flower config\n"
        "[superlink]\n"
        'default = "prod"  # keep me\n\n'
        "[superlink.prod]\n"
        'address = "flower.example.org:443"\n'
        'root-certificates = "/etc/ca.pem"\n'
    )
    text = update_connection_text(existing, "fedweigh-sim", "127.0.0.1:4000")
    assert text.startswith(existing.rstrip("\n"))
    assert "# keep me" in text
    parsed = tomllib.loads(text)
    assert parsed["superlink"]["default"] == "prod"
    assert parsed["superlink"]["prod"]["address"] == "flower.example.org:443"
    assert parsed["superlink"]["fedweigh-sim"]["address"] == "127.0.0.1:4000"


def test_update_connection_text_unchanged_returns_none():
    text = update_connection_text(None, "fedweigh-sim", "127.0.0.1:39191")
    assert update_connection_text(text, "fedweigh-sim", "127.0.0.1:39191") is None


def test_update_connection_text_rewrites_changed_port_keeping_others():
    text = update_connection_text(None, "fedweigh-sim", "127.0.0.1:39191")
    new = update_connection_text(text, "fedweigh-sim", "127.0.0.1:40000")
    parsed = tomllib.loads(new)
    assert parsed["superlink"]["fedweigh-sim"]["address"] == "127.0.0.1:40000"
    assert parsed["superlink"]["local"] == {"address": ":local:"}
    assert parsed["superlink"]["default"] == "local"


def test_update_connection_text_inline_superlink_table_falls_back_to_rewrite():
    existing = 'superlink = { default = "x", x = { address = "h:1" } }\n'
    parsed = tomllib.loads(update_connection_text(existing, "sim", "127.0.0.1:5"))
    assert parsed["superlink"]["x"] == {"address": "h:1"}
    assert parsed["superlink"]["sim"] == {"address": "127.0.0.1:5", "insecure": True}


def test_update_connection_text_rejects_odd_names():
    with pytest.raises(ValueError, match="connection name"):
        update_connection_text(None, "has space", "127.0.0.1:1")


def test_write_connection_roundtrip(tmp_path: Path):
    home = tmp_path / ".flwr"
    path = write_connection(home, "fedweigh-sim", "127.0.0.1:39191")
    first = path.read_text()
    write_connection(home, "fedweigh-sim", "127.0.0.1:39191")
    assert path.read_text() == first  # idempotent, no rewrite
    write_connection(home, "other", "127.0.0.1:1")
    parsed = tomllib.loads(path.read_text())
    assert {"fedweigh-sim", "other", "local"} <= set(parsed["superlink"])


def test_resolve_flwr_home(tmp_path: Path):
    assert resolve_flwr_home(tmp_path, env={}) == tmp_path.resolve() / ".flwr"
    assert resolve_flwr_home(tmp_path, env={"FLWR_HOME": str(tmp_path / "h")}) == (tmp_path / "h")


# ---------------------------------------------------------------- run-config strings


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, "true"),
        (False, "false"),
        (3, "3"),
        (0.05, "0.05"),
        (1e-05, "1e-05"),
        (float("inf"), "inf"),
        ("digits", "'digits'"),
        ("a b c", "'a b c'"),
        ("/data/my set/x", "'/data/my set/x'"),
        ("C:\\data\\x", "'C:\\data\\x'"),
        ("it's", '"it\'s"'),
        ("", "''"),
    ],
)
def test_format_toml_value(value, expected):
    assert format_toml_value(value) == expected


def test_format_toml_value_rejects_unrepresentable():
    with pytest.raises(ValueError):
        format_toml_value("both ' and \"")
    with pytest.raises(ValueError):
        format_toml_value("two\nlines")
    with pytest.raises(TypeError):
        format_toml_value([1, 2])


def test_format_toml_value_numpy_scalars():
    np = pytest.importorskip("numpy")
    assert format_toml_value(np.float32(0.5)) == "0.5"
    assert format_toml_value(np.int64(7)) == "7"


def test_format_toml_value_path():
    assert format_toml_value(Path("/a b/c")) == "'/a b/c'"


def test_build_run_config_arg_order_and_quoting():
    arg = build_run_config_arg({"strategy": "fedoui", "seed": 3, "output-dir": "/tmp/my out", "augment": False})
    assert arg == "strategy='fedoui' seed=3 output-dir='/tmp/my out' augment=false"


def test_build_run_config_arg_rejects_bad_keys():
    with pytest.raises(ValueError):
        build_run_config_arg({"bad key": 1})
    with pytest.raises(ValueError):
        build_run_config_arg({"a=b": 1})


ROUNDTRIP = {
    "strategy": "fedavg",
    "seed": 7,
    "learning-rate": 0.1,
    "augment": True,
    "output-dir": "/tmp/with space/out",
    "dataset": "C:\\Users\\me\\data",
    "note": "it's fine",
    "run-name": "x=y",
    "fedprox.proximal-mu": 0.001,
}


def test_run_config_string_roundtrips_through_flwr_parser():
    from flwr.common.config import parse_config_args

    assert parse_config_args([build_run_config_arg(ROUNDTRIP)]) == ROUNDTRIP


def test_run_config_string_roundtrips_through_our_parser():
    assert parse_run_config([build_run_config_arg(ROUNDTRIP)]) == ROUNDTRIP


def test_parse_run_config_like_flwr():
    got = parse_run_config(["strategy='fedoui' seed=3", 'note="a b" fedprox.proximal-mu=0.1 augment=false'])
    assert got == {
        "strategy": "fedoui",
        "seed": 3,
        "note": "a b",
        "fedprox.proximal-mu": 0.1,
        "augment": False,
    }


def test_parse_run_config_bare_words_are_strings():
    assert parse_run_config(["strategy=fedoui dataset=./data/x"]) == {
        "strategy": "fedoui",
        "dataset": "./data/x",
    }


def test_parse_run_config_rejects_unquoted_spaces():
    with pytest.raises(ValueError, match="world"):
        parse_run_config(["note=hello world"])


def test_parse_run_config_toml_file(tmp_path: Path):
    f = tmp_path / "over.toml"
    f.write_text('strategy = "ufl"\n[fedprox]\nproximal-mu = 0.5\n')
    assert parse_run_config([str(f)]) == {"strategy": "ufl", "fedprox.proximal-mu": 0.5}
    with pytest.raises(ValueError):
        parse_run_config([str(f), "seed=1"])


def test_parse_run_config_empty():
    assert parse_run_config(None) == {}
    assert parse_run_config(["", "  "]) == {}


def test_build_federation_config():
    assert build_federation_config(10, 1, 0.0) == (
        "num-supernodes=10 client-resources-num-cpus=1 client-resources-num-gpus=0.0"
    )
    assert build_federation_config(4, 2, 0.25, {"init-args-num-cpus": 2}).endswith(
        "client-resources-num-gpus=0.25 init-args-num-cpus=2"
    )
    with pytest.raises(ValueError):
        build_federation_config(0)
    with pytest.raises(ValueError):
        build_federation_config(2, 0)


def test_federation_config_is_accepted_by_flwr():
    from flwr.common.config import parse_config_args
    from flwr.supercore.utils import simulation_config_from_json

    parsed = parse_config_args([build_federation_config(7, 1, 0.5)])
    sim = simulation_config_from_json({k.replace("-", "_"): v for k, v in parsed.items()})
    assert sim.num_supernodes == 7
    assert sim.client_resources_num_cpus == 1
    assert sim.client_resources_num_gpus == 0.5


# ---------------------------------------------------------------- paths & run name


def test_resolve_output_dir(tmp_path: Path):
    assert resolve_output_dir("outputs", tmp_path) == tmp_path / "outputs"
    assert resolve_output_dir("../x/./y", tmp_path / "a") == tmp_path / "x" / "y"
    assert resolve_output_dir(None, tmp_path) == tmp_path / "outputs"
    assert resolve_output_dir("", tmp_path) == tmp_path / "outputs"
    assert resolve_output_dir("/abs/out", tmp_path) == Path("/abs/out")
    assert resolve_output_dir("~/o", tmp_path) == Path.home() / "o"


def test_resolve_dataset(tmp_path: Path):
    (tmp_path / "data" / "femnist").mkdir(parents=True)
    assert resolve_dataset("data/femnist", tmp_path) == str(tmp_path / "data" / "femnist")
    assert resolve_dataset("./data/../data", tmp_path) == str(tmp_path / "data")
    # names / hub ids that are not local folders stay untouched
    assert resolve_dataset("digits", tmp_path) == "digits"
    assert resolve_dataset("uoft-cs/cifar10", tmp_path) == "uoft-cs/cifar10"
    assert resolve_dataset("/abs/path", tmp_path) == "/abs/path"
    assert resolve_dataset("", tmp_path) == ""
    assert resolve_dataset(3, tmp_path) == 3


def test_default_run_name():
    assert default_run_name("fedoui", NOW) == "fedoui-20260102T030405Z"
    plus2 = timezone(timedelta(hours=2))
    assert default_run_name("ufl", NOW.astimezone(plus2)) == "ufl-20260102T030405Z"
    assert default_run_name("a b/c", NOW) == "a_b_c-20260102T030405Z"
    assert default_run_name("", NOW) == "run-20260102T030405Z"
    assert default_run_name(None).startswith("run-")


def test_prepare_run_config_defaults(tmp_path: Path):
    cfg = prepare_run_config({}, APP_DEFAULTS, tmp_path, now=NOW)
    assert cfg == {
        "output-dir": str(tmp_path / "outputs"),
        "run-name": "fedavg-20260102T030405Z",
    }
    assert results_dir_for(cfg) == tmp_path / "outputs" / "fedavg-20260102T030405Z"


def test_prepare_run_config_strategy_override_and_paths(tmp_path: Path):
    (tmp_path / "mydata").mkdir()
    cfg = prepare_run_config(
        {"strategy": "feddle", "output-dir": "res", "dataset": "mydata", "learning-rate": 1, "seed": 2},
        APP_DEFAULTS,
        tmp_path,
        now=NOW,
    )
    assert cfg["run-name"] == "feddle-20260102T030405Z"
    assert cfg["output-dir"] == str(tmp_path / "res")
    assert cfg["dataset"] == str(tmp_path / "mydata")
    assert cfg["learning-rate"] == 1.0 and isinstance(cfg["learning-rate"], float)
    assert cfg["seed"] == 2 and isinstance(cfg["seed"], int)


def recorded_run(folder: Path, **settings) -> Path:
    """A run folder whose config.json records ``settings`` (flat keys) over the app's defaults."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"settings": nest({**APP_DEFAULTS, **settings})}))
    return folder


def test_a_resumed_run_continues_in_its_folder_with_the_settings_it_was_made_with(tmp_path: Path):
    """``resume-from`` alone continues the run as it was: its folder, and every setting config.json recorded."""
    folder = recorded_run(tmp_path / "outputs" / "x", seed=7, strategy="fedoui", **{"fedoui.window": 3})
    cfg = prepare_run_config({"resume-from": "outputs/x", "num-server-rounds": 8}, APP_DEFAULTS, tmp_path, now=NOW)
    assert cfg["resume-from"] == str(folder) and results_dir_for(cfg) == folder
    assert cfg["run-name"] == "x" and cfg["output-dir"] == str(folder.parent)  # not a generated name
    assert (cfg["seed"], cfg["strategy"], cfg["fedoui.window"], cfg["num-server-rounds"]) == (7, "fedoui", 3, 8)
    assert "learning-rate" not in cfg  # the defaults are the app's: not repeated
    given = prepare_run_config({"resume-from": str(folder), "seed": 9}, APP_DEFAULTS, tmp_path)
    assert given["seed"] == 9  # what is given is sent: the check before the run says whether it may differ


@pytest.mark.parametrize(("key", "value"), [("run-name", "y"), ("output-dir", "elsewhere")])
def test_a_resumed_run_refuses_to_be_placed_in_another_folder(tmp_path: Path, key, value):
    folder = recorded_run(tmp_path / "outputs" / "x")
    with pytest.raises(ValueError, match=f"{key} = '{value}' with resume-from = .*continues in its own folder"):
        prepare_run_config({"resume-from": str(folder), key: value}, APP_DEFAULTS, tmp_path)
    same = {"run-name": "x", "output-dir": "outputs"}[key]
    assert (
        results_dir_for(prepare_run_config({"resume-from": str(folder), key: same}, APP_DEFAULTS, tmp_path)) == folder
    )


def test_prepare_run_config_keeps_explicit_run_name(tmp_path: Path):
    cfg = prepare_run_config({"run-name": "mine"}, APP_DEFAULTS, tmp_path, now=NOW)
    assert cfg["run-name"] == "mine"


def test_prepare_run_config_default_name_avoids_existing_results(tmp_path: Path):
    (tmp_path / "outputs" / "fedavg-20260102T030405Z").mkdir(parents=True)
    (tmp_path / "outputs" / "fedavg-20260102T030405Z-2").mkdir()
    cfg = prepare_run_config({}, APP_DEFAULTS, tmp_path, now=NOW)
    assert cfg["run-name"] == "fedavg-20260102T030405Z-3"


def test_prepare_run_config_rejects_unknown_keys(tmp_path: Path):
    with pytest.raises(ValueError, match="bogus"):
        prepare_run_config({"bogus": 1}, APP_DEFAULTS, tmp_path)


def test_a_misspelled_setting_gets_the_closest_names_not_every_key(tmp_path: Path):
    with pytest.raises(ValueError) as refused:
        prepare_run_config({"num-server-round": 2}, APP_DEFAULTS, tmp_path)
    message = str(refused.value)
    assert "unknown setting 'num-server-round' (did you mean num-server-rounds?)" in message
    assert "adam-beta1" not in message and len(message) < 300  # was: all ~150 keys


def test_a_setting_given_twice_is_refused_not_silently_the_last():
    with pytest.raises(ValueError, match=r"seed is given twice in --run-config \(seed=1, then seed=2\)"):
        parse_run_config(["seed=1 seed=2"])
    with pytest.raises(ValueError, match="seed is given twice"):
        parse_run_config(["seed=1", "strategy=fedoui seed=1"])


def test_prepare_run_config_app_without_output_keys(tmp_path: Path):
    assert prepare_run_config({"seed": 3}, {"seed": 1}, tmp_path) == {"seed": 3}
    assert results_dir_for({"seed": 3}) is None


def test_load_app_config_matches_repo_pyproject():
    root = Path(__file__).resolve().parents[1]
    cfg = load_app_config(root)
    for key in ("strategy", "output-dir", "run-name", "dataset"):
        assert key in cfg
    assert "fedprox.proximal-mu" in cfg  # nested tables are flattened like flwr does


# ---------------------------------------------------------------- commands & parsing


def test_superlink_command_disables_uv_sync():
    cmd = superlink_command(39191)
    assert Path(cmd[0]).name == "flower-superlink"
    assert "--disable-runtime-dependency-installation" in cmd
    assert "--simulation" in cmd and "--insecure" in cmd
    assert cmd[cmd.index("--port") + 1] == "39191"
    assert "--database" not in cmd
    assert superlink_command(1, database="/x/state.db")[-2:] == ["--database", "/x/state.db"]


def test_flwr_run_command(tmp_path: Path):
    cmd = flwr_run_command(tmp_path, "fedweigh-sim", "num-supernodes=2", {"seed": 1})
    assert cmd[:3] == [sys.executable, "-m", "fedweigh.launch.flwr_cli"]  # Flower's CLI, see test_flower_walk.py
    assert cmd[3:6] == ["run", str(tmp_path), "fedweigh-sim"]
    assert cmd[cmd.index("--federation-config") + 1] == "num-supernodes=2"
    assert cmd[cmd.index("--run-config") + 1] == "seed=1"
    assert cmd[-1] == "--stream"
    assert "--run-config" not in flwr_run_command(tmp_path, "c", "n=1", {}, stream=False)


def test_simulation_env(tmp_path: Path):
    env = simulation_env(tmp_path / ".flwr", base={"PATH": "/usr/bin", "MKL_NUM_THREADS": "4"})
    assert env["FLWR_HOME"] == str(tmp_path / ".flwr")
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["MKL_NUM_THREADS"] == "4"  # explicit user setting wins
    assert env["RAY_worker_niceness"] == "0"  # ClientApp actors train at normal priority
    assert env["MALLOC_ARENA_MAX"] == "1"  # the ServerApp's thread keeps its freed memory (allocator.py)
    assert env["PATH"].endswith("/usr/bin")
    assert simulation_env(tmp_path, base={"MALLOC_ARENA_MAX": "4"})["MALLOC_ARENA_MAX"] == "4"  # the user's value


def test_parse_run_id():
    assert parse_run_id("Successfully started run 7133483675557156164\n") == 7133483675557156164
    assert parse_run_id("\x1b[32mSuccessfully started run 42\x1b[0m") == 42
    assert parse_run_id("INFO : Starting logstream for run_id `42`") is None


def test_parse_run_status():
    ok = (
        '{"success": true, "runs": [{"run-id": "5", "status": "finished:failed", '
        '"status-details": "Simulation failed"}]}'
    )
    assert parse_run_status(ok, 5) == ("finished:failed", "Simulation failed")
    running = '{"success": true, "runs": [{"run-id": "5", "status": "running", "status-details": "N/A"}]}'
    assert parse_run_status(running, 5) == ("running", "")
    # flwr ls exits 0 on errors and reports success=false
    err = '{"success": false, "error-message": "Run ID not found."}'
    assert parse_run_status(err, 5) == (None, "Run ID not found.")
    assert parse_run_status("garbage", 5)[0] is None


# ---------------------------------------------------------------- process tree (Linux)


@pytest.mark.deploy
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_process_tree_terminate_and_orphans(tmp_path: Path):
    import subprocess
    import time

    from fedweigh.launch.processes import ProcessTree, process_table

    # root (bash) -> middle (bash) -> sleep; killing the middle orphans the sleep,
    # which the tree still remembers (like Ray's agents after a stopped run).
    ready = tmp_path / "ready"
    script = f"bash -c 'sleep 30 & echo $! > {ready}.sleep; touch {ready}; wait' & wait"
    root = subprocess.Popen(["bash", "-c", script])
    try:
        deadline = time.monotonic() + 10
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        sleep_pid = int(Path(f"{ready}.sleep").read_text())
        tree = ProcessTree(root.pid, root)
        assert sleep_pid in {p for p, _ in tree.known}
        middle = process_table()[sleep_pid][0]
        subprocess.run(["kill", "-KILL", str(middle)], check=True)
        time.sleep(0.3)
        assert sleep_pid in {p for p, _ in tree.orphans(tree.refresh())}
        tree.kill_orphans()
        table = process_table()  # a killed orphan may linger as a zombie of init
        assert sleep_pid not in table or table[sleep_pid][2] == "Z"
        tree.terminate(grace=2.0, settle=0.2)
        assert root.wait(timeout=5) is not None
    finally:
        if root.poll() is None:
            root.kill()


def test_fedweigh_list_shows_every_name_a_run_config_may_use(capsys):
    from fedweigh.cli import main
    from fedweigh.methods.catalog import SIGNALS, STEPS
    from fedweigh.methods.registry import METHODS, RULES
    from fedweigh.models import model_names

    assert main(["list"]) == 0
    printed = capsys.readouterr().out
    for name in [*METHODS, *RULES, *STEPS, *SIGNALS, *model_names()]:
        assert f"  {name} " in printed, name


# ---------------------------------------------------------------- a launcher killed, a run that stopped

LAUNCHER = """
import os, sys, time
from fedweigh.launch.processes import Guardian, descendants, process_table, spawn_logged

with open(sys.argv[1], "wb") as log:
    service = spawn_logged(["sh", "-c", "sleep 300 & sleep 300"], log, os.environ)
while not descendants(service.pid, process_table()):  # the tree is whole before the guardian looks at it
    time.sleep(0.01)
guardian = Guardian(service.pid)
if sys.argv[2] == "release":
    guardian.release()
print(service.pid, flush=True)
time.sleep(300)
"""


def alive(pids: set[int]) -> set[int]:
    table = process_table()
    return {pid for pid in pids if pid in table and table[pid][2] != "Z"}


@pytest.mark.deploy
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("release", [False, True], ids=["killed", "released"])
def test_a_service_ends_with_the_launcher_that_started_it_even_after_sigkill(tmp_path: Path, release):
    """``kill -9`` of ``fedweigh simulate`` left its SuperLink and SuperExec running; its guardian now stops the
    whole tree (the service and the child it forked). A guardian told ``release`` leaves the service alone."""
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path / "log"), "release" if release else "guard"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert launcher.stdout is not None
    service = int(launcher.stdout.readline())
    tree = {service} | {pid for pid, _ in descendants(service, process_table())}
    assert len(tree) >= 2  # the shell and its children
    launcher.kill()
    launcher.wait()
    try:
        if release:
            assert alive(tree) == tree  # the guardian exited when released: nothing will stop them
            return
        deadline = time.monotonic() + 60
        while alive(tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(tree)
    finally:
        for pid in alive(tree):
            os.kill(pid, signal.SIGKILL)


def test_the_progress_line_of_a_failed_run_says_failed():
    out = io.StringIO()
    progress = RunsProgress([PendingRun("x", 3)], label="simulate", out=out)
    progress.start_run(progress.runs[0])
    progress.finish_run(False)
    assert out.getvalue().splitlines()[-1].startswith("[simulate] x: failed")  # was: "x: done"


def written(path: Path, text: str, age: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if age:
        stamp = time.time() - age
        os.utime(path, (stamp, stamp))
    return path


def test_an_outcome_reads_only_what_its_own_run_wrote(tmp_path: Path):
    """A failed resume printed the ``final_accuracy`` an earlier run had left in the folder."""
    folder = tmp_path / "x"
    written(folder / "summary.json", '{"final_accuracy": 0.99, "rounds": 3}', age=3600)
    outcome = RunOutcome(1, "finished:failed", folder, submitted=time.time())
    assert outcome.summary() is None and not outcome.results_complete(3)
    written(folder / "summary.json", '{"final_accuracy": 0.5, "rounds": 3}')
    assert outcome.summary() == {"final_accuracy": 0.5, "rounds": 3} and not outcome.results_complete(3)
    written(folder / "model.pt", "")
    assert outcome.results_complete(3) and not outcome.results_complete(4)


class ScriptedSimulation:
    """Stands in for :class:`LocalSimulation` in ``fedweigh simulate``: its run writes what ``script`` writes."""

    script: Any = None
    calls = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.startup_seconds = self.stop_seconds = None

    def __enter__(self) -> ScriptedSimulation:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def run(self, overrides: dict[str, Any], **kwargs: Any) -> RunOutcome:
        ScriptedSimulation.calls += 1
        submitted = time.time()
        folder = Path(overrides["output-dir"]) / overrides["run-name"]
        status = ScriptedSimulation.script(folder)
        return RunOutcome(11, status, folder, overrides, "" if status == COMPLETED else "No heartbeat", {}, submitted)


def simulate(monkeypatch, capsys, script, config: str) -> tuple[int, str]:
    monkeypatch.setattr(cli, "LocalSimulation", ScriptedSimulation)
    ScriptedSimulation.script, ScriptedSimulation.calls = script, 0
    code = cli.main(["simulate", "--app", str(REPO), "--port", "1", "--num-supernodes", "4", "--run-config", config])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_run_killed_mid_way_says_how_to_continue_it_and_shows_no_other_runs_result(tmp_path, monkeypatch, capsys):
    """After ``kill -9`` of the simulation process: ``finished:failed (No heartbeat...)`` and not a word on
    ``resume-from``; and the summary an earlier run had left was printed as this run's."""

    def killed_after_round_1(folder: Path) -> str:
        Checkpoint(1, {}, {}).save(written(folder / "metrics.jsonl", "").parent / CHECKPOINT_FILE)
        written(folder / "summary.json", '{"final_accuracy": 0.99, "rounds": 3}', age=3600)
        return "finished:failed"

    code, printed = simulate(monkeypatch, capsys, killed_after_round_1, f"output-dir='{tmp_path}' run-name=x")
    assert code == 1 and "final_accuracy" not in printed
    assert "run 11: finished:failed (No heartbeat)" in printed
    command = f"fedweigh simulate --app {REPO} --num-supernodes 4 --run-config \"resume-from='{tmp_path / 'x'}'\""
    assert f"the run stopped after round 1 of 5; its checkpoint continues it:\n  {command}" in printed


def test_a_run_killed_after_writing_all_its_results_is_reported_complete(tmp_path, monkeypatch, capsys):
    def killed_after_the_last_files(folder: Path) -> str:
        written(folder / "summary.json", '{"final_accuracy": 0.9, "rounds": 5, "rounds_not_aggregated": [2]}')
        written(folder / "model.pt", "")
        return "finished:failed"

    code, printed = simulate(monkeypatch, capsys, killed_after_the_last_files, f"output-dir='{tmp_path}' run-name=x")
    assert code == 0 and "final_accuracy: 0.9" in printed
    assert "its results are complete nonetheless: all 5 rounds, model.pt and summary.json were written" in printed
    assert "warning: 1 of 5 rounds were not aggregated (the global model stayed as it was): rounds 2" in printed
    assert "resume-from" not in printed


@pytest.mark.sim
def test_a_resume_with_changed_settings_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    from loopback import run_in_process

    folder = run_in_process({"num-server-rounds": 1, "local-epochs": 1, "output-dir": str(tmp_path), "run-name": "x"})
    config = (folder / "config.json").read_bytes()
    code, printed = simulate(monkeypatch, capsys, None, f"resume-from='{folder}' num-server-rounds=2 model-hidden='32'")
    assert code == 2 and ScriptedSimulation.calls == 0
    assert "model-hidden = '32', but the run in" in printed and "Traceback" not in printed
    assert (folder / "config.json").read_bytes() == config
    code, printed = simulate(monkeypatch, capsys, None, f"resume-from='{folder}'")
    assert code == 2 and "already holds 1 rounds, and num-server-rounds = 1" in printed
