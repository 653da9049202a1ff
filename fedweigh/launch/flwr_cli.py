"""Flower's ``flwr`` CLI as fedweigh starts it: with :mod:`fedweigh.flower.walk`'s app walk installed.

fedweigh starts ``flwr run`` as ``python -m fedweigh.launch.flwr_cli run ...``
(:data:`FLWR_CLI`), so that building the app's FAB does not walk the
project's virtual environment (see :mod:`fedweigh.flower.walk`); under a
Flower version the walk was not checked against it runs Flower's CLI as it is.
"""

from __future__ import annotations

import sys

from fedweigh.flower import walk

__all__ = ["FLWR_CLI", "main"]

FLWR_CLI = (sys.executable, "-m", "fedweigh.launch.flwr_cli")
"""The command that stands for ``flwr``."""


def main(argv: list[str]) -> None:
    """Run Flower's CLI with ``argv`` (as ``flwr`` would), with :func:`fedweigh.flower.walk.install` first."""
    from flwr.cli.app import app

    walk.install()
    app(args=argv, prog_name="flwr")


if __name__ == "__main__":
    main(sys.argv[1:])
