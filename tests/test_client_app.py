"""The ClientApp's data warm-up: the query starts loading the node's data, once per process."""

from __future__ import annotations

from flwr.app import Context, RecordDict

from fedweigh.client_app import warm_data
from fedweigh.data.federated import _load_partition, clear_caches


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
