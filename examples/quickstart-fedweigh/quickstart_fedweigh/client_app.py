"""The ClientApp: Flower's quickstart training, plus what the server's strategy asks for."""

from __future__ import annotations

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedweigh.client import (
    Instruction,
    asw_sample_weights,
    ood_score_signal,
    oui_signal,
    train_reply,
    ufl_weights,
    weighted_loss,
)
from quickstart_fedweigh.task import Net, inputs_in_order, load_data, test
from quickstart_fedweigh.task import train as train_loop

app = ClientApp()

OUI_LAYER = "fc2"
"""The penultimate layer, whose pre-activations FedOUI's OUI measures."""
CLASSIFIER = "fc3"
"""The last layer, before which UFL puts its dropout (this CNN has none)."""


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train on the local partition; measure what the strategy's instruction asks for."""
    instruction = Instruction.of(msg)
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    partition_id, num_partitions = context.node_config["partition-id"], context.node_config["num-partitions"]
    run = context.run_config
    trainloader, _ = load_data(str(run["dataset"]), int(partition_id), int(num_partitions), int(run["batch-size"]))
    signals: dict[str, float] = {}
    inputs, labels = None, None
    if instruction.asks("ufl") or instruction.asks("ood-score") or instruction.asks("oui"):
        inputs, labels = inputs_in_order(trainloader)
        inputs, labels = inputs.to(device), labels.to(device)

    sample_weights = None
    if instruction.asks("ufl"):  # UFL, before training: the most uncertain samples weigh more
        options = instruction.ufl
        sample_weights, measured = ufl_weights(
            model,
            inputs,
            labels,
            passes=options.mc_passes,
            ratio=options.ratio,
            alpha=options.alpha,
            dropout=options.dropout,
            classifier=CLASSIFIER,
            seed=instruction.server_round,
        )
        signals.update(measured)

    def loss_fn(logits: torch.Tensor, batch_labels: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        weights = None if sample_weights is None else sample_weights[indices.to(sample_weights.device)]
        if instruction.asks("asw"):  # FLood's ASW: the batch's pseudo-OOD samples weigh λ(t)
            flood = instruction.flood
            asw = asw_sample_weights(logits, instruction.asw_lambda, q=flood.q, temperature=flood.temperature)
            weights = asw if weights is None else weights * asw
        return weighted_loss(logits, batch_labels, weights)

    lr = float(msg.content["config"]["lr"])
    train_loss = train_loop(model, trainloader, int(run["local-epochs"]), lr, device, loss_fn)

    if instruction.asks("oui"):  # FedOUI, after training: the OUI on a fixed probe batch
        signals.update(oui_signal(model, inputs[: instruction.oui.probe_size], layer=OUI_LAYER))
    if instruction.asks("ood-score"):  # FLood's DAC: the trained model's mean energy score
        signals.update(ood_score_signal(model, inputs, temperature=instruction.flood.temperature))
    return train_reply(msg, model, num_examples=len(trainloader.dataset), train_loss=train_loss, signals=signals)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the global model on the local test part."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    partition_id, num_partitions = context.node_config["partition-id"], context.node_config["num-partitions"]
    run = context.run_config
    _, testloader = load_data(str(run["dataset"]), int(partition_id), int(num_partitions), int(run["batch-size"]))
    loss, accuracy = test(model, testloader, device)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(testloader.dataset)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
