"""Feddle's server step: merge the model atlas with coefficients searched on the server's data.

The Feddle paper (Zhu et al., "Guided Model Merging for Hybrid Data Learning:
Leveraging Centralized Data to Refine Decentralized Models"; spec
``specs/feddle.md`` §3) leaves the clients as plain local trainers and puts
the whole method on the server. Each round, :class:`FeddleUpdate`:

1. adds every arriving client update ``Δ = θ_client − θ_start`` (trainable
   parameters only, relative to the model the client started from) to the
   :class:`~fedweigh.methods.feddle.atlas.ModelAtlas` of at most M anchors,
   evicting the least important one when full;
2. rescales the anchors to their median norm, ``ā_m = r_m a_m`` (Eq. 4);
3. starts the coefficients at FedBuff's step, ``c'`` (the fallback, §3.4);
4. with in-distribution server data, searches ``c`` on the loss of
   ``w + Σ c_m ā_m`` over that data (Eq. 5) plus ``(λ/2)||c − c'||²``;
   with out-of-distribution data, first fits a linear head θ on the server's
   own classes at ``c'``, then searches on the body scored through θ (Eqs.
   7-9). Each step is one forward and one backward pass at the merged model
   and two products with the anchor matrix (App. E: the model is linear in
   c, so ``∂L/∂c_m = r_m <∂L/∂w, a_m>``; no graph runs through the anchors);
5. sets the new global model to ``w + Σ ĉ_m ā_m`` (the head too, with the
   coefficients found on the body), and each anchor's importance to |ĉ_m|.

Batch-norm buffers are not searched: they are the sample-weighted mean of the
arriving clients' buffers (FedAvg's), unchanged in a round nothing arrives.
The fallback is FedBuff's step over the updates received since the last
search, which is the round's arrivals (spec §3.4: ``c'_m = η_g sw(τ_m) /
|B| / r_m``, τ in rounds, η_g = 1 and sw = 1 by default,
``feddle.fallback-server-lr`` and ``feddle.fallback-staleness-scaling``), not
Nguyen et al.'s buffer of K updates (:mod:`fedweigh.methods.fedbuff.server`).
:class:`FallbackStep` is the step with the search off: the fallback itself,
``w + η_g / |B| Σ_{new} sw(τ) Δ``.

Each search records its cost in the round's diagnostics: its wall time
(``search-seconds``), its coefficient steps (``search-steps``:
``feddle.search-epochs`` passes over the server's data, each batch a forward
and a backward pass through the model), the head's steps with
out-of-distribution data (``head-steps``, as many, each a forward pass through
the body), and every image the model took in (``search-images``: those
batches, and the two loss measurements on up to :data:`LOSS_SAMPLE` images).

Example
-------
>>> import torch
>>> from torch import nn
>>> view = ParameterView(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
>>> view.parameters, view.buffers
(['0.weight', '0.bias', '1.weight', '1.bias'], ['1.running_mean', '1.running_var', '1.num_batches_tracked'])
>>> view.size
10
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedweigh.components import new_model, resolve_device
from fedweigh.data.loader import batches
from fedweigh.data.server import ServerData
from fedweigh.methods.feddle.atlas import (
    ModelAtlas,
    coefficient_gradient,
    fallback_coefficients,
    median_norm_ratios,
    merged,
)
from fedweigh.models import on_device
from fedweigh.models.finetuning import exchanged_keys
from fedweigh.results import SEARCH_SECONDS
from fedweigh.settings import Settings
from fedweigh.strategies.averaging import NamedArrays, weighted_average
from fedweigh.strategies.updates import RoundUpdate, ServerUpdate

logger = logging.getLogger("flwr.fedweigh")

LOSS_SAMPLE = 256
"""The search loss recorded before and after each search is measured on this many server images."""


class ParameterView:
    """A model's trainable parameters as one flat vector; its buffers apart.

    The order is ``model.named_parameters()``'s; a model arriving as
    ``{name: array}`` (a Flower ``ArrayRecord``, decoded) is flattened in that
    order (:meth:`flatten`) and written back (:meth:`unflatten`).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.parameters = [name for name, _ in named]
        self.tensors = [p for _, p in named]
        self.shapes = [tuple(p.shape) for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        parameters = set(self.parameters)
        self.buffers = [name for name in exchanged_keys(model) if name not in parameters]  # those that travel
        self.size = sum(self.sizes)

    def flatten(self, arrays: NamedArrays) -> torch.Tensor:
        """The trainable parameters of ``arrays`` as one float32 vector."""
        return torch.cat(
            [torch.tensor(np.asarray(arrays[name]), dtype=torch.float32).reshape(-1) for name in self.parameters]
        )

    def unflatten(self, vector: torch.Tensor) -> dict[str, np.ndarray]:
        """``{name: array}`` of the trainable parameters in ``vector``."""
        pieces = torch.split(vector.detach().cpu(), self.sizes)
        return {
            name: piece.reshape(shape).numpy().astype(np.float32, copy=True)
            for name, piece, shape in zip(self.parameters, pieces, self.shapes, strict=True)
        }

    @torch.no_grad()
    def load(self, vector: torch.Tensor) -> None:
        """Write ``vector`` into the model's parameters (in place: their memory format stays)."""
        pieces = torch.split(vector.to(self.tensors[0].device), self.sizes)
        for tensor, piece in zip(self.tensors, pieces, strict=True):
            tensor.copy_(piece.view_as(tensor))

    def gradient(self, loss: torch.Tensor) -> torch.Tensor:
        """``∂loss/∂w`` as one flat vector (zeros for parameters the loss does not touch)."""
        grads = torch.autograd.grad(loss, self.tensors, allow_unused=True)
        return torch.cat(
            [
                (g if g is not None else torch.zeros_like(p)).reshape(-1)
                for g, p in zip(grads, self.tensors, strict=True)
            ]
        )

    def head_mask(self, head: str) -> torch.Tensor:
        """True on the entries of the vector that belong to submodule ``head``."""
        mask = [
            torch.full((size,), name.startswith(head + "."), dtype=torch.bool)
            for name, size in zip(self.parameters, self.sizes, strict=True)
        ]
        return torch.cat(mask)


@dataclass(frozen=True)
class SearchOptions:
    """How the coefficients are searched (the ``[feddle]`` settings)."""

    search: bool = True
    init: str = "fallback"  # or "zero"
    regularization: float = 0.01
    learning_rate: float = 1e-3
    epochs: int = 10
    batch_size: int = 64
    optimizer: str = "adam"
    max_coefficient: float = 0.0
    head_learning_rate: float = 1e-3

    @classmethod
    def from_settings(cls, settings: Settings) -> SearchOptions:
        feddle = settings.feddle
        return cls(
            search=feddle.search,
            init=feddle.init,
            regularization=feddle.regularization,
            learning_rate=feddle.search_lr,
            epochs=feddle.search_epochs,
            batch_size=feddle.search_batch_size,
            optimizer=feddle.search_optimizer,
            max_coefficient=feddle.max_coefficient,
            head_learning_rate=feddle.head_lr,
        )


Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""Batch loss of the model as currently loaded: ``loss(images uint8, labels)``."""


def search_coefficients(
    view: ParameterView,
    base: torch.Tensor,
    anchors: torch.Tensor,
    ratios: torch.Tensor,
    start: torch.Tensor,
    fallback: torch.Tensor,
    loss: Loss,
    data: Iterator[tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    options: SearchOptions,
) -> torch.Tensor:
    """Minimise ``loss(w + Σ c_m r_m a_m) + (λ/2)||c − c'||²`` over ``c`` from ``start`` (spec §3.7).

    Each step loads the merged model (no graph through the anchors), takes
    one backward pass for ``g = ∂loss/∂w``, and steps ``c`` along
    ``r ⊙ (A g) + λ (c − c')``. Returns the last iterate.
    """
    coefficients = start.clone().double()
    coefficients.requires_grad_(False)
    parameters = [coefficients]
    if options.optimizer == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(parameters, lr=options.learning_rate)
    else:
        optimizer = torch.optim.Adam(parameters, lr=options.learning_rate)
    for _ in range(steps):
        images, labels = next(data)
        view.load(merged(base, anchors, ratios, coefficients))
        gradient = view.gradient(loss(images, labels))
        coefficients.grad = coefficient_gradient(
            gradient.to(anchors.device), anchors, ratios, coefficients, fallback, options.regularization
        )
        optimizer.step()
        if options.max_coefficient > 0:
            coefficients.clamp_(-options.max_coefficient, options.max_coefficient)
    return coefficients.detach()


class Tally:
    """A stream of ``(images, labels)`` batches that counts the images it hands out."""

    def __init__(self, stream: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.stream = stream
        self.images = 0

    def __iter__(self) -> Tally:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = next(self.stream)
        self.images += len(labels)
        return images, labels


def epochs_of(
    server_data: ServerData, batch_size: int, generator: torch.Generator, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of the server data, reshuffled every epoch, for as long as asked."""
    data = server_data.data.to(device)
    while True:
        for images, labels, _ in batches(data, batch_size, shuffle=True, generator=generator):
            yield images, labels


class FeddleUpdate(ServerUpdate):
    """Feddle's server step (see the module docstring).

    Parameters
    ----------
    model : nn.Module
        A model of the run's architecture, used for the search (its weights
        are overwritten every step).
    server_data : ServerData, optional
        In-distribution (the clients' classes) or out-of-distribution (its
        own classes: a head θ is fitted). Without it there is no search.
    options : SearchOptions
    atlas_size : int
        M; 0: twice the clients sampled in the first round that brings news.
    fifo : bool
        Evict the oldest anchor instead of the least important.
    normalize : bool
        Rescale anchors to the median norm.
    server_lr, staleness_scaling
        The fallback's η_g and 1/sqrt(1 + τ) scaling (τ in rounds).
    seed : int
        Seeds the search's batch order, round by round.
    """

    name = "feddle"
    uses_weights = False
    server_data = ("id", "ood")

    def __init__(
        self,
        model: nn.Module,
        server_data: ServerData | None = None,
        options: SearchOptions | None = None,
        *,
        atlas_size: int = 0,
        fifo: bool = False,
        normalize: bool = True,
        server_lr: float = 1.0,
        staleness_scaling: bool = False,
        seed: int = 0,
        device: torch.device | None = None,
    ) -> None:
        self.device = device or torch.device("cpu")
        self.model = on_device(model, self.device)
        self.view = ParameterView(self.model)
        self.data = server_data
        self.options = options or SearchOptions()
        self.atlas = ModelAtlas(capacity=atlas_size, fifo=fifo, device=self.device)
        self.normalize = normalize
        self.server_lr = server_lr
        self.staleness_scaling = staleness_scaling
        self.seed = seed
        self.head: nn.Linear | None = None
        if server_data is not None and server_data.kind == "ood":
            classifier = self.model.get_submodule(self.model.classifier_layer)
            if not isinstance(classifier, nn.Linear):
                raise ValueError(f"the model's classifier {self.model.classifier_layer!r} is not an nn.Linear")
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.head = nn.Linear(classifier.in_features, server_data.num_classes).to(self.device)

    @classmethod
    def build(cls, settings: Settings, server_data: object | None = None) -> FeddleUpdate:
        data = server_data if isinstance(server_data, ServerData) else None
        feddle = settings.feddle
        options = SearchOptions.from_settings(settings)
        return cls._from_settings(settings, data, options, feddle.fallback_server_lr, feddle.fallback_staleness_scaling)

    @classmethod
    def _from_settings(
        cls,
        settings: Settings,
        data: ServerData | None,
        options: SearchOptions,
        server_lr: float,
        staleness_scaling: bool,
        model: nn.Module | None = None,
    ) -> FeddleUpdate:
        return cls(
            new_model(settings) if model is None else model,
            data,
            options,
            atlas_size=settings.feddle.atlas_size,
            fifo=settings.feddle.eviction == "fifo",
            normalize=settings.feddle.normalize,
            server_lr=server_lr,
            staleness_scaling=staleness_scaling,
            seed=settings.seed,
            device=resolve_device(settings.device),
        )

    @classmethod
    def for_model(cls, settings: Settings, model: nn.Module, data: ServerData | None) -> FeddleUpdate:
        """The step the settings' ``[feddle]`` describe, searching with ``model`` (a library user's own)."""
        feddle = settings.feddle
        options = SearchOptions.from_settings(settings)
        return cls._from_settings(
            settings, data, options, feddle.fallback_server_lr, feddle.fallback_staleness_scaling, model
        )

    @property
    def searches(self) -> bool:
        return self.options.search and self.data is not None

    # -- the round ------------------------------------------------------------

    def __call__(self, update: RoundUpdate) -> dict[str, np.ndarray]:
        if self.atlas.capacity == 0:
            self.atlas.capacity = max(1, 2 * (update.clients_per_round or len(update.models)))
        base = self.view.flatten(update.global_model)
        evicted_before = self.atlas.evictions
        for index, model in enumerate(update.models):
            delta = (self.view.flatten(model) - self.view.flatten(update.start_model(index))).to(self.device)
            self.atlas.add(
                delta,
                origin=update.partitions[index] if update.partitions else index,
                num_examples=int(update.num_examples[index]),
                dispatch_round=update.model_rounds[index],
                arrival_round=update.server_round,
            )
        anchors = self.atlas.matrix()
        ratios = median_norm_ratios(anchors.cpu(), self.normalize).to(self.device)
        fallback = fallback_coefficients(self.atlas.anchors, ratios.cpu(), self.server_lr, self.staleness_scaling).to(
            self.device
        )
        base = base.to(self.device)
        diagnostics = update.diagnostics
        if self.searches:
            coefficients = self._search(update.server_round, base, anchors, ratios, fallback, diagnostics)
        else:
            coefficients = fallback
        new = merged(base, anchors, ratios, coefficients)
        self.atlas.score(coefficients.cpu())

        diagnostics.update(
            {
                "atlas-size": len(self.atlas),
                "atlas-mb": round(self.atlas.nbytes / 2**20, 3),
                "evictions": self.atlas.evictions - evicted_before,
                "new-anchors": len(update.models),
                "coefficients": [round(float(c), 6) for c in coefficients.cpu()],
                "negative-coefficients": int((coefficients < 0).sum()),
                "mean-abs-coefficient": float(coefficients.abs().mean()),
                "anchor-origins": [anchor.origin for anchor in self.atlas.anchors],
            }
        )
        result = dict(self.view.unflatten(new))
        result.update(self._buffers(update))
        return {name: result[name] for name in update.global_model}  # the global model's key order

    def _buffers(self, update: RoundUpdate) -> dict[str, np.ndarray]:
        """The arrivals' buffers, weighted by sample count (FedAvg's); not searched."""
        if not self.view.buffers:
            return {}
        weights = np.asarray(update.num_examples, dtype=np.float64)
        buffers = [{name: model[name] for name in self.view.buffers} for model in update.models]
        return weighted_average(buffers, weights / weights.sum())

    # -- the search -----------------------------------------------------------

    def _search(
        self,
        server_round: int,
        base: torch.Tensor,
        anchors: torch.Tensor,
        ratios: torch.Tensor,
        fallback: torch.Tensor,
        diagnostics: dict[str, Any],
    ) -> torch.Tensor:
        assert self.data is not None
        started = time.perf_counter()
        generator = torch.Generator(device="cpu").manual_seed(
            int(np.random.SeedSequence([self.seed, server_round]).generate_state(1)[0])
        )
        stream = Tally(epochs_of(self.data, self.options.batch_size, generator, self.device))
        steps = self.options.epochs * math.ceil(len(self.data) / self.options.batch_size)
        self.model.eval()  # BN running statistics, no dropout: the search never touches the buffers
        if self.data.kind == "ood":
            self.view.load(merged(base, anchors, ratios, fallback))
            diagnostics["head-loss"] = self._fit_head(stream, steps)
            diagnostics["head-steps"] = steps
            loss = self._surrogate_loss
        else:
            loss = self._task_loss
        start = fallback if self.options.init == "fallback" else torch.zeros_like(fallback)
        diagnostics["search-loss-before"] = self._server_loss(merged(base, anchors, ratios, start), loss)
        coefficients = search_coefficients(
            self.view, base, anchors, ratios, start, fallback, loss, stream, steps, self.options
        )
        diagnostics["search-loss-after"] = self._server_loss(merged(base, anchors, ratios, coefficients), loss)
        diagnostics["search-steps"] = steps
        diagnostics["search-images"] = stream.images + 2 * min(LOSS_SAMPLE, len(self.data))
        diagnostics[SEARCH_SECONDS] = round(time.perf_counter() - started, 4)
        return coefficients

    def _task_loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        assert self.data is not None
        return F.cross_entropy(self.model(self.data.transform(images, train=False)), labels)

    def _features(self, images: torch.Tensor) -> torch.Tensor:
        """The input of the model's classifier: the body's output φ(x)."""
        assert self.data is not None
        captured: list[torch.Tensor] = []
        classifier = self.model.get_submodule(self.model.classifier_layer)
        handle = classifier.register_forward_hook(lambda module, inputs, output: captured.append(inputs[0]))
        try:
            self.model(self.data.transform(images, train=False))
        finally:
            handle.remove()
        return captured[0]

    def _surrogate_loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``h = CE(θ(φ(x; w_body)), y_ood)``: the body scored through the server's head (Eq. 7)."""
        assert self.head is not None
        return F.cross_entropy(self.head(self._features(images)), labels)

    def _fit_head(self, stream: Iterator[tuple[torch.Tensor, torch.Tensor]], steps: int) -> float:
        """θ on the server's classes, the body fixed at the fallback merge (Eq. 8); warm-started every round."""
        assert self.head is not None
        optimizer = torch.optim.Adam(self.head.parameters(), lr=self.options.head_learning_rate)
        total = 0.0
        for _ in range(steps):
            images, labels = next(stream)
            with torch.no_grad():
                features = self._features(images)
            loss = F.cross_entropy(self.head(features), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item()
        return total / max(steps, 1)

    @torch.no_grad()
    def _server_loss(self, weights: torch.Tensor, loss: Loss) -> float:
        """Mean loss at ``weights`` over the first :data:`LOSS_SAMPLE` server images (a random draw already)."""
        assert self.data is not None
        self.view.load(weights)
        data = self.data.data.subset(torch.arange(min(LOSS_SAMPLE, len(self.data))))
        images, labels = data.images.to(self.device), data.labels.to(self.device)
        return float(loss(images, labels))

    # -- checkpoint -----------------------------------------------------------

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"atlas": self.atlas.state()}
        if self.head is not None:
            state["head"] = {k: v.detach().cpu().clone() for k, v in self.head.state_dict().items()}
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        if "atlas" in state:
            self.atlas.capacity = int(state["atlas"].get("capacity", self.atlas.capacity))
            self.atlas.load_state(state["atlas"])
        if self.head is not None and "head" in state:
            self.head.load_state_dict(state["head"])


class FallbackStep(FeddleUpdate):
    """Feddle's fallback alone, the search off: ``w + η_g / |B| Σ sw(τ) Δ`` over the round's arrivals, τ in rounds.

    It is spec §3.11's mode "none", and what ``strategy = "fedbuff"`` runs with
    ``fedbuff.buffer-size = 0`` (with ``fedbuff.server-lr`` and
    ``fedbuff.staleness-scaling``): the FedBuff of this package before issue
    51, bit for bit. Nguyen et al.'s buffer of K updates is
    :class:`fedweigh.methods.fedbuff.server.BufferedStep`.
    """

    name = "fedbuff"
    server_data = ()

    @classmethod
    def build(cls, settings: Settings, server_data: object | None = None) -> FallbackStep:
        fedbuff = settings.fedbuff
        update = cls._from_settings(
            settings, None, SearchOptions(search=False), fedbuff.server_lr, fedbuff.staleness_scaling
        )
        return update  # type: ignore[return-value]
