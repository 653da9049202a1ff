"""Tests for the model zoo and its registry (``fedweigh.models``)."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
import torch
import torchvision
from torch import nn

from fedweigh.models import MODEL_BUILDERS, build_model, model_names, model_options

#: Natural input (channels, side) of every registered model.
NATURAL_INPUT: dict[str, tuple[int, int]] = {
    "fedoui-cnn": (3, 32),
    "fashion-cnn": (1, 28),
    "feddle-cnn": (1, 28),
    "lenet5": (1, 28),
    "vgg9": (3, 32),
    "resnet8": (3, 32),
    "resnet18": (3, 32),
    "mlp": (1, 8),
}

#: Parameter counts stated by the papers / specs for 10 classes.
PAPER_PARAMETER_COUNTS: dict[str, int] = {
    "fedoui-cnn": 545_098,
    "fashion-cnn": 688_586,
    "feddle-cnn": 115_370,  # the Feddle spec's CPU-sized CNN at 28x28 (146,090 at 32x32, "~146K" in the spec)
    "lenet5": 348_874,
    "vgg9": 3_512_650,
    "resnet8": 4_896_394,
}

LINEAR_PROBE_MODELS = ["fedoui-cnn", "fashion-cnn", "feddle-cnn", "lenet5", "vgg9", "mlp"]
RESNETS = ["resnet8", "resnet18"]
ALL_MODELS = sorted(NATURAL_INPUT)


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    """Run on one thread: the CI machine has two cores."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@functools.cache
def _cached_model(name: str, num_classes: int) -> nn.Module:
    """Build (once) a model at its natural input size, in eval mode."""
    in_channels, side = NATURAL_INPUT[name]
    torch.manual_seed(0)
    return build_model(name, num_classes, in_channels, side).eval()


