"""The ServerApp: Flower's FedAvg, or a fedweigh strategy, chosen by the run config's ``method``."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Strategy

from fedweigh.strategies import UFL, Feddle, FedNolowe, FedOUI, FLood
from quickstart_fedweigh.task import Net, load_centralized_test, load_server_images, preprocess, test

app = ServerApp()

METHODS = ("fedavg", "fedoui", "fednolowe", "ufl", "flood", "feddle")


def make_strategy(method: str, fraction_train: float, num_rounds: int, dataset: str, server_images: int) -> Strategy:
    """The strategy ``method`` names; FLood's λ(t) grows over the run's rounds; Feddle searches on server data."""
    if method == "fedavg":
        return FedAvg(fraction_train=fraction_train, fraction_evaluate=0.0)
    if method == "fedoui":
        return FedOUI(fraction_train=fraction_train, fraction_evaluate=0.0)
    if method == "fednolowe":
        return FedNolowe(fraction_train=fraction_train, fraction_evaluate=0.0)
    if method == "ufl":
        return UFL(fraction_train=fraction_train, fraction_evaluate=0.0)
    if method == "flood":
        return FLood(fraction_train=fraction_train, fraction_evaluate=0.0, halt_round=num_rounds)
    if method == "feddle":
        images, labels = load_server_images(dataset, server_images)
        return Feddle(
            model=Net(),
            server_images=images,
            server_labels=labels,
            preprocess=preprocess,
            fraction_train=fraction_train,
            fraction_evaluate=0.0,
        )
    raise ValueError(f"method = {method!r}; accepted: {', '.join(METHODS)}")


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train for ``num-server-rounds`` with the chosen method, evaluating the global model on the test split."""
    run = context.run_config
    num_rounds = int(run["num-server-rounds"])
    strategy = make_strategy(
        str(run["method"]), float(run["fraction-train"]), num_rounds, str(run["dataset"]), int(run["server-images"])
    )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    testloader = load_centralized_test(str(run["dataset"]))

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test(model, testloader, device)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        train_config=ConfigRecord({"lr": float(run["lr"])}),
        num_rounds=num_rounds,
        evaluate_fn=central_evaluate,
    )
    torch.save(result.arrays.to_torch_state_dict(), str(run["model-file"]))
