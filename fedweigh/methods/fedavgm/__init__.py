"""FedAvgM: FedAvg's update taken with server momentum (Hsu et al., arXiv 1909.06335)."""
