"""Floating-point operations of one federated round, counted rather than timed.

What is counted
---------------
*Local training* (the bulk): the forward and backward pass of every local
SGD step, counted by PyTorch's own :class:`torch.utils.flop_counter.FlopCounterMode`
on a real training step (train mode, mean cross-entropy, ``backward()``) run
on ``meta`` tensors, so nothing is computed and no memory is used. Like
PyTorch's profiler, the counter counts matrix multiplications and
convolutions (2 FLOPs per multiply-add) and leaves out element-wise work
(BatchNorm, ReLU, pooling, the softmax, the optimiser update). The backward
pass is counted exactly as autograd runs it: the first layer computes no
gradient with respect to the input image, so a step costs slightly less than
three forward passes. A client with ``n`` samples runs ``ceil(n / B)`` steps
per epoch, the last one on the ``n mod B`` remaining samples.

*Method extras*, counted analytically (these are element-wise, which no
profiler counts):

* FedProx's proximal term ``mu/2 * ||w - w_global||^2`` adds 6 FLOPs per
  trainable parameter per step: subtract, square and sum in the forward
  pass; two multiplications (``2 (w - w_global)`` times the incoming
  gradient) and the accumulation into the parameter's gradient in the
  backward pass.
* The server's weighted average costs ``2 K d`` for ``K`` clients and ``d``
  averaged entries (every ``state_dict`` entry, BatchNorm buffers included):
  one multiply and one add per entry per client. It is the same for every
  weighting rule.
* The weighting rule itself costs ``O(K)`` scalar operations; each rule's count
  follows its implementation in :mod:`fedweigh.strategies` (additions,
  multiplications, divisions and square roots; comparisons and sorting are
  not floating-point arithmetic and are not counted).
* ``fedma-simplified`` (:mod:`fedweigh.methods.fedma_simplified.server`) matches each
  matched tensor of ``K - 1`` clients to the first client's: the Euclidean
  distances of its ``r`` rows of ``c`` entries to the reference's rows cost
  ``r^2 (3c - 1)`` (subtract, square, sum) plus ``r^2`` square roots, exactly
  as computed; the assignment (SciPy's shortest augmenting path) is counted
  as its bound of ``2 r^3`` additions of reduced costs, so this part is an
  upper bound, not a count.

About the FedNolowe paper's "40% fewer FLOPs": it compares FedNolowe with
FedMa, not with FedAvg. Counted as above, FedNolowe costs exactly what FedAvg
costs except for ``O(K)`` scalar operations (about 25 FLOPs for 5 clients),
FedProx costs well under 1% more, and the authors' FedMa (``fedma-simplified``)
adds its matching, about 0.4% of a LeNet-5 round (5 clients of 1,200 MNIST
images, 2 epochs). The paper's Table 6 numbers (34.3
MFLOPs per round for LeNet-5) are about one training sample's worth, not a
round's (see the FedNolowe spec, section 5).

Example
-------
>>> from fedweigh.data.description import DatasetInfo
>>> mnist = DatasetInfo(10, 1, 28, (0.1307,), (0.3081,), "none", "image", "label")
>>> cost = round_flops("lenet5", mnist, num_clients=5, samples_per_client=1200,
...                    local_epochs=2, batch_size=32, strategy="fednolowe")
>>> round(cost["local_training"] / 1e9, 1), cost["server_weighting"]
(279.4, 28)
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fedweigh.methods.fedma_simplified.server import is_matched
from fedweigh.methods.registry import METHOD_COSTS
from fedweigh.models import build_model

if TYPE_CHECKING:
    from fedweigh.data.description import DatasetInfo


# ---------------------------------------------------------------------------
# local training
# ---------------------------------------------------------------------------


def _count_training_step(meta_model: nn.Module, input_shape: Sequence[int], batch_size: int) -> int:
    meta_model.train()
    images = torch.empty((batch_size, *input_shape), device="meta")
    labels = torch.zeros(batch_size, dtype=torch.int64, device="meta")
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(meta_model(images), labels).backward()
    meta_model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def training_step_flops(model: nn.Module, input_shape: Sequence[int], batch_size: int) -> int:
    """FLOPs of one local step's forward and backward pass on a batch of ``batch_size``.

    Parameters
    ----------
    model : nn.Module
        Any classifier taking ``[B, *input_shape]`` and returning logits; it is
        copied to the ``meta`` device, the original is left untouched.
    input_shape : sequence of int
        Shape of one input, e.g. ``(1, 28, 28)``.
    batch_size : int
        Samples in the batch, ``>= 1``.

    Returns
    -------
    int
        Matmul and convolution FLOPs (2 per multiply-add) counted by
        ``FlopCounterMode``.

    Examples
    --------
    >>> training_step_flops(nn.Linear(4, 3), (4,), batch_size=2)  # forward 2*2*4*3, weight gradient the same
    96
    """
    if batch_size < 1:
        raise ValueError(f"batch_size = {batch_size!r} is not accepted; it must be >= 1")
    return _count_training_step(copy.deepcopy(model).to("meta"), input_shape, batch_size)


def local_steps(num_samples: int, local_epochs: int, batch_size: int) -> int:
    """SGD steps of one client in one round: ``E * ceil(n / B)`` (the last batch may be smaller)."""
    return local_epochs * math.ceil(num_samples / batch_size)


def local_training_flops(step_flops: Callable[[int], int], num_samples: int, local_epochs: int, batch_size: int) -> int:
    """Forward and backward FLOPs of one client's local training in one round.

    Parameters
    ----------
    step_flops : callable
        FLOPs of one step as a function of its batch size (e.g. a
        :func:`functools.partial` of :func:`training_step_flops`).
    num_samples : int
        The client's training samples ``n``.
    local_epochs, batch_size : int
        ``E`` and ``B``.

    Returns
    -------
    int
        ``E * (floor(n / B) * step_flops(B) + step_flops(n mod B))``, the last
        term only when ``n mod B > 0``.
    """
    full_batches, remainder = divmod(num_samples, batch_size)
    per_epoch = full_batches * step_flops(batch_size) if full_batches else 0
    if remainder:
        per_epoch += step_flops(remainder)
    return local_epochs * per_epoch


@lru_cache(maxsize=256)
def _registry_step_flops(
    model_name: str,
    num_classes: int,
    in_channels: int,
    image_size: int,
    options: tuple[tuple[str, Any], ...],
    batch_size: int,
) -> int:
    with torch.device("meta"):
        model = build_model(model_name, num_classes, in_channels, image_size, **dict(options))
    return _count_training_step(model, (in_channels, image_size, image_size), batch_size)


def _model_sizes(
    model_name: str, dataset: DatasetInfo, options: Mapping[str, Any], skip_layers: Sequence[str]
) -> tuple[int, int, list[tuple[int, int]]]:
    with torch.device("meta"):
        model = build_model(model_name, dataset.num_classes, dataset.in_channels, dataset.image_size, **options)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    state = model.state_dict()
    averaged = sum(t.numel() for t in state.values())
    matched = [(t.shape[0], t[0].numel()) for name, t in state.items() if is_matched(name, t, skip_layers)]
    return trainable, averaged, matched


def round_flops(
    model_name: str,
    dataset: DatasetInfo,
    num_clients: int,
    samples_per_client: int | Sequence[int],
    local_epochs: int,
    batch_size: int,
    strategy: str,
    model_options: Mapping[str, Any] | None = None,
    skip_layers: Sequence[str] = (),
) -> dict[str, int]:
    """FLOPs of one federated round, by part (see the module docstring for what is counted).

    Parameters
    ----------
    model_name : str
        A name from :func:`fedweigh.models.model_names`.
    dataset : DatasetInfo
        Supplies ``num_classes``, ``in_channels`` and ``image_size``.
    num_clients : int
        Clients trained this round, ``K >= 1``.
    samples_per_client : int or sequence of int
        Training samples of each client (one number for all, or one per client).
    local_epochs, batch_size : int
        ``E`` and ``B``.
    strategy : str
        One of :data:`METHOD_COSTS`.
    model_options : mapping, optional
        Model options such as ``{"width": 64}`` for ``resnet8``.
    skip_layers : sequence of str, optional
        ``fedma-simplified.skip-layers``: layers the matching leaves alone
        (``("fc3",)`` as the authors' code does for LeNet-5).

    Returns
    -------
    dict[str, int]
        ``local_training`` (forward and backward passes of all clients),
        ``client_extra`` (e.g. FedProx's proximal term, all clients),
        ``server_averaging`` (``2 K d``), ``server_weighting`` (the rule's
        scalar work), ``server_matching`` (``fedma-simplified``'s alignment,
        an upper bound; 0 for the others), ``total`` (the sum of those five),
        and for context
        ``step_forward_backward`` (one full batch), ``local_steps`` (all
        clients), ``trainable_parameters`` and ``averaged_entries``.

    Raises
    ------
    ValueError
        If the strategy has no cost model, or a count is not positive.
    """
    if strategy not in METHOD_COSTS:
        raise ValueError(f"strategy = {strategy!r} has no FLOP model; accepted: {', '.join(sorted(METHOD_COSTS))}")
    for name, value in (("num_clients", num_clients), ("local_epochs", local_epochs), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} = {value!r} is not accepted; it must be an integer >= 1")
    sizes = [samples_per_client] * num_clients if isinstance(samples_per_client, int) else list(samples_per_client)
    if len(sizes) != num_clients or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(
            f"samples_per_client = {samples_per_client!r} is not accepted; it must be an integer >= 1 "
            f"or {num_clients} such integers (one per client)"
        )
    options = dict(model_options or {})
    frozen_options = tuple(sorted(options.items()))

    def step_flops(batch: int) -> int:
        return _registry_step_flops(
            model_name, dataset.num_classes, dataset.in_channels, dataset.image_size, frozen_options, batch
        )

    cost = METHOD_COSTS[strategy]
    trainable, averaged, matched = _model_sizes(model_name, dataset, options, skip_layers)
    steps = sum(local_steps(n, local_epochs, batch_size) for n in sizes)
    parts = {
        "local_training": sum(local_training_flops(step_flops, n, local_epochs, batch_size) for n in sizes),
        "client_extra": steps * cost.extra_per_step(trainable),
        "server_averaging": 2 * num_clients * averaged,
        "server_weighting": cost.weighting(num_clients),
        "server_matching": cost.matching(num_clients, matched),
    }
    return {
        **parts,
        "total": sum(parts.values()),
        "step_forward_backward": step_flops(batch_size),
        "local_steps": steps,
        "trainable_parameters": trainable,
        "averaged_entries": averaged,
    }
