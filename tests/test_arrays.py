"""Model tensors in a message (fedweigh/arrays.py): Flower's own bytes, built and read without needless copies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedweigh.arrays import array_view, decode, encode, encode_array, to_tensors
from fedweigh.client.training import seed_torch
from fedweigh.strategies.averaging import weighted_average

DTYPES = st.sampled_from([np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_])
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)


def same_array(ours: Array, flowers: Array) -> bool:
    fields = ("dtype", "shape", "stype", "data")
    return all(getattr(ours, name) == getattr(flowers, name) for name in fields)


@given(hnp.arrays(DTYPES, SHAPES), st.sampled_from(["c", "fortran", "strided"]))
def test_encode_writes_the_bytes_flower_writes(values, layout):
    """First encoding of a (dtype, shape) and every later one (the reused header) alike, whatever the layout."""
    if layout == "fortran":
        values = np.asfortranarray(values)
    elif layout == "strided" and values.ndim:
        values = values[..., ::-1]
    expected = Array(values)
    assert same_array(encode_array(values), expected)
    assert same_array(encode_array(values), expected)  # the header now comes from the cache
    assert np.array_equal(expected.numpy(), values, equal_nan=values.dtype.kind == "f")


def test_an_encoded_model_is_flowers_record_with_the_same_content_id():
    """What travels is what Flower's ArrayRecord(state_dict) sends: same arrays, same object id."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten())
    model = model.to(memory_format=torch.channels_last)  # non-contiguous conv weights, as the CPU models use
    state = {name: value.detach() for name, value in model.state_dict().items()}
    for _ in range(2):
        ours, flowers = encode(state), ArrayRecord(state)
        assert list(ours) == list(flowers)
        assert all(same_array(ours[name], flowers[name]) for name in flowers)
        assert ours.object_id == flowers.object_id
    assert all(torch.equal(to_tensors(ours)[name], value) for name, value in state.items())


def test_encode_refuses_what_flower_refuses():
    with pytest.raises(TypeError):  # NumPy has no bfloat16: Flower's conversion raises the same
        encode({"w": torch.ones(2, dtype=torch.bfloat16)})


@given(hnp.arrays(DTYPES, SHAPES), st.booleans())
def test_array_view_reads_what_flower_decodes(values, fortran):
    if fortran:
        values = np.asfortranarray(values)
    array = Array(values)
    view = array_view(array)
    expected = array.numpy()
    assert view.dtype == expected.dtype and view.shape == expected.shape
    assert np.array_equal(view, expected, equal_nan=np.issubdtype(view.dtype, np.floating))


def test_decoded_arrays_are_read_only_views_of_the_record():
    record = ArrayRecord({"w": Array(np.arange(1000, dtype=np.float32))})
    decoded = decode(record)["w"]
    assert not decoded.flags.writeable and not decoded.flags.owndata
    with pytest.raises(ValueError, match="read-only"):
        decoded[0] = 1.0
    average = weighted_average([decode(record), decode(record)], np.array([0.5, 0.5]))
    assert average["w"].flags.writeable and np.array_equal(average["w"], np.arange(1000, dtype=np.float32))


def test_writable_tensors_are_copies_and_views_share_the_record():
    record = encode({"w": torch.arange(4.0)})
    view, copy = to_tensors(record)["w"], to_tensors(record, writable=True)["w"]
    assert view.data_ptr() == decode(record)["w"].ctypes.data  # no copy: the record's own bytes
    copy.add_(1.0)  # an optimizer's buffers are changed in place
    assert to_tensors(record)["w"].tolist() == [0.0, 1.0, 2.0, 3.0] and copy.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_a_model_loads_the_views_and_owns_its_values():
    model = torch.nn.Linear(3, 2)
    record = encode({name: torch.full_like(value, 0.5) for name, value in model.state_dict().items()})
    model.load_state_dict(to_tensors(record))
    with torch.no_grad():
        model.weight.add_(1.0)  # the model's parameters are its own memory, not the record's
    assert decode(record)["weight"].tolist() == [[0.5] * 3] * 2


def test_seeding_on_the_cpu_draws_what_manual_seed_draws():
    torch.manual_seed(1234)
    expected = (torch.rand(5), torch.nn.functional.dropout(torch.ones(8), 0.5))
    torch.manual_seed(99)
    seed_torch(1234, torch.device("cpu"))
    drawn = (torch.rand(5), torch.nn.functional.dropout(torch.ones(8), 0.5))
    assert torch.equal(drawn[0], expected[0]) and torch.equal(drawn[1], expected[1])
