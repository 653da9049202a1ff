"""End to end through Flower: real ``flwr run`` simulations (Ray backend) on the offline digits data.

The runs share one simulation SuperLink and Ray cluster (``shared_simulation``
in conftest); each is a real Flower run, exactly what ``fedweigh simulate``
does for a user. One run's server process is SIGKILLed in the middle of the
run and the run resumed; one config is run three times: as it is, without the
engine's event-driven hand-off, and with the ClientApp in the simulation's own
process instead of Ray actors (``simulation-backend = "in-process"``). One test goes through the ``fedweigh
simulate`` command itself, with a SuperLink and Ray of its own, as the
README's first command does. Every strategy and every rule also run end to
end in ``test_end_to_end.py``, in one process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, SHARED_DATASETS

from fedweigh.cli import main
from fedweigh.launch.commands import COMPLETED
from fedweigh.launch.processes import descendants, free_port, process_table
from fedweigh.results import CHECKPOINT_FILE, MODEL_FILE, SUMMARY_FILE, Checkpoint, read_metrics, without_timing
from fedweigh.rules.base import complement_share_weights

pytestmark = pytest.mark.xdist_group("simulation")

SMALL = {"num-server-rounds": 2, "fraction-train": 0.5, "seed": 3}
IN_PROCESS = {"simulation-backend": "in-process"}
FEDDLE_ASYNC = {
    "strategy": "feddle",
    "server-data": str(SHARED_DATASETS / "mnist"),
    "server-data-size": 128,
    "feddle.search-epochs": 1,
    "num-server-rounds": 4,
    "delay-std": 1.0,
    "max-staleness": 5,
}


# Session-scoped, not module-scoped: pytest-xdist may interleave the tests of one group from several
# modules, and a module fixture would then be torn down and built again.
@pytest.fixture(scope="session")
def output_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("outputs")


def run(simulation, output_dir, name: str, **config):
    """A real run of ``SMALL`` plus ``config``; its log (Flower's and the app's) in ``<output_dir>/<name>.log``."""
    place = {} if "resume-from" in config else {"output-dir": str(output_dir), "run-name": name}  # its own folder
    outcome = simulation.run(
        {**SMALL, **place, **config},
        num_supernodes=4,
        echo=False,
        log_path=output_dir / f"{name}.log",
    )
    assert outcome.ok, f"run {name} ended {outcome.status}: {outcome.details}"
    return outcome.results_dir


def checkpoint_round(folder) -> int:
    """The round of the run's checkpoint, 0 before the first (a checkpoint is replaced whole, never half-written)."""
    try:
        return Checkpoint.load(folder / CHECKPOINT_FILE).round
    except ValueError:  # not there yet
        return 0


def server_processes(simulation) -> dict[int, str]:
    """The ``flwr-simulation`` processes below the SuperLink, pid to command line: the runs' ServerApps."""
    table = process_table()
    found = {}
    for pid, _ in descendants(simulation.process.pid, table):
        try:
            command = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "flwr-simulation" in command:
            found[pid] = command
    return found


def run_killed(simulation, output_dir, name: str, after_round: int, **config) -> dict:
    """A run whose server process is SIGKILLed once round ``after_round``'s checkpoint is on disk.

    Which process is the server: in Flower 1.41 the simulation SuperLink
    (``flower-superlink --simulation``) starts a SuperExec
    (``flower-superexec``, one for the SuperLink's life), which starts one
    ``flwr-simulation`` process per run; that process runs the ServerApp's
    ``main`` (this app's strategy, evaluation, checkpoints) and drives the
    run's ClientApps, which are actors of the shared Ray cluster (below its
    raylet, not below the SuperLink). So ``flwr-simulation`` is the process
    whose death is a server crash: the SuperLink and the Ray cluster survive
    it, as a deployment's SuperLink and SuperNodes survive their ServerApp;
    its actors go with it (Ray ends a dead driver's actors). It is found as
    the one ``flwr-simulation`` below the SuperLink (runs here go one at a
    time). The SuperLink would mark the run failed only when the process's
    heartbeat is overdue (43 s measured); ``flwr stop`` ends it at once.

    The run goes on in a thread; this one polls the checkpoint (whole or
    absent: it is replaced atomically) and kills as soon as it reaches
    ``after_round``, so the server dies while later rounds train.
    """
    outcome = {}

    def submit() -> None:
        overrides = {**SMALL, "output-dir": str(output_dir), "run-name": name, **config}
        outcome["run"] = simulation.run(overrides, num_supernodes=4, echo=False)

    runner = threading.Thread(target=submit, daemon=True)
    runner.start()
    folder, deadline = output_dir / name, time.monotonic() + 600
    while checkpoint_round(folder) < after_round:
        assert runner.is_alive(), f"run {name} ended before round {after_round}: {outcome}"
        assert time.monotonic() < deadline, f"run {name}: no checkpoint of round {after_round} after 600 s"
        runner.join(0.05)  # the polling interval; returns early if the run ends
    servers = server_processes(simulation)
    assert len(servers) == 1, f"run {name}: expected one flwr-simulation below the SuperLink, found {servers}"
    ((server, command),) = servers.items()
    os.kill(server, signal.SIGKILL)
    killed_after = checkpoint_round(folder)
    for run_id in list(simulation.active_runs):
        simulation.stop_run(run_id)
    runner.join(180)
    assert not runner.is_alive(), f"run {name} still going after its server was killed"
    return {"folder": folder, "outcome": outcome["run"], "killed_after": killed_after, "server": command}


