"""Building a run's pieces from its settings, the same way in both apps.

The ServerApp and the ClientApp read the same run config; these functions
turn it into the data spec, the model, the batch transform and the device,
so that server and clients can never disagree on them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from fedweigh.allocator import keep_freed_memory
from fedweigh.data.description import DatasetInfo
from fedweigh.data.federated import DataSpec, dataset_info, feature_normalization, load_test_split
from fedweigh.data.server import ServerData, hold_out, load_other_dataset
from fedweigh.data.tensors import ImageTensors
from fedweigh.data.transforms import BatchTransform
from fedweigh.models import ModelInput, build_model, model_input
from fedweigh.models.finetuning import FineTuning, apply_fine_tuning
from fedweigh.settings import Settings, validate


@functools.lru_cache(maxsize=8)
def _parse_cached(items: tuple[tuple[str, Any], ...]) -> Settings:
    return validate(dict(items))


def settings_from(run_config: Mapping[str, Any]) -> Settings:
    """Parsed settings, cached per process (the run config is the same every message).

    Names (strategy, rule, steps, model) are not checked here: the ServerApp
    checks the whole run config (:mod:`fedweigh.preflight`) before any client
    is asked to do anything.
    """
    return _parse_cached(tuple(sorted(run_config.items())))


def configure_torch() -> None:
    """One intra-op thread per process, unless the user set OMP_NUM_THREADS; freed memory kept for reuse.

    Each simulated client is its own process; two threads per process on a
    2-core machine was measured 7x slower per step than one.
    :func:`~fedweigh.allocator.keep_freed_memory` spares local training the
    page faults that cost it 18-26 % of its time.
    """
    keep_freed_memory()
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def resolve_device(setting: str) -> torch.device:
    """``auto`` picks CUDA when present; ``cuda`` without a GPU is an error."""
    if setting == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "setting device = 'cuda' needs a CUDA GPU, but none is visible to this process "
            "(torch.cuda.is_available() is False); accepted here: 'auto' (CPU when there is no GPU) or 'cpu'"
        )
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda")


def data_spec(settings: Settings, num_partitions: int) -> DataSpec:
    """The data part of the settings, for ``num_partitions`` clients.

    Every :class:`~fedweigh.data.federated.DataSpec` field is the setting of
    the same name, except the number of partitions and the seed (the data
    seed: ``partition-seed``, or the run's seed).
    """
    names = [f.name for f in dataclasses.fields(DataSpec) if f.name not in ("num_partitions", "seed")]
    values = {name: getattr(settings, name) for name in names}
    return DataSpec(**values, num_partitions=num_partitions, seed=settings.data_seed)


def fine_tuning(settings: Settings) -> FineTuning:
    """The ``fine-tuning`` and ``lora-*`` settings."""
    return FineTuning(
        mode=settings.fine_tuning,
        lora_rank=settings.lora_rank,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        lora_targets=settings.lora_target_names,
    )


def input_of(settings: Settings) -> ModelInput:
    """The input the run's model needs (its size, channels and normalisation; None: the dataset's).

    ``normalization-mean`` and ``normalization-std``, when set, replace the
    normalisation (the dataset's statistics, or a pretrained model's).
    """
    needs = model_input(settings.model, **settings.model_options())
    statistics = settings.channel_statistics
    if statistics is None:
        return needs
    return dataclasses.replace(needs, mean=statistics[0], std=statistics[1])


def new_model(settings: Settings, *, pretrained_weights: bool = True) -> nn.Module:
    """The model the settings name, shaped for their dataset and fine-tuned as they say, seeded by ``seed``.

    Its input is the model's own when it has one (:func:`input_of`: a
    pretrained model's 3 x 224 x 224), else the dataset's. With
    ``pretrained_weights=False`` the architecture is built without loading
    the weights ``model-pretrained`` asks for (the preflight check builds it
    on the meta device, where nothing can be loaded).
    """
    info = dataset_info(settings.dataset)
    needs = input_of(settings)
    options = settings.model_options()
    if not pretrained_weights:
        options.pop("pretrained", None)
        options.pop("weights", None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        model = build_model(
            settings.model,
            num_classes=info.num_classes,
            in_channels=needs.channels or info.in_channels,
            image_size=needs.size or info.image_size,
            **options,
        )
        return apply_fine_tuning(model, fine_tuning(settings))


def input_transform(
    info: DatasetInfo,
    augment: bool,
    needs: ModelInput,
    per_feature: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> BatchTransform:
    """Batches of the dataset ``info`` describes (augmented if asked), in the input ``needs`` names."""
    size, channels, mean, std = needs.size, needs.channels, needs.mean, needs.std
    return BatchTransform(info, augment, size=size, channels=channels, mean=mean, std=std, per_feature=per_feature)


def batch_transform(settings: Settings) -> BatchTransform:
    """The dataset's augmentation (training only), then the model's input: size, channels, normalisation.

    ``normalization = 'feature'`` standardises every pixel with the train split's statistics.
    """
    per_feature = feature_normalization(settings.dataset) if settings.normalization == "feature" else None
    return input_transform(dataset_info(settings.dataset), settings.augment, input_of(settings), per_feature)


def server_and_test_data(settings: Settings, num_partitions: int) -> tuple[ServerData | None, ImageTensors]:
    """The server's own data (``server-data``; None without) and the images left to evaluate on.

    In-distribution data is held out of the test split, which then evaluates
    on the rest (``test-holdout`` leaves the same draw out without server
    data); a dataset is loaded in the clients' input shape.

    Raises
    ------
    ValueError
        Naming ``server-data`` or ``server-data-size`` and what is accepted.
    """
    test = load_test_split(data_spec(settings, num_partitions))
    in_distribution = settings.server_data == "id"
    excluded = max(settings.test_holdout, settings.server_data_size if in_distribution else 0)
    held, evaluation = hold_out(test, excluded, settings.data_seed) if excluded else (None, test)
    info = dataset_info(settings.dataset)
    if not settings.server_data:
        return None, evaluation
    if in_distribution:
        assert held is not None
        mine = held.subset(torch.arange(settings.server_data_size))
        transform = batch_transform(settings)
        return ServerData("id", mine, info.num_classes, transform, "held out of the test split"), evaluation
    other = load_other_dataset(
        settings.server_data,
        settings.server_data_size,
        settings.data_seed,
        info.in_channels,
        info.image_size,
        functools.partial(input_transform, augment=False, needs=input_of(settings)),
    )
    return other, evaluation
