"""Pretrained backbones and parameter-efficient fine-tuning: ViT + LoRA, ResNet-18 (ImageNet), what travels.

Tiny randomly initialised configurations of the same architectures stand in
for the real ones (no download): ``vit-tiny`` is ``transformers``' ViTModel
at toy size, ``resnet18-imagenet`` with ``model-width = 8`` is torchvision's
ResNet-18 layout at an eighth of the width. Pretrained loading is tested from
local files and folders written here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from loopback import run_in_process
from torch import nn

from fedweigh import client_app
from fedweigh.arrays import decode
from fedweigh.client.mc_dropout import dropout_sites, ensure_mc_dropout
from fedweigh.client.training import autocast, evaluate, train_locally
from fedweigh.components import batch_transform, new_model, settings_from
from fedweigh.data.federated import DataSpec, load_partition
from fedweigh.methods.fedoui.client import probe_oui, resolve_probe_layer
from fedweigh.models import build_model, model_input
from fedweigh.models.finetuning import (
    FineTuning,
    apply_fine_tuning,
    exchanged_keys,
    exchanged_state,
    frozen_digest,
    load_exchanged_state,
    trainable_count,
)
from fedweigh.models.vit import LORA_TARGETS
from fedweigh.models.weights import WeightsUnavailable
from fedweigh.preflight import check_run
from fedweigh.protocol import FROZEN_DIGEST, TrainRecipe
from fedweigh.results import read_metrics
from fedweigh.settings import SettingsError, validate
from fedweigh.strategies.averaging import weighted_average

VIT = {"dataset": "digits", "model": "vit-tiny"}


def vit_settings(**extra):
    return validate({**VIT, **extra})


# -- what trains, what travels --------------------------------------------------


def test_lora_on_a_vit_trains_the_adapters_of_the_four_attention_projections_and_the_head():
    model = new_model(vit_settings())
    keys = exchanged_keys(model)
    assert {key.split(".")[-4] for key in keys if "lora_" in key} == set(LORA_TARGETS)
    assert sum("lora_A" in key for key in keys) == 2 * len(LORA_TARGETS)  # 2 layers x 4 projections
    assert keys[-2:] == ["head.weight", "head.bias"]
    # rank 4 on q, k, v, o of width 32: (32*4 + 4*32) per projection; head 32*10 + 10
    assert trainable_count(model) == 2 * 4 * (32 * 4 + 4 * 32) + 330
    assert all(p.requires_grad == (name in keys) for name, p in model.named_parameters())


def test_vit_b16_with_lora_sends_more_than_100x_fewer_numbers_than_full_fine_tuning():
    with torch.device("meta"):
        lora = apply_fine_tuning(build_model("vit-b16", 10, 3, 224), FineTuning())
        full = apply_fine_tuning(build_model("vit-b16", 10, 3, 224), FineTuning(mode="full"))
    lora_numbers = sum(lora.state_dict()[k].numel() for k in exchanged_keys(lora))
    full_numbers = sum(full.state_dict()[k].numel() for k in exchanged_keys(full))
    assert lora_numbers == 12 * 4 * (768 * 4 + 4 * 768) + 768 * 10 + 10  # the spec's 294,912 plus the head
    assert full_numbers > 100 * lora_numbers


def test_the_adapters_only_round_trip_through_the_client_app_leaves_the_frozen_body_untouched():
    settings = vit_settings(**{"learning-rate": 0.1})
    server_model = new_model(settings)
    sent = ArrayRecord(exchanged_state(server_model))
    expected_bytes = sum(server_model.state_dict()[k].numel() * 4 for k in exchanged_keys(server_model))
    assert sum(np.asarray(a).nbytes for a in decode(sent).values()) == expected_bytes

    client_model, digest = client_app._cached_model(settings)
    frozen_before = {
        k: v.clone() for k, v in client_model.state_dict().items() if k not in exchanged_keys(client_model)
    }
    context = Context(
        run_id=1,
        node_id=5,
        node_config={"partition-id": 0, "num-partitions": 4},
        state=RecordDict(),
        run_config={**VIT, "learning-rate": 0.1},
    )
    config = TrainRecipe(batch_size=16, learning_rate=0.1, local_epochs=1).to_config()
    config |= {"server-round": 1, FROZEN_DIGEST: frozen_digest(server_model)}
    message = Message(RecordDict({"arrays": sent, "config": ConfigRecord(config)}), dst_node_id=5, message_type="train")
    reply = client_app.train(message, context)

    returned = decode(reply.content["arrays"])
    assert list(returned) == exchanged_keys(server_model)  # adapters and head only, in the server's order
    assert sum(v.nbytes for v in returned.values()) == expected_bytes
    assert any(not np.array_equal(returned[k], decode(sent)[k]) for k in returned)  # it trained
    frozen_after = {k: v for k, v in client_model.state_dict().items() if k not in exchanged_keys(client_model)}
    assert frozen_after.keys() == frozen_before.keys()
    assert all(torch.equal(frozen_before[k], frozen_after[k]) for k in frozen_before)
    assert digest == frozen_digest(server_model)  # the same seed builds the same frozen body everywhere


def test_a_client_whose_frozen_body_differs_from_the_server_s_refuses_the_instruction():
    settings = vit_settings()
    model = new_model(settings)
    context = Context(
        run_id=1, node_id=5, node_config={"partition-id": 0, "num-partitions": 4}, state=RecordDict(), run_config=VIT
    )
    config = TrainRecipe(local_epochs=1).to_config() | {"server-round": 1, FROZEN_DIGEST: "0123456789abcdef"}
    message = Message(
        RecordDict({"arrays": ArrayRecord(exchanged_state(model)), "config": ConfigRecord(config)}),
        dst_node_id=5,
        message_type="train",
    )
    with pytest.raises(ValueError, match="frozen model part .* differs from the server's .*model-weights"):
        client_app.train(message, context)


def test_a_full_model_sent_to_a_lora_client_is_refused_by_name():
    model = new_model(vit_settings())
    full = new_model(vit_settings(**{"fine-tuning": "full"}))
    with pytest.raises(ValueError, match=r"does not fit this one's trainable tensors: 16 missing .* 38 unexpected"):
        load_exchanged_state(model, full.state_dict())


def test_aggregating_the_reduced_set_equals_aggregating_full_models_restricted_to_it():
    settings = vit_settings()
    base = new_model(settings)
    keys = exchanged_keys(base)
    generator = torch.Generator().manual_seed(0)
    fulls = []
    for _ in range(3):  # three clients: each changes only its trainable tensors, as LoRA training does
        state = {k: v.clone() for k, v in base.state_dict().items()}
        for key in keys:
            state[key] = state[key] + torch.randn(state[key].shape, generator=generator)
        fulls.append({k: v.numpy() for k, v in state.items()})
    weights = np.array([0.5, 0.3, 0.2])
    reduced = weighted_average([{k: full[k] for k in keys} for full in fulls], weights)
    restricted = weighted_average(fulls, weights)
    assert list(reduced) == keys
    for key in keys:
        np.testing.assert_array_equal(reduced[key], restricted[key])
    frozen = [k for k in restricted if k not in keys]
    assert frozen and all(np.allclose(restricted[k], base.state_dict()[k].numpy()) for k in frozen)


def test_fedprox_pulls_only_the_adapters_and_the_head():
    model = new_model(vit_settings())
    data = load_partition(DataSpec(dataset="digits", partitioner="iid", num_partitions=8, seed=1), 0)
    frozen = {k: v.clone() for k, v in model.state_dict().items() if k not in exchanged_keys(model)}
    stats = train_locally(
        model,
        data,
        TrainRecipe(local_epochs=1, batch_size=32, learning_rate=0.05, proximal_mu=0.5),
        batch_transform(vit_settings()),
        torch.device("cpu"),
        torch.Generator().manual_seed(0),
    )
    assert np.isfinite(stats.train_loss)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in frozen.items())


# -- every strategy on the reduced set, end to end ---------------------------------


@pytest.mark.parametrize(
    ("strategy", "extra"),
    [
        ("fedoui", {}),
        ("ufl", {}),
        ("feddle", {"server-data": "id", "server-data-size": 60, "feddle.search-epochs": 1}),
    ],
)
def test_two_rounds_of_a_tiny_vit_with_lora(tmp_path, strategy, extra):
    folder = run_in_process(
        {
            **VIT,
            "strategy": strategy,
            "num-server-rounds": 2,
            "fraction-train": 0.5,
            "seed": 3,
            "output-dir": str(tmp_path),
            "run-name": strategy,
            **extra,
        }
    )
    rows = read_metrics(folder)
    assert [row["round"] for row in rows] == [1, 2]
    assert all(row["aggregated"] and not row["left_out"] for row in rows)
    model = new_model(vit_settings())
    wire = sum(model.state_dict()[k].numel() * 4 for k in exchanged_keys(model))
    for row in rows:
        assert {client["bytes_sent"] for client in row["clients"]} == {wire}
        assert {client["bytes_received"] for client in row["clients"]} == {wire}
    signal = {"fedoui": "oui", "ufl": "uncertainty"}.get(strategy)
    if signal:
        assert all(np.isfinite(client[signal]) for row in rows for client in row["clients"])
    saved = torch.load(folder / "model.pt", weights_only=True)
    assert list(saved) == exchanged_keys(model)  # the run keeps what trains; the body is rebuilt from settings


def test_a_full_model_s_bytes_per_message_are_its_whole_state(tmp_path):
    folder = run_in_process(
        {"num-server-rounds": 1, "fraction-train": 0.5, "seed": 3, "output-dir": str(tmp_path), "run-name": "mlp"}
    )
    model = new_model(validate({}))
    whole = sum(v.numel() * v.element_size() for v in model.state_dict().values())
    clients = read_metrics(folder)[0]["clients"]
    assert clients and all(c["bytes_sent"] == whole == c["bytes_received"] for c in clients)


# -- the signals on a ViT --------------------------------------------------------------


def test_oui_reads_the_cls_feature_before_the_head_or_a_named_module():
    model = new_model(vit_settings()).eval()
    inputs = batch_transform(vit_settings())(torch.randint(0, 255, (8, 1, 8, 8), dtype=torch.uint8), train=False)
    value = probe_oui(model, resolve_probe_layer(model, ""), inputs)
    assert 0.0 <= value <= 1.0
    named = probe_oui(model, resolve_probe_layer(model, "vit.layers.1.mlp.fc1"), inputs)  # last pre-GELU
    assert 0.0 <= named <= 1.0


def test_mc_dropout_in_a_vit_uses_its_own_dropout_when_set_else_one_before_the_head():
    plain = new_model(vit_settings())
    assert dropout_sites(plain) == []  # the ViT's dropout modules are there at p = 0: not sampling sites
    sites = ensure_mc_dropout(plain, 0.5)
    assert [(s.module, s.inserted) for s in sites] == [("head", True)]
    own = new_model(vit_settings(**{"model-dropout": 0.1}))
    sites = ensure_mc_dropout(own, 0.5)
    assert sites and all(not s.inserted and s.p == 0.1 for s in sites)
    lora_dropout = new_model(vit_settings(**{"lora-dropout": 0.2}))
    assert [s.module for s in ensure_mc_dropout(lora_dropout, 0.5)] == ["head"]  # adapter dropout is not a site


# -- input pipeline ------------------------------------------------------------------------


def test_grayscale_images_are_resized_and_replicated_for_a_pretrained_model():
    settings = validate({"dataset": "digits", "model": "resnet18-imagenet", "model-width": 8})
    transform = batch_transform(settings)
    batch = torch.randint(0, 255, (2, 1, 8, 8), dtype=torch.uint8)
    out = transform(batch, train=False)
    assert out.shape == (2, 3, 224, 224)
    assert torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 1], out[:, 2])
    model = new_model(settings)
    assert model(out).shape == (2, 10)


def test_imagenet_normalisation_only_with_pretrained_weights():
    assert model_input("resnet18-imagenet").mean is None
    assert model_input("resnet18-imagenet", pretrained=True).mean == (0.485, 0.456, 0.406)
    assert model_input("vit-b16", pretrained=True).std == (0.5, 0.5, 0.5)  # Google's ViT checkpoints' own
    assert model_input("resnet18-imagenet", input_size=96).size == 96


# -- pretrained weights from local files -------------------------------------------------


def test_resnet18_imagenet_loads_a_torchvision_state_dict_and_gets_a_new_head(tmp_path):
    import torchvision

    reference = torchvision.models.resnet18(num_classes=1000)
    path = tmp_path / "resnet18.pth"
    torch.save(reference.state_dict(), path)
    model = build_model("resnet18-imagenet", 10, 3, 224, pretrained=True, weights=str(path))
    assert torch.equal(model.conv1.weight, reference.conv1.weight)
    assert torch.equal(model.layer4[1].bn2.running_var, reference.layer4[1].bn2.running_var)
    assert model.fc.out_features == 10
    folder = tmp_path / "folder"
    folder.mkdir()
    torch.save(reference.state_dict(), folder / "weights.pth")
    from_folder = build_model("resnet18-imagenet", 10, 3, 224, pretrained=True, weights=str(folder))
    assert torch.equal(from_folder.conv1.weight, reference.conv1.weight)


def test_a_vit_loads_a_save_pretrained_folder(tmp_path):
    source = build_model("vit-tiny", 10, 3, 32)
    source.vit.save_pretrained(str(tmp_path / "vit"))
    loaded = build_model("vit-tiny", 5, 3, 32, pretrained=True, weights=str(tmp_path / "vit"))
    for (name, a), (_, b) in zip(source.vit.state_dict().items(), loaded.vit.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert loaded.head.out_features == 5


def test_head_only_fine_tuning_keeps_frozen_batchnorm_statistics_in_place():
    settings = validate(
        {
            "dataset": "digits",
            "model": "resnet18-imagenet",
            "model-width": 8,
            "model-input-size": 32,
            "fine-tuning": "head",
        }
    )
    model = new_model(settings)
    assert exchanged_keys(model) == ["fc.weight", "fc.bias"]
    before = model.bn1.running_mean.clone()
    data = load_partition(DataSpec(dataset="digits", partitioner="iid", num_partitions=16, seed=1), 0)
    train_locally(
        model,
        data,
        TrainRecipe(local_epochs=1, batch_size=16),
        batch_transform(settings),
        torch.device("cpu"),
        torch.Generator().manual_seed(0),
    )
    assert torch.equal(model.bn1.running_mean, before)  # frozen body: its statistics cannot drift from the server's


# -- mixed precision -------------------------------------------------------------------------


def test_bf16_autocast_trains_and_evaluates_a_vit_on_the_cpu():
    settings = vit_settings(**{"mixed-precision": "bf16"})
    model = new_model(settings)
    data = load_partition(DataSpec(dataset="digits", partitioner="iid", num_partitions=8, seed=1), 0)
    recipe = TrainRecipe.from_settings(settings, local_epochs=1, proximal_mu=0.0)
    assert recipe.mixed_precision == "bf16"
    stats = train_locally(
        model, data, recipe, batch_transform(settings), torch.device("cpu"), torch.Generator().manual_seed(0)
    )
    assert np.isfinite(stats.train_loss)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # weights stay float32
    result = evaluate(model, data, batch_transform(settings), torch.device("cpu"), 64, "bf16")
    assert 0.0 <= result.accuracy <= 1.0


def test_fp16_on_a_cpu_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="mixed-precision = 'fp16' needs a CUDA device"):
        autocast("fp16", torch.device("cpu"))
    with pytest.raises(SettingsError, match="mixed-precision = 'fp16' needs a CUDA device, but device = 'cpu'"):
        check_run({**VIT, "mixed-precision": "fp16", "device": "cpu"})


# -- bad input, before training -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"lora-rank": 0}, r"lora-rank = 0: Input should be greater than or equal to 1"),
        ({"lora-targets": "query,value"}, r"lora-targets = 'query,value': they match no module"),
        ({"lora-targets": "layernorm"}, r"lora-targets = 'layernorm': \['vit.layernorm'\] cannot take LoRA"),
        (
            {"model": "resnet18-imagenet", "fine-tuning": "lora"},
            r"has no default LoRA target modules; accepted: lora-targets = .*conv1",
        ),
        ({"model": "mlp", "model-pretrained": True}, r"model = 'mlp' has no option model-pretrained"),
        ({"model-pretrained": True}, r"model 'vit-tiny' has no published weights; accepted: model-weights"),
        ({"model-weights": "/x/w.pth"}, r"model-weights = '/x/w.pth' is only read with model-pretrained = true"),
        (
            {"model-pretrained": True, "model-weights": "/no/such/weights.pth"},
            r"model-weights = '/no/such/weights.pth': no such file or folder",
        ),
    ],
)
def test_bad_fine_tuning_settings_fail_before_training_with_one_message(config, message):
    with pytest.raises(SettingsError, match=message):
        check_run({**VIT, **config})


def test_pretrained_weights_offline_with_nothing_cached_name_the_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "torch"))
    for model in ("vit-b16", "resnet18-imagenet"):
        with pytest.raises(SettingsError, match=rf"model-pretrained = true needs the weights of model '{model}'.*"):
            check_run({"dataset": "digits", "model": model, "model-pretrained": True})
    with pytest.raises(WeightsUnavailable, match="accepted: model-weights = a local state_dict file"):
        build_model("resnet18-imagenet", 10, 3, 224, pretrained=True)


def test_a_failed_download_names_the_settings(monkeypatch, tmp_path):
    def unreachable(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    monkeypatch.setattr(torch.hub, "download_url_to_file", unreachable)
    with pytest.raises(WeightsUnavailable, match=r"resnet18-f37072fd.pth could not be read \(network is unreachable\)"):
        build_model("resnet18-imagenet", 10, 3, 224, pretrained=True)


def test_lora_works_on_any_model_whose_linear_modules_are_named():
    model = build_model("mlp", 10, 1, 8, hidden=(16, 16))
    model = apply_fine_tuning(model, FineTuning(mode="lora", lora_rank=2, lora_targets=("fc1", "fc2")))
    assert [k for k in exchanged_keys(model) if "lora" not in k] == ["fc3.weight", "fc3.bias"]
    assert isinstance(model.get_submodule(model.classifier_layer), nn.Linear)  # module names are kept
    assert settings_from({"model": "mlp"}).fine_tuning == ""
