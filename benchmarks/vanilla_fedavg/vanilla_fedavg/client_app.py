"""A plain ClientApp: train the received model on the node's partition and send it back."""

from __future__ import annotations

import time

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from vanilla_fedavg.task import load_partition, new_model, train

app = ClientApp()


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    config = context.run_config
    partition = int(context.node_config["partition-id"])
    data = load_partition(
        str(config["dataset"]),
        partition,
        int(context.node_config["num-partitions"]),
        int(config["train-subset"]),
        int(config["seed"]),
    )
    model = new_model(int(config["seed"]))
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    started = time.perf_counter()
    loss = train(
        model,
        data,
        int(config["local-epochs"]),
        int(config["batch-size"]),
        float(config["learning-rate"]),
        float(config["momentum"]),
        int(config["seed"]) * 1000 + partition,
    )
    metrics = {
        "train_loss": loss,
        "num-examples": len(data[1]),
        "train-seconds": time.perf_counter() - started,
    }
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)