@pytest.fixture(scope="session")
def runs(shared_simulation, output_dir):
    """FedAvg, 3 rounds; FLood (client steps and a per-round value over the wire), 2, three times: the second
    time with the engine's event-driven hand-off switched off, the third with the ClientApp in the simulation's
    own process instead of Ray actors; FedAvg, 3 rounds, its server killed after round 1, then
    resumed; Feddle with out-of-distribution server data and delayed clients, 4."""
    flood_config = {"strategy": "flood", "flood.halt-round": 1, "flood.a": 2.0}
    straight = run(shared_simulation, output_dir, "fedavg", **{"num-server-rounds": 3})
    flood = run(shared_simulation, output_dir, "flood", **flood_config)
    again = run(shared_simulation, output_dir, "flood-again", **flood_config, **{"event-driven-simulation": False})
    in_process = run(shared_simulation, output_dir, "flood-in-process", **flood_config, **IN_PROCESS)
    killed = run_killed(shared_simulation, output_dir, "killed", after_round=1, **{"num-server-rounds": 3})
    resumed = run(
        shared_simulation, output_dir, "resumed", **{"num-server-rounds": 3, "resume-from": str(killed["folder"])}
    )
    feddle = run(shared_simulation, output_dir, "feddle", **FEDDLE_ASYNC)
    return {
        "fedavg": straight,
        "flood": flood,
        "flood-again": again,
        "flood-in-process": in_process,
        "killed": killed,
        "resumed": resumed,
        "feddle": feddle,
    }


def test_results_folder_is_complete(runs):
    folder = runs["fedavg"]
    for name in ("config.json", "metrics.jsonl", "checkpoint.pt", "model.pt", "summary.json"):
        assert (folder / name).is_file(), name
    config = json.loads((folder / "config.json").read_text())
    assert config["settings"]["strategy"] == "fedavg" and config["settings"]["num-server-rounds"] == 3
    assert config["instruction"]["local-epochs"] == 3 and config["instruction"]["optimizer"] == "sgd"
    rows = read_metrics(folder)
    assert [row["round"] for row in rows] == [1, 2, 3]
    for row in rows:
        assert 0.0 <= row["accuracy"] <= 1.0 and row["loss"] > 0 and row["seconds"] > 0
        assert len(row["sampled"]) == 2 and len(row["clients"]) == 2
        assert sum(client["weight"] for client in row["clients"]) == pytest.approx(1.0)
        assert all(client["staleness"] == 0 for client in row["clients"])
        # the round's wait for replies holds each client's whole handler, which holds its training
        assert 0 < row["wait_seconds"] <= row["seconds"] and 0 < row["evaluate_seconds"] <= row["seconds"]
        assert all(0 < c["train-seconds"] <= c["client-seconds"] <= row["wait_seconds"] for c in row["clients"])
        # the training thread cannot compute longer than training took (one torch thread), beyond clock granularity
        assert all(0 < c["train-cpu-seconds"] <= c["train-seconds"] + 0.01 for c in row["clients"])
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["final_accuracy"] == rows[-1]["accuracy"] and summary["rounds"] == 3
    state = torch.load(folder / "model.pt")
    assert all(torch.isfinite(tensor).all() for tensor in state.values() if tensor.is_floating_point())


def test_client_steps_and_a_round_value_cross_the_wire(runs):
    rows = read_metrics(runs["flood"])
    assert all(row["aggregated"] for row in rows) and rows[-1]["accuracy"] > 0.15
    assert [row["diagnostics"]["asw-lambda"] for row in rows] == [0.0, 4.0]  # λ(t) = 2a from round T + 1 on
    for row in rows:
        for client in row["clients"]:
            assert client["asw-lambda"] == row["diagnostics"]["asw-lambda"]  # what the client trained with
            assert np.isfinite(client["ood-score"]) and 0.0 < client["pseudo-ood-fraction"] < 0.7


