"""The GPU bundle: what a bare GPU machine lacks, and ``scripts/gpu-evidence.sh`` run as it would run there.

The lent machine cannot be reached from the suite; what can be checked here is
checked: the carried set against the machine's package list, the packing of
wheels, the data slice, the refusal of a run the slice cannot serve, and the
script itself in an environment holding only the machine's distributions
(no Ray) and the carried ones, in the smoke mode.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import REPO

from fedweigh.benchmarks.common import BenchmarkError
from fedweigh.benchmarks.gpu_bundle import (
    ALWAYS_CARRIED,
    LEFT_BEHIND,
    SLICE_FILE,
    carried,
    device_packages,
    emulated_env,
    is_slice,
    link_distributions,
    pack_wheels,
    runtime_closure,
    write_slice,
)
from fedweigh.benchmarks.gpu_evidence import NO_RAY, Context, build_cases, load_arm
from fedweigh.launch.commands import build_federation_config, engine_backend


@pytest.fixture(scope="module")
def closure() -> dict[str, str]:
    return runtime_closure()


@pytest.mark.unit
def test_the_closure_holds_what_fedweigh_imports_and_leaves_ray_and_its_own_needs_behind(closure):
    assert {"flwr", "flwr-datasets", "datasets", "pydantic", "pydantic-core", "torch", "peft", "scipy"} <= set(closure)
    assert "ray" not in closure and "fedweigh" not in closure
    assert "uv" not in closure  # Flower's dependency installer, which fedweigh's SuperLink is started without
    full = runtime_closure(left_behind=())
    assert {"ray", "uv"} <= set(full) and set(closure) < set(full)
    assert all(why for why in LEFT_BEHIND.values())


@pytest.mark.unit
def test_what_travels_is_what_the_machine_lacks_and_flowers_transport(closure):
    device = device_packages()
    assert {"torch", "torchvision", "numpy", "pyarrow", "peft", "grpcio"} <= device
    assert "flwr" not in device and "pydantic" not in device
    travelling = carried(closure, device)
    assert {"flwr", "flwr-datasets", "datasets", "pydantic", "cryptography"} <= set(travelling)
    assert set(travelling) >= ALWAYS_CARRIED  # on the image too, but Flower's stubs are pinned to ours
    assert not {"torch", "torchvision", "numpy", "scipy", "pyarrow", "peft", "transformers"} & set(travelling)
    assert all(travelling[name] == closure[name] for name in travelling)  # the versions the suite ran


@pytest.mark.unit
def test_the_device_list_reads_names_only(tmp_path):
    listing = tmp_path / "packages.txt"
    listing.write_text("# a comment\nTyping_Extensions\n\nflwr  # inline\n", encoding="utf-8")
    assert device_packages(listing) == {"typing-extensions", "flwr"}


def _wheel(folder: Path, name: str, version: str, module: str) -> Path:
    """A pure-Python wheel of one module, deflated, with a RECORD that hashes its members."""
    members = {
        f"{name}.py": module.encode(),
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    lines = []
    for path, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{path},sha256={digest},{len(data)}")
    members[f"{name}-{version}.dist-info/RECORD"] = (
        "\n".join([*lines, f"{name}-{version}.dist-info/RECORD,,"]) + "\n"
    ).encode()
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in members.items():
            archive.writestr(path, data)
    return wheel


@pytest.mark.unit
def test_packed_wheels_come_out_stored_and_install_offline(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    wheels = [_wheel(source, "alpha", "1.0", "VALUE = 41 + 1\n"), _wheel(source, "beta", "2.0", "NAME = 'beta'\n")]
    archive = tmp_path / "wheels.tar.xz"
    pack_wheels(wheels, archive)
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["wheels/alpha-1.0-py3-none-any.whl", "wheels/beta-2.0-py3-none-any.whl"]
        tar.extractall(tmp_path / "out", filter="data")
    unpacked = sorted((tmp_path / "out" / "wheels").glob("*.whl"))
    for wheel in unpacked:
        with zipfile.ZipFile(wheel) as archive_file:
            assert {member.compress_type for member in archive_file.infolist()} == {zipfile.ZIP_STORED}
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", str(site),
         *map(str, unpacked)],
        check=True,
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", "import alpha, beta; print(alpha.VALUE, beta.NAME)"],
        env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.split() == ["42", "beta"]


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory) -> Path:
    """scikit-learn's digits as a local dataset folder (train.parquet, test.parquet) of the Hugging Face layout."""
    from fedweigh.data.sources import load_digits

    folder = tmp_path_factory.mktemp("digits")
    for split, data in load_digits().items():
        data.to_parquet(str(folder / f"{split}.parquet"))
    return folder


