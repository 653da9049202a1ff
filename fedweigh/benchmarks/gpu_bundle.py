"""What a bare GPU machine lacks, packed to travel with the working tree to ``fedweigh benchmark gpu-evidence``.

The lent GPU machines reach no package registry and no hub, and a call
carries at most 64 MiB: the working tree (about 30 MiB, most of it the
committed plots) and whatever paths it names. Their image has PyTorch,
NumPy, SciPy, pyarrow, pandas, peft and transformers
(``deploy/gpu/device-packages.txt``) but not Flower, pydantic or the
``datasets`` library. This module builds ``.gpu-bundle/`` (ignored by git):

* ``wheels.tar.xz``: a wheel for Python 3.12 of every distribution that
  fedweigh needs at run time and the machine lacks, each at the version
  installed here (so that what runs there is what the suite tested), found
  by walking the installed requirements from ``fedweigh`` down
  (:func:`runtime_closure`, :func:`carried`), less :data:`LEFT_BEHIND` (Ray,
  whose wheel alone is over the carry: every run there is in-process; uv).
  The wheels are stored uncompressed inside the xz archive, which makes
  them 19 MiB instead of 28 (:func:`pack_wheels`); they stay valid wheels.
* ``datasets/cifar10/``: a seeded draw of 10,000 training and 2,000 test
  images of CIFAR-10 (:data:`SLICE`), the most any case of ``gpu-evidence``
  but FedNolowe's takes; its ``slice.json`` says so, and a case that trains
  on the whole dataset is skipped with that reason rather than run on a
  part of it (:func:`is_slice`).
* ``manifest.json``: what was carried and left behind, the sizes and the
  tree's, and the total against the limit (a bundle over it is refused).

``scripts/gpu-evidence.sh`` is the command to run there. ``emulate``
builds, from this machine's environment, a site holding only the device's
distributions and the carried ones, so that the test suite can run the
smoke mode in it and a missing wheel shows up here, not in a lease.

Usage: ``python -m fedweigh.benchmarks.gpu_bundle build`` (``--help``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from fedweigh.benchmarks.common import APP_DIR, BenchmarkError

__all__ = [
    "BUNDLE_DIR",
    "CARRY_LIMIT_BYTES",
    "DEVICE_PACKAGES_FILE",
    "DEVICE_PYTHON",
    "LEFT_BEHIND",
    "SLICE",
    "build_bundle",
    "carried",
    "device_packages",
    "download_wheels",
    "emulated_env",
    "is_slice",
    "link_distributions",
    "pack_wheels",
    "runtime_closure",
    "tree_bytes",
    "write_slice",
]

BUNDLE_DIR = APP_DIR / ".gpu-bundle"
"""Where the bundle is built; ``.gitignore`` ignores it, the device call names it in ``carry``."""
DEVICE_PACKAGES_FILE = APP_DIR / "deploy" / "gpu" / "device-packages.txt"
DEVICE_PYTHON = "3.12"
"""The lent machines' ``python3`` (3.12.3 as seen there)."""
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
"""The wheels' platforms pip may take for that machine (x86-64, glibc of Ubuntu 24.04)."""
CARRY_LIMIT_BYTES = 64 * 2**20
"""What one device call carries: the working tree and the paths it names."""
LEFT_BEHIND = {
    "ray": "its wheel alone (about 70 MB) is over the 64 MiB a call carries; the runs there use the in-process "
    "backend, which Flower then neither asks for nor checks (fedweigh.launch.commands.engine_backend)",
    "uv": "an executable (17 MB) that Flower runs only to install an app's dependencies, which fedweigh's "
    "SuperLink is started without (--disable-runtime-dependency-installation)",
}
"""Distributions of the closure that do not travel, and why (their own requirements stay behind with them)."""
ALWAYS_CARRIED = frozenset({"grpcio", "protobuf"})
"""On the machine's image too, at versions not recorded; Flower's transport is pinned to these, so ours travel."""
SLICE = {"dataset": "cifar10", "train": 10_000, "test": 2_000, "seed": 0}
"""The CIFAR-10 draw that travels: the FLood case's 10,000 / 2,000 images, the most any case takes."""
SLICE_FILE = "slice.json"


