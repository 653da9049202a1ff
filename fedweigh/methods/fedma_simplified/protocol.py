"""The FedNolowe authors' simplified matching: its options table ``[fedma-simplified]``."""

from __future__ import annotations

from fedweigh.options import OptionsTable


class FedMASimplifiedSettings(OptionsTable):
    """``[fedma-simplified]``: the FedNolowe authors' simplified matching (:mod:`.server`)."""

    skip_layers: str = ""  # comma-separated layers averaged without matching; "fc3": lenet5's output, as the authors


OPTIONS = {"fedma-simplified": FedMASimplifiedSettings}
