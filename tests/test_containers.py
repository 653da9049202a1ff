"""The container path for real: docker-compose.yml and docker-compose.resident.yml on a Docker engine.

What docs/deployment.md's container walkthrough says, step by step, with its
own pytest marker (``-m containers``): ``.ci/run`` installs and starts a
Docker engine where it can and runs this module after the rest of the suite;
without an engine it is skipped with the reason.

1. The images: Flower's ``flwr/superlink``, ``flwr/supernode`` and
   ``flwr/superexec`` at the pinned version, pulled or, where no registry
   answers, built as local stand-ins, and the app image from the Dockerfile
   (``deploy/build-images.sh -a``; the compose files are used unchanged, from
   the repository, with ``--project-directory`` set to this test's folder so
   that its certificates and keys never touch ``deploy/``).
2. ``docker-compose.yml``: TLS and SuperNode authentication, the three keys
   registered with ``flwr supernode register`` from this host; inside the
   federation's network a SuperNode with an unregistered key and a plaintext
   SuperNode are refused; ``flwr run . docker`` (fedoui on digits, 3 rounds)
   finishes and its ``metrics.jsonl``, ``summary.json`` and ``model.pt`` are
   read back from the ``outputs`` volume, equal to the same run in one process.
3. Faults: a SuperNode container killed mid-round (``docker kill``): the round
   closes without it and, started again, it rejoins a later round. The
   SuperLink container restarted mid-run: it keeps nothing (no state
   database), the SuperNodes leave, the run is lost; the keys registered again,
   the SuperNodes started, the same run with ``resume-from`` on the outputs
   volume ends exactly where the uninterrupted run ended. ``down -v``.
4. ``docker-compose.resident.yml`` on top: fedweigh-superexec and
   fedweigh-supernode at every site; the same run, the same results.
5. ``docker-compose.gpu.yml``: accepted by Compose, and its GPU request
   reaches the engine (on a machine without an NVIDIA GPU the engine refuses
   it, which this test expects there).

Every wait polls a log, a file or the CLI with a deadline. The wall time of
each step is printed and, with ``FEDWEIGH_CONTAINER_TIMINGS=<file.json>``,
written there (docs/deployment.md cites benchmarks/results/containers.json).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
import yaml
from loopback import run_in_process

from fedweigh.launch.commands import ANSI
from fedweigh.launch.containers import (
    APP_UID,
    FLOWER_VERSION,
    SUPERNODES,
    Project,
    Stack,
    build_images,
    engine_problem,
    run,
)
from fedweigh.launch.virtual_federation import poll_until
from fedweigh.results import without_timing

pytestmark = [pytest.mark.containers, pytest.mark.xdist_group("containers")]

SKIP_ENV = "FEDWEIGH_CONTAINERS_SKIP"
"""Set by ``.ci/run`` to the reason it could not install or start a Docker engine."""
TIMINGS_ENV = "FEDWEIGH_CONTAINER_TIMINGS"
TORCH_INDEX_ENV = "FEDWEIGH_TORCH_INDEX_URL"
"""Passed to ``deploy/build-images.sh -t`` when set (where the app image's PyTorch comes from)."""
STRANGER = "stranger"  # a key pair nobody registered
RUN = {
    "strategy": "fedoui",
    "dataset": "digits",
    "seed": 2,
    "fraction-train": 1.0,
    "min-train-nodes": 2,
    "num-server-rounds": 3,
    "output-dir": "/app/outputs",
}
RESULT_FILES = ("config.json", "metrics.jsonl", "checkpoint.pt", "model.pt", "summary.json")
STEPS: list[dict[str, object]] = []


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    """Time one step of the walkthrough (printed, and kept for :data:`TIMINGS_ENV`)."""
    started = time.monotonic()
    yield
    STEPS.append({"step": name, "seconds": round(time.monotonic() - started, 1)})
    print(f"[containers] {name}: {STEPS[-1]['seconds']} s", flush=True)


@pytest.fixture(scope="module")
def engine() -> None:
    if problem := os.environ.get(SKIP_ENV) or engine_problem():
        pytest.skip(f"no container engine: {problem}")


@pytest.fixture(scope="module")
def images(engine) -> str:
    """``deploy/build-images.sh -a``: what it did, one line per image."""
    with step("images: deploy/build-images.sh -a"):
        report = build_images(os.environ.get(TORCH_INDEX_ENV))
    print(report, flush=True)
    return report


def same_tensors(a: Path, b: Path) -> bool:
    first, second = torch.load(a), torch.load(b)
    return first.keys() == second.keys() and all(
        first[k].dtype == second[k].dtype and torch.equal(first[k], second[k]) for k in first
    )


def partitions(row: dict) -> list[int]:
    return sorted(client["partition"] for client in row["clients"])


@pytest.fixture(scope="module")
def project(images, tmp_path_factory) -> Iterator[Project]:
    project = Project(tmp_path_factory.mktemp("containers"))
    with step("certificates and keys (make-certificates.sh -c 3, make-supernode-keys.sh -c 3, chown)"):
        project.prepare(extra_keys=[STRANGER])
    load = [os.getloadavg()[0]]
    yield project
    if path := os.environ.get(TIMINGS_ENV):
        load.append(os.getloadavg()[0])  # other work on the machine slows every step
        report = {"images": images.splitlines(), "steps": STEPS, "load_average_1m_before_after": load}
        Path(path).write_text(json.dumps(report, indent=1) + "\n")


@pytest.fixture(scope="module")
def base(project) -> Iterator[Stack]:
    stack = Stack(project, "base", ["docker-compose.yml"], timed=step)
    try:
        stack.bring_up()
        yield stack
    finally:
        stack.down()


@pytest.fixture(scope="module")
def reference(base) -> Path:
    """The reference run on Flower's images: fedoui on digits, 3 rounds, every site every round."""
    with step("base: flwr run . docker (3 rounds), results copied out of the outputs volume"):
        return base.completed({**RUN, "run-name": "reference"})


def test_the_stack_runs_flower_s_images_as_app_with_tls_and_every_supernode_registered(base, images):
    names = base("ps", "--services").stdout.split()
    assert sorted(names) == sorted(
        ["superlink", "superexec-serverapp", *SUPERNODES, *(f"superexec-clientapp-{i}" for i in (1, 2, 3))]
    )
    assert all(base.running(name) for name in names)
    for name in ("superlink", "supernode-1", "superexec-serverapp"):
        user = run(["docker", "exec", base.container(name), "id", "-u"]).stdout.strip()
        assert user == str(APP_UID), f"{name} runs as uid {user}"
    states = base.project.node_states()
    assert [states[base.node_ids[name]] for name in SUPERNODES] == ["online"] * 3
    superlink = base.logs("superlink")
    assert superlink.count('"POST /v1/fleet/activate-node HTTP/1.1" 200') == 3  # each SuperNode, authenticated
    for component in ("superlink", "supernode", "superexec"):  # pulled, or built here as a stand-in
        assert re.search(rf"^flwr/{component}:{FLOWER_VERSION}: (present|pulled|stand-in built)", images, re.M), images


def stray_supernode(base: Stack, name: str, args: Sequence[str], mounts: Sequence[str]) -> tuple[str, str, int]:
    """A SuperNode container on the federation's network that is not part of the stack: (its address, log, exit)."""
    volumes = [arg for mount in mounts for arg in ("-v", mount)]
    image = f"flwr/supernode:{FLOWER_VERSION}"
    container = run(
        ["docker", "run", "-d", "--name", f"{base.name}-{name}", "--network", f"{base.name}_federation"]
        + [*volumes, image, *args]
    ).stdout.strip()
    try:
        address = run(
            ["docker", "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container]
        ).stdout.strip()
        code = int(run(["docker", "wait", container], timeout=300).stdout.strip())
        logs = run(["docker", "logs", container], check=False)
        return address, ANSI.sub("", logs.stdout + logs.stderr), code
    finally:
        run(["docker", "rm", "-f", container], check=False)


def test_a_supernode_with_an_unregistered_key_is_refused_inside_the_federation(base):
    certificates = base.project.certificates
    with step("base: an unregistered SuperNode refused"):
        address, log, code = stray_supernode(
            base,
            STRANGER,
            ["--root-certificates", "/app/certificates/ca.crt", "--auth-supernode-private-key", "/app/keys/stranger"]
            + ["--superlink", "superlink:9093", "--max-retries", "1", "--isolation", "process"],
            [
                f"{certificates / 'ca.crt'}:/app/certificates/ca.crt:ro",
                f"{base.project.keys / STRANGER}:/app/keys/stranger:ro",
            ],
        )
    assert code != 0 and "Failed to activate SuperNode" in log, log[-2000:]
    assert re.search(
        rf'{re.escape(address)}:\d+ - "POST /v1/fleet/activate-node HTTP/1\.1" 412', base.logs("superlink")
    )


def test_a_plaintext_supernode_is_refused_inside_the_federation(base):
    since = len(base.logs("superlink"))  # (an address of the network may have been another container's before)
    with step("base: a plaintext SuperNode refused"):
        address, log, code = stray_supernode(
            base, "plaintext", ["--insecure", "--superlink", "superlink:9093", "--max-retries", "1"], []
        )
    assert code != 0 and "Failed to initialize the connection" in log, log[-2000:]
    assert f"{address}:" not in base.logs("superlink")[since:]  # not one request of it served: refused at the TLS layer


def test_a_run_finishes_and_its_results_are_read_back_from_the_outputs_volume(reference, tmp_path):
    assert all((reference / name).is_file() for name in RESULT_FILES), sorted(p.name for p in reference.iterdir())
    rows = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == [1, 2, 3]
    assert all(partitions(row) == [0, 1, 2] and row["left_out"] == {} for row in rows)
    assert rows[-1]["accuracy"] > 0.5  # chance is 0.1
    summary = json.loads((reference / "summary.json").read_text())
    assert summary["rounds"] == 3 and summary["final_accuracy"] == rows[-1]["accuracy"]
    # The same config in one process on this host: the containers changed no result.
    with step("the same run in one process, for comparison"):
        in_process = run_in_process({**RUN, "run-name": "reference", "output-dir": str(tmp_path)}, num_nodes=3)
    assert without_timing(rows) == without_timing(
        [json.loads(line) for line in (in_process / "metrics.jsonl").read_text().splitlines()]
    )
    assert same_tensors(reference / "model.pt", in_process / "model.pt")


def test_a_killed_supernode_container_leaves_its_round_and_rejoins_a_later_one(base, reference):
    victim = "supernode-3"  # partition 2
    config = {**RUN, "run-name": "kill"}
    log = base.project.folder / "kill.log"
    with step("base: docker kill supernode-3 mid-round, round closes without it, restarted it rejoins"):
        since = len(base.logs(victim))
        process = base.submit(config, log)
        base.wait_log(victim, r"Receiving: train message", timeout=600, since=since)
        run(["docker", "kill", base.container(victim)])
        first = poll_until(lambda: base.rounds_recorded("kill")[:1], 300, "round 1 recorded", 1.0)[0]
        base("start", victim)  # with the same key and partition
        status, details = base.finish(process, log, timeout=1200)
    assert status == "finished:completed", f"{status} {details}"
    rows = base.rounds_recorded("kill")
    assert partitions(first) == [0, 1] and "left the federation" in first["left_out"]["2"], first
    assert any(partitions(row) == [0, 1, 2] for row in rows[1:]), [partitions(row) for row in rows]


def test_a_restarted_superlink_container_forgets_everything_and_the_run_resumes_from_the_outputs_volume(
    base, reference
):
    """The compose files run the SuperLink without ``--database``: its state lives in memory only."""
    config = {**RUN, "run-name": "restart"}
    log = base.project.folder / "restart.log"
    with step("base: SuperLink container restarted after round 1"):
        process = base.submit(config, log)
        poll_until(lambda: base.rounds_recorded("restart")[:1], 900, "round 1 recorded", 1.0)
        base("restart", "superlink")
        base.wait_log("superlink", r"Uvicorn running on https://0\.0\.0\.0:9093", timeout=180)
        # The SuperNodes are no longer known (401) and stop; the ServerApp's task token is refused.
        poll_until(lambda: not any(base.running(name) for name in SUPERNODES), 300, "SuperNodes stopped", 1.0)
        process.wait(timeout=600)
    assert base.project.node_states() == {}  # no registration survived
    assert base.project.flwr("ls", "docker", "--format", "json").stdout.count('"run-id"') == 0  # nor the run
    recorded = base.rounds_recorded("restart")
    assert 1 <= len(recorded) < 3 and base.outputs_file("restart/checkpoint.pt") is not None
    with step("base: keys registered again, SuperNodes started, the run resumed with resume-from"):
        for name in SUPERNODES:
            base.project.register(name)
        since = {name: len(base.logs(name)) for name in SUPERNODES}
        base("up", "-d")
        for name in SUPERNODES:
            base.wait_log(name, r"SuperNode ID: \d+", timeout=300, since=since[name])
        folder = base.completed({**config, "resume-from": "/app/outputs/restart"})
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    expected = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    assert without_timing(rows) == without_timing(expected)
    assert same_tensors(folder / "model.pt", reference / "model.pt")
    summaries = [
        {k: v for k, v in json.loads((path / "summary.json").read_text()).items() if k not in {"seconds", "run_dir"}}
        for path in (folder, reference)
    ]
    assert summaries[0] == summaries[1]


def test_down_v_removes_every_container_network_and_the_outputs_volume(base):
    base.down()
    assert run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={base.name}"]).stdout == ""
    assert run(["docker", "volume", "ls", "-q", "--filter", f"name={base.name}_"]).stdout == ""
    assert run(["docker", "network", "ls", "-q", "--filter", f"name={base.name}_"]).stdout == ""


@pytest.fixture(scope="module")
def resident(project, base) -> Iterator[Stack]:
    base.down()  # one stack at a time: both publish 127.0.0.1:9093
    stack = Stack(project, "resident", ["docker-compose.yml", "docker-compose.resident.yml"], timed=step)
    try:
        stack.bring_up()
        yield stack
    finally:
        stack.down()


def test_the_resident_overlay_runs_fedweigh_s_site_processes_with_the_same_results(resident, reference):
    with step("resident: flwr run . docker (3 rounds), results copied out of the outputs volume"):
        folder = resident.completed({**RUN, "run-name": "reference"})
    names = resident("ps", "--services").stdout.split()
    assert len(names) == 8 and all(resident.running(name) for name in names)  # every site kept its processes
    for index, name in enumerate(SUPERNODES, start=1):
        assert "[fedweigh] SuperNode asks again after 0.05s" in resident.logs(name)
        tasks = re.findall(r"resident ClientApp task \d+ \((\w+)\) done", resident.logs(f"superexec-clientapp-{index}"))
        assert tasks == ["query", "train", "train", "train"], tasks  # one process answered every message
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    expected = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    assert without_timing(rows) == without_timing(expected)
    assert same_tensors(folder / "model.pt", reference / "model.pt")


def test_the_gpu_overlay_is_accepted_and_its_gpu_request_reaches_the_engine(project, resident):
    resident.down()
    gpu = Stack(project, "gpu", ["docker-compose.yml", "docker-compose.gpu.yml"])
    services = yaml.safe_load(gpu("config").stdout)["services"]
    for name in ("superexec-serverapp", "superexec-clientapp-1", "superexec-clientapp-2", "superexec-clientapp-3"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert [(d["driver"], d["capabilities"]) for d in devices] == [("nvidia", ["gpu"])], name
        assert services[name]["image"] == f"fedweigh-superexec:{FLOWER_VERSION}-cuda"
    with step("gpu: a container asking for every GPU, as the overlay's services do"):
        result = run(
            ["docker", "run", "--rm", "--gpus", "all", "--entrypoint", "python", "fedweigh-superexec:1.41.0"]
            + ["-c", "import torch; print(torch.cuda.device_count())"],
            check=False,
        )
    if shutil.which("nvidia-smi") and run(["nvidia-smi", "-L"], check=False).returncode == 0:
        assert result.returncode == 0 and int(result.stdout.split()[-1]) >= 1, result.stderr
    else:  # no GPU here: the engine itself refuses the request the overlay makes
        assert result.returncode != 0 and 'could not select device driver "" with capabilities: [[gpu]]' in (
            result.stderr
        ), result.stderr
