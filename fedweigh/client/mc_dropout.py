"""Monte Carlo dropout on any model: dropout sites, seeded masks, MC predictive probabilities.

* a model's own ``nn.Dropout`` modules with ``p > 0`` are used as they are
  (a ViT's are there at ``p = 0`` unless ``model-dropout`` is set; LoRA's
  adapter dropout is not a sampling site); a model without such dropout gets
  one on the input of its ``classifier_layer`` through a forward pre-hook
  (:func:`ensure_mc_dropout`), so its ``state_dict`` keys do not change, it
  is active whenever the model trains, and it does nothing in eval mode (UFL
  spec §4);
* :func:`mc_mean_probabilities`: the mean of ``N`` softmax outputs, each pass
  with fresh masks from :class:`DropoutMasks` (seeded per dropout site), in
  eval mode (BatchNorm on running statistics), without gradients.

Cost of the passes
------------------
Everything before the first dropout is deterministic during the MC passes (the
model is in eval mode there), so the cheap path (``ufl.cheap-path``, default
on) computes the input of the first dropout once per sample and runs only the
rest of the network ``N`` times, batched. The naive path (``N`` full forward
passes) is kept as the reference; both draw their masks from the same
per-dropout-site generators in the same order, so with the same seed they give
the same probabilities up to float rounding.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedweigh.data.loader import batches
from fedweigh.data.tensors import ImageTensors
from fedweigh.data.transforms import BatchTransform

logger = logging.getLogger("flwr.fedweigh")

MC_BATCH_SIZE = 64
"""Samples per batch in the MC passes (the cheap path holds ``N`` copies of a batch's features).

On one CPU thread inference over batches of 64 was faster than over 256
(cache): 0.048 against 0.100 s for 512 LeNet-5 samples, 0.070 against 0.107 s
for the FedOUI CNN (channels-last).
"""
PLAN_CHECK_SAMPLES = 4
"""Samples on which the cheap path checks that the layers after the first dropout reproduce the model.

Eval mode treats every sample on its own (BatchNorm uses running statistics),
so a few samples show whether the chain is right; checking on a whole MC batch
cost a second forward pass of the network over it (measured: the MC step took
about as long as a training epoch on 256 samples instead of about a third).
"""
HEAD_DROPOUT_ATTRIBUTE = "_mc_head_dropout"
"""Attribute of a model holding its inserted :class:`HeadDropout` (and marking it installed)."""


# ---------------------------------------------------------------------------
# MC dropout: where the dropout is, and its masks
# ---------------------------------------------------------------------------


class HeadDropout:
    """Forward pre-hook: dropout on the input of a model's classifier.

    Installed by :func:`ensure_mc_dropout` on models without dropout. The
    classifier module's own ``training`` flag decides: in train mode it is
    ``F.dropout`` (drawing from the global generator, like ``nn.Dropout``), in
    eval mode it does nothing, so evaluation never sees it. During MC sampling
    (``masks`` set) it applies the sampler's masks instead.
    """

    def __init__(self, p: float) -> None:
        self.p = p
        self.masks: DropoutMasks | None = None
        self.key = ""

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if self.masks is not None:
            return (self.masks.apply(self.key, args[0], self.p), *args[1:])
        if module.training and self.p > 0:
            return (F.dropout(args[0], self.p, training=True), *args[1:])
        return None


@dataclass(frozen=True)
class DropoutSite:
    """One place where MC dropout samples masks.

    Attributes
    ----------
    module : str
        Name of an ``nn.Dropout`` module, or of the classifier whose input the
        inserted :class:`HeadDropout` drops.
    p : float
        Drop probability.
    inserted : bool
        Whether this is the inserted head dropout.
    """

    module: str
    p: float
    inserted: bool


def ensure_mc_dropout(model: nn.Module, p: float, classifier: str = "") -> list[DropoutSite]:
    """Make sure ``model`` has dropout to sample; return its dropout sites.

    A model with ``nn.Dropout`` modules of ``p > 0`` keeps them (``p`` is not used). A model
    without gets one :class:`HeadDropout` with probability ``p`` on the input
    of its classifier (``classifier``, else ``model.classifier_layer``), installed once per model object (the
    ClientApp keeps its model across rounds; a later call only updates ``p``).

    Raises
    ------
    ValueError
        If ``p`` is not in ``[0, 1)``, if the model has dropout of a kind other
        than ``nn.Dropout`` (masks of ``Dropout2d`` and ``AlphaDropout`` are
        not element-wise), or if it has neither dropout nor a classifier layer.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"ufl.dropout = {p!r}: the dropout probability must be in [0, 1)")
    head = getattr(model, HEAD_DROPOUT_ATTRIBUTE, None)
    if head is None:
        other = [
            f"{name} ({type(m).__name__})"
            for name, m in model.named_modules()
            if isinstance(m, nn.modules.dropout._DropoutNd) and type(m) is not nn.Dropout
        ]
        if other:
            raise ValueError(f"ufl supports nn.Dropout for MC sampling; the model also has {', '.join(other)}")
        own = dropout_sites(model)
        if own:
            return own
        classifier_name = classifier or getattr(model, "classifier_layer", None)
        if not classifier_name:
            raise ValueError(
                f"ufl: {type(model).__name__} has no nn.Dropout and no classifier_layer to put one before; accepted: "
                "a model with nn.Dropout, or the name of its last layer (classifier)"
            )
        head = HeadDropout(p)
        head.key = classifier_name
        model.get_submodule(classifier_name).register_forward_pre_hook(head)
        setattr(model, HEAD_DROPOUT_ATTRIBUTE, head)  # a plain attribute: not in state_dict
    head.p = p
    return dropout_sites(model)


