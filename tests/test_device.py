"""The ``device`` setting: ``auto`` takes CUDA when there is one; ``cuda`` without one stops early.

The machines that run these tests have no GPU, so CUDA's presence is
simulated by patching ``torch.cuda.is_available``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import REPO, FakeGrid
from flwr.app import Context, Message, RecordDict

from fedweigh import client_app, server_app
from fedweigh.components import resolve_device
from fedweigh.launch.runconfig import load_app_config

NO_GPU = "none is visible to this process"


@pytest.fixture
def without_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def run_config(**changes) -> dict:
    return {**load_app_config(REPO), **changes}


def test_auto_takes_cuda_when_present_and_cpu_otherwise(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda") and resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")  # cpu stays cpu even with a GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")


def test_cuda_without_a_gpu_names_the_setting_and_the_way_out(without_gpu):
    with pytest.raises(ValueError, match=NO_GPU) as raised:
        resolve_device("cuda")
    assert "device = 'cuda'" in str(raised.value) and "'auto'" in str(raised.value) and "'cpu'" in str(raised.value)


def test_serverapp_stops_before_asking_any_node_or_writing_results(without_gpu, tmp_path):
    grid = FakeGrid({100 + i: i for i in range(3)})
    context = Context(
        run_id=1,
        node_id=0,
        node_config={},
        state=RecordDict(),
        run_config=run_config(device="cuda", **{"output-dir": str(tmp_path / "outputs"), "run-name": "gpu"}),
    )
    with pytest.raises(ValueError, match=NO_GPU):
        server_app.main(grid, context)
    assert grid.sent == []  # not even the query that asks nodes for their partition
    assert not (tmp_path / "outputs").exists()


def test_clientapp_stops_before_loading_data_or_training(without_gpu, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("reached data loading or training")

    monkeypatch.setattr(client_app, "load_partition", must_not_run)
    monkeypatch.setattr(client_app, "train_locally", must_not_run)
    context = Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": 0, "num-partitions": 3},
        state=RecordDict(),
        run_config=run_config(device="cuda"),
    )
    message = Message(RecordDict(), dst_node_id=7, message_type="train")
    with pytest.raises(ValueError, match=NO_GPU):
        client_app.train(message, context)
