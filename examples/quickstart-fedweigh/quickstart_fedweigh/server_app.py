"""The ServerApp: Flower's FedAvg, or a fedweigh strategy, chosen by the run config's ``method``."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Strategy

from fedweigh.strategies import UFL, FedNolowe, FedOUI, FLood
from quickstart_fedweigh.task import Net, load_centralized_test, test

app = ServerApp()

METHODS = ("fedavg", "fedoui", "fednolowe", "ufl", "flood")


def make_strategy(method: str, fraction_train: float, num_rounds: int) -> Strategy:
    """The strategy ``method`` names; FLood's λ(t) grows over the run's rounds."""
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
    raise ValueError(f"method = {method!r}; accepted: {', '.join(METHODS)}")


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train for ``num-server-rounds`` with the chosen method, evaluating the global model on the test split."""
    run = context.run_config
    num_rounds = int(run["num-server-rounds"])
    strategy = make_strategy(str(run["method"]), float(run["fraction-train"]), num_rounds)
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