def test_feddle_searches_on_another_dataset_while_updates_arrive_late(runs):
    rows = read_metrics(runs["feddle"])
    assert [row["round"] for row in rows] == [1, 2, 3, 4] and sum(row["aggregated"] for row in rows) >= 2
    late = [c["staleness"] for row in rows for c in row["clients"]]
    assert any(s > 0 for s in late) and any(row["in_flight"] for row in rows)
    searched = [row["diagnostics"] for row in rows if "search-loss-after" in row["diagnostics"]]
    assert searched and all(d["head-loss"] > 0 and len(d["coefficients"]) == d["atlas-size"] for d in searched)
    assert rows[-1]["accuracy"] > 0.15


def test_strategies_see_the_same_clients(runs):
    fedavg, flood = read_metrics(runs["fedavg"]), read_metrics(runs["flood"])
    assert [row["sampled"] for row in fedavg[:2]] == [row["sampled"] for row in flood]


def comparable(folder) -> tuple[str, str]:
    """``metrics.jsonl`` and ``summary.json`` without wall times (and the summary without its folder)."""
    summary = without_timing(json.loads((folder / SUMMARY_FILE).read_text()))
    summary.pop("run_dir")
    return json.dumps(without_timing(read_metrics(folder))), json.dumps(summary)


def assert_same_files(first: Path, second: Path) -> None:
    """Two runs wrote the same metrics and summary (wall times aside) and the same final model, byte for byte."""
    assert comparable(second) == comparable(first)
    assert (second / MODEL_FILE).read_bytes() == (first / MODEL_FILE).read_bytes()


def logs(output_dir: Path, *names: str) -> list[str]:
    """The runs' logs (Flower's and the app's), as :func:`run` wrote them."""
    return [(output_dir / f"{name}.log").read_text() for name in names]


def test_a_run_killed_and_resumed_ends_exactly_where_the_uninterrupted_one_does(runs):
    straight, killed, resumed = runs["fedavg"], runs["killed"], runs["resumed"]
    assert "flwr-simulation" in killed["server"] and killed["outcome"].status != COMPLETED
    assert 1 <= killed["killed_after"] < 3  # the server died with rounds left to train
    assert resumed == killed["folder"]  # a resumed run continues in its own folder
    config = json.loads((resumed / "config.json").read_text())
    assert config["resumed_from_round"] == 0 and config["settings"]["resume-from"] == ""  # the first segment's
    (resumption,) = [json.loads(line) for line in (resumed / "resumes.jsonl").read_text().splitlines()]
    assert resumption["after_round"] == killed["killed_after"]
    assert resumption["changed"] == {"resume-from": {"was": "", "now": str(resumed)}}  # nothing else differs
    assert [row["round"] for row in read_metrics(resumed)] == [1, 2, 3]
    assert comparable(resumed) == comparable(straight)
    final_straight, final_resumed = torch.load(straight / MODEL_FILE), torch.load(resumed / MODEL_FILE)
    assert final_straight.keys() == final_resumed.keys()
    for name, tensor in final_straight.items():
        assert torch.equal(tensor, final_resumed[name]), name


def test_a_config_run_twice_gives_the_same_files_with_or_without_the_event_driven_hand_off(runs, output_dir):
    """Two real simulations of FLood (seeded client sampling, ASW's batch weights, the OOD scores) on CPU.

    The engine's loop is fedweigh's (fedweigh/flower/engine.py) and hands messages on
    when they are stored; the second run switches that off and goes by Flower's
    polling: the very same files come out.
    """
    assert_same_files(runs["flood"], runs["flood-again"])
    driven, polling = logs(output_dir, "flood", "flood-again")
    assert "simulation hand-off: replies event-driven; the engine's loop event-driven" in driven
    assert "Flower's 0.1 s polling (event-driven-simulation = false)" in polling
    assert "Flower's 0.1 s polling" not in driven


def test_the_in_process_backend_computes_what_ray_actors_compute(runs, output_dir):
    """The same FLood run with ``simulation-backend = "in-process"``: the ClientApp handles every message in the
    ServerApp's own process (fedweigh/flower/engine.py), and the very same files come out as with Ray's actors."""
    assert_same_files(runs["flood"], runs["flood-in-process"])
    ray_log, own_log = logs(output_dir, "flood", "flood-in-process")
    assert "the engine's loop event-driven; the ClientApp runs in this process" in own_log
    assert "the engine's loop event-driven; ClientApps in Ray actors" in ray_log


