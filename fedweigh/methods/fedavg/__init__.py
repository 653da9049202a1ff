"""FedAvg and the plain mean: the sample-count and uniform rules, the weighted mean as the server update."""
