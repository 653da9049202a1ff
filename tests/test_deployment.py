"""The app on a real multi-host federation: TLS, node authentication, failures.

A SuperLink and three SuperNodes run as separate processes, each on its own
host (a network namespace with its own address, see
:mod:`virtual_federation`), and talk over 10.231.0.0/24, not loopback. TLS is
on (a CA made by ``deploy/make-certificates.sh``), also on each SuperNode's
Runtime API (to its own SuperExec and ClientApps), SuperNode authentication is
on (keys from ``deploy/make-supernode-keys.sh``, registered with
``flwr supernode register``), and the operator submits ``flwr run`` from a
host of its own. Where namespaces are not permitted the same topology runs on
127.0.0.1 and the test says so with a :class:`LoopbackFallbackWarning`.

supernode-1 and supernode-2 keep one long-running ClientApp each
(``fedweigh-superexec``, ``--isolation process``) and ask for their messages
promptly (``fedweigh-supernode``); supernode-3 runs Flower's default, a
ClientApp process per message and Flower's SuperNode.

Order matters and pytest keeps it, and later tests build on earlier ones:

1. refusals: an unregistered SuperNode, one that does not trust the CA, a
   plaintext one (``--insecure``), and one pointed at a rogue SuperLink whose
   certificate (from the same CA) names another host;
2. the reference run ``tls``: fedoui, 2 rounds, all three partitions;
3. ``kill``: supernode-3 is killed mid-round, the run goes on without it (and
   the survivors' round 1 training equals the reference's, bit for bit);
4. supernode-3 comes back with its key and partition and is online again;
5. ``crash``: the run's ServerApp process is killed with SIGKILL during round
   2, then the run is resumed from its folder (``resume-from``) and ends with
   the reference's metrics rows and model, exactly; the rejoined supernode-3
   trains partition 2 in both halves, as it did in the reference;
6. ``faults``: one node a round raises, returns NaN, or has its reply
   delivered twice; each round closes with the others;
7. supernode-3 stops cleanly and is offline at once;
8. ``deadline``: an asynchronous run whose rounds close at a deadline while a
   slow node (resident, 12 s late), holding supernode-3's partition, keeps
   training.

The suite runs this module on one pytest-xdist worker (``xdist_group``), in
this order; ``tests/conftest.py`` fails it if the group cannot be kept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import warnings
from pathlib import Path

import pytest
import torch
from fault_reasons import REASON as FAULT_REASONS
from loopback import run_in_process

from fedweigh.launch.virtual_federation import (
    DEPLOY,
    Federation,
    FlowerProcess,
    RunHandle,
    command_line,
    federation_on_hosts,
    namespaces_permitted,
    plan_topology,
    poll_until,
)
from fedweigh.results import Checkpoint, read_metrics, without_timing

SUPERNODES = ["supernode-1", "supernode-2", "supernode-3"]
STRANGER = "stranger"  # has a key, never registered
NO_CA = "no-ca"  # registered, but does not trust the federation's CA
PLAINTEXT = "plaintext"  # no TLS at all (--insecure), hence no key either
ROGUE = "rogue"  # a second SuperLink, with a certificate from the CA for another host
MISLED = "misled"  # a SuperNode that trusts the CA, pointed at the rogue SuperLink
SLOW = "slow"  # registered; replies 12 s after training, like a slow device
KEYS = [*SUPERNODES, STRANGER, NO_CA, MISLED, SLOW]
# Two sites keep one long-running ClientApp (fedweigh-superexec beside a SuperNode with --isolation process) and run
# fedweigh-supernode (no 3 s wait for the next message); the third runs Flower's default, a flwr-clientapp process
# per message. A federation may mix them, and the ClientApp process that supernode-3 starts for each message is
# also what leaves time to kill it, or the ServerApp, mid-round.
RESIDENT = ("supernode-1", "supernode-2")
RUN = {"strategy": "fedoui", "dataset": "digits", "seed": 2, "fraction-train": 1.0, "min-train-nodes": 2}
RESULT_FILES = ("config.json", "metrics.jsonl", "checkpoint.pt", "model.pt", "summary.json")
CLIENT_SIDE = ("num_examples", "train_loss", "oui")  # what a client computes alone, from the model it received
TASK_DONE = re.compile(r"\[fedweigh\] resident ClientApp task \d+ \((\w+)\) done in [0-9.]+s in process (\d+)")

pytestmark = pytest.mark.xdist_group("deployment")


class LoopbackFallbackWarning(UserWarning):
    """Network namespaces were not permitted: the federation ran on 127.0.0.1."""


def partition(index: int) -> dict[str, int]:
    return {"partition-id": index, "num-partitions": len(SUPERNODES)}


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    hosts = [*SUPERNODES, STRANGER, NO_CA, PLAINTEXT, ROGUE, MISLED, SLOW]
    with federation_on_hosts(hosts, tmp_path_factory.mktemp("deployment"), KEYS) as fed:
        if not fed.topology.isolated:
            warnings.warn(
                LoopbackFallbackWarning(
                    f"network namespaces are not permitted here ({namespaces_permitted()[1]}); the deployment test "
                    "runs the same SuperLink/SuperNode topology on 127.0.0.1 instead of separate addresses"
                ),
                stacklevel=1,
            )
        for name in [*SUPERNODES, NO_CA]:
            fed.register(name)
        for index, name in enumerate(SUPERNODES):
            fed.start_supernode(name, name, partition(index), resident=name in RESIDENT, prompt=name in RESIDENT)
        for name in SUPERNODES:
            fed.supernodes[name].wait_for(r"SuperNode ID: \d+", timeout=180)
        yield fed


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("deployment-outputs")


def activations(fed: Federation, host: str) -> list[str]:
    """HTTP statuses of the SuperLink's answers to ``host`` asking to activate as a node."""
    address = re.escape(fed.topology.hosts[host].address)
    pattern = rf'{address}:\d+ - "POST /v1/fleet/activate-node HTTP/1\.1" (\d+)'
    return re.findall(pattern, fed.processes[0].text())


