"""fedweigh.flower.walk, as fedweigh.launch.flwr_cli installs it: Flower's CLI builds the same FAB without walking
what the app leaves out."""

from __future__ import annotations

import io
import subprocess
import zipfile
from pathlib import Path

import flwr
import pytest
from conftest import REPO
from flwr.cli.build import build_fab_from_files
from flwr.cli.utils import collect_files

from fedweigh.flower import SUPPORTED_FLOWER
from fedweigh.flower.walk import collect_app_files
from fedweigh.launch.flwr_cli import FLWR_CLI


def test_flower_is_the_version_the_walk_was_checked_against():
    """On a Flower upgrade: check flwr.cli.utils.collect_files and the FAB rules against collect_app_files."""
    assert flwr.__version__.startswith(SUPPORTED_FLOWER), flwr.__version__


def _fab_members(files: dict[str, Path]) -> dict[str, bytes]:
    fab, _ = build_fab_from_files(files)
    with zipfile.ZipFile(io.BytesIO(fab)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_this_project_builds_the_same_fab_without_entering_its_virtual_environment():
    walked, flower = collect_app_files(REPO), collect_files(REPO)
    assert set(walked) <= set(flower)
    assert _fab_members(walked) == _fab_members(flower)  # every member, byte for byte
    if (REPO / ".venv").is_dir():
        assert not any(name.startswith(".venv/") for name in walked)


def _app(root: Path, gitignore: str) -> Path:
    (root / "pyproject.toml").write_text(
        '[project]\nname = "tiny"\nversion = "1.0.0"\ndependencies = []\n'
        '[tool.flwr.app]\npublisher = "me"\n[tool.flwr.app.components]\nserverapp = "a:b"\nclientapp = "a:c"\n'
        "[tool.flwr.app.config]\n"
    )
    (root / ".gitignore").write_text(gitignore)
    for name in ("a.py", "build/keep.py", "build/drop.py", ".venv/lib/x.py", "pkg/__pycache__/m.py", "pkg/m.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("b = c = 1\n")  # a.py holds the components pyproject.toml names
    return root


@pytest.mark.parametrize(
    ("gitignore", "kept"),
    [
        ("build/\n", {"a.py", "pkg/m.py"}),
        ("build/\n!build/keep.py\n", None),  # a re-include: everything is walked, Flower decides
    ],
)
def test_an_ignored_directory_is_skipped_unless_something_in_it_may_be_included_again(tmp_path, gitignore, kept):
    app = _app(tmp_path, gitignore)
    walked = collect_app_files(app)
    assert _fab_members(walked) == _fab_members(collect_files(app))
    if kept is None:
        assert set(walked) == set(collect_files(app))
    else:
        assert {name for name in walked if name.endswith(".py")} == kept


def test_flwr_cli_is_flower_s_cli_and_builds_the_fab_flower_would(tmp_path):
    # `flwr build` takes the app's name from its folder, which must be a valid app name (not a clone's tmp.* folder)
    app = tmp_path / "tinyapp"
    app.mkdir()
    _app(app, "build/\n")
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [*FLWR_CLI, "build", "--app", str(app)], cwd=out, capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (fab,) = out.glob("*.fab")
    with zipfile.ZipFile(fab) as archive:
        built = {name: archive.read(name) for name in archive.namelist()}
    assert built == _fab_members(collect_files(app))
    assert "a.py" in built and "build/drop.py" not in built and ".venv/lib/x.py" not in built
