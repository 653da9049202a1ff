"""The example app (examples/quickstart-fedweigh): Flower's PyTorch quickstart switching methods by one key.

It uses fedweigh's public API only (:mod:`fedweigh.strategies`,
:mod:`fedweigh.client`) with its own model, data pipeline (Flower Datasets)
and training loop. Every method runs two rounds here, its real ServerApp and
ClientApp in this process (``loopback``) on a small CIFAR-10-like dataset;
the replies must carry what the method's rule weighs with, and its weights
must be the rule's. One method also runs through ``flwr run`` on the shared
simulation SuperLink, as a user runs the app.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
from conftest import REPO, SHARED_DATASETS
from flwr.app import Context, RecordDict
from loopback import LoopbackGrid
from PIL import Image

from fedweigh.launch.runconfig import load_app_config
from fedweigh.rules.base import complement_share_weights

EXAMPLE = REPO / "examples" / "quickstart-fedweigh"
DEFAULTS = load_app_config(EXAMPLE)
NODES = 4
SIGNALS = {
    "fedavg": set(),
    "fednolowe": {"train_loss"},
    "fedoui": {"oui"},
    "ufl": {"uncertainty", "uncertainty-mean"},
    "flood": {"ood-score"},
    "feddle": set(),
}


@pytest.fixture(scope="module")
def example():
    """The example's server and client modules, imported from its folder as Flower imports an app."""
    sys.path.insert(0, str(EXAMPLE))
    try:
        yield (
            importlib.import_module("quickstart_fedweigh.server_app"),
            importlib.import_module("quickstart_fedweigh.client_app"),
        )
    finally:
        sys.path.remove(str(EXAMPLE))


@pytest.fixture(scope="module")
def small_cifar(tmp_path_factory) -> Path:
    """CIFAR-10 in the Hugging Face layout, 480 training and 100 test images (the local copy's first ones,
    else random 32x32 images with labels 0..9)."""
    folder = tmp_path_factory.mktemp("cifar10-small")
    local = SHARED_DATASETS / "cifar10"
    for split, rows in (("train", 480), ("test", 100)):
        if (local / f"{split}.parquet").is_file():
            part = datasets.load_dataset("parquet", data_files={split: str(local / f"{split}.parquet")}, split=split)
            part = part.shuffle(seed=rows).select(range(rows))
        else:
            rng = np.random.default_rng(rows)
            images = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(rows)]
            features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
            part = datasets.Dataset.from_dict({"img": images, "label": [k % 10 for k in range(rows)]}, features)
        part.to_parquet(str(folder / f"{split}.parquet"))
    return folder


def run_example(example, dataset: Path, method: str, model_file: Path) -> tuple[LoopbackGrid, object]:
    """Two rounds of ``method``: the example's ServerApp ``main`` and ClientApp, in this process."""
    server_app, client_app = example
    run_config = {**DEFAULTS, "method": method, "num-server-rounds": 2, "dataset": str(dataset)}
    run_config.update({"model-file": str(model_file), "server-images": 50})
    grid = LoopbackGrid(client_app.app, run_config, NODES)
    captured = {}
    make_strategy = server_app.make_strategy

    def keep(*args):
        captured["strategy"] = make_strategy(*args)
        return captured["strategy"]

    server_app.make_strategy = keep
    try:
        server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    finally:
        server_app.make_strategy = make_strategy
    return grid, captured["strategy"]


@pytest.mark.parametrize("method", sorted(SIGNALS))
def test_the_example_runs_each_method_with_the_public_api(example, small_cifar, tmp_path, method):
    grid, strategy = run_example(example, small_cifar, method, tmp_path / "final_model.pt")
    trained = [message for message in grid.sent if message.metadata.message_type == "train"]
    assert len(trained) == 2 * NODES // 2  # fraction-train 0.5 of 4 nodes, 2 rounds
    assert len(trained) == len(grid.sent)  # nothing else: no node is asked for a partition it does not know
    assert (tmp_path / "final_model.pt").is_file()
    if method == "fedavg":
        assert type(strategy).__name__ == "FedAvg"  # Flower's own: the example's baseline
        return
    names = {"fedoui": "FedOUI", "fednolowe": "FedNolowe", "ufl": "UFL", "flood": "FLood", "feddle": "Feddle"}
    assert type(strategy).__name__ == names[method]
    for round_number in (1, 2):
        record = strategy.records[round_number]
        assert record.aggregated and len(record.clients) == 2 and not record.left_out, record
        for client in record.clients:
            assert SIGNALS[method] <= set(client), client
        if method == "feddle":  # no weights: the coefficients searched on the server's 50 images
            assert record.diagnostics["search-steps"] > 0 and record.diagnostics["search-images"] > 0
            continue
        weights = [client["weight"] for client in record.clients]
        assert sum(weights) == pytest.approx(1.0)
        signal = {"fednolowe": "train_loss", "ufl": "uncertainty"}.get(method)
        if signal:  # the rule's own weights, from what the example's clients reported
            reported = np.array([client[signal] for client in record.clients])
            np.testing.assert_allclose(weights, complement_share_weights(reported))
    if method == "flood":  # λ(t) reached the clients: round 2's pseudo-OOD samples weighed more than 1
        assert strategy.records[2].diagnostics["asw-lambda"] > 0


@pytest.mark.xdist_group("simulation")
def test_the_example_runs_through_flwr_run(shared_simulation, small_cifar, tmp_path):
    """``flwr run examples/quickstart-fedweigh --run-config "method='fedoui'"`` on the shared simulation SuperLink."""
    config = {"method": "fedoui", "num-server-rounds": 2, "dataset": str(small_cifar)}
    outcome = shared_simulation.run(
        {**config, "model-file": str(tmp_path / "final_model.pt")},
        app_dir=EXAMPLE,
        num_supernodes=NODES,
        echo=False,
        log_path=tmp_path / "example.log",
    )
    log = (tmp_path / "example.log").read_text()
    assert outcome.ok, f"{outcome.status} {outcome.details}\n{log[-3000:]}"
    assert "Starting FedOUI strategy" in log and "[ROUND 2/2]" in log
    assert (tmp_path / "final_model.pt").is_file()
