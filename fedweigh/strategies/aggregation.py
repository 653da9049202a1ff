"""Weighted averaging of client models.

Arrays are decoded once (validation needs them decoded too) without copying:
:func:`decode` returns read-only NumPy views of the record's own ``.npy``
bytes, so K client models cost no extra memory and no decoding time beyond
reading each header. They are summed in place with a fused multiply-add, so
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

import functools
import io
import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from flwr.common.constant import SType
from numpy.lib import format as npy_format

NamedArrays = Mapping[str, np.ndarray]


def decode(record: ArrayRecord) -> dict[str, np.ndarray]:
    """ArrayRecord to ``{name: ndarray}``, keeping the record's key order.

    The arrays are read-only views of the record's bytes (see :func:`array_view`);
    copy one (``np.array(a)``) before changing it in place.
    """
    return {name: array_view(array) for name, array in record.items()}


def array_view(array: Array) -> np.ndarray:
    """The values of a Flower ``Array`` as a read-only view of its bytes, without copying.

    Flower stores an array as the bytes of a ``.npy`` file; ``Array.numpy()``
    parses them with ``np.load``, which copies. Here only the header is read
    (and parsed once per distinct header: every client's copy of a tensor
    has the same one) and the data is viewed in place. Anything that is not a
    plain ``.npy`` payload is handed to ``Array.numpy()``, which raises as
    Flower does.

    Examples
    --------
    >>> view = array_view(Array(np.arange(6, dtype=np.float32).reshape(2, 3)))
    >>> view.tolist(), view.flags.writeable
    ([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], False)
    """
    data = array.data
    if array.stype != SType.NUMPY or len(data) < 12 or data[:6] != npy_format.MAGIC_PREFIX:
        return array.numpy()
    major = data[6]
    if major == 1:
        offset = 10 + int.from_bytes(data[8:10], "little")
    elif major == 2:
        offset = 12 + int.from_bytes(data[8:12], "little")
    else:
        return array.numpy()
    header = _npy_header(bytes(data[:offset]))
    if header is None:
        return array.numpy()
    shape, fortran_order, dtype = header
    values = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset)
    return values.reshape(shape[::-1]).T if fortran_order else values.reshape(shape)


@functools.lru_cache(maxsize=4096)
def _npy_header(header: bytes) -> tuple[tuple[int, ...], bool, np.dtype] | None:
    """``(shape, fortran_order, dtype)`` of a ``.npy`` header; None if it is not a plain array."""
    stream = io.BytesIO(header)
    try:
        version = npy_format.read_magic(stream)
        reader = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
        shape, fortran_order, dtype = reader(stream)
    except ValueError:
        return None
    return None if dtype.hasobject else (tuple(shape), bool(fortran_order), dtype)


def encode(arrays: NamedArrays) -> ArrayRecord:
    """``{name: ndarray}`` to an ArrayRecord."""
    return ArrayRecord({name: Array(np.asarray(value, order="C")) for name, value in arrays.items()})


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
    with warnings.catch_warnings():
        # Decoded arrays are read-only views; torch warns about wrapping them, but they are only read here.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
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