def superexec_tls(federation: Federation, host: str | None) -> list[str]:
    """How the SuperExec of a SuperNode (``host``) or of the SuperLink (``None``) reaches its Runtime API: its TLS
    flags. Flower's ``flower-superexec`` runs below its SuperNode or SuperLink; a resident ``fedweigh-superexec``
    beside its SuperNode (and then none below it)."""
    process = federation.processes[0] if host is None else federation.supernodes[host]
    below = process.running("flower-superexec")
    if host in federation.superexecs:
        assert below == [], f"{host}: --isolation process, yet a flower-superexec below it"
        argv = command_line(federation.superexecs[host].popen.pid)
        assert Path(argv[1]).name == "fedweigh-superexec", argv
    else:
        (superexec,) = below
        argv = command_line(superexec)
    return [arg for arg in argv if arg in {"--insecure", "--root-certificates"}]


def started_or_refused(node: FlowerProcess) -> bool:
    """The SuperNode got its ID, failed to bind its port, or exited."""
    return bool(re.search(r"SuperNode ID: \d+|address already in use", node.text())) or node.popen.poll() is not None


def restart_when_its_port_is_free(federation: Federation, name: str, node_config: dict) -> FlowerProcess:
    """Start SuperNode ``name`` again; while its killed predecessor's Runtime API port is still held, try again.

    A SIGKILLed server leaves its accepted connections in TIME_WAIT for up to
    a minute, and Flower's Runtime API binds without SO_REUSEADDR: a restart
    within that minute exits with "address already in use". Each attempt is
    awaited (its ID, or its exit), for at most two minutes in all.
    """
    deadline = time.monotonic() + 120
    while True:
        node = federation.start_supernode(name, name, node_config)
        poll_until(lambda node=node: started_or_refused(node), timeout=180, what=f"{name} started or refused its port")
        if "address already in use" not in node.text() or time.monotonic() > deadline:
            return node
        node.wait_exit(timeout=30)


def same_tensors(a: Path, b: Path) -> bool:
    """Two saved state_dicts hold the same names, dtypes and values, exactly."""
    first, second = torch.load(a), torch.load(b)
    return first.keys() == second.keys() and all(
        first[k].dtype == second[k].dtype and torch.equal(first[k], second[k]) for k in first
    )


def completed(federation: Federation, config: dict, name: str) -> RunHandle:
    """Submit a run, wait for it, and insist that it completed (its status, details and log tail if not)."""
    run = federation.submit(config, name)
    federation.finish(run, timeout=480)
    assert run.status == "finished:completed", f"{run.status} {run.details}\n{run.process.tail(40)}"
    return run


