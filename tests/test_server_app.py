"""The run folder the ServerApp writes: resuming, keeping the rounds up to the checkpoint."""

from __future__ import annotations

import pytest

from fedweigh.results import CHECKPOINT_FILE, Checkpoint, RunRecorder, read_metrics, resolve_run_dir


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
