"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks"): FedAvg with a proximal term."""
