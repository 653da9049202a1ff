"""Model tensors in a message: named arrays to a Flower ``ArrayRecord`` and back, without needless copies.

Flower stores each array of an ``ArrayRecord`` as the bytes of a ``.npy``
file (``stype = "numpy.ndarray"``). Its own conversions go through
``np.save`` and ``np.load`` for every tensor of every message, which parse
and write the ``.npy`` header in Python each time and copy the values twice.
Server and client use these instead; what they build is what Flower builds,
byte for byte (tested), so a peer that uses Flower's conversions reads it
unchanged:

* :func:`encode`: tensors to an ``ArrayRecord``. The header of each distinct
  (dtype, shape) is written once by ``np.save`` and reused; the values are
  copied once, into the record's bytes.
* :func:`decode`: an ``ArrayRecord`` to read-only NumPy views of its bytes;
  only the header is read, and parsed once per distinct header.
* :func:`to_tensors`: the same as torch tensors, views (to load into a model,
  which copies them) or writable copies.

Anything that is not a plain ``.npy`` payload is handed to Flower's
``Array.numpy()``, which raises as Flower does.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import threading
import warnings
from collections.abc import Iterator, Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from flwr.common.constant import SType
from numpy.lib import format as npy_format

NamedArrays = Mapping[str, np.ndarray]
"""Arrays by name, in a model's ``state_dict`` order."""


def encode(arrays: Mapping[str, np.ndarray | torch.Tensor]) -> ArrayRecord:
    """``{name: ndarray or tensor}`` to an ArrayRecord, the same bytes as ``ArrayRecord(arrays)`` builds.

    >>> record = encode({"w": np.arange(3, dtype=np.float32), "b": torch.ones(2)})
    >>> record["w"].data == Array(np.arange(3, dtype=np.float32)).data, decode(record)["b"].tolist()
    (True, [1.0, 1.0])
    """
    return ArrayRecord({name: encode_array(value) for name, value in arrays.items()})


_HEADERS: dict[tuple[np.dtype, tuple[int, ...]], bytes] = {}
_HEADERS_LOCK = threading.Lock()
_MAX_HEADERS = 4096


def encode_array(value: np.ndarray | torch.Tensor) -> Array:
    """One tensor as a Flower ``Array``, the bytes ``np.save`` writes (``Array(value)``)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()  # raises for dtypes NumPy lacks, as Flower's conversion does
    if value.flags.f_contiguous and not value.flags.c_contiguous:
        return Array(value)  # np.save keeps a Fortran-ordered array in Fortran order
    array = np.asarray(value, order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    key = (array.dtype, array.shape)
    header = _HEADERS.get(key)
    if header is None:
        first = Array(array)  # Flower's own encoding, once per (dtype, shape): its header is reused
        with _HEADERS_LOCK:
            if len(_HEADERS) >= _MAX_HEADERS:
                _HEADERS.clear()
            _HEADERS[key] = first.data[: len(first.data) - array.nbytes]
        return first
    data = b"".join((header, array)) if array.nbytes else header
    return Array(dtype=str(array.dtype), shape=tuple(array.shape), stype=SType.NUMPY, data=data)


def decode(record: ArrayRecord) -> dict[str, np.ndarray]:
    """ArrayRecord to ``{name: ndarray}``, keeping the record's key order.

    The arrays are read-only views of the record's bytes (see :func:`array_view`);
    copy one (``np.array(a)``) before changing it in place.
    """
    return {name: array_view(array) for name, array in record.items()}


def to_tensors(record: ArrayRecord, *, writable: bool = False) -> dict[str, torch.Tensor]:
    """ArrayRecord to ``{name: tensor}`` on the CPU, keeping the record's key order.

    By default the tensors share the record's read-only bytes: load them into
    a model (``load_state_dict`` copies) and do not change them in place.
    ``writable=True`` copies each one, for state that is updated in place
    (an optimizer's buffers).
    """
    if writable:
        return {name: torch.from_numpy(np.array(value)) for name, value in decode(record).items()}
    with wrapping_views():
        return {name: torch.from_numpy(value) for name, value in decode(record).items()}


@contextlib.contextmanager
def wrapping_views() -> Iterator[None]:
    """``torch.from_numpy`` on decoded (read-only) arrays without its warning, for tensors that are only read."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
        yield


def array_view(array: Array) -> np.ndarray:
    """The values of a Flower ``Array`` as a read-only view of its bytes, without copying.

    ``Array.numpy()`` parses the ``.npy`` bytes with ``np.load``, which copies.
    Here only the header is read (and parsed once per distinct header: every
    client's copy of a tensor has the same one) and the data is viewed in
    place. Anything that is not a plain ``.npy`` payload is handed to
    ``Array.numpy()``, which raises as Flower does.

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
