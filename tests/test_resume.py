"""Resuming a run: the checkpoint survives a crash, a bad file is refused clearly, and the server's state crosses it.

A run is resumed from its ``checkpoint.pt`` (:class:`fedweigh.results.Checkpoint`):
the global model and the strategy's state after the last round it finished.
Three things make that safe, each tested here:

* the file is written atomically (temporary file, fsync, rename, fsync of the
  folder), so the server dying at any moment leaves the previous checkpoint or
  the new one, whole: tested by a failing rename and by SIGKILLing a writer
  between its write and its rename;
* it is read with ``weights_only=True``, and a file that is not a fedweigh
  checkpoint (truncated, random bytes, a model's ``state_dict``, pickled code)
  is refused with one ``ValueError`` naming ``resume-from``, the file and what
  is accepted;
* every strategy's server state is in it: each strategy (and six of them with
  delayed clients, updates in flight at the crash) runs 3 rounds straight, and
  again with the server dying after round 2 (an exception nothing catches,
  right after the checkpoint) and a second run resuming it; both must end with
  the same model, tensor for tensor, and the same ``metrics.jsonl`` and
  ``summary.json`` but for wall times. FedBuff crashes with a partly filled
  buffer (synchronously and with delays). A last test shows that the
  comparison notices lost state: resumed without their strategy state, the
  stateful strategies end elsewhere.

The runs go through the real ServerApp and ClientApp in this process
(``loopback``); the uninterrupted ones are shared with ``test_determinism.py``.
A real simulation whose server process is SIGKILLed is in ``test_simulation.py``.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import QUICK_RUN, REPO, STRATEGY_OPTIONS
from loopback import run_in_process

from fedweigh.methods.catalog import STEPS
from fedweigh.methods.registry import METHODS
from fedweigh.results import (
    CHECKPOINT_FILE,
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    MODEL_FILE,
    SUMMARY_FILE,
    Checkpoint,
    CheckpointWriter,
    read_metrics,
    without_timing,
)

pytestmark = pytest.mark.xdist_group("in-process-runs")  # with test_determinism.py: the straight runs are shared

STRATEGIES = sorted(METHODS)
ASYNC = {"delay-std": 1.5, "max-staleness": 3}
# stale updates rebased, a rule with a window, the atlas, FedBuff's buffer, staleness-discounted mixing, fine-tuning,
# SCAFFOLD's corrections sent to clients whose replies are late
ASYNC_STRATEGIES = ("fedavg", "fedoui", "feddle", "fedbuff", "fedasync", "fedft", "scaffold")
# MOON keeps each client's last model on its node, which no server checkpoint holds (test below)
NODE_STATE = sorted(name for name in STRATEGIES if any(STEPS[step].keeps_node_state for step in METHODS[name].steps))
CASES = [(name, False) for name in STRATEGIES if name not in NODE_STATE] + [(name, True) for name in ASYNC_STRATEGIES]
STOP = 2  # the server dies after this round of QUICK_RUN's 3


def case_config(strategy: str, asynchronous: bool) -> dict[str, object]:
    return {**QUICK_RUN, "strategy": strategy, **STRATEGY_OPTIONS.get(strategy, {}), **(ASYNC if asynchronous else {})}


def case_name(strategy: str, asynchronous: bool) -> str:
    """The shared straight run's name (``test_determinism.py`` asks for the synchronous ones by it)."""
    return f"{strategy}-async" if asynchronous else strategy


def num_nodes(asynchronous: bool) -> int:
    return 6 if asynchronous else 4  # with updates in flight, the idle clients left to sample


class Crash(BaseException):
    """The server process dying (a BaseException: no ``except Exception`` on the way catches it)."""