def device_packages(path: Path = DEVICE_PACKAGES_FILE) -> frozenset[str]:
    """The canonical names of the distributions on the lent machines' image (one a line, ``#`` comments)."""
    names = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return frozenset(canonicalize_name(name) for name in names if name)


def _requirements(dist: metadata.Distribution, extras: Iterable[str]) -> list[Requirement]:
    """``dist``'s requirements that apply here with ``extras`` (markers evaluated for this interpreter)."""
    wanted = []
    for text in dist.requires or ():
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in ("", *extras)):
            wanted.append(requirement)
    return wanted


def runtime_closure(root: str = "fedweigh", left_behind: Iterable[str] = LEFT_BEHIND) -> dict[str, str]:
    """Every installed distribution that ``root`` needs at run time, name -> version, without ``left_behind``.

    Walks the installed metadata (no extras of ``root`` itself: ``dev`` and
    ``tracking`` are not needed to run). Raises :class:`BenchmarkError` naming
    a requirement that is not installed here.
    """
    skip = {canonicalize_name(name) for name in left_behind}
    found: dict[str, str] = {}
    extras_seen: dict[str, set[str]] = {}
    pending: list[tuple[str, tuple[str, ...], str]] = [(root, (), "the command line")]
    while pending:
        name, extras, needed_by = pending.pop()
        key = canonicalize_name(name)
        if key in skip:
            continue
        new_extras = set(extras) - extras_seen.get(key, set())
        if key in found and not new_extras:
            continue
        try:
            dist = metadata.distribution(key)
        except metadata.PackageNotFoundError:
            raise BenchmarkError(f"{name}, needed by {needed_by}, is not installed here (scripts/setup.sh)") from None
        found[key] = dist.version
        extras_seen.setdefault(key, set()).update(extras)
        for requirement in _requirements(dist, extras_seen[key]):
            pending.append((requirement.name, tuple(requirement.extras), key))
    found.pop(canonicalize_name(root), None)  # fedweigh itself travels as source, with the tree
    return dict(sorted(found.items()))


def carried(closure: Mapping[str, str], device: Iterable[str]) -> dict[str, str]:
    """What travels: the closure less what the machine has, but for :data:`ALWAYS_CARRIED`."""
    there = set(device) - ALWAYS_CARRIED
    return {name: version for name, version in closure.items() if name not in there}


def download_wheels(packages: Mapping[str, str], dest: Path, python_version: str = DEVICE_PYTHON) -> list[Path]:
    """Each ``name==version`` as a binary wheel for ``python_version`` on x86-64 Linux into ``dest``.

    Raises :class:`BenchmarkError` naming the distributions that have no such wheel.
    """
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--python-version", python_version, "--implementation", "cp", *platforms, "--dest", str(dest),
        *(f"{name}=={version}" for name, version in packages.items()),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BenchmarkError(
            f"pip could not download every wheel for Python {python_version} on x86-64 Linux:\n{done.stderr.strip()}"
        )
    wheels = [path for path in sorted(dest.glob("*.whl")) if _wheel_name(path) in packages]
    if missing := sorted(set(packages) - {_wheel_name(path) for path in wheels}):
        raise BenchmarkError(f"no wheel came for {', '.join(missing)} (in {dest})")
    return wheels


def _wheel_name(path: Path) -> str:
    return canonicalize_name(path.name.split("-", 1)[0])


def pack_wheels(wheels: Iterable[Path], archive: Path) -> None:
    """``wheels`` into the xz archive ``archive``, each rewritten with its members stored, not deflated.

    A wheel's RECORD hashes its members, not the zip, so a stored wheel
    installs as the original does; xz then compresses across them (28 ->
    19 MiB for the bundle's, where the deflated ones gain nothing).
    """
    import tarfile
    import tempfile
    import zipfile

    with tempfile.TemporaryDirectory() as scratch, tarfile.open(archive, "w:xz", preset=6) as tar:
        for wheel in wheels:
            stored = Path(scratch) / wheel.name
            with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(stored, "w", zipfile.ZIP_STORED) as target:
                for member in source.infolist():
                    data = source.read(member)
                    member.compress_type = zipfile.ZIP_STORED
                    target.writestr(member, data)
            tar.add(stored, arcname=f"wheels/{wheel.name}")
            stored.unlink()


