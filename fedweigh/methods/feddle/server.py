"""Feddle's methods and strategy; Center and Fed+FT, its baselines trained on the server's data.

The atlas (:mod:`~fedweigh.methods.feddle.atlas`) and the coefficient search
(:mod:`~fedweigh.methods.feddle.update`) are Feddle's server update; Center
and Fed+FT (:mod:`~fedweigh.methods.feddle.server_training`) are the
paper's baselines on the same server data. Clients train as they always do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fedweigh.data.server import ServerData
from fedweigh.data.tensors import ImageTensors
from fedweigh.methods.declaration import Declaration, Method
from fedweigh.methods.fedavg.server import SAMPLE_COUNT
from fedweigh.methods.feddle.protocol import FeddleSettings
from fedweigh.methods.feddle.server_training import Center, FineTunedMean
from fedweigh.methods.feddle.update import FeddleUpdate
from fedweigh.settings import Settings, SettingsError
from fedweigh.strategies.library import MethodStrategy
from fedweigh.strategies.updates import ServerUpdate

FEDDLE = Method("feddle", SAMPLE_COUNT, update=FeddleUpdate, meaning="Feddle: atlas merging searched on server data")
_FEDDLE = FeddleSettings()


class Feddle(MethodStrategy):
    """Feddle: the new model is ``w + Σ ĉ_m ā_m`` over an atlas of past client updates, ĉ searched on server data.

    Clients train as they always do (no client step). The server holds
    images of its own: of the clients' classes (``kind = "id"``), or another
    dataset's (``"ood"``: a linear head on the model's ``classifier`` layer
    is fitted to them first). ``server_images`` are ``uint8`` ``[N, C, H, W]``
    as your dataset stores them, ``preprocess`` what your pipeline does to a
    batch of them before the model (say, scale and normalise), ``model`` a
    model of your architecture (its weights are overwritten). Without server
    data the step is the fallback (FedBuff's step over the round's arrivals).
    Made for asynchrony, as :class:`~fedweigh.methods.fedbuff.server.FedBuff`.
    Options as ``[feddle]``.
    """

    method = FEDDLE

    def __init__(
        self,
        *,
        model: nn.Module,
        server_images: torch.Tensor | None = None,
        server_labels: torch.Tensor | None = None,
        preprocess: Callable[[torch.Tensor], torch.Tensor] = lambda images: images.float() / 255.0,
        kind: str = "id",
        classifier: str = "",
        search_epochs: int = _FEDDLE.search_epochs,
        search_lr: float = _FEDDLE.search_lr,
        regularization: float = _FEDDLE.regularization,
        atlas_size: int = _FEDDLE.atlas_size,
        **kwargs: Any,
    ) -> None:
        if kind not in ("id", "ood"):
            raise SettingsError([f"kind = {kind!r}: the server data's classes; accepted: 'id' (the clients'), 'ood'"])
        if classifier:
            model.classifier_layer = classifier  # what an out-of-distribution head replaces
        self._model = model
        self._server_data = None
        if server_images is not None:
            if server_labels is None:
                raise SettingsError(["server_labels = None with server_images: accepted: one label per image"])
            labels = server_labels.to(torch.int64)
            classes = int(labels.max()) + 1 if len(labels) else 0
            self._server_data = ServerData(
                kind, ImageTensors(server_images, labels), classes, _Preprocessing(preprocess), "library"
            )
        feddle = {
            "search_epochs": search_epochs,
            "search_lr": search_lr,
            "regularization": regularization,
            "atlas_size": atlas_size,
        }
        super().__init__(options={"feddle": feddle}, server_data=self._server_data, **kwargs)

    def server_update(self, settings: Settings) -> ServerUpdate:
        return FeddleUpdate.for_model(settings, self._model, self._server_data)


class _Preprocessing:
    """A user's batch preprocessing as a :class:`~fedweigh.data.transforms.BatchTransform` (no augmentation)."""

    def __init__(self, preprocess: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.preprocess = preprocess

    def __call__(self, images: torch.Tensor, train: bool = False, generator: torch.Generator | None = None) -> Any:
        return self.preprocess(images)


DECLARATION = Declaration(
    methods=(
        FEDDLE,
        Method("center", SAMPLE_COUNT, update=Center, meaning="Center: trained on the server's data alone"),
        Method("fedft", SAMPLE_COUNT, update=FineTunedMean, meaning="Fed+FT: FedAvg, then fine-tuned on server data"),
    ),
    updates=(FeddleUpdate, Center, FineTunedMean),
    strategies=(Feddle,),
)