def crash_after(monkeypatch: pytest.MonkeyPatch, last_round: int, written: bool = True) -> None:
    """Make the server die right after round ``last_round``'s checkpoint is on disk (or, not ``written``, before
    the background write of it began: the previous round's checkpoint is the last on disk)."""
    save = CheckpointWriter.save

    def save_then_crash(self: CheckpointWriter, checkpoint: Checkpoint) -> None:
        if checkpoint.round == last_round and not written:
            self.flush()
            raise Crash(f"after round {last_round}, its checkpoint not yet written")
        save(self, checkpoint)
        if checkpoint.round == last_round:
            self.flush()
            raise Crash(f"after round {last_round}")

    monkeypatch.setattr(CheckpointWriter, "save", save_then_crash)


def crashed_run(monkeypatch, folder, config: dict, nodes: int):
    """A run of ``config`` in ``folder`` whose server dies after round :data:`STOP`; its folder."""
    crash_after(monkeypatch, STOP)
    with pytest.raises(Crash):
        run_in_process({**config, "output-dir": str(folder.parent), "run-name": folder.name}, nodes, node_seed=2)
    monkeypatch.undo()
    assert Checkpoint.load(folder / CHECKPOINT_FILE).round == STOP and not (folder / MODEL_FILE).exists()
    return folder


def resume(folder, config: dict, nodes: int) -> None:
    """Resume ``folder``'s run to the end, on other node ids (as a new run on a SuperLink gets)."""
    overrides = {**config, "output-dir": str(folder.parent), "run-name": folder.name, "resume-from": str(folder)}
    run_in_process(overrides, nodes, node_seed=3)


def outcome(folder) -> tuple[str, str, dict[str, torch.Tensor]]:
    """What must not depend on wall time or the run folder: the metrics rows, the summary, the final model."""
    summary = without_timing(json.loads((folder / SUMMARY_FILE).read_text()))
    summary.pop("run_dir")
    return json.dumps(without_timing(read_metrics(folder))), json.dumps(summary), torch.load(folder / MODEL_FILE)


def assert_same_outcome(folder, expected) -> None:
    (rows, summary, model), (want_rows, want_summary, want_model) = outcome(folder), outcome(expected)
    assert rows == want_rows
    assert summary == want_summary
    assert model.keys() == want_model.keys()
    for name, tensor in want_model.items():
        assert torch.equal(model[name], tensor), name


# ---------------------------------------------------------------------------
# every strategy's state crosses the checkpoint
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("strategy", "asynchronous"), CASES, ids=[case_name(*case) for case in CASES])
def test_a_run_resumed_after_a_crash_ends_exactly_where_the_uninterrupted_one_does(
    in_process_runs, tmp_path, monkeypatch, strategy, asynchronous
):
    config, nodes = case_config(strategy, asynchronous), num_nodes(asynchronous)
    straight = in_process_runs(case_name(strategy, asynchronous), config, nodes)
    folder = crashed_run(monkeypatch, tmp_path / "run", config, nodes)
    assert [row["round"] for row in read_metrics(folder)] == [1, 2]
    state = Checkpoint.load(folder / CHECKPOINT_FILE).strategy_state
    if asynchronous:  # updates were on their way at the crash: the resumed server must send and apply them
        assert read_metrics(folder)[-1]["in_flight"] and state["dispatches"]
    if strategy == "fedbuff":  # updates wait in its buffer at the crash: the resumed server must step with them
        assert 0 < state["update"]["buffer"]["count"] < STRATEGY_OPTIONS["fedbuff"]["fedbuff.buffer-size"]
    resume(folder, config, nodes)
    assert [row["round"] for row in read_metrics(folder)] == [1, 2, 3]
    assert_same_outcome(folder, straight)


def test_a_run_whose_clients_keep_state_resumes_and_says_it_cannot_end_exactly_the_same(tmp_path, monkeypatch, caplog):
    assert NODE_STATE == ["moon"]
    config, nodes = case_config("moon", False), num_nodes(False)
    folder = crashed_run(monkeypatch, tmp_path / "run", config, nodes)
    with caplog.at_level(logging.WARNING, logger="flwr.fedweigh"):
        resume(folder, config, nodes)
    assert [row["round"] for row in read_metrics(folder)] == [1, 2, 3]
    warnings = [record.getMessage() for record in caplog.records if "lives on the clients" in record.getMessage()]
    assert len(warnings) == 1 and "the client step 'moon'" in warnings[0]


