"""The run folder the ServerApp writes: resuming, keeping the rounds up to the checkpoint."""

from __future__ import annotations

import pytest

from fedweigh.results import CHECKPOINT_FILE, MODEL_FILE, Checkpoint, RunRecorder, read_metrics, resolve_run_dir


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
    assert message.startswith(f"setting resume-from = {str(folder)!r}: {checkpoint} {why}"), message
    assert "; accepted: the folder of an earlier run of this app" in message
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before
