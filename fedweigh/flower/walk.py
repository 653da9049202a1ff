"""The ``flwr`` CLI's app walk, without entering the directories the app leaves out.

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
``.gitignore`` re-includes anything (a ``!`` pattern). :func:`install` puts
it in place of Flower's in this process (``fedweigh.launch.flwr_cli`` does,
before it runs Flower's CLI); under another Flower version it changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import supported

__all__ = ["collect_app_files", "install"]


def _skipped_directories(root: Path):
    """What decides that a directory (its path relative to ``root``, ending in ``/``) holds nothing to keep."""
    from flwr.cli.utils import build_pathspec, load_gitignore_patterns
    from flwr.supercore.constant import APP_PUBLISH_EXCLUDE_PATTERNS

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


def install() -> bool:
    """Make the ``flwr`` CLI in this process build FABs with :func:`collect_app_files`; whether it did (only on a
    supported Flower)."""
    if not supported():
        return False
    import flwr.cli.build

    flwr.cli.build.collect_files = collect_app_files  # build_fab_from_disk looks the name up there
    return True