def test_a_crash_before_the_last_checkpoint_was_written_repeats_that_round_and_ends_the_same(
    in_process_runs, tmp_path, monkeypatch
):
    """The checkpoint is written in the background: a server killed before round 2's write resumes after round 1."""
    config, nodes = case_config("fedoui", False), num_nodes(False)
    straight = in_process_runs(case_name("fedoui", False), config, nodes)
    folder = tmp_path / "run"
    crash_after(monkeypatch, STOP, written=False)
    with pytest.raises(Crash):
        run_in_process({**config, "output-dir": str(folder.parent), "run-name": folder.name}, nodes, node_seed=2)
    monkeypatch.undo()
    assert Checkpoint.load(folder / CHECKPOINT_FILE).round == STOP - 1
    assert [row["round"] for row in read_metrics(folder)] == [1, 2]  # round 2's row, ahead of its checkpoint
    resume(folder, config, nodes)
    assert [row["round"] for row in read_metrics(folder)] == [1, 2, 3]
    assert_same_outcome(folder, straight)


STATEFUL = [("fedoui", False), ("feddle", False), ("fedbuff", False), ("center", False), ("fedavg", True)]


@pytest.mark.parametrize(("strategy", "asynchronous"), STATEFUL, ids=[case_name(*case) for case in STATEFUL])
def test_resumed_without_its_state_a_stateful_strategy_ends_elsewhere(
    in_process_runs, tmp_path, monkeypatch, strategy, asynchronous
):
    """The check above can fail: FedOUI's window, Feddle's atlas, FedBuff's buffer, Center's Adam moments, the updates
    in flight."""
    config, nodes = case_config(strategy, asynchronous), num_nodes(asynchronous)
    straight = in_process_runs(case_name(strategy, asynchronous), config, nodes)
    folder = crashed_run(monkeypatch, tmp_path / "run", config, nodes)
    load = Checkpoint.load.__func__

    def load_without_state(cls, path, setting="resume-from"):
        checkpoint = load(cls, path, setting)
        checkpoint.strategy_state = {}
        return checkpoint

    monkeypatch.setattr(Checkpoint, "load", classmethod(load_without_state))
    resume(folder, config, nodes)
    (rows, _, model), (want_rows, _, want_model) = outcome(folder), outcome(straight)
    assert rows != want_rows
    assert any(not torch.equal(model[name], tensor) for name, tensor in want_model.items())


# ---------------------------------------------------------------------------
# the file: atomic writes
# ---------------------------------------------------------------------------


