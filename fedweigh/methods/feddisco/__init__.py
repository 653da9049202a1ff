"""FedDisco: aggregation weights from data size and label-distribution discrepancy (Ye et al., arXiv 2305.19229)."""