def dropout_sites(model: nn.Module) -> list[DropoutSite]:
    """The inserted head dropout, or else every ``nn.Dropout`` module in registration order."""
    head = getattr(model, HEAD_DROPOUT_ATTRIBUTE, None)
    if head is not None:
        return [DropoutSite(head.key, head.p, inserted=True)]
    return [
        DropoutSite(name, float(m.p), False)
        for name, m in model.named_modules()
        if type(m) is nn.Dropout and m.p > 0 and ".lora_dropout." not in f".{name}."
    ]


class DropoutMasks:
    """Keep-masks for MC dropout, one generator per dropout site.

    Each site draws from its own ``torch.Generator`` seeded by ``(seed,
    site)``, one ``[B, ...]`` mask per pass. The cheap path stacks ``N``
    passes of a batch along the batch dimension (``stacked = N``) and then
    draws the ``N`` masks of a site one after the other, exactly as ``N``
    separate passes do: both paths see the same masks.

    Parameters
    ----------
    seed : int
        Seed of this client's round (``StepContext.seed``).
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self.stacked = 1
        self._generators: dict[str, torch.Generator] = {}

    def _generator(self, key: str, device: torch.device) -> torch.Generator:
        if key not in self._generators:
            entropy = [self.seed, *key.encode()]
            state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0]
            self._generators[key] = torch.Generator(device=device).manual_seed(int(state) & 0x7FFF_FFFF_FFFF_FFFF)
        return self._generators[key]

    def apply(self, key: str, x: torch.Tensor, p: float) -> torch.Tensor:
        """``x * keep / (1 - p)`` with ``keep ~ Bernoulli(1 - p)`` element-wise, per pass."""
        if p <= 0.0:
            return x
        if p >= 1.0:
            return torch.zeros_like(x)
        generator = self._generator(key, x.device)
        rows = x.shape[0] // self.stacked
        draws = [
            torch.rand((rows, *x.shape[1:]), generator=generator, device=x.device, dtype=x.dtype)
            for _ in range(self.stacked)
        ]
        keep = torch.cat(draws) >= p
        return x * keep.to(x.dtype) * (1.0 / (1.0 - p))


@contextmanager
def _modes_restored(model: nn.Module) -> Iterator[None]:
    """Eval mode and no gradients inside; every module's mode restored after."""
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for module, mode in modes.items():
            module.training = mode


