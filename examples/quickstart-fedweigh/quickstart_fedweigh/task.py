"""The model, the data and the training loop: the example's own, as in Flower's quickstart."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from flwr_datasets import FederatedDataset
from flwr_datasets.partitioner import IidPartitioner
from torch import nn
from torch.utils.data import DataLoader
from torchvision.transforms import Compose, Normalize, ToTensor

BatchWeights = Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None]
"""Per-sample loss weights of a batch, from its logits and its samples' indices (None: plain mean loss)."""


class Net(nn.Module):
    """The quickstart's CNN for 32x32 RGB images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


_federations: dict[tuple[str, int], FederatedDataset] = {}
_normalize = Compose([ToTensor(), Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])


def _federation(dataset: str, num_partitions: int) -> FederatedDataset:
    key = (dataset, num_partitions)
    if key not in _federations:
        partitioners = {"train": IidPartitioner(num_partitions=num_partitions)}
        folder = Path(dataset).expanduser()
        if folder.is_dir():  # a local copy in the Hugging Face layout
            files = {split: str(folder / f"{split}.parquet") for split in ("train", "test")}
            _federations[key] = FederatedDataset(dataset="parquet", data_files=files, partitioners=partitioners)
        else:
            _federations[key] = FederatedDataset(dataset=dataset, partitioners=partitioners)
    return _federations[key]


def _as_tensors(batch: dict) -> dict:
    image = "img" if "img" in batch else "image"
    return {"img": [_normalize(img.convert("RGB")) for img in batch[image]], "label": batch["label"]}


def load_data(dataset: str, partition_id: int, num_partitions: int, batch_size: int) -> tuple[DataLoader, DataLoader]:
    """This client's partition, 80 % to train on and 20 % to test on, as the quickstart splits it."""
    partition = _federation(dataset, num_partitions).load_partition(partition_id)
    split = partition.train_test_split(test_size=0.2, seed=42)
    train = split["train"].add_column("index", list(range(len(split["train"])))).with_transform(_with_index)
    return (
        DataLoader(train, batch_size=batch_size, shuffle=True),
        DataLoader(split["test"].with_transform(_as_tensors), batch_size=batch_size),
    )


def _with_index(batch: dict) -> dict:
    return {**_as_tensors(batch), "index": batch["index"]}


def load_centralized_test(dataset: str) -> DataLoader:
    """The whole test split, for the server's evaluation."""
    test = _federation(dataset, 1).load_split("test").with_transform(_as_tensors)
    return DataLoader(test, batch_size=128)


def load_server_images(dataset: str, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` images of the test split as ``uint8 [N, C, H, W]``, and their labels: data the server holds."""
    test = _federation(dataset, 1).load_split("test").select(range(count))
    image = "img" if "img" in test.column_names else "image"
    images = [torch.as_tensor(np.asarray(img.convert("RGB"))).permute(2, 0, 1) for img in test[image]]
    return torch.stack(images), torch.as_tensor(test["label"])


def preprocess(images: torch.Tensor) -> torch.Tensor:
    """What the clients' pipeline does to an image: scale to [0, 1], normalise each channel to [-1, 1]."""
    return (images.float() / 255.0 - 0.5) / 0.5


def inputs_in_order(loader: DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    """Every training input and label of a loader's dataset, in its order (``index`` 0, 1, ...)."""
    images, labels = [], []
    for batch in DataLoader(loader.dataset, batch_size=256, shuffle=False):
        images.append(batch["img"])
        labels.append(batch["label"])
    return torch.cat(images), torch.cat(labels)


def train(
    net: nn.Module,
    loader: DataLoader,
    epochs: int,
    lr: float,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
) -> float:
    """The quickstart's loop; ``loss_fn(logits, labels, indices)`` is the batch loss. Returns the mean loss."""
    net.to(device)
    net.train()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    total, batches = 0.0, 0
    for _ in range(epochs):
        for batch in loader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            optimizer.zero_grad()
            loss = loss_fn(net(images), labels, batch["index"])
            loss.backward()
            optimizer.step()
            total += loss.item()
            batches += 1
    return total / max(batches, 1)


def test(net: nn.Module, loader: DataLoader, device: torch.device) -> tuple[float, float]:
    """Mean loss and accuracy."""
    net.to(device)
    net.eval()
    loss, correct, seen = 0.0, 0, 0
    with torch.no_grad():
        for batch in loader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            logits = net(images)
            loss += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(1) == labels).sum().item()
            seen += len(labels)
    return loss / seen, correct / seen