def test_topology_is_planned_on_separate_addresses_or_on_loopback():
    isolated = plan_topology(["a", "b"], isolated=True, tag="x1")
    assert {h.address for h in isolated.hosts.values()} == {"10.231.0.1", "10.231.0.2", "10.231.0.10", "10.231.0.11"}
    assert isolated.hosts["a"].wrap(["flwr", "ls"]) == ["ip", "netns", "exec", "fwx1-a", "flwr", "ls"]
    assert isolated.superlink_address == "10.231.0.1:9093"
    ports = iter(range(5000, 5010))
    loopback = plan_topology(["a", "b"], isolated=False, tag="x1", port=lambda: next(ports))
    assert {h.address for h in loopback.hosts.values()} == {"127.0.0.1"}
    assert loopback.hosts["a"].wrap(["flwr"]) == ["flwr"] and loopback.switch is None
    assert len({loopback.superlink_port, *loopback.runtime_ports.values()}) == 3  # no two listeners share a port
    with pytest.raises(ValueError, match="unique"):
        plan_topology(["operator"], isolated=True, tag="x1")


def test_federation_is_up_with_tls_and_every_node_authenticated(federation):
    superlink = federation.processes[0].text()
    assert f"Uvicorn running on https://{federation.topology.superlink_address}" in superlink
    states = federation.node_states()
    assert [states[federation.node_ids[name]] for name in SUPERNODES] == ["online"] * 3
    assert superexec_tls(federation, None) == ["--root-certificates"]  # the ServerApps' SuperExec
    assert sorted(federation.superexecs) == sorted(RESIDENT)
    for name in SUPERNODES:  # the resident sites' SuperNodes ask for messages promptly (fedweigh-supernode)
        log, program = federation.supernodes[name].text(), command_line(federation.supernodes[name].popen.pid)
        assert ("[fedweigh] SuperNode asks again after 0.05s" in log) == (name in RESIDENT), log[-2000:]
        assert Path(program[1]).name == ("fedweigh-supernode" if name in RESIDENT else "flower-supernode"), program
    for name in SUPERNODES:  # each Runtime API serves TLS, and its SuperExec verifies it with the CA
        node = federation.supernodes[name]
        assert f"Uvicorn running on https://127.0.0.1:{federation.topology.runtime_ports[name]}" in node.text()
        assert superexec_tls(federation, name) == ["--root-certificates"]
    answers = {name: activations(federation, name) for name in SUPERNODES}
    if federation.topology.isolated:  # each node reached the SuperLink from its own address
        assert answers == dict.fromkeys(SUPERNODES, ["200"])
    else:  # on loopback they all come from 127.0.0.1
        assert answers["supernode-1"] == ["200"] * len(SUPERNODES)


def test_unregistered_supernode_is_refused(federation):
    before = len(activations(federation, STRANGER))
    stranger = federation.start_supernode(STRANGER, STRANGER, partition(0))  # claims partition 0
    assert stranger.wait_exit(timeout=120) != 0
    log = stranger.text()
    assert "Failed to initialize the connection to the SuperLink" in log
    assert "Failed to activate SuperNode" in log
    assert activations(federation, STRANGER)[before:] == ["412"]  # 412 Precondition Failed
    assert len(federation.node_states()) == len(SUPERNODES) + 1  # the stranger is nobody's node


def test_supernode_without_the_ca_is_refused(federation):
    before = len(activations(federation, NO_CA))
    no_ca = federation.start_supernode(NO_CA, NO_CA, partition(1), trust_ca=False)
    assert no_ca.wait_exit(timeout=120) != 0
    log = no_ca.text()
    assert "SSL/TLS handshake error detected" in log and "CERTIFICATE_VERIFY_FAILED" in log
    assert len(activations(federation, NO_CA)) == before  # never got past the handshake
    assert federation.node_states()[federation.node_ids[NO_CA]] == "registered"  # never online


