"""Every server update, by the name a method gives (:attr:`fedweigh.methods.Method.update`).

>>> sorted(UPDATES)
['center', 'fedasync', 'fedbuff', 'feddle', 'fedft', 'fedma-simplified', 'mean']
"""

from __future__ import annotations

from fedweigh.strategies.fedbuff import BufferedStep
from fedweigh.strategies.feddle import FeddleUpdate
from fedweigh.strategies.fedma import FedMASimplified
from fedweigh.strategies.server_training import Center, FineTunedMean
from fedweigh.strategies.updates import AsyncMixing, ServerUpdate, WeightedMean

UPDATES: dict[str, type[ServerUpdate]] = {
    update.name: update
    for update in (
        WeightedMean,
        AsyncMixing,
        FeddleUpdate,
        BufferedStep,
        Center,
        FineTunedMean,
        FedMASimplified,
    )
}