@pytest.mark.unit
def test_the_slice_is_the_seeded_draw_of_the_subset_settings_and_says_so(digits_folder, tmp_path):
    import datasets

    from fedweigh.data.federated import SubsetSplits

    slice_dir = tmp_path / "digits"
    described = write_slice(digits_folder, slice_dir, 300, 100, seed=0)
    assert is_slice(slice_dir) == described and (slice_dir / SLICE_FILE).is_file()
    assert is_slice(digits_folder) is None
    full = {
        split: datasets.Dataset.from_parquet(str(digits_folder / f"{split}.parquet")) for split in ("train", "test")
    }
    assert described["of"] == {split: full[split].num_rows for split in full}
    drawn = SubsetSplits(300, 100, 0)(datasets.DatasetDict(full))
    for split, size in (("train", 300), ("test", 100)):
        written = datasets.Dataset.from_parquet(str(slice_dir / f"{split}.parquet"))
        assert written.num_rows == size and written.features == full[split].features
        assert written["label"] == drawn[split]["label"]


@pytest.mark.unit
def test_a_file_that_trains_on_more_than_the_slice_is_skipped_with_the_reason(tmp_path, monkeypatch, digits_folder):
    root = tmp_path / "datasets"
    write_slice(digits_folder, root / "cifar10", 300, 100, seed=0)  # a stand-in: only the slice's description counts
    (root / "cifar10" / SLICE_FILE).write_text(
        json.dumps({"train": 10_000, "test": 2_000, "seed": 0, "of": {"train": 50_000, "test": 10_000}}),
        encoding="utf-8",
    )
    monkeypatch.setenv("FEDWEIGH_DATASETS", str(root))
    ctx = Context(None, quick=False, runs_dir=tmp_path, ray=False)
    with pytest.raises(BenchmarkError, match=r"fednolowe_cifar10\.toml asks for train-subset = all, test-subset = all"):
        load_arm(ctx, "experiments/fednolowe_cifar10.toml", "fedavg", 5, 1.0)
    experiment = load_arm(ctx, "experiments/flood_cifar10_gpu.toml", "flood", None, 1.0)  # 10,000 / 2,000: served
    assert experiment.arm_configs["flood"]["simulation-backend"] == "in-process"  # no Ray there


@pytest.mark.unit
def test_without_ray_the_ray_step_is_skipped_and_the_rest_runs_in_process(tmp_path):
    from fedweigh.benchmarks.gpu_evidence import run_cases

    cases = {case.name: case for case in build_cases(Context(None, quick=False, runs_dir=tmp_path, ray=False))}
    assert cases["vit-lora"].steps[0].name.endswith("-in-process")
    ray_step = cases["overhead"].steps[0]
    report = run_cases([cases["overhead"].__class__(**{**cases["overhead"].__dict__, "steps": (ray_step,)})], 1e6)
    assert report["cases"][0]["steps"][0] == {**report["cases"][0]["steps"][0], "status": "skipped", "reason": NO_RAY}


@pytest.mark.unit
def test_an_in_process_run_names_its_backend_to_flower_and_a_ray_run_does_not():
    assert engine_backend({"simulation-backend": "in-process"}) == {"backend": "in-process"}
    assert engine_backend({"simulation-backend": "ray"}) == {}
    assert "backend='in-process'" in build_federation_config(
        4, extra=engine_backend({"simulation-backend": "in-process"})
    )


@pytest.mark.sim
def test_the_device_script_runs_the_smoke_mode_with_only_the_machines_packages_and_the_bundle(tmp_path, closure):
    """``scripts/gpu-evidence.sh`` with an interpreter that holds the image's distributions alone (no Ray, no Flower)
    and a site holding the carried ones, as the script's install leaves it: a wheel the bundle lacks fails here."""
    device = device_packages()
    python = emulated_env(tmp_path / "image", sorted({name for name in closure if name in device} | {"pip"}))
    site = tmp_path / "site"
    link_distributions(site, site / "bin", python, carried(closure, device))
    (site / ".installed").touch()  # the script's own install is what pack_wheels' test and the docs' check cover
    assert subprocess.run([str(python), "-c", "import ray"], capture_output=True, check=False).returncode != 0
    assert subprocess.run([str(python), "-c", "import flwr"], capture_output=True, check=False).returncode != 0
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "wheels.tar.xz").touch()
    out = tmp_path / "out"
    env = {
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PATH": f"{python.parent}:/usr/bin:/bin",
        "OUT": str(out),
        "FEDWEIGH_GPU_BUNDLE": str(bundle),
        "FEDWEIGH_GPU_SITE": str(site),
        "TMPDIR": str(tmp_path),
    }
    arguments = ["--quick", "--cases", "flood", "--port", "39461", "--runs-dir", str(tmp_path / "runs")]
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu-evidence.sh"), *arguments],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu-evidence.json").read_text(encoding="utf-8"))
    assert [case["case"] for case in report["cases"]] == ["flood"] and report["cases"][0]["status"] == "done"
    run_dir = Path(report["cases"][0]["steps"][0]["result"]["run_dir"])
    assert (
        json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["settings"]["simulation-backend"]
        == "in-process"
    )
    assert (out / "log.txt").is_file() and (out / "machine.txt").is_file()
