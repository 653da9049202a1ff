"""The FedNolowe authors' code's 'FedMa' (not FedMA): rows matched to one client's, then the uniform mean."""