def test_plaintext_supernode_is_refused(federation):
    """``--insecure`` speaks plain HTTP to a TLS-only SuperLink: no handshake, no request served, no node."""
    states = federation.node_states()
    plaintext = federation.start_supernode(PLAINTEXT, None, partition(0), max_retries=1)
    assert plaintext.wait_exit(timeout=120) != 0
    log = plaintext.text()
    assert "Option `--insecure` was set" in log
    assert re.search(r"Giving up reconnection after [\d.]+ seconds and 2 tries", log), log
    assert "Failed to initialize the connection to the SuperLink" in log
    # The SuperLink hung up at the TLS layer: seen as a close before any response, or as a reset when the
    # SuperLink's TLS stack answers the plaintext bytes with an RST first (CI saw it on a loaded machine).
    assert re.search(r"Server disconnected without sending a response|\[Errno 104\] Connection reset by peer", log), log
    assert "SuperNode ID" not in log and federation.node_states() == states
    if federation.topology.isolated:  # not one request from its address reached the API
        assert f"{federation.topology.hosts[PLAINTEXT].address}:" not in federation.processes[0].text()


def test_supernode_refuses_a_superlink_certified_for_another_host(federation, tmp_path):
    """A certificate from the federation's own CA is not enough: it must name the address the node dialled."""
    certificates = tmp_path / "rogue"
    certificates.mkdir()
    for name in ("ca.crt", "ca.key"):  # the script keeps an existing CA and signs with it
        shutil.copy(federation.certificates / name, certificates / name)
    make = [DEPLOY / "make-certificates.sh", "-o", certificates, "-n", "elsewhere.example.org", "-L"]
    subprocess.run(make, check=True, capture_output=True, timeout=60)
    verify = ["openssl", "verify", "-CAfile", federation.certificates / "ca.crt", certificates / "server.crt"]
    assert subprocess.run(verify, capture_output=True, check=False).returncode == 0  # a valid certificate of the CA

    rogue = federation.start_rogue_superlink(ROGUE, certificates)
    misled = federation.start_supernode(MISLED, MISLED, partition(0), superlink=federation.rogue_address(ROGUE))
    assert misled.wait_exit(timeout=120) != 0
    log = misled.text()
    address = federation.topology.hosts[ROGUE].address
    assert "SSL/TLS handshake error detected" in log and "CERTIFICATE_VERIFY_FAILED" in log
    assert f"IP address mismatch, certificate is not valid for '{address}'" in log
    assert "/v1/fleet/" not in rogue.text()  # the node sent it nothing: no key, no request
    rogue.stop()


def test_fedoui_trains_across_the_hosts(federation, output_dir, tmp_path):
    """The reference run: complete, and what the same config gives in one process, to the bit.

    Partitions 0 and 1 trained in long-running ClientApps, partition 2 in a
    ClientApp process per message: the run's rows (timings aside) and model
    equal those of the same config run in this process (``tests/loopback.py``),
    so neither way of running a ClientApp changes a result.
    """
    config = {**RUN, "num-server-rounds": 2, "output-dir": str(output_dir), "run-name": "tls"}
    run = completed(federation, config, "tls")

    folder = output_dir / "tls"
    assert all((folder / name).is_file() for name in RESULT_FILES), sorted(p.name for p in folder.iterdir())
    rows = read_metrics(folder)
    assert [row["round"] for row in rows] == [1, 2]
    assert all(row["aggregated"] and row["left_out"] == {} for row in rows)
    assert all(sorted(client["partition"] for client in row["clients"]) == [0, 1, 2] for row in rows)
    assert all("oui" in client for row in rows for client in row["clients"])
    assert rows[-1]["accuracy"] > rows[0]["accuracy"] and rows[-1]["accuracy"] > 0.5  # chance is 0.1
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["final_accuracy"] == rows[-1]["accuracy"]
    assert "[fedweigh] done: final accuracy" in run.log

    for name in RESIDENT:  # every message of the site (the partition query, two trainings): one process, one import
        superexec = federation.superexecs[name]
        log = superexec.text()
        tasks = TASK_DONE.findall(log)
        assert [kind for kind, _ in tasks] == ["query", "train", "train"], log[-3000:]
        assert {int(pid) for _, pid in tasks} == {superexec.popen.pid}
        assert log.count("resident ClientApp of FAB") == 1 and superexec.running("flwr-clientapp") == []
    in_process = run_in_process({**config, "output-dir": str(tmp_path)}, num_nodes=len(SUPERNODES))
    assert without_timing(rows) == without_timing(read_metrics(in_process))
    assert same_tensors(folder / "model.pt", in_process / "model.pt")


