"""The ClientApp: its data warm-up (started by the query, once per process) and the state it keeps."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fedweigh import client_app
from fedweigh.client.training import TrainStats
from fedweigh.client_app import warm_data
from fedweigh.data.federated import _load_partition, clear_caches
from fedweigh.protocol import TrainRecipe


def node_context(partition_id: int, run_config: dict) -> Context:
    return Context(
        run_id=1,
        node_id=100 + partition_id,
        node_config={"partition-id": partition_id, "num-partitions": 4},
        state=RecordDict(),
        run_config=run_config,
    )


def test_the_query_loads_the_data_in_the_background_once_per_process():
    clear_caches()
    run_config = {"dataset": "digits", "partitioner": "iid", "seed": 5}
    thread = warm_data(node_context(2, run_config))
    assert thread is not None
    thread.join(timeout=60)
    assert _load_partition.cache_info().currsize == 1  # partition 2 is decoded and cached
    assert warm_data(node_context(3, run_config)) is None  # same data in this process: nothing more to start
    other = warm_data(node_context(0, {**run_config, "seed": 6}))  # another run's data: loaded too
    assert other is not None
    other.join(timeout=60)
    assert _load_partition.cache_info().currsize == 2
    clear_caches()


def test_a_node_without_a_partition_still_answers_and_loads_nothing():
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={"seed": 9})
    thread = warm_data(context)
    assert thread is not None
    thread.join(timeout=60)  # the failure (no partition) is left to the train message, not raised here


def test_the_client_app_keeps_momentum_in_its_context_state(monkeypatch):
    """persist-optimizer-state (FedNolowe's clients, spec A12).

    The ClientApp stores the buffers in Context.state and hands them to the next round's training.
    """
    seen = []

    def fake_train(model, data, recipe, transform, device, generator, weighting=None, optimizer_state=None, **rest):
        seen.append(optimizer_state)
        buffers = {name: torch.full_like(p, float(len(seen))) for name, p in model.named_parameters()}
        kept = buffers if recipe.persist_optimizer_state else None
        return TrainStats(1.0, len(data), 1, 0.0, 0.0, optimizer_state=kept)

    monkeypatch.setattr(client_app, "train_locally", fake_train)
    context = node_context(0, {"dataset": "digits", "model": "mlp"})
    model = client_app.new_model(client_app.settings_from(context.run_config))
    for server_round in (1, 2):
        config = TrainRecipe(batch_size=8, learning_rate=0.1, persist_optimizer_state=True).to_config()
        config |= {"server-round": server_round}
        message = Message(
            RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": ConfigRecord(config)}),
            dst_node_id=context.node_id,
            message_type="train",
        )
        client_app.train(message, context)
    assert seen[0] is None
    assert all(torch.equal(t, torch.ones_like(t)) for t in seen[1].values())
    assert set(seen[1]) == {name for name, _ in model.named_parameters()}
    assert isinstance(context.state[client_app.OPTIMIZER_STATE], ArrayRecord)


def test_a_process_per_message_loads_nothing_ahead(monkeypatch):
    """Flower's flwr-clientapp exits after its reply: a warm-up there could only be cut off at exit (holding the
    dataset cache's lock, which left the next message's process waiting in the compose stack)."""
    clear_caches()
    monkeypatch.setattr("sys.argv", ["/python/venv/bin/flwr-clientapp", "--runtime-api-address", "supernode-2:9094"])
    assert not client_app.outlives_its_message()
    assert warm_data(node_context(1, {"dataset": "digits", "partitioner": "iid", "seed": 5})) is None
    assert _load_partition.cache_info().currsize == 0
    monkeypatch.setattr("sys.argv", ["/python/venv/bin/fedweigh-superexec"])  # a resident ClientApp stays
    assert client_app.outlives_its_message()