@contextmanager
def mc_sampling(model: nn.Module, sites: list[DropoutSite], masks: DropoutMasks) -> Iterator[None]:
    """MC-dropout mode: eval mode (BatchNorm uses running statistics), no gradients, dropout from ``masks``.

    ``nn.Dropout`` modules stay in eval mode (identity) and a forward hook
    replaces their output by the masked input; the inserted head dropout reads
    ``masks`` directly. Everything is undone on exit.
    """
    handles = []
    head = getattr(model, HEAD_DROPOUT_ATTRIBUTE, None)
    with _modes_restored(model):
        try:
            for site in sites:
                if site.inserted:
                    head.masks = masks
                    continue

                def masked(module: nn.Module, args: Any, output: torch.Tensor, key: str = site.module) -> torch.Tensor:
                    return masks.apply(key, output, float(module.p))

                handles.append(model.get_submodule(site.module).register_forward_hook(masked))
            yield
        finally:
            for handle in handles:
                handle.remove()
            if head is not None:
                head.masks = None


# ---------------------------------------------------------------------------
# MC predictive probabilities: naive (reference) and cheap paths
# ---------------------------------------------------------------------------


class _Captured(Exception):
    """Raised by a capture hook to stop a forward pass once it has what it needs."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        self.value = value


@dataclass
class _CheapPlan:
    """Where the deterministic part of the network ends, and the modules that follow."""

    entry: nn.Module  # its input is the first dropout's input
    tail: list[nn.Module]

    def features(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Input of ``entry`` for batch ``x``; the forward pass stops there."""

        def capture(module: nn.Module, args: tuple[Any, ...]) -> None:
            raise _Captured(args[0])

        handle = self.entry.register_forward_pre_hook(capture, prepend=True)
        try:
            model(x)
        except _Captured as captured:
            return captured.value
        finally:
            handle.remove()
        raise RuntimeError("ufl: the forward pass never reached the first dropout")

    def run_tail(self, h: torch.Tensor) -> torch.Tensor:
        for module in self.tail:
            h = module(h)
        return h


def _cheap_plan(model: nn.Module, sites: list[DropoutSite], x: torch.Tensor) -> _CheapPlan | None:
    """Find the first dropout the forward pass reaches, and check the rest is a plain chain.

    The rest is taken as the leaf modules registered from the first dropout on
    (for the inserted head dropout: the classifier alone). It is accepted only
    if it contains every dropout site and, in eval mode on ``x``, reproduces
    the model's output; otherwise None (use the naive path).
    """
    entries = {site.module: model.get_submodule(site.module) for site in sites}
    reached: list[tuple[str, torch.Tensor]] = []
    handles = [
        module.register_forward_pre_hook(lambda m, args, name=name: reached.append((name, args[0])), prepend=True)
        for name, module in entries.items()
    ]
    with _modes_restored(model):
        try:
            expected = model(x)
        finally:
            for handle in handles:
                handle.remove()
        if not reached:
            return None
        first, h = reached[0]
        if sites[0].inserted:
            tail = [entries[first]]
        else:
            leaves = [(name, m) for name, m in model.named_modules() if not any(True for _ in m.children())]
            start = next(i for i, (name, _) in enumerate(leaves) if name == first)
            tail_names = [name for name, _ in leaves[start:]]
            if not set(entries) <= set(tail_names):
                return None
            tail = [m for _, m in leaves[start:]]
        plan = _CheapPlan(entry=entries[first], tail=tail)
        try:
            got = plan.run_tail(h)
        except (RuntimeError, ValueError, TypeError):
            return None
    if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-4, atol=1e-5):
        return None
    return plan