def test_run_completes_when_a_supernode_is_killed_mid_round(federation, output_dir):
    victim = federation.supernodes["supernode-3"]  # holds partition 2
    before = len(victim.text())
    run = federation.submit({**RUN, "num-server-rounds": 2, "output-dir": str(output_dir), "run-name": "kill"}, "kill")
    victim.wait_for(r"Receiving: train message", timeout=300, since=before)
    killed = victim.crash()  # SuperNode, its SuperExec and the ClientApp at work: a host gone
    federation.finish(run, timeout=480)
    assert run.status == "finished:completed", f"{run.status} {run.details}\n{run.process.tail(40)}"
    assert len(killed) >= 2

    first, second = read_metrics(output_dir / "kill")
    assert first["sampled"] == [0, 1, 2] and set(first["left_out"]) == {"2"}
    assert "left the federation" in first["left_out"]["2"]
    assert sorted(client["partition"] for client in first["clients"]) == [0, 1] and first["aggregated"]
    assert second["sampled"] == [0, 1] and second["left_out"] == {} and second["aggregated"]
    assert re.search(r"round 1: left out node \d+: the node left the federation", run.log)
    assert federation.node_states()[federation.node_ids["supernode-3"]] == "offline"
    # Two runs, one seed: the survivors trained round 1 exactly as in the reference run.
    reference = {client["partition"]: client for client in read_metrics(output_dir / "tls")[0]["clients"]}
    for client in first["clients"]:
        assert {k: client[k] for k in CLIENT_SIDE} == {k: reference[client["partition"]][k] for k in CLIENT_SIDE}


def test_the_killed_supernode_rejoins_with_its_key_and_partition(federation):
    """Restarted after the crash (same key, same partition), supernode-3 is the same node, online again."""
    node_id = federation.node_ids["supernode-3"]
    before = activations(federation, "supernode-3")
    rejoined = restart_when_its_port_is_free(federation, "supernode-3", partition(2))
    assert int(rejoined.wait_for(r"SuperNode ID: (\d+)", timeout=180).group(1)) == node_id
    assert federation.node_states()[node_id] == "online"
    if federation.topology.isolated:
        assert activations(federation, "supernode-3") == [*before, "200"]


def test_run_resumes_after_its_serverapp_is_killed_and_ends_as_the_uninterrupted_run(federation, output_dir):
    """SIGKILL the ``flwr-serverapp`` process mid-run, resume from the run folder: the reference's result, exactly.

    The ServerApp is the process below the SuperLink (SuperLink -> SuperExec ->
    ``flwr-serverapp``) that runs the strategy and writes the run folder. It is
    killed once round 1 is recorded and checkpointed and round 2's training has
    reached the nodes. The resumed run (same config, plus ``resume-from``) is
    compared with the reference run ``tls`` (same config and seed, never
    interrupted): metrics rows without their timings, summary and final model.
    """
    config = {**RUN, "num-server-rounds": 2, "output-dir": str(output_dir), "run-name": "crash"}
    folder, reference = output_dir / "crash", output_dir / "tls"
    superlink, witness = federation.processes[0], federation.supernodes["supernode-1"]
    start = len(witness.text())
    crashed = federation.submit(config, "crash")
    poll_until(
        lambda: (folder / "checkpoint.pt").is_file() and witness.text().count("Receiving: train message", start) >= 2,
        timeout=400,
        what="round 1 checkpointed and round 2 sent to the nodes",
    )
    serverapps = superlink.running("flwr-serverapp")
    assert len(serverapps) == 1, [command_line(pid) for pid in serverapps]
    os.kill(serverapps[0], signal.SIGKILL)
    poll_until(lambda: not superlink.running("flwr-serverapp"), timeout=30, what="the ServerApp gone")
    assert [row["round"] for row in read_metrics(folder)] == [1]  # round 2 was never recorded
    assert Checkpoint.load(folder / "checkpoint.pt").round == 1

    resumed = completed(federation, {**config, "resume-from": str(folder)}, "resume")
    assert f"[fedweigh] resuming {folder} after round 1" in resumed.log

    rows = read_metrics(folder)
    assert [row["round"] for row in rows] == [1, 2]
    assert all(sorted(client["partition"] for client in row["clients"]) == [0, 1, 2] for row in rows)
    assert without_timing(rows) == without_timing(read_metrics(reference))
    assert same_tensors(folder / "model.pt", reference / "model.pt")
    resumed_summary, reference_summary = (
        {k: v for k, v in json.loads((path / "summary.json").read_text()).items() if k not in {"seconds", "run_dir"}}
        for path in (folder, reference)
    )
    assert resumed_summary == reference_summary  # best accuracy too, over rounds of two processes

    # The SuperLink gives up on the killed run by itself, once the ServerApp's heartbeats stop.
    federation.finish(crashed, timeout=180)
    assert crashed.status == "finished:failed" and "No heartbeat" in crashed.details, crashed.details


