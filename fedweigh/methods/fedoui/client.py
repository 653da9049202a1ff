"""FedOUI's client half: the OUI of the trained model on a fixed probe batch.

The FedOUI paper (Fernández-Hernández et al., "FedOUI: OUI-Guided Client
Weighting for Federated Aggregation", spec ``specs/fedoui.md`` §2-§3) measures
the **OUI** (Overfitting-Underfitting Indicator) of a batch of
pre-activations, :func:`oui` (paper Eqs. 1-4). The client step ``"oui"``
(:class:`OUIProbe`) runs, after local training, one no-grad, eval-mode forward
pass of the trained model over a fixed per-client probe batch, with a hook on
the model's ``probe_layer``, and reports the ``oui`` signal. The server's rule
is :mod:`fedweigh.methods.fedoui.server`.

Example
-------
>>> import torch
>>> oui(torch.tensor([[1.0, -1.0], [1.0, 2.0], [1.0, -3.0], [1.0, 0.5]]))
0.5
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.clientapp.typing import Mod
from torch import nn

from fedweigh.client.mods import signal_mod
from fedweigh.client.signals import Signals
from fedweigh.client.steps import ClientStep, Metrics, StepContext
from fedweigh.methods.catalog import STEPS
from fedweigh.methods.fedoui.protocol import OUI, OUIProbeSettings
from fedweigh.protocol import table_from_config

PROBE_SIZE_METRIC = "oui-probe-size"
"""Reported with the OUI: the number of probe samples it was measured on."""
PROBE_SEED_STRIDE = 10007
"""The probe generator of partition ``k`` is seeded with ``seed + PROBE_SEED_STRIDE * k`` (spec §3)."""


def oui(pre_activations: torch.Tensor) -> float:
    """Overfitting-Underfitting Indicator of one batch of pre-activations.

    Every non-batch position is a unit (a ``[B, C, H, W]`` conv output has
    ``d = C*H*W`` units). A unit is *active* on a sample when its
    pre-activation is strictly positive (ReLU's on/off). With ``s_j`` the
    number of samples on which unit ``j`` is active, the OUI is the mean over
    units of the minority count ``min(s_j, B - s_j)`` divided by ``⌊B/2⌋``:
    0 when every unit is constant over the batch (always on, or dead), 1 when
    every unit is on for exactly half of the samples.

    Parameters
    ----------
    pre_activations : torch.Tensor
        Shape ``[B, ...]`` with at least one unit per sample (a 1-D tensor is
        ``B`` samples of one unit). Not modified.

    Returns
    -------
    float
        In ``[0, 1]``; an exact multiple of ``1 / (d ⌊B/2⌋)`` up to the one
        final division.

    Notes
    -----
    With fewer than two samples no unit can be split, so the OUI is 0.0
    (the authors' code does the same; spec §2.1). For odd ``B`` the minority
    count is at most ``⌊B/2⌋``, so the value stays in ``[0, 1]`` but can reach
    1 only for even ``B``.

    Raises
    ------
    ValueError
        If the tensor is 0-dimensional or has no units.

    Examples
    --------
    >>> import torch
    >>> oui(torch.tensor([[1.0, -1.0], [1.0, 2.0], [1.0, -3.0], [1.0, 0.5]]))
    0.5
    """
    values = torch.as_tensor(pre_activations)
    if values.dim() == 0:
        raise ValueError("pre_activations must have a batch dimension, got a scalar")
    batch = int(values.shape[0])
    units = values[0].numel() if batch > 0 else math.prod(values.shape[1:])
    if units == 0:
        raise ValueError(f"pre_activations of shape {tuple(values.shape)} have no units per sample")
    if batch < 2:
        return 0.0
    active = values.detach().reshape(batch, units) > 0
    on = active.sum(dim=0)
    minority = torch.minimum(on, batch - on)
    value = int(minority.sum().item()) / (units * (batch // 2))
    return min(max(value, 0.0), 1.0)


def probe_indices(num_samples: int, probe_size: int, seed: int, partition_id: int) -> torch.Tensor:
    """Positions of a client's probe samples in its partition; the same every round.

    Drawn from a torch generator seeded with ``seed + 10007 * partition_id``:
    the first ``probe_size`` entries of a random permutation when the
    partition has that many samples, otherwise ``probe_size`` draws with
    replacement (so the probe always has ``probe_size`` samples).

    Examples
    --------
    >>> probe_indices(100, 4, seed=1, partition_id=3).tolist() == probe_indices(100, 4, 1, 3).tolist()
    True
    >>> len(probe_indices(3, 8, seed=1, partition_id=0))
    8
    """
    if num_samples < 1:
        raise ValueError(f"partition {partition_id} has no samples to probe")
    if probe_size < 1:
        raise ValueError(f"oui.probe-size = {probe_size!r} is invalid: accepted values are integers >= 1")
    generator = torch.Generator().manual_seed(seed + PROBE_SEED_STRIDE * partition_id)
    if num_samples >= probe_size:
        return torch.randperm(num_samples, generator=generator)[:probe_size]
    return torch.randint(0, num_samples, (probe_size,), generator=generator)


def probe_generator(seed: int, partition_id: int, server_round: int) -> torch.Generator:
    """The generator augmenting a client's probe in a round (``oui.probe-transform = 'train'``).

    Seeded from ``(seed, partition_id, server_round)``: a different crop and
    flip every round and client, the same ones in a rerun.

    >>> a = probe_generator(1, 2, 3).initial_seed()
    >>> a == probe_generator(1, 2, 3).initial_seed(), a == probe_generator(1, 2, 4).initial_seed()
    (True, False)
    """
    state = np.random.SeedSequence([seed, partition_id, server_round]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 31 | int(state[1]) >> 1)


def resolve_probe_layer(model: nn.Module, layer: str) -> nn.Module:
    """The module to hook: ``layer`` if given, else the model's own ``probe_layer``."""
    name = layer or getattr(model, "probe_layer", "")
    if not name:
        raise ValueError(
            f"oui.probe-layer is empty and model {type(model).__name__} has no probe_layer attribute: "
            "set oui.probe-layer to the name of a submodule"
        )
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise ValueError(
            f"oui.probe-layer = {name!r} is not a submodule of {type(model).__name__}; accepted: "
            f"{', '.join(n for n, _ in model.named_modules() if n)}"
        ) from None


@torch.no_grad()
def probe_oui(model: nn.Module, layer: nn.Module, inputs: torch.Tensor) -> float:
    """OUI of ``layer``'s output when ``model`` runs on ``inputs`` in eval mode, without gradients.

    The forward hook is removed and every submodule's train/eval mode is
    restored afterwards, even if the forward pass fails.
    """
    captured: list[torch.Tensor] = []

    def keep_output(module: nn.Module, args: Any, output: Any) -> None:
        if not isinstance(output, torch.Tensor):
            raise ValueError(f"the probe layer {type(module).__name__} must output one tensor, got {type(output)}")
        captured.append(output.detach())

    modes = {module: module.training for module in model.modules()}
    handle = layer.register_forward_hook(keep_output)
    try:
        model.eval()
        model(inputs)
    finally:
        handle.remove()
        for module, training in modes.items():
            module.training = training
    if len(captured) != 1:
        raise ValueError(f"the probe layer ran {len(captured)} times in one forward pass; expected once")
    return oui(captured[0])


def probe_options(config: Mapping[str, Any]) -> OUIProbeSettings:
    """The ``oui.*`` options of a train instruction."""
    return table_from_config(STEPS["oui"].options, OUIProbeSettings, config)


class OUIProbe(ClientStep):
    """After local training: the trained model's OUI on the client's fixed probe batch.

    Options (``[oui]``): ``probe-size`` (B) and ``probe-layer`` (default: the
    model's ``probe_layer``) and ``probe-transform``. The probe is drawn
    with the run's seed and the partition id, and by default goes through
    the evaluation transform (no augmentation), so it is the same every
    round (spec §3, A3); ``probe-transform = 'train'`` augments the same
    images anew every round (:func:`probe_generator`), as the authors' code
    does. Replies
    ``{"oui": value, "oui-probe-size": B}``.
    """

    name = "oui"

    @classmethod
    def check_model(cls, model: nn.Module, config: Mapping[str, Any]) -> None:
        resolve_probe_layer(model, probe_options(config).probe_layer)

    def after_training(self, context: StepContext) -> Metrics:
        options = probe_options(context.config)
        layer = resolve_probe_layer(context.model, options.probe_layer)
        positions = probe_indices(len(context.data), options.probe_size, context.run_seed, context.partition_id)
        images = context.data.images[positions.to(context.data.images.device)]
        if options.probe_transform == "train":
            generator = probe_generator(context.run_seed, context.partition_id, context.server_round)
            inputs = context.transform(images.to(context.device), train=True, generator=generator)
        else:
            inputs = context.transform(images.to(context.device), train=False)
        return {OUI: probe_oui(context.model, layer, inputs), PROBE_SIZE_METRIC: float(options.probe_size)}


# ---------------------------------------------------------------------------
# for your own ClientApp
# ---------------------------------------------------------------------------


def oui_signal(model: nn.Module, probe: torch.Tensor, layer: str = "") -> Signals:
    """FedOUI's signal: the OUI of ``layer``'s output on a probe batch, in eval mode, after training.

    Parameters
    ----------
    model : nn.Module
        The trained model (its modes are restored afterwards).
    probe : torch.Tensor
        The probe batch, ready for the model: the same images every round
        (the paper's fixed probe); ``oui.probe-size`` of the instruction says
        how many the server asks for.
    layer : str
        The submodule whose output (a pre-activation) is measured, by its
        name in ``model.named_modules()``; ``""`` uses ``model.probe_layer``.
    """
    return {OUI: probe_oui(model, resolve_probe_layer(model, layer), probe)}


def oui_mod(model_fn: Callable[[], nn.Module], probe: torch.Tensor, layer: str = "") -> Mod:
    """FedOUI's OUI (:func:`oui_signal`) on ``probe`` (at most ``oui.probe-size`` of it)."""
    return signal_mod(
        "oui", model_fn, lambda model, instruction: oui_signal(model, probe[: instruction.oui.probe_size], layer)
    )


STEP_CLASSES = (OUIProbe,)
"""This package's client steps (gathered by :mod:`fedweigh.client.registry`)."""

__all__ = ["OUIProbe", "oui_mod", "oui_signal"]
