"""The run folder the ServerApp writes: resuming, keeping the rounds up to the checkpoint."""

from __future__ import annotations

import json

import pytest

from fedweigh.results import CHECKPOINT_FILE, MODEL_FILE, Checkpoint, RunRecorder, read_metrics, resolve_run_dir
from fedweigh.run_folder import CONFIG_FILE, RESUMES_FILE, ROUNDS_NOT_AGGREGATED, SUMMARY_FILE


def test_resume_from_a_folder_without_checkpoint_is_refused(tmp_path):
    with pytest.raises(ValueError, match="resume-from.*no checkpoint.pt"):
        resolve_run_dir("outputs", "", str(tmp_path), "fedavg")


def test_resume_keeps_rounds_up_to_the_checkpoint(tmp_path):
    recorder = RunRecorder(tmp_path)
    recorder.begin({"strategy": "fedavg"}, resumed_round=0)
    for round_number in (1, 2, 3):
        recorder.record_round({"round": round_number, "accuracy": 0.1 * round_number, "loss": 1.0}, 3)
    Checkpoint(2, {}, {}).save(tmp_path / CHECKPOINT_FILE)
    assert resolve_run_dir("ignored", "ignored", str(tmp_path), "fedavg") == tmp_path
    resumed = RunRecorder(tmp_path)
    resumed.begin({"strategy": "fedavg"}, resumed_round=Checkpoint.load(tmp_path / CHECKPOINT_FILE).round)
    assert [row["round"] for row in read_metrics(tmp_path)] == [1, 2]
    summary = resumed.finish({}, {"accuracy": 0.2, "loss": 1.0})
    assert summary["best_accuracy"] == pytest.approx(0.2) and summary["rounds"] == 2


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("truncate", "is truncated or damaged (a PyTorch file that cannot be read whole: "),
        ("model.pt", "is not a fedweigh checkpoint: it holds a dict of 4 tensors (a model's state_dict?)"),
    ],
    ids=["truncated", "model.pt-in-its-place"],
)
def test_the_server_app_refuses_a_bad_checkpoint_with_one_clear_message_before_writing_anything(tmp_path, damage, why):
    """A half-written checkpoint (a copy interrupted, a full disk), or the final model put in its place.

    The real ServerApp ``main`` (in process) stops with the message of :meth:`Checkpoint.load`, naming
    ``resume-from``, the file and what is accepted, and leaves the run's folder as it was.
    """
    from loopback import run_in_process

    config = {"num-server-rounds": 1, "local-epochs": 1, "output-dir": str(tmp_path), "run-name": "run"}
    folder = run_in_process(config)
    checkpoint = folder / CHECKPOINT_FILE
    if damage == "truncate":
        checkpoint.write_bytes(checkpoint.read_bytes()[:-100])
    else:
        checkpoint.write_bytes((folder / MODEL_FILE).read_bytes())  # mlp: fc1, fc2 weights and biases
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    with pytest.raises(ValueError) as refused:
        run_in_process({**config, "num-server-rounds": 2, "resume-from": str(folder)})
    message = str(refused.value)
    assert message.startswith(f"invalid run config:\n  - resume-from = {str(folder)!r}: {checkpoint} {why}"), message
    assert "; accepted: the folder of an earlier run of this app" in message
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before


def test_a_resume_keeps_the_runs_config_and_notes_what_changed(tmp_path):
    """A resume rewrote config.json with its own settings (and a generated run-name): the original was lost."""
    from loopback import run_in_process

    config = {"num-server-rounds": 2, "local-epochs": 1, "seed": 7, "output-dir": str(tmp_path), "run-name": "x"}
    folder = run_in_process(config)
    original = (folder / CONFIG_FILE).read_bytes()
    assert json.loads(original)["num_partitions"] == 4
    run_in_process({**config, "num-server-rounds": 3, "resume-from": str(folder), "round-timeout": 60.0})
    assert (folder / CONFIG_FILE).read_bytes() == original
    (resumption,) = [json.loads(line) for line in (folder / RESUMES_FILE).read_text().splitlines()]
    assert resumption["after_round"] == 2 and resumption["num_partitions"] == 4
    assert resumption["changed"] == {
        "num-server-rounds": {"was": 2, "now": 3},
        "round-timeout": {"was": 3600.0, "now": 60.0},
        "resume-from": {"was": "", "now": str(folder)},
    }
    assert [row["round"] for row in read_metrics(folder)] == [1, 2, 3]


def test_rounds_that_were_not_aggregated_are_named_in_the_summary(tmp_path):
    """A run whose rounds lost every client reported finished:completed; only metrics.jsonl told."""
    from loopback import run_in_process

    config = {"num-server-rounds": 2, "local-epochs": 1, "output-dir": str(tmp_path), "run-name": "lost"}
    faulty = run_in_process({**config, "faults.kinds": "exception", "faults.fraction": 1.0})
    summary = json.loads((faulty / SUMMARY_FILE).read_text())
    assert summary[ROUNDS_NOT_AGGREGATED] == [1, 2]
    healthy = run_in_process({**config, "run-name": "healthy"})
    assert json.loads((healthy / SUMMARY_FILE).read_text())[ROUNDS_NOT_AGGREGATED] == []