def _fork_rng(device: torch.device) -> Any:
    devices = [device.index or 0] if device.type == "cuda" else []
    return torch.random.fork_rng(devices=devices)


def mc_mean_probabilities(
    model: nn.Module,
    data: ImageTensors,
    transform: BatchTransform,
    device: torch.device,
    passes: int,
    seed: int,
    *,
    cheap: bool = True,
    batch_size: int = MC_BATCH_SIZE,
) -> torch.Tensor:
    """``p̄``: the mean of ``passes`` MC-dropout softmax outputs for every sample of ``data``.

    Eval transform (no augmentation), eval mode (BatchNorm on running
    statistics, not updated), no gradients, fresh dropout masks per pass and
    per sample from :class:`DropoutMasks` seeded by ``seed``. Runs inside
    ``torch.random.fork_rng``, so the global generator (which local training's
    dropout uses) is where it was. Call :func:`ensure_mc_dropout` first. With
    no dropout to sample (or all ``p = 0``) the passes would be identical: one
    pass is run, with a warning.

    Parameters
    ----------
    model : nn.Module
        The received global model; its modes are restored afterwards.
    data : ImageTensors
        All local training samples, in order.
    transform : BatchTransform
        Applied with ``train=False``.
    device : torch.device
        Where the model is.
    passes : int
        ``N``, at least 1.
    seed : int
        Seeds the masks.
    cheap : bool
        Compute the part before the first dropout once per sample (see the
        module docstring); falls back to full passes, with a warning, if the
        part after the first dropout is not a plain chain of modules.
    batch_size : int
        Samples per MC batch.

    Returns
    -------
    torch.Tensor
        ``[n, C]`` float32 probabilities on ``device``.
    """
    inputs = (
        transform(images.to(device), train=False, generator=None)
        for images, _, _ in batches(data, batch_size, shuffle=False)
    )
    return mc_mean_probabilities_of(model, inputs, device, passes, seed, cheap=cheap)


def mc_mean_probabilities_of(
    model: nn.Module,
    inputs: Iterable[torch.Tensor],
    device: torch.device,
    passes: int,
    seed: int,
    *,
    cheap: bool = True,
) -> torch.Tensor:
    """:func:`mc_mean_probabilities` on batches of model inputs as they are (a user's own pipeline's).

    ``inputs`` are the batches in order, ready for ``model`` (on ``device``,
    transformed); each sample's masks depend on ``seed`` and its position.
    """
    if passes < 1:
        raise ValueError(f"ufl.mc-passes = {passes!r}: need at least one pass")
    sites = dropout_sites(model)
    if all(site.p == 0.0 for site in sites):
        if passes > 1:
            logger.warning("ufl: no dropout to sample (p = 0); one pass instead of %d, u is the plain CE", passes)
        passes = 1
    masks = DropoutMasks(seed)
    plan: _CheapPlan | None = None
    chunks: list[torch.Tensor] = []
    with _fork_rng(device):
        for index, x in enumerate(inputs):
            if cheap and index == 0 and passes > 1:
                plan = _cheap_plan(model, sites, x[:PLAN_CHECK_SAMPLES])
                if plan is None:
                    logger.warning("ufl: the layers after the first dropout are not a plain chain; full MC passes")
            with mc_sampling(model, sites, masks):
                if plan is None:
                    probabilities = torch.stack([F.softmax(model(x), dim=1) for _ in range(passes)])
                else:
                    h = plan.features(model, x)
                    stacked = h.unsqueeze(0).expand(passes, *h.shape).reshape(passes * h.shape[0], *h.shape[1:])
                    masks.stacked = passes
                    try:
                        logits = plan.run_tail(stacked)
                    finally:
                        masks.stacked = 1
                    probabilities = F.softmax(logits, dim=1).view(passes, h.shape[0], -1)
            chunks.append(probabilities.mean(dim=0))
    return torch.cat(chunks)