def test_faulty_clients_are_left_out_across_the_hosts(federation, output_dir):
    """The fault switch in a deployment: each round one node misbehaves, the round closes with the other two.

    The faulty node learns its fault from its own train instruction; the
    ServerApp, on another host, leaves its reply out with the reason, counts
    it, and keeps the model finite.
    """
    kinds = ["exception", "nan", "duplicate"]  # the ClientApp raises; returns NaN; its reply is delivered twice
    config = {
        **RUN,
        "strategy": "fedavg",
        "num-server-rounds": len(kinds),
        "faults.kinds": ",".join(kinds),
        "faults.fraction": 1 / len(SUPERNODES),
        "output-dir": str(output_dir),
        "run-name": "faults",
    }
    run = completed(federation, config, "faults")
    rows = read_metrics(output_dir / "faults")
    assert sorted(kind for row in rows for kind in row["faults"].values()) == sorted(kinds)
    for row in rows:
        ((partition, kind),) = row["faults"].items()
        accepted = sorted(str(client["partition"]) for client in row["clients"])
        assert row["aggregated"] and row["excluded"] == 1 and set(row["left_out"]) == {partition}
        assert re.search(FAULT_REASONS[kind], row["left_out"][partition]), (kind, row["left_out"])
        assert accepted == sorted({"0", "1", "2"} - ({partition} if kind != "duplicate" else set()))
        assert f"round {row['round']}: left out" in run.log
    assert all(torch.isfinite(t).all() for t in torch.load(output_dir / "faults" / "model.pt").values())


def test_a_supernode_that_stops_cleanly_is_offline_at_once(federation):
    """SIGTERM: supernode-3 deactivates itself on the way out, so the SuperLink need not wait for heartbeats."""
    assert federation.supernodes["supernode-3"].stop(grace=30) == []  # it exited on SIGTERM, nothing needed SIGKILL
    # Heartbeats come every 30 s and are trusted for 60 s: without the deactivation it would still be online.
    assert federation.node_states()[federation.node_ids["supernode-3"]] == "offline"


def test_rounds_close_at_their_deadline_and_a_slow_node_s_update_joins_a_later_round(federation, output_dir):
    federation.register(SLOW)
    slow = federation.start_supernode(SLOW, SLOW, {**partition(2), "train-delay": 12}, resident=True)  # supernode-3's
    slow.wait_for(r"SuperNode ID: \d+", timeout=180)
    config = {
        **RUN,
        "strategy": "fedavg",
        "num-server-rounds": 15,
        "round-deadline": 8.0,
        "min-round-replies": 2,
        "max-staleness": 14,
        "output-dir": str(output_dir),
        "run-name": "deadline",
    }
    # Round 1 closes at 8 s; the reply comes about 13-16 s after round 1 began. A round without the slow node takes
    # 1-3 s (fedweigh-supernode asks promptly, Flower's SuperNode 3 s later), so 14 more rounds outlast it.
    run = completed(federation, config, "deadline")

    rows = read_metrics(output_dir / "deadline")
    first = rows[0]
    assert first["sampled"] == [0, 1, 2] and first["in_flight"] == [2] and first["left_out"] == {}
    assert sorted(c["partition"] for c in first["clients"]) == [0, 1] and first["aggregated"]
    assert "round closed at its 8.0s deadline with 2 replies; 1 node(s) still training" in run.log
    late = [(row["round"], c["staleness"]) for row in rows for c in row["clients"] if c["partition"] == 2]
    assert late, "the slow node's update never arrived"
    arrival, staleness = late[0]
    assert arrival > 1 and staleness == arrival - 1  # trained on round 1's model, applied relative to it
    assert all(2 not in row["sampled"] for row in rows[1:arrival])  # rounds 2 .. arrival: not sampled in flight
    assert all(row["aggregated"] for row in rows)
