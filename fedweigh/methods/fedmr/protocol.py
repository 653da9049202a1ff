"""FedMR's part of the protocol: its options table ``[fedmr]`` (the server's; nothing reaches the client)."""

from __future__ import annotations

from pydantic import Field

from fedweigh.options import OptionsTable


class FedMRSettings(OptionsTable):
    """``[fedmr]``: rounds of the first stage, in which every client is sent the mean model (see :mod:`.server`).

    0 (recombination from the first round) is the authors' default (``--first_stage_bound``); their README
    suggests 50 or 100 for VGG. FLood's Table I gives FedMR no hyperparameter.
    """

    first_stage_rounds: int = Field(0, ge=0)


OPTIONS = {"fedmr": FedMRSettings}