def _batch(name: str, size: int = 2) -> torch.Tensor:
    in_channels, side = NATURAL_INPUT[name]
    generator = torch.Generator().manual_seed(1)
    return torch.randn(size, in_channels, side, side, generator=generator)


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _capture(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Forward ``x`` and capture the probe output and classifier input/output.

    The probe output is stored **by reference** (no clone), so a later
    in-place operation on it would show up in the test.
    """
    seen: dict[str, torch.Tensor] = {}
    probe = model.get_submodule(model.probe_layer)
    classifier = model.get_submodule(model.classifier_layer)

    def on_probe(_m: nn.Module, _i: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        seen["probe"] = out

    def on_classifier(_m: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        seen["classifier_in"] = inputs[0]
        seen["classifier_out"] = out

    handles = [
        probe.register_forward_hook(on_probe),
        classifier.register_forward_hook(on_classifier),
    ]
    try:
        with torch.no_grad():
            seen["logits"] = model(x)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def test_registry_names_are_exactly_the_documented_ones() -> None:
    expected = {
        "fedoui-cnn",
        "fashion-cnn",
        "feddle-cnn",
        "lenet5",
        "vgg9",
        "resnet8",
        "resnet18",
        "resnet18-imagenet",
        "vit-b16",
        "vit-tiny",
        "mlp",
    }
    assert set(MODEL_BUILDERS) == expected
    assert model_names() == sorted(expected)


@pytest.mark.parametrize("num_classes", [10, 7])
@pytest.mark.parametrize("name", ALL_MODELS)
def test_output_is_a_logit_tensor_of_the_right_shape(name: str, num_classes: int) -> None:
    in_channels, side = NATURAL_INPUT[name]
    torch.manual_seed(0)
    model = build_model(name, num_classes, in_channels, side)
    model.train()  # BatchNorm in training mode must cope with a batch of 2
    logits = model(_batch(name))
    assert isinstance(logits, torch.Tensor)
    assert logits.shape == (2, num_classes)
    assert torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize(("name", "expected"), sorted(PAPER_PARAMETER_COUNTS.items()))
def test_paper_models_have_the_published_parameter_count(name: str, expected: int) -> None:
    assert _count(_cached_model(name, 10)) == expected


@pytest.mark.sim
def test_resnet18_parameter_count_matches_torchvision() -> None:
    # Replacing the 7x7 stem by a 3x3 one removes (49 - 9) * 3 * 64 weights.
    reference = torchvision.models.resnet18(weights=None, num_classes=10)
    assert _count(_cached_model("resnet18", 10)) == _count(reference) - 40 * 3 * 64


@pytest.mark.parametrize("num_classes", [10, 7])
@pytest.mark.parametrize("name", ALL_MODELS)
def test_layer_names_resolve_and_classifier_produces_the_logits(name: str, num_classes: int) -> None:
    model = _cached_model(name, num_classes)
    assert isinstance(model.probe_layer, str)
    assert isinstance(model.classifier_layer, str)
    probe = model.get_submodule(model.probe_layer)
    classifier = model.get_submodule(model.classifier_layer)
    assert isinstance(probe, nn.Module)
    assert isinstance(classifier, nn.Linear)
    assert classifier.out_features == num_classes

    seen = _capture(model, _batch(name))
    assert seen["probe"].shape[0] == 2
    assert seen["probe"].flatten(1).shape[1] > 1
    torch.testing.assert_close(seen["classifier_out"], seen["logits"])


@pytest.mark.parametrize("name", ALL_MODELS)
def test_probe_output_is_a_pre_activation(name: str) -> None:
    # Before a ReLU the tap has negative entries; the captured tensor must keep
    # them after the forward pass (no in-place ReLU on the probed tensor).
    seen = _capture(_cached_model(name, 10), _batch(name, size=8))
    probe = seen["probe"]
    assert (probe < 0).any()
    assert (probe > 0).any()


@pytest.mark.parametrize("name", LINEAR_PROBE_MODELS)
def test_probe_is_the_last_hidden_linear_layer(name: str) -> None:
    model = _cached_model(name, 10)
    linear_names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert linear_names[-1] == model.classifier_layer
    assert linear_names[-2] == model.probe_layer
    probe = model.get_submodule(model.probe_layer)
    classifier = model.get_submodule(model.classifier_layer)
    assert isinstance(probe, nn.Linear)
    assert probe.out_features == classifier.in_features


@pytest.mark.parametrize("name", RESNETS)
def test_resnet_probe_pools_into_the_classifier_input(name: str) -> None:
    # The tap is the last residual sum before its ReLU: ReLU + global average
    # pooling of it must give exactly the classifier's input.
    seen = _capture(_cached_model(name, 10), _batch(name))
    probe = seen["probe"]
    assert probe.dim() == 4
    pooled = torch.relu(probe).mean(dim=(2, 3))
    torch.testing.assert_close(pooled, seen["classifier_in"])


@pytest.mark.parametrize(
    ("name", "has_dropout"),
    [(n, n in {"fashion-cnn", "lenet5", "vgg9"}) for n in ALL_MODELS],
)
def test_dropout_only_where_the_papers_put_it(name: str, has_dropout: bool) -> None:
    model = _cached_model(name, 10)
    found = any(isinstance(m, nn.Dropout) for m in model.modules())
    assert found is has_dropout


def test_unknown_name_lists_the_accepted_names() -> None:
    with pytest.raises(ValueError, match="no-such-net") as info:
        build_model("no-such-net", 10, 3, 32)
    for name in MODEL_BUILDERS:
        assert name in str(info.value)


def test_non_string_name_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="accepted names"):
        build_model(["vgg9"], 10, 3, 32)  # type: ignore[arg-type]


def test_unknown_option_names_option_model_and_accepted_options() -> None:
    with pytest.raises(ValueError) as info:
        build_model("resnet8", 10, 3, 32, depth=20)
    message = str(info.value)
    assert "depth" in message and "resnet8" in message and "width" in message

    with pytest.raises(ValueError) as info:
        build_model("fedoui-cnn", 10, 3, 32, hidden=64)
    message = str(info.value)
    assert "hidden" in message and "fedoui-cnn" in message and "accepted options: width" in message


def test_model_options_lists_each_models_options() -> None:
    options = {name: model_options(name) for name in model_names()}
    assert options["mlp"] == ["dropout", "hidden"]
    assert options["resnet18-imagenet"] == ["input_size", "pretrained", "weights", "width"]
    assert options["vit-b16"] == ["dropout", "pretrained", "weights"]
    assert options["vit-tiny"] == ["dropout", "input_size", "pretrained", "weights"]
    pretrained = {"mlp", "resnet18-imagenet", "vit-b16", "vit-tiny"}
    assert all(options[n] == ["width"] for n in options if n not in pretrained)  # the CNN and ResNet families


def test_resnet8_width_option_scales_the_network() -> None:
    model = build_model("resnet8", 7, 3, 32, width=16)
    assert model.conv1.out_channels == 16
    assert model.get_submodule(model.classifier_layer).in_features == 64
    assert _count(model) < _count(_cached_model("resnet8", 10)) // 50
    assert model(_batch("resnet8")).shape == (2, 7)


def test_mlp_hidden_option_sets_the_probe_width() -> None:
    model = build_model("mlp", 10, 1, 8, hidden=32)
    probe = model.get_submodule(model.probe_layer)
    assert probe.in_features == 64
    assert probe.out_features == 32
    assert _count(model) == 64 * 32 + 32 + 32 * 10 + 10


@pytest.mark.parametrize(
    ("name", "size", "options"),
    [
        ("vgg9", {"num_classes": 0}, {}),
        ("mlp", {"in_channels": -1}, {}),
        ("lenet5", {"image_size": 12}, {}),
        ("fashion-cnn", {"image_size": 4}, {}),
        ("feddle-cnn", {"image_size": 3}, {}),
        ("vgg9", {"image_size": 4}, {}),
        ("fedoui-cnn", {"num_classes": 2.5}, {}),
        ("resnet8", {}, {"width": 0}),
        ("mlp", {}, {"hidden": True}),
    ],
)
def test_bad_sizes_and_option_values_are_rejected(
    name: str, size: dict[str, object], options: dict[str, object]
) -> None:
    in_channels, side = NATURAL_INPUT[name]
    arguments = {"num_classes": 10, "in_channels": in_channels, "image_size": side}
    arguments.update(size)
    with pytest.raises(ValueError, match=name):
        build_model(name, **arguments, **options)


@pytest.mark.parametrize(
    ("name", "in_channels", "side", "flatten_features"),
    [
        ("fedoui-cnn", 1, 28, 64 * 7 * 7),
        ("lenet5", 3, 32, 64 * 5 * 5),
        ("vgg9", 1, 28, 256 * 3 * 3),
        ("fashion-cnn", 3, 32, 128 * 4 * 4),
        ("feddle-cnn", 1, 32, 32 * 8 * 8),
        ("mlp", 3, 16, 3 * 16 * 16),
    ],
)
def test_flatten_size_follows_the_input_size(name: str, in_channels: int, side: int, flatten_features: int) -> None:
    model = build_model(name, 5, in_channels, side)
    first_linear = next(m for m in model.modules() if isinstance(m, nn.Linear))
    assert first_linear.in_features == flatten_features
    assert model(torch.zeros(2, in_channels, side, side)).shape == (2, 5)


def test_resnet18_is_adapted_to_32x32_inputs() -> None:
    model = _cached_model("resnet18", 10)
    assert isinstance(model.conv1, nn.Conv2d)
    assert model.conv1.kernel_size == (3, 3)
    assert model.conv1.stride == (1, 1)
    assert model.conv1.padding == (1, 1)
    assert model.conv1.bias is None
    assert isinstance(model.maxpool, nn.Identity)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    # A 32x32 input reaches the last stage at 4x4 (no stem downsampling).
    seen = _capture(model, _batch("resnet18"))
    assert seen["probe"].shape == (2, 512, 4, 4)


@pytest.mark.sim
def test_resnet18_accepts_grayscale_and_keeps_torchvision_keys() -> None:
    model = build_model("resnet18", 7, 1, 28)
    assert model.conv1.in_channels == 1
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 7)
    reference = torchvision.models.resnet18(weights=None, num_classes=7)
    assert list(model.state_dict()) == list(reference.state_dict())


def test_resnet8_state_dict_has_no_tap_entries_and_round_trips() -> None:
    model = _cached_model("resnet8", 10)
    keys = list(model.state_dict())
    assert not any("preact" in key for key in keys)
    assert keys[0] == "conv1.weight" and keys[-1] == "fc.bias"
    torch.manual_seed(5)
    other = build_model("resnet8", 10, 3, 32).eval()
    other.load_state_dict(model.state_dict())
    x = _batch("resnet8")
    with torch.no_grad():
        torch.testing.assert_close(other(x), model(x))


def test_build_is_deterministic_under_a_seed() -> None:
    torch.manual_seed(3)
    first = build_model("vgg9", 10, 3, 32)
    torch.manual_seed(3)
    second = build_model("vgg9", 10, 3, 32)
    for (key_a, a), (key_b, b) in zip(first.state_dict().items(), second.state_dict().items(), strict=True):
        assert key_a == key_b
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["fedoui-cnn", "fashion-cnn", "feddle-cnn", "lenet5", "vgg9", "resnet8"])
def test_on_device_keeps_what_the_model_computes_and_sends(name):
    """Channels-last on CPU (where a model asks for it) changes speed, not outputs or the state sent."""
    from flwr.app import ArrayRecord

    from fedweigh.models import on_device

    channels, size = (1, 28) if name in ("fashion-cnn", "feddle-cnn", "lenet5") else (3, 32)
    options = {"width": 16} if name == "resnet8" else {}
    torch.manual_seed(0)
    plain = build_model(name, 10, channels, size, **options).eval()
    fast = build_model(name, 10, channels, size, **options)
    fast.load_state_dict(plain.state_dict())
    fast = on_device(fast, torch.device("cpu")).eval()
    conv = next(m for m in fast.modules() if isinstance(m, torch.nn.Conv2d))
    wants = getattr(fast, "cpu_channels_last", False)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) is wants
    assert wants is (name != "resnet8")
    x = torch.randn(4, channels, size, size)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), plain(x), rtol=1e-4, atol=1e-5)
    sent = ArrayRecord(fast.state_dict()).to_torch_state_dict()
    assert all(torch.equal(sent[key], value) for key, value in plain.state_dict().items())


@pytest.mark.parametrize(
    ("name", "channels", "size", "default_width"),
    [
        ("fedoui-cnn", 3, 32, 32),
        ("fashion-cnn", 1, 28, 32),
        ("feddle-cnn", 1, 28, 16),
        ("lenet5", 1, 28, 32),
        ("vgg9", 3, 32, 64),
        ("resnet8", 3, 32, 128),
        ("resnet18", 3, 32, 64),
    ],
)
def test_width_scales_every_cnn_and_resnet_and_keeps_the_default(name, channels, size, default_width):
    default = build_model(name, 10, channels, size)
    same = build_model(name, 10, channels, size, width=default_width)
    assert [(k, v.shape) for k, v in default.state_dict().items()] == [
        (k, v.shape) for k, v in same.state_dict().items()
    ]
    narrow = build_model(name, 10, channels, size, width=default_width // 2)
    assert _count(narrow) < _count(default)
    assert list(narrow.state_dict()) == list(default.state_dict())  # the same layers, fewer channels
    x = torch.zeros(2, channels, size, size)
    assert narrow(x).shape == (2, 10)
    narrow.get_submodule(narrow.probe_layer)  # the probe tap is still there


def test_resnet8_at_width_16_is_flood_s_small_network():
    model = build_model("resnet8", 10, 3, 32, width=16)
    assert _count(model) == 78_042  # "78k params" (FLood spec §10)


def test_mlp_target_b_of_ufl():
    """UFL's Target B: MLP 64-128-128-10 with Dropout(0.2) after each hidden layer (spec §11)."""
    model = build_model("mlp", 10, 1, 8, hidden=(128, 128), dropout=0.2)
    assert _count(model) == (64 * 128 + 128) + (128 * 128 + 128) + (128 * 10 + 10)
    assert [type(m).__name__ for m in model.children()] == [
        "Flatten",
        "Linear",
        "ReLU",
        "Dropout",
        "Linear",
        "ReLU",
        "Dropout",
        "Linear",
    ]
    assert (model.probe_layer, model.classifier_layer) == ("fc2", "fc3")
    assert [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)] == [0.2, 0.2]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"hidden": ()}, "hidden"),
        ({"hidden": (64, 0)}, "hidden"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.1}, "dropout"),
    ],
)
def test_bad_mlp_options_are_named(options, message):
    with pytest.raises(ValueError, match=f"mlp option '{message}'"):
        build_model("mlp", 10, 1, 8, **options)
