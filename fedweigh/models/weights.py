"""Pretrained weights: where they come from, and one clear error when they cannot be had.

A model with published weights is built from them when ``model-pretrained =
true``. ``model-weights`` names where:

* ``""`` (default): the model's published source, the Hugging Face Hub for
  the ViT (``google/vit-base-patch16-224-in21k``, the supervised ImageNet-21k
  checkpoint the Feddle paper fine-tunes) or torchvision's store for the
  ResNet-18 (``resnet18-f37072fd.pth``, ImageNet-1k). Each is downloaded once
  into its library's cache (``HF_HOME``, ``TORCH_HOME``) and read from there
  afterwards, also offline;
* a local file or folder: a ``state_dict`` file (``.pth``, ``.pt``,
  ``.safetensors``) or, for the ViT, a folder written by ``save_pretrained``
  (``config.json`` and the weights). Nothing is downloaded;
* for the ViT, another Hub id (``google/vit-base-patch16-224``).

:func:`fetch` makes sure the weights are at hand without building a model (the
preflight check calls it, so a missing download fails before any process
starts training, and the cache is filled once for every client on that
machine). Anything that cannot be had raises :class:`WeightsUnavailable`,
whose message names the settings and what is accepted.

Which source each model has is in :data:`PUBLISHED`; the loading itself is in
the model modules (:mod:`fedweigh.models.resnet`, :mod:`fedweigh.models.vit`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

STATE_DICT_SUFFIXES = (".pth", ".pt", ".safetensors", ".bin")


class WeightsUnavailable(ValueError):
    """Pretrained weights that cannot be found or read; the message says which setting to change."""


@dataclass(frozen=True)
class Published:
    """Where a model's published weights live.

    Attributes
    ----------
    kind : {"hub", "torchvision"}
        The Hugging Face Hub (``location`` a repository id) or torchvision's
        store (``location`` a URL, cached under ``torch.hub.get_dir()``).
    location : str
        The repository id or the URL.
    description : str
        What the weights are, for messages and the docs.
    """

    kind: str
    location: str
    description: str


PUBLISHED: dict[str, Published] = {
    "vit-b16": Published(
        "hub", "google/vit-base-patch16-224-in21k", "ViT-B/16 pretrained on ImageNet-21k (the Hugging Face Hub)"
    ),
    "resnet18-imagenet": Published(
        "torchvision",
        "https://download.pytorch.org/models/resnet18-f37072fd.pth",
        "torchvision's ResNet-18 IMAGENET1K_V1 (resnet18-f37072fd.pth)",
    ),
}
"""Model name -> its published weights (a model not listed has none: it needs ``model-weights``)."""


def offline() -> bool:
    """True when downloads are switched off (``HF_HUB_OFFLINE=1``, which this project honours for both stores)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def local_path(weights: str) -> Path | None:
    """``weights`` as an existing local file or folder; None when it is not a path (a Hub id, or empty)."""
    if not weights:
        return None
    path = Path(weights).expanduser()
    if path.exists():
        return path
    if path.is_absolute() or weights.startswith((".", "~")) or path.suffix in STATE_DICT_SUFFIXES:
        raise WeightsUnavailable(
            f"setting model-weights = {weights!r}: no such file or folder; accepted: an existing state_dict file "
            f"({', '.join(STATE_DICT_SUFFIXES)}), a folder written by save_pretrained, or '' for the published weights"
        )
    return None


def state_dict_file(path: Path) -> Path:
    """The one state_dict file at ``path`` (the file itself, or the only one in a folder)."""
    if path.is_file():
        return path
    found = sorted(p for p in path.iterdir() if p.suffix in STATE_DICT_SUFFIXES)
    if len(found) != 1:
        raise WeightsUnavailable(
            f"setting model-weights = {str(path)!r} is a folder with {len(found)} state_dict files; "
            f"accepted: a folder with exactly one ({', '.join(STATE_DICT_SUFFIXES)}) or the file itself"
        )
    return found[0]


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` or a ``torch.save``'d state_dict file."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same message
        raise WeightsUnavailable(
            f"setting model-weights = {str(path)!r} cannot be read as a state_dict: {err}"
        ) from err
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsUnavailable(f"setting model-weights = {str(path)!r} does not hold a state_dict of tensors")
    return state


def unavailable(model: str, source: str, reason: object) -> WeightsUnavailable:
    """The one message for weights that cannot be had: what was tried, why it failed, what to set instead."""
    return WeightsUnavailable(
        f"setting model-pretrained = true needs the weights of model {model!r}, but {source} could not be read "
        f"({reason}); accepted: model-weights = a local state_dict file or save_pretrained folder, a machine online "
        "once (the download is cached), or model-pretrained = false"
    )


def torchvision_file(model: str, url: str) -> Path:
    """A torchvision checkpoint's file in torchvision's cache, downloaded once (hash-checked) unless offline."""
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(url).name
    if cached.is_file():
        return cached
    if offline():
        raise unavailable(model, f"{cached.name} (not in torchvision's cache {cached.parent})", "HF_HUB_OFFLINE=1")
    cached.parent.mkdir(parents=True, exist_ok=True)
    digest = torch.hub.HASH_REGEX.search(cached.name)
    try:  # written to a temporary file and moved into place: a failed download leaves nothing behind
        torch.hub.download_url_to_file(
            url, str(cached), hash_prefix=digest.group(1) if digest else None, progress=False
        )
    except Exception as err:  # noqa: BLE001 - network, disk and hash failures alike
        raise unavailable(model, url, err) from err
    return cached


def hub_snapshot(model: str, repository: str) -> Path:
    """A local folder with the Hub repository's config and weights (cached; downloaded once unless offline)."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repository, allow_patterns=["*.json", "*.safetensors"])
    except Exception as err:  # noqa: BLE001 - offline, unknown repository, network
        raise unavailable(model, f"the Hub repository {repository!r}", f"{type(err).__name__}: {err}") from err
    return Path(folder)


def fetch(model: str, weights: str) -> Path:
    """Make sure the weights for ``model`` are at hand; their local file or folder.

    Raises :class:`WeightsUnavailable` when they are neither local nor
    downloadable.
    """
    path = local_path(weights)
    if path is not None:
        return path
    published = PUBLISHED.get(model)
    if weights:  # a Hub id
        if published is not None and published.kind != "hub":
            raise WeightsUnavailable(
                f"setting model-weights = {weights!r} is not a local file or folder; accepted for model {model!r}: "
                f"a local state_dict file, or '' for {published.description}"
            )
        return hub_snapshot(model, weights)
    if published is None:
        raise WeightsUnavailable(
            f"setting model-pretrained = true: model {model!r} has no published weights; accepted: model-weights = "
            "a local state_dict file or save_pretrained folder, or model-pretrained = false"
        )
    if published.kind == "hub":
        return hub_snapshot(model, published.location)
    return torchvision_file(model, published.location)
