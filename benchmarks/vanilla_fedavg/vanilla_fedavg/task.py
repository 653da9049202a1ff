"""Model, data and the training and test loops, in the style of Flower's PyTorch template."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from flwr_datasets import FederatedDataset
from flwr_datasets.partitioner import IidPartitioner
from torch import nn

MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


class Net(nn.Module):
    """The FedOUI paper's CNN: two 3x3 convolutions with pooling, then 128 hidden units."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(64 * 8 * 8, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def new_model(seed: int) -> Net:
    torch.manual_seed(seed)
    # Channels-last weights, as fedweigh's CPU models have: the same training speed on both sides.
    return Net().to(memory_format=torch.channels_last)


def _tensors(split) -> tuple[torch.Tensor, torch.Tensor]:
    images = np.stack([np.asarray(image.convert("RGB")) for image in split["img"]])  # decoded by Flower Datasets
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(255.0)
    return ((x - MEAN) / STD).contiguous(memory_format=torch.channels_last), torch.tensor(split["label"])


@functools.cache
def _federated(dataset: str, num_partitions: int, train_subset: int, test_subset: int, seed: int):
    folder = Path(dataset)
    fds = FederatedDataset(
        dataset="parquet",
        data_files={"train": str(folder / "train.parquet"), "test": str(folder / "test.parquet")},
        partitioners={"train": IidPartitioner(num_partitions=num_partitions)},
        preprocessor=lambda splits: splits.__class__(
            {
                "train": splits["train"].shuffle(seed=seed).select(range(train_subset)),
                "test": splits["test"].shuffle(seed=seed).select(range(test_subset)),
            }
        ),
    )
    return fds


def load_partition(dataset: str, partition_id: int, num_partitions: int, train_subset: int, seed: int):
    """A client's images and labels, decoded once per process."""
    return _decoded(dataset, partition_id, num_partitions, train_subset, seed)


@functools.cache
def _decoded(dataset: str, partition_id: int, num_partitions: int, train_subset: int, seed: int):
    fds = _federated(dataset, num_partitions, train_subset, 1, seed)
    return _tensors(fds.load_partition(partition_id))


def load_test(dataset: str, test_subset: int, seed: int):
    fds = _federated(dataset, 1, 1, test_subset, seed)
    return _tensors(fds.load_split("test"))


def train(net: Net, data, epochs: int, batch_size: int, lr: float, momentum: float, seed: int) -> float:
    images, labels = data
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    criterion = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(seed)
    net.train()
    total = 0.0
    for _ in range(epochs):
        order = torch.randperm(len(labels), generator=generator)
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = criterion(net(images[batch]), labels[batch])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
    return total / (epochs * len(labels))


@torch.no_grad()
def test(net: Net, data) -> tuple[float, float]:
    images, labels = data
    net.eval()
    loss, correct = 0.0, 0
    for start in range(0, len(labels), 256):
        logits = net(images[start : start + 256])
        loss += nn.functional.cross_entropy(logits, labels[start : start + 256], reduction="sum").item()
        correct += int((logits.argmax(1) == labels[start : start + 256]).sum())
    return loss / len(labels), correct / len(labels)
