"""A vanilla Flower app: Flower's FedAvg and a plain ClientApp (the peer of fedweigh's overhead benchmark)."""
