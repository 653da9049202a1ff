"""A SuperNode for a real site: ``--node-config "data-dir=<folder>"`` trains on the site's own data."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from conftest import REPO
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fedweigh import client_app
from fedweigh.components import new_model, settings_from
from fedweigh.data.sources import load_digits
from fedweigh.launch.runconfig import load_app_config
from fedweigh.protocol import TrainRecipe

SITE_TRAIN, SITE_TEST = 200, 40


@pytest.fixture(autouse=True)
def private_arrow_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


@pytest.fixture
def site(tmp_path):
    """A hospital's folder: digits it holds itself, as train.parquet and test.parquet."""
    folder = tmp_path / "site"
    folder.mkdir()
    digits = load_digits()
    digits["train"].select(range(SITE_TRAIN)).to_parquet(folder / "train.parquet")
    digits["test"].select(range(SITE_TEST)).to_parquet(folder / "test.parquet")
    return str(folder)


def context(node_config: dict, node_id: int = 4242, **run_config) -> Context:
    config = {**load_app_config(REPO), "device": "cpu", **run_config}
    return Context(run_id=1, node_id=node_id, node_config=node_config, state=RecordDict(), run_config=config)


def test_site_trains_on_all_of_its_own_train_split(site):
    settings = settings_from(context({}).run_config)
    data, partition_id, seed_key = client_app.local_data(settings, context({"data-dir": site}))
    assert len(data) == SITE_TRAIN and partition_id == -1 and seed_key == 4242
    _, named, key = client_app.local_data(settings, context({"data-dir": site, "partition-id": 7}))
    assert named == 7 and key == 7


def test_site_with_other_images_than_the_runs_dataset_is_refused(tmp_path):
    folder = tmp_path / "small"
    folder.mkdir()
    features = datasets.Features(
        {"image": datasets.Array2D(shape=(4, 4), dtype="uint8"), "label": datasets.ClassLabel(num_classes=10)}
    )
    rows = {"image": np.zeros((20, 4, 4), dtype=np.uint8), "label": np.arange(20) % 10}
    for split in ("train", "test"):
        datasets.Dataset.from_dict(rows, features=features).to_parquet(folder / f"{split}.parquet")
    settings = settings_from(context({}).run_config)
    with pytest.raises(ValueError, match=r"node config data-dir = .* does not fit setting dataset = 'digits'") as err:
        client_app.local_data(settings, context({"data-dir": str(folder)}))
    assert "image_size 4 (the run's dataset has 8)" in str(err.value)


def test_train_message_on_a_site_replies_with_its_sample_count(site):
    ctx = context({"data-dir": site})
    model = new_model(settings_from(ctx.run_config))
    config = ConfigRecord(
        {
            **TrainRecipe(batch_size=32, learning_rate=0.05).to_config(),
            "server-round": 1,
            "client-steps": ["oui"],
            "oui.probe-size": 16,
            "oui.probe-layer": "",
        }
    )
    message = Message(
        RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": config}),
        dst_node_id=4242,
        message_type="train",
    )
    metrics = client_app.train(message, ctx).content["metrics"]
    assert metrics["num-examples"] == SITE_TRAIN and metrics["partition-id"] == -1
    assert np.isfinite(metrics["train_loss"]) and 0.0 <= metrics["oui"] <= 1.0
