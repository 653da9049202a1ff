"""Tests of the data layer: sources, partitioning, tensors, batches, transforms, caching.

Everything runs offline: the digits need no download, and the parquet tests
use the local copies of MNIST and CIFAR-10 (``../shared/datasets`` from the
project root, or ``$FEDWEIGH_DATASETS``), skipped where they are absent.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from fedweigh.data.description import DatasetInfo
from fedweigh.data.federated import (
    DataSpec,
    clear_caches,
    dataset_info,
    load_partition,
    load_test_split,
    partition_sizes,
)
from fedweigh.data.files import detect_image_column, detect_label_column
from fedweigh.data.loader import batches
from fedweigh.data.partitioning import build_partitioner, partition_row_counts
from fedweigh.data.sources import load_digits, resolve_source, validate_dataset_setting
from fedweigh.data.tensors import ImageTensors, to_image_tensors
from fedweigh.data.transforms import BatchTransform, normalize, random_crop_flip
from fedweigh.settings import PARTITIONERS

ROOT = Path(__file__).resolve().parents[1]
DATASETS = Path(os.environ.get("FEDWEIGH_DATASETS", ROOT.parent / "shared" / "datasets"))
DIGITS_TRAIN = 1437
KINDS = PARTITIONERS

# flwr-datasets' ShardPartitioner sorts with an argument pyarrow 25 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:Specifying null_placement:FutureWarning")


@pytest.fixture(autouse=True, scope="module")
def offline_hf_cache() -> Iterator[None]:
    """No network, and a project-local Hugging Face cache (git-ignored ``.cache``)."""
    import flwr_datasets.common.telemetry as telemetry

    cache = ROOT / ".cache" / "huggingface"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_HOME", str(cache))
        patch.setenv("HF_DATASETS_CACHE", str(cache / "datasets"))
        patch.setenv("FLWR_TELEMETRY_ENABLED", "0")
        # datasets and flwr_datasets read these once, at import time.
        patch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        patch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", cache / "datasets")
        patch.setattr(telemetry, "FLWR_TELEMETRY_ENABLED", "0")
        yield


def local_dataset(name: str) -> str:
    folder = DATASETS / name
    if not (folder / "train.parquet").is_file():
        pytest.skip(f"no local copy of {name} under {DATASETS}")
    return str(folder)


def digits_spec(kind: str = "dirichlet", **changes: object) -> DataSpec:
    fields: dict[str, object] = {"dataset": "digits", "partitioner": kind, "num_partitions": 10, "seed": 1}
    fields.update(changes)
    return DataSpec(**fields)  # type: ignore[arg-type]


def partition_labels(spec: DataSpec) -> list[torch.Tensor]:
    return [load_partition(spec, pid).labels for pid in range(spec.num_partitions)]


# --- partitioning -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "pathological"])
def test_partitions_cover_the_train_split(kind: str) -> None:
    sizes = partition_sizes(digits_spec(kind))
    assert len(sizes) == 10
    assert sum(sizes) == DIGITS_TRAIN


def test_shard_partitions_cover_all_but_the_remainder() -> None:
    # Equal shards: floor(N / (P * S)) samples each; the remainder is left out.
    spec = digits_spec("shard", shards_per_client=2)
    shards = spec.num_partitions * spec.shards_per_client
    sizes = partition_sizes(spec)
    assert sizes == [DIGITS_TRAIN // shards * spec.shards_per_client] * spec.num_partitions
    assert DIGITS_TRAIN - shards < sum(sizes) <= DIGITS_TRAIN


def test_partitions_are_disjoint() -> None:
    ids = datasets.Dataset.from_dict({"label": np.repeat(np.arange(10), 50), "row": np.arange(500)})
    for kind in KINDS:
        partitioner = build_partitioner(
            kind, 10, seed=3, dirichlet_alpha=0.3, classes_per_client=2, shards_per_client=2, min_partition_size=0
        )
        partitioner.dataset = ids
        rows = np.concatenate([partitioner.load_partition(pid)["row"] for pid in range(10)])
        assert len(rows) == len(set(rows.tolist())), kind


@pytest.mark.parametrize("rows", [500, 503, 9, 10])
def test_row_counts_are_the_sizes_of_the_loaded_partitions(rows: int) -> None:
    """The counts read without loading (IID's chunks, fedweigh's row partitioners) match the partitions."""
    ids = datasets.Dataset.from_dict({"label": np.arange(rows) % 10, "row": np.arange(rows)})
    compared = set()
    for kind in PARTITIONERS:
        partitioner = build_partitioner(
            kind, 7, seed=3, dirichlet_alpha=0.3, classes_per_client=2, shards_per_client=1, min_partition_size=0
        )
        partitioner.dataset = ids
        try:
            loaded = [partitioner.load_partition(pid).num_rows for pid in range(7)]
        except ValueError:  # a split these few rows cannot give (e.g. too few per shard)
            continue
        assert partition_row_counts(partitioner) == loaded, kind
        compared.add(kind)
    assert {"iid", "soft-capped-dirichlet", "dirichlet"} <= compared


def _partition_rows(kind: str, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    table = datasets.Dataset.from_dict({"label": rng.integers(0, 10, 600), "row": np.arange(600)})
    partitioner = build_partitioner(
        kind, 10, seed=seed, dirichlet_alpha=0.5, classes_per_client=2, shards_per_client=2, min_partition_size=0
    )
    partitioner.dataset = table
    return [list(partitioner.load_partition(pid)["row"]) for pid in range(10)]


@pytest.mark.sim
@pytest.mark.parametrize("kind", [kind for kind in PARTITIONERS if kind != "iid"])
def test_partitioner_is_deterministic_given_the_seed(kind: str) -> None:
    assert _partition_rows(kind, seed=5) == _partition_rows(kind, seed=5)
    assert _partition_rows(kind, seed=5) != _partition_rows(kind, seed=6)


@pytest.mark.sim
@pytest.mark.parametrize("kind", KINDS)
def test_federated_partitions_are_deterministic_given_the_seed(kind: str) -> None:
    first = [load_partition(digits_spec(kind), pid) for pid in (0, 7)]
    clear_caches()
    again = [load_partition(digits_spec(kind), pid) for pid in (0, 7)]
    other = [load_partition(digits_spec(kind, seed=2), pid) for pid in (0, 7)]
    for a, b in zip(first, again, strict=True):
        assert a is not b
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert any(
        a.images.shape != c.images.shape or not torch.equal(a.images, c.images)
        for a, c in zip(first, other, strict=True)
    )


def _mean_max_class_share(spec: DataSpec) -> float:
    shares = [
        float(labels.bincount(minlength=10).max()) / len(labels) for labels in partition_labels(spec) if len(labels)
    ]
    return float(np.mean(shares))


@pytest.mark.sim
def test_label_skew_grows_as_alpha_falls() -> None:
    skewed = np.mean([_mean_max_class_share(digits_spec(dirichlet_alpha=0.1, seed=s)) for s in (1, 2, 3)])
    mild = np.mean([_mean_max_class_share(digits_spec(dirichlet_alpha=10.0, seed=s)) for s in (1, 2, 3)])
    assert skewed > mild + 0.2
    assert mild < 0.3  # close to the 0.1 share of a balanced client


@pytest.mark.sim
@pytest.mark.parametrize("classes", [1, 2, 3])
def test_pathological_partitions_hold_at_most_classes_per_client(classes: int) -> None:
    spec = digits_spec("pathological", classes_per_client=classes)
    for labels in partition_labels(spec):
        assert len(labels) > 0
        assert len(labels.unique()) <= classes


def test_unknown_partitioner_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match=r"partitioner.*'uniform'.*" + ", ".join(PARTITIONERS)):
        build_partitioner(
            "uniform", 4, seed=1, dirichlet_alpha=0.5, classes_per_client=2, shards_per_client=2, min_partition_size=0
        )
    with pytest.raises(ValueError, match="partitioner"):
        digits_spec("uniform")


def test_partition_id_out_of_range_is_a_clear_error() -> None:
    spec = digits_spec("iid", num_partitions=4)
    for bad in (-1, 4):
        with pytest.raises(ValueError, match=rf"partition_id = {bad} is out of range: num_partitions = 4"):
            load_partition(spec, bad)
    with pytest.raises(ValueError, match="integer"):
        load_partition(spec, "0")  # type: ignore[arg-type]


# --- sources ------------------------------------------------------------------


@pytest.mark.sim
def test_digits_split_and_info() -> None:
    splits = load_digits()
    assert (splits["train"].num_rows, splits["test"].num_rows) == (DIGITS_TRAIN, 360)
    info = dataset_info("digits")
    assert (info.num_classes, info.in_channels, info.image_size, info.augment) == (10, 1, 8, "none")
    assert (info.image_column, info.label_column) == ("image", "label")
    test = load_test_split(digits_spec())
    assert test.images.shape == (360, 1, 8, 8) and test.images.dtype == torch.uint8
    assert int(test.images.max()) == 255


@pytest.mark.parametrize(
    ("name", "column", "shape", "augment"),
    [("mnist", "image", (1, 28, 28), "none"), ("cifar10", "img", (3, 32, 32), "crop-flip")],
)
@pytest.mark.sim
def test_local_parquet_folder(name: str, column: str, shape: tuple[int, int, int], augment: str) -> None:
    folder = local_dataset(name)
    info = dataset_info(folder)
    assert (info.image_column, info.label_column) == (column, "label")
    assert (info.num_classes, info.in_channels, info.image_size, info.augment) == (10, shape[0], shape[1], augment)
    spec = DataSpec(
        dataset=folder, partitioner="dirichlet", num_partitions=5, seed=1, train_subset=1000, test_subset=200
    )
    assert sum(partition_sizes(spec)) == 1000
    for data, size in ((load_partition(spec, 2), partition_sizes(spec)[2]), (load_test_split(spec), 200)):
        assert data.images.shape == (size, *shape)
        assert data.images.dtype == torch.uint8 and data.labels.dtype == torch.int64
        assert int(data.labels.min()) >= 0 and int(data.labels.max()) <= 9
        assert data.images.float().std() > 10  # real pictures, not blanks


def test_known_statistics_are_used_for_known_datasets() -> None:
    info = dataset_info(local_dataset("cifar10"))
    assert info.mean == (0.4914, 0.4822, 0.4465) and info.std == (0.2470, 0.2435, 0.2616)


def test_subsets_have_the_requested_sizes() -> None:
    spec = digits_spec("iid", num_partitions=4, train_subset=500, test_subset=100)
    assert sum(partition_sizes(spec)) == 500
    assert len(load_test_split(spec)) == 100
    with pytest.raises(ValueError, match="train-subset = 5000 exceeds"):
        partition_sizes(digits_spec("iid", train_subset=5000))


def test_cache_returns_the_same_objects() -> None:
    spec = digits_spec("dirichlet")
    assert load_partition(spec, 3) is load_partition(spec, 3)
    assert load_test_split(spec) is load_test_split(spec)
    assert dataset_info("digits") is dataset_info(" digits")
    assert load_partition(digits_spec("dirichlet"), 3) is load_partition(spec, 3)  # equal specs share


def test_dataset_setting_rejects_missing_path_and_folder_without_parquet(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere")
    for value in (missing, "./no-such-folder", "~/no/such/folder/here"):
        with pytest.raises(ValueError, match="dataset") as raised:
            validate_dataset_setting(value)
        assert value in str(raised.value) and "owner/name" in str(raised.value)
    (tmp_path / "train.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match="dataset") as raised:
        validate_dataset_setting(str(tmp_path))
    assert str(tmp_path) in str(raised.value) and "test.parquet" in str(raised.value)
    with pytest.raises(ValueError, match="dataset"):
        validate_dataset_setting("cifar10-but-no-owner")


def test_dataset_setting_accepts_digits_folders_and_hub_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    assert validate_dataset_setting("digits") == "digits"
    for hub_id in ("uoft-cs/cifar10", "ylecun/mnist", "zalando-datasets/fashion_mnist"):
        assert validate_dataset_setting(hub_id) == hub_id
    assert resolve_source("uoft-cs/cifar10").loader_arguments() == {"dataset": "uoft-cs/cifar10"}
    for name in ("mnist", "cifar10"):
        folder = local_dataset(name)
        assert validate_dataset_setting(folder) == folder
        monkeypatch.chdir(DATASETS)
        canonical = validate_dataset_setting(f"./{name}")
        assert os.path.isabs(canonical)  # canonical: absolute (realpath: the folder may sit behind a symlink)
        assert os.path.realpath(canonical) == os.path.realpath(folder)


def test_columns_are_detected_from_features() -> None:
    features = datasets.Features(
        {"fine_label": datasets.ClassLabel(num_classes=3), "photo": datasets.Image(), "label": datasets.Value("int8")}
    )
    assert detect_image_column(features) == "photo"
    assert detect_label_column(features) == "fine_label"
    with pytest.raises(ValueError, match="image column"):
        detect_image_column(datasets.Features({"label": datasets.Value("int8")}))


# --- tensors ------------------------------------------------------------------


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def test_encoded_images_decode_to_one_uint8_tensor() -> None:
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, (3, 6, 6, 4), dtype=np.uint8)
    rows = {"picture": [{"bytes": _png(image), "path": None} for image in rgba], "y": [0, 1, 2]}
    table = datasets.Dataset.from_dict(
        rows, features=datasets.Features({"picture": datasets.Image(), "y": datasets.Value("int64")})
    )
    data = to_image_tensors(table, "picture", "y")
    assert data.images.shape == (3, 3, 6, 6)  # alpha dropped
    assert torch.equal(data.images, torch.from_numpy(rgba[..., :3]).permute(0, 3, 1, 2))
    assert to_image_tensors(table, "picture", "y", channels=1).images.shape == (3, 1, 6, 6)
    empty = to_image_tensors(table.select([]), "picture", "y", channels=3, image_size=6)
    assert len(empty) == 0 and empty.images.shape == (0, 3, 6, 6)


def test_image_tensors_subset_and_validation() -> None:
    data = ImageTensors(torch.arange(4, dtype=torch.uint8).view(4, 1, 1, 1).expand(4, 1, 2, 2), torch.arange(4))
    part = data.subset(np.array([3, 1]))
    assert len(part) == 2 and part.labels.tolist() == [3, 1] and part.images[:, 0, 0, 0].tolist() == [3, 1]
    assert data.label_counts(5).tolist() == [1, 1, 1, 1, 0]
    with pytest.raises(ValueError, match="uint8"):
        ImageTensors(torch.zeros(2, 1, 2, 2), torch.arange(2))
    with pytest.raises(ValueError, match="labels"):
        ImageTensors(torch.zeros(2, 1, 2, 2, dtype=torch.uint8), torch.arange(3))


# --- loader -------------------------------------------------------------------


@pytest.mark.parametrize(("shuffle", "batch_size"), [(True, 32), (False, 32), (True, 1), (True, 1000)])
def test_batches_visit_every_index_once_per_epoch(shuffle: bool, batch_size: int) -> None:
    data = load_partition(digits_spec("iid", num_partitions=3), 0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(2):
        seen = []
        for images, labels, indices in batches(data, batch_size, shuffle=shuffle, generator=generator):
            assert len(images) == len(labels) == len(indices) <= batch_size
            assert torch.equal(images, data.images[indices]) and torch.equal(labels, data.labels[indices])
            seen.append(indices)
        order = torch.cat(seen)
        assert sorted(order.tolist()) == list(range(len(data)))
        assert (order.tolist() == list(range(len(data)))) is not shuffle


def test_batches_shuffle_is_seeded() -> None:
    data = load_partition(digits_spec("iid", num_partitions=3), 1)

    def order(seed: int) -> list[int]:
        generator = torch.Generator().manual_seed(seed)
        return torch.cat([i for _, _, i in batches(data, 50, shuffle=True, generator=generator)]).tolist()

    assert order(4) == order(4) and order(4) != order(5)


# --- transforms ---------------------------------------------------------------


def _cifar_like_batch(n: int = 16) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)


def test_random_crop_flip_keeps_shape_is_seeded_and_changes_images() -> None:
    batch = _cifar_like_batch().float() / 255
    first = random_crop_flip(batch, 4, torch.Generator().manual_seed(1))
    again = random_crop_flip(batch, 4, torch.Generator().manual_seed(1))
    other = random_crop_flip(batch, 4, torch.Generator().manual_seed(2))
    assert first.shape == batch.shape and first.dtype == batch.dtype
    assert torch.equal(first, again) and not torch.equal(first, other)
    changed = [not torch.equal(a, b) for a, b in zip(first, batch, strict=True)]
    assert sum(changed) >= len(batch) // 2


def test_random_crop_flip_is_a_padded_crop_possibly_mirrored() -> None:
    batch = _cifar_like_batch(6)
    out = random_crop_flip(batch, 2, torch.Generator().manual_seed(3))
    padded = torch.nn.functional.pad(batch, (2, 2, 2, 2))
    for sample, result in zip(padded, out, strict=True):
        candidates = [
            crop.flip(-1) if mirror else crop
            for top in range(5)
            for left in range(5)
            for mirror in (False, True)
            for crop in [sample[:, top : top + 32, left : left + 32]]
        ]
        assert any(torch.equal(result, candidate) for candidate in candidates)


def test_normalize_with_the_data_own_stats_gives_zero_mean() -> None:
    images = load_partition(digits_spec("iid", num_partitions=1), 0).images
    info = dataset_info("digits")
    x = normalize(images, info.mean, info.std)
    assert x.dtype == torch.float32
    assert abs(float(x.mean())) < 1e-3 and abs(float(x.std()) - 1) < 1e-2
    cifar = _cifar_like_batch().float() / 255
    mean, std = cifar.mean(dim=(0, 2, 3)).tolist(), cifar.std(dim=(0, 2, 3)).tolist()
    assert normalize(cifar, mean, std).mean(dim=(0, 2, 3)).abs().max() < 1e-5


def test_batch_transform_augments_only_training_batches_of_crop_flip_datasets() -> None:
    batch = _cifar_like_batch(8)
    info = DatasetInfo(10, 3, 32, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), "crop-flip", "img", "label")
    plain = normalize(batch, info.mean, info.std)
    augmenting = BatchTransform(info, augment=True)
    assert torch.equal(augmenting(batch, train=False, generator=None), plain)
    assert not torch.equal(augmenting(batch, train=True, generator=torch.Generator().manual_seed(0)), plain)
    assert torch.equal(BatchTransform(info, augment=False)(batch, train=True), plain)
    gray = DatasetInfo(10, 1, 28, (0.5,), (0.25,), "none", "image", "label")
    small = batch[:, :1, :28, :28]
    assert torch.equal(BatchTransform(gray, augment=True)(small, train=True), normalize(small, (0.5,), (0.25,)))


# --- partition seed, self-balancing, top-up -------------------------------------------


@pytest.mark.sim
def test_partition_seed_fixes_the_split_whatever_the_run_seed():
    from fedweigh.components import data_spec
    from fedweigh.settings import validate

    def sizes(**config: object) -> list[int]:
        return partition_sizes(data_spec(validate({"dirichlet-alpha": 0.3, **config}), 10))

    assert sizes(seed=1, **{"partition-seed": 42}) == sizes(seed=2, **{"partition-seed": 42})
    assert sizes(seed=1) != sizes(seed=2)  # -1, the default: the split follows the run seed
    assert sizes(seed=42) == sizes(seed=7, **{"partition-seed": 42})


@pytest.mark.sim
def test_self_balancing_stops_filling_clients_past_the_mean():
    spec = digits_spec(dirichlet_alpha=0.1, num_partitions=10)
    balanced = replace(spec, dirichlet_self_balancing=True)
    plain_sizes, balanced_sizes = partition_sizes(spec), partition_sizes(balanced)
    assert sum(balanced_sizes) == sum(plain_sizes) == DIGITS_TRAIN
    # a client past N/K gets no more classes; it can exceed the mean only by the class that filled it
    largest_class = max(np.bincount(load_test_split(spec).labels.numpy(), minlength=10)) * 4  # ~train share
    assert max(balanced_sizes) <= DIGITS_TRAIN / 10 + largest_class
    assert np.std(balanced_sizes) < np.std(plain_sizes)


@pytest.mark.sim
def test_top_up_reaches_the_minimum_where_rejection_sampling_gives_up():
    spec = digits_spec(dirichlet_alpha=0.1, num_partitions=100, min_partition_size=10)
    with pytest.raises(ValueError, match="max number of attempts"):
        partition_sizes(spec)  # Flower's 10 draws cannot reach it
    topped = replace(spec, partition_top_up=True)
    sizes = partition_sizes(topped)
    assert min(sizes) >= 10 and sum(sizes) == DIGITS_TRAIN
    first = partition_labels(topped)
    clear_caches()
    again = partition_labels(topped)  # recomputed from scratch: the top-up is seeded
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_top_up_moves_samples_disjointly_and_only_when_needed():
    from fedweigh.data.top_up import top_up

    rng = np.random.default_rng(0)
    parts = [np.arange(0, 50), np.arange(50, 53), np.arange(53, 60), np.arange(60, 62)]
    moved, count = top_up(parts, 5, rng)
    assert [len(p) for p in moved] == [45, 5, 7, 5] and count == 5  # smallest first, from the largest
    assert sorted(np.concatenate(moved).tolist()) == list(range(62))  # nothing lost, nothing duplicated
    again, _ = top_up(parts, 5, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(moved, again, strict=True))
    assert top_up(parts, 2, rng)[1] == 0  # every partition already big enough
    with pytest.raises(ValueError, match="cannot give every partition 40 samples"):
        top_up(parts, 40, rng)


def test_top_up_keeps_a_draw_that_already_meets_the_minimum():
    spec = digits_spec(dirichlet_alpha=0.5, num_partitions=10, min_partition_size=20)
    assert partition_sizes(replace(spec, partition_top_up=True)) == partition_sizes(spec)