@pytest.mark.xdist_group("cli")  # a SuperLink and Ray of its own: it can run beside the shared simulation
def test_fedweigh_simulate_with_fedprox_training_and_fednolowe_weights(tmp_path, capsys):
    """``fedweigh simulate --run-config "strategy=fedprox aggregation=fednolowe"``, the command as a user runs it."""
    config = f"strategy=fedprox aggregation=fednolowe num-server-rounds=2 seed=3 output-dir='{tmp_path}' run-name=cli"
    code = main(
        ["simulate", "--app", str(REPO), "--port", str(free_port()), "--num-supernodes", "4", "--run-config", config]
    )
    captured = capsys.readouterr()
    printed = captured.out
    assert code == 0, printed
    assert "finished:completed" in printed and f"results: {tmp_path / 'cli'}" in printed
    # Flower's log on stdout, the progress line (the round, time left) on stderr
    assert "[fedweigh] round 2/2  accuracy" in printed and "[simulate] cli: round 2/2 acc" in captured.err
    rows = read_metrics(tmp_path / "cli")
    for row in rows:
        losses = np.array([client["train_loss"] for client in row["clients"]])
        np.testing.assert_allclose([client["weight"] for client in row["clients"]], complement_share_weights(losses))
    instruction = json.loads((tmp_path / "cli" / "config.json").read_text())["instruction"]
    assert instruction["proximal-mu"] == 0.01  # what every client trained with
    assert f"final_accuracy: {rows[-1]['accuracy']}" in printed


@pytest.mark.xdist_group("cli")
def test_fedweigh_simulate_refuses_a_bad_run_config_before_starting_anything(capsys):
    port = free_port()
    assert main(["simulate", "--app", str(REPO), "--port", str(port), "--run-config", "aggregation=median"]) == 2
    error = capsys.readouterr().err
    assert "aggregation = 'median': unknown aggregation rule; accepted:" in error
    assert not list((REPO / ".flwr").glob(f"superlink-{port}.pid"))  # no SuperLink was started


def test_the_vanilla_flower_peer_of_the_overhead_benchmark_runs(shared_simulation, output_dir):
    from fedweigh.benchmarks.overhead import VANILLA_APP, peer_settings

    _, config = peer_settings(rounds=2)
    config |= {"output-dir": str(output_dir), "run-name": "vanilla", "train-subset": 100, "test-subset": 50}
    outcome = shared_simulation.run(config, num_supernodes=5, echo=False, app_dir=VANILLA_APP)
    assert outcome.ok, f"{outcome.status} {outcome.details}"
    rows = read_metrics(outcome.results_dir)
    assert [row["round"] for row in rows] == [1, 2]
    assert all(0.0 <= row["accuracy"] <= 1.0 and row["seconds"] > 0 for row in rows)


@pytest.mark.xdist_group("cli")
def test_fedweigh_simulate_killed_with_sigkill_takes_its_superlink_and_runs_with_it(tmp_path):
    """``kill -9`` of ``fedweigh simulate`` left its SuperLink and SuperExec running (and the run training):
    its guardian now stops the SuperLink's whole tree, then ends itself."""
    port = free_port()
    config = f"num-server-rounds=100 output-dir='{tmp_path}' run-name=k simulation-backend='in-process'"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "fedweigh.cli", "simulate", "--app", str(REPO), "--port", str(port)]
        + ["--num-supernodes", "2", "--run-config", config],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    assert launcher.stdout is not None
    seen = []
    for line in launcher.stdout:  # until the run trains; ends early only if the command does
        seen.append(line)
        if "[ROUND 1/" in line:
            break
    assert any("[ROUND 1/" in line for line in seen), "".join(seen)
    superlink = int((REPO / ".flwr" / f"superlink-{port}.pid").read_text())
    table = process_table()
    tree = {superlink} | {pid for pid, _ in descendants(superlink, table)}
    guardians = {pid for pid in table if f"fedweigh.launch.guardian {superlink}" in command_line(pid)}
    assert len(guardians) == 1 and any("flwr-simulation" in command_line(pid) for pid in tree)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 120
    while living(tree | guardians) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not living(tree | guardians), {pid: command_line(pid) for pid in living(tree | guardians)}


def command_line(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def living(pids: set[int]) -> set[int]:
    table = process_table()
    return {pid for pid in pids if pid in table and table[pid][2] != "Z"}
