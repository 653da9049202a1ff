"""A server update's input, built by hand for the tests of the methods' updates."""

from __future__ import annotations

import numpy as np

from fedweigh.strategies.updates import RoundUpdate


def round_of(
    server_round, global_model, models, weights=None, num_examples=None, model_rounds=None, start_models=None, **extra
):
    """A :class:`RoundUpdate` of ``models`` (uniform weights and 10 examples each unless given)."""
    count = len(models)
    return RoundUpdate(
        server_round=server_round,
        global_model=global_model,
        models=models,
        model_rounds=model_rounds or [server_round] * count,
        weights=np.asarray(weights if weights is not None else [1.0 / count] * count, dtype=np.float64),
        num_examples=np.asarray(num_examples or [10] * count, dtype=np.float64),
        start_models=start_models or {},
        **extra,
    )