def is_slice(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The slice's description if ``folder`` holds a draw of a dataset rather than all of it (else None)."""
    path = Path(folder) / SLICE_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def write_slice(source: Path, dest: Path, train: int, test: int, seed: int) -> dict[str, Any]:
    """A seeded draw of ``train`` / ``test`` images of the dataset folder ``source`` into ``dest``.

    The draw is the one ``train-subset`` / ``test-subset`` make at ``seed``
    (:class:`fedweigh.data.federated.SubsetSplits`); the files keep the
    dataset's features, so the folder loads as the whole one does.
    """
    import datasets

    from fedweigh.data.federated import SubsetSplits

    splits = datasets.DatasetDict(
        {
            split: datasets.Dataset.from_parquet(str(source / f"{split}.parquet"), keep_in_memory=True)
            for split in ("train", "test")
        }
    )
    sizes = {split: splits[split].num_rows for split in splits}
    drawn = SubsetSplits(train, test, seed)(splits)
    dest.mkdir(parents=True, exist_ok=True)
    for split, data in drawn.items():
        data.to_parquet(str(dest / f"{split}.parquet"))
    description = {
        "source": source.name,
        "train": train,
        "test": test,
        "seed": seed,
        "of": sizes,
        "note": "a draw of the dataset (fedweigh.benchmarks.gpu_bundle): a run that needs all of it is refused",
    }
    (dest / SLICE_FILE).write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")
    return description


def tree_bytes(root: Path = APP_DIR) -> int:
    """The bytes of the working tree a device call carries: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, check=True,
    ).stdout  # fmt: skip
    paths = (root / name.decode() for name in listed.split(b"\0") if name)
    return sum(path.stat().st_size for path in paths if path.is_file())


def _folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def build_bundle(
    out: Path = BUNDLE_DIR,
    python_version: str = DEVICE_PYTHON,
    datasets_root: Path | None = None,
    cache: Path | None = None,
) -> dict[str, Any]:
    """The wheels' archive, the CIFAR-10 slice and the manifest into ``out``; refuses a bundle the call cannot carry.

    The wheels are downloaded into ``cache`` (default: a folder beside the
    system's temporary files, kept for the next build) and only their archive
    goes into ``out``, which the device call carries whole.
    """
    from fedweigh.benchmarks.common import dataset_folder

    closure = runtime_closure()
    packages = carried(closure, device_packages())
    cache = cache or Path(os.environ.get("TMPDIR", "/tmp")) / f"fedweigh-gpu-wheels-{python_version}"
    wheels = download_wheels(packages, cache, python_version)
    out.mkdir(parents=True, exist_ok=True)
    archive = out / "wheels.tar.xz"
    pack_wheels(wheels, archive)
    source = Path(datasets_root / SLICE["dataset"]) if datasets_root else Path(dataset_folder(SLICE["dataset"]))
    data_dir = out / "datasets" / SLICE["dataset"]
    if not _slice_key().items() <= (is_slice(data_dir) or {}).items():
        write_slice(source, data_dir, SLICE["train"], SLICE["test"], SLICE["seed"])
    sizes = {"tree": tree_bytes(), "wheels": archive.stat().st_size, "datasets": _folder_bytes(out / "datasets")}
    manifest = {
        "python": python_version,
        "carried": packages,
        "left_behind": dict(LEFT_BEHIND),
        "on_the_device": sorted(set(closure) - set(packages)),
        "wheels": [path.name for path in wheels],
        "slice": is_slice(data_dir),
        "bytes": {**sizes, "total": sum(sizes.values()), "limit": CARRY_LIMIT_BYTES},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    if manifest["bytes"]["total"] > CARRY_LIMIT_BYTES:
        raise BenchmarkError(
            f"the bundle ({sizes['wheels'] + sizes['datasets']:,} bytes) and the tree ({sizes['tree']:,}) make "
            f"{manifest['bytes']['total']:,} bytes, over the {CARRY_LIMIT_BYTES:,} a device call carries"
        )
    return manifest


def _slice_key() -> dict[str, Any]:
    return {"source": SLICE["dataset"], "train": SLICE["train"], "test": SLICE["test"], "seed": SLICE["seed"]}


def _top_level(dist: metadata.Distribution) -> set[str]:
    """The names a distribution puts at the top of site-packages (packages, modules, its .dist-info)."""
    names = set()
    for file in dist.files or ():
        first = file.parts[0]
        if first not in ("..", "__pycache__") and not first.endswith(".pth"):
            names.add(first)
    return names


def link_distributions(site: Path, bin_dir: Path, python: Path, distributions: Iterable[str]) -> None:
    """This environment's copies of ``distributions``, linked into ``site``, their console scripts in ``bin_dir``.

    What ``pip install --target`` of their wheels would give, without
    copying or downloading: the scripts start ``python``.
    """
    site.mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in distributions:
        dist = metadata.distribution(name)
        root = Path(dist.locate_file(""))
        for entry in _top_level(dist):
            if not (site / entry).exists() and (root / entry).exists():
                (site / entry).symlink_to(root / entry)
        for entry_point in dist.entry_points.select(group="console_scripts"):
            module, _, attribute = entry_point.value.partition(":")
            script = bin_dir / entry_point.name
            script.write_text(
                f"#!{python}\nimport sys\nfrom {module} import {attribute.split('.')[0]}\nsys.exit({attribute}())\n",
                encoding="utf-8",
            )
            script.chmod(0o755)


def emulated_env(dest: Path, distributions: Iterable[str]) -> Path:
    """A virtual environment at ``dest`` holding this machine's copies of ``distributions`` and nothing else.

    With the device's distributions (and ``pip``), it stands in for the lent
    machine's image; returns its interpreter. The test suite runs
    ``scripts/gpu-evidence.sh`` with it and the carried distributions linked
    into the script's site (:func:`link_distributions`), so that a
    distribution the bundle lacks fails here, not in a lease.
    """
    import venv

    venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(dest)
    python = dest / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    link_distributions(Path(site), dest / "bin", python, distributions)
    return python


def main(argv: list[str] | None = None) -> int:
    prog = "python -m fedweigh.benchmarks.gpu_bundle"
    parser = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="wheels, the data slice and the manifest into --out")
    build.add_argument("--out", type=Path, default=BUNDLE_DIR)
    build.add_argument("--python-version", default=DEVICE_PYTHON)
    build.add_argument("--datasets", type=Path, default=None, help="the folder holding cifar10/ (default: as tests do)")
    show = commands.add_parser("carried", help="print what would travel, name==version a line")
    show.add_argument("--all", action="store_true", help="the whole runtime closure instead")
    args = parser.parse_args(argv)
    try:
        if args.command == "carried":
            closure = runtime_closure()
            chosen = closure if args.all else carried(closure, device_packages())
            print("\n".join(f"{name}=={version}" for name, version in chosen.items()))
            return 0
        manifest = build_bundle(args.out, args.python_version, args.datasets)
    except BenchmarkError as err:
        print(f"gpu-bundle: {err}", file=sys.stderr)
        return 2
    total = manifest["bytes"]
    print(
        f"gpu-bundle: {len(manifest['wheels'])} wheels ({total['wheels'] / 2**20:.1f} MiB packed), the CIFAR-10 slice "
        f"({total['datasets'] / 2**20:.1f} MiB), the tree ({total['tree'] / 2**20:.1f} MiB): "
        f"{total['total'] / 2**20:.1f} of {total['limit'] / 2**20:.0f} MiB; in {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
