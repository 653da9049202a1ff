"""Flower's ``flwr`` CLI, with an app walk that does not enter the directories the app leaves out.

``flwr run <app>`` builds the app's FAB from disk on every run: Flower 1.41
(``flwr.cli.utils.collect_files``) walks the whole app directory, resolving
every file, and only then drops what the FAB leaves out (Flower's own
exclusions ``.venv/``, ``.flwr/``, ``__pycache__/``, and what the app's
``.gitignore`` ignores). With a virtual environment inside the project, as
the README sets it up, that is some 65,000 files walked for about 200 kept:
4-5 s of every ``flwr run`` on a 2-core machine (``docs/benchmarks.md``,
section 1).

:func:`collect_app_files` is Flower's walk that skips such a directory
instead of entering it. The FAB is the same file for file (a test builds
it both ways): a directory is skipped only when Flower's exclusions or the
``.gitignore`` would drop everything below it, and not at all when the
``.gitignore`` re-includes anything (a ``!`` pattern). fedweigh starts
``flwr run`` as ``python -m fedweigh.launch.flwr_cli run ...``
(:data:`FLWR_CLI`); under a Flower version other than :data:`SUPPORTED_FLOWER`
this module changes nothing and runs Flower's CLI as it is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import flwr
import flwr.cli.build
from flwr.cli.utils import build_pathspec, load_gitignore_patterns
from flwr.supercore.constant import APP_PUBLISH_EXCLUDE_PATTERNS
from pathspec import PathSpec

__all__ = ["FLWR_CLI", "SUPPORTED_FLOWER", "collect_app_files", "main"]

SUPPORTED_FLOWER = "1.41."
"""The Flower versions whose ``collect_files`` this module was checked against (tests/test_flwr_cli.py)."""

FLWR_CLI = (sys.executable, "-m", "fedweigh.launch.flwr_cli")
"""The command that stands for ``flwr``."""


def _skipped_directories(root: Path) -> PathSpec | None:
    """What decides that a directory (its path relative to ``root``, ending in ``/``) holds nothing to keep."""
    gitignore = load_gitignore_patterns(root / ".gitignore")
    if any(pattern.lstrip().startswith("!") for pattern in gitignore):
        return None  # something below an ignored directory may be re-included: walk everything
    return build_pathspec([*APP_PUBLISH_EXCLUDE_PATTERNS, *gitignore])


def collect_app_files(root: Path) -> dict[str, Path]:
    """Flower's ``collect_files(root)``, without entering directories whose files would all be dropped.

    Like Flower's: symlinks are skipped, paths resolving outside ``root``
    are left out, keys are POSIX paths relative to ``root``.
    """
    skip = _skipped_directories(root)
    resolved_root = root.resolve()
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        relative_dir = Path(dirpath).relative_to(root)
        if skip is not None:
            dirnames[:] = [d for d in dirnames if not skip.match_file(f"{(relative_dir / d).as_posix()}/")]
        for filename in filenames:
            path = Path(dirpath) / filename
            if path.is_symlink() or not path.resolve().is_relative_to(resolved_root):
                continue
            files[path.relative_to(root).as_posix()] = path
    return files


def main(argv: list[str]) -> None:
    """Run Flower's CLI with ``argv`` (as ``flwr`` would), on a supported Flower with :func:`collect_app_files`."""
    from flwr.cli.app import app

    if flwr.__version__.startswith(SUPPORTED_FLOWER):
        flwr.cli.build.collect_files = collect_app_files  # build_fab_from_disk looks the name up here
    app(args=argv, prog_name="flwr")


if __name__ == "__main__":
    main(sys.argv[1:])