def sample_checkpoint(round_: int = 2) -> Checkpoint:
    """A checkpoint holding every kind of value the strategies keep."""
    return Checkpoint(
        round_,
        {"fc.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "bn.num_batches_tracked": np.array(7)},
        {
            "rule": {"history": [[0.25, 0.5]]},
            "update": {"anchors": [{"delta": torch.ones(3), "score": float("inf"), "new": False, "origin": 4}]},
            "global_models": {1: {"fc.weight": np.zeros((2, 3), dtype=np.float64)}},
            "dispatches": [{"partition": 1, "round": 1, "arrival": 3}],
            "scalars": [np.float64(0.5), np.int64(3), np.bool_(True), np.float16(1.5)],
        },
    )


def test_a_checkpoint_round_trips_and_is_marked_as_one_of_ours(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    sample_checkpoint().save(path)
    loaded = Checkpoint.load(path)
    raw = torch.load(path, weights_only=False)
    assert raw["format"] == CHECKPOINT_FORMAT and raw["version"] == CHECKPOINT_VERSION
    assert all(isinstance(t, torch.Tensor) for t in raw["arrays"].values())  # tensors: written ~15x faster
    assert all(isinstance(a, np.ndarray) for a in loaded.arrays.values())
    assert loaded.round == 2 and loaded.arrays.keys() == {"fc.weight", "bn.num_batches_tracked"}
    np.testing.assert_array_equal(loaded.arrays["fc.weight"], sample_checkpoint().arrays["fc.weight"])
    assert loaded.arrays["fc.weight"].dtype == np.float32 and loaded.arrays["bn.num_batches_tracked"] == 7
    state = loaded.strategy_state
    assert state["rule"] == {"history": [[0.25, 0.5]]} and state["dispatches"][0]["arrival"] == 3
    anchor = state["update"]["anchors"][0]
    assert torch.equal(anchor["delta"], torch.ones(3)) and anchor["score"] == float("inf") and anchor["new"] is False
    assert state["global_models"][1]["fc.weight"].dtype == np.float64 and state["scalars"][3] == np.float16(1.5)
    assert os.listdir(tmp_path) == [CHECKPOINT_FILE]  # no temporary file left
    (tmp_path / "other").write_bytes(b"")  # as readable as any file the run writes (umask applied)
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE((tmp_path / "other").stat().st_mode)


def test_a_version_1_checkpoint_with_numpy_arrays_still_loads(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    arrays = {"w": np.arange(3, dtype=np.float32)}
    torch.save({"format": CHECKPOINT_FORMAT, "version": 1, "round": 4, "arrays": arrays, "strategy_state": {}}, path)
    loaded = Checkpoint.load(path)
    assert loaded.round == 4 and isinstance(loaded.arrays["w"], np.ndarray)
    np.testing.assert_array_equal(loaded.arrays["w"], arrays["w"])


def test_the_writer_writes_each_round_in_order_from_a_snapshot_taken_at_save(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    writer = CheckpointWriter(path)
    arrays = {"w": np.zeros(1000, dtype=np.float32)}
    for round_ in (1, 2, 3):
        arrays["w"][:] = round_
        state = {"seen": [round_]}
        writer.save(Checkpoint(round_, arrays, state))
        arrays["w"][:] = -1  # the next round changes the model and the state in place: the saved ones must not see it
        state["seen"].append(-1)
    writer.close()
    loaded = Checkpoint.load(path)
    assert loaded.round == 3 and loaded.strategy_state == {"seen": [3]}
    assert np.array_equal(loaded.arrays["w"], np.full(1000, 3, dtype=np.float32))
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_a_failed_background_write_is_raised_not_lost(tmp_path):
    writer = CheckpointWriter(tmp_path / "missing-folder" / CHECKPOINT_FILE)
    writer.save(Checkpoint(1, {}, {}))
    with pytest.raises(FileNotFoundError):
        writer.close()


def test_an_unmarked_checkpoint_of_an_earlier_version_still_loads(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    torch.save({"round": 4, "arrays": {"w": np.ones(2, dtype=np.float32)}, "strategy_state": {"rule": {}}}, path)
    loaded = Checkpoint.load(path)
    assert loaded.round == 4 and loaded.strategy_state == {"rule": {}}


def test_the_file_is_synced_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    events: list[str] = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(descriptor: int) -> None:
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(descriptor).st_mode) else "fsync file")
        fsync(descriptor)

    def recording_replace(source, target) -> None:
        assert os.path.dirname(source) == str(tmp_path)  # same folder: the rename cannot cross file systems
        events.append("replace")
        replace(source, target)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    sample_checkpoint().save(tmp_path / CHECKPOINT_FILE)
    assert events == ["fsync file", "replace", "fsync folder"]


def test_a_failed_rename_leaves_the_previous_checkpoint_whole_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / CHECKPOINT_FILE
    sample_checkpoint(1).save(path)

    def failing_replace(source, target) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        sample_checkpoint(2).save(path)
    monkeypatch.undo()
    assert Checkpoint.load(path).round == 1
    assert os.listdir(tmp_path) == [CHECKPOINT_FILE]


KILLED_WRITER = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from pathlib import Path
    from fedweigh.results import Checkpoint

    path = Path(sys.argv[1])
    Checkpoint(1, {"w": np.zeros(1000, dtype=np.float32)}, {}).save(path)

    def hang(source, target):  # the process is killed here: written, synced, not yet renamed
        print("renaming", flush=True)
        sys.stdin.read()

    os.replace = hang
    Checkpoint(2, {"w": np.ones(1000, dtype=np.float32)}, {}).save(path)
    """
)


def test_a_server_killed_between_write_and_rename_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(path)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline() == "renaming\n"  # blocks until the writer is at its rename
    finally:
        writer.kill()  # SIGKILL: no handler, no cleanup
        writer.wait()
    (leftover,) = [name for name in os.listdir(tmp_path) if name != CHECKPOINT_FILE]
    assert leftover.startswith(f".{CHECKPOINT_FILE}.") and leftover.endswith(".tmp")
    previous = Checkpoint.load(path)
    assert previous.round == 1 and not previous.arrays["w"].any()
    sample_checkpoint(3).save(path)  # the resumed server's next checkpoint clears the dead writer's file
    assert os.listdir(tmp_path) == [CHECKPOINT_FILE] and Checkpoint.load(path).round == 3


# ---------------------------------------------------------------------------
# the file: what is refused, and how
# ---------------------------------------------------------------------------


class RunsCode:
    """Pickles as a call: loading it unsafely would create ``marker``."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def write_bad_file(kind: str, path, tmp_path) -> str:
    """Write a bad ``kind`` of file at ``path``; the words the refusal must use."""
    if kind == "truncated":
        sample_checkpoint().save(path)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return "is truncated or damaged"
    if kind == "empty":
        path.write_bytes(b"")
        return "is empty"
    if kind == "random bytes":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
        return "is not a PyTorch file, or is damaged"
    if kind == "state_dict":
        torch.save(torch.nn.Linear(3, 2).state_dict(), path)
        return "is not a fedweigh checkpoint: it holds a dict of 2 tensors (a model's state_dict?): 'weight', 'bias'"
    if kind == "code":
        torch.save({"round": 1, "arrays": {}, "strategy_state": {"x": RunsCode(tmp_path / "ran")}}, path)
        return "holds Python objects (posix.mkdir) that a fedweigh checkpoint never holds; not loaded"
    if kind == "newer":
        torch.save({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION + 1, "round": 1}, path)
        return f"is a fedweigh checkpoint of version {CHECKPOINT_VERSION + 1}, which this version cannot read"
    if kind == "damaged":
        payload = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "round": 2}
        torch.save({**payload, "arrays": {"w": [1.0, 1.0]}, "strategy_state": {}}, path)
        return "is a damaged fedweigh checkpoint: its arrays are not named arrays or tensors"
    raise AssertionError(kind)


BAD_FILES = ("truncated", "empty", "random bytes", "state_dict", "code", "newer", "damaged")


@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_file_that_is_not_a_whole_checkpoint_is_refused_with_the_setting_the_file_and_what_is_accepted(
    tmp_path, kind
):
    path = tmp_path / CHECKPOINT_FILE
    why = write_bad_file(kind, path, tmp_path)
    with pytest.raises(ValueError) as refused:
        Checkpoint.load(path)
    message = str(refused.value)
    assert message.startswith(f"setting resume-from = {str(tmp_path)!r}: {path} {why}"), message
    assert message.endswith(
        f"accepted: the folder of an earlier run of this app, with the {CHECKPOINT_FILE} it wrote "
        f"(format {CHECKPOINT_FORMAT!r}, version {CHECKPOINT_VERSION} or older)"
    )
    assert "\n" not in message and not (tmp_path / "ran").exists()  # one line; the pickled call never ran
