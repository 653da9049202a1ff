"""FedMR: federated learning by layer-wise model recombination instead of aggregation (Hu et al., arXiv 2208.07677)."""
