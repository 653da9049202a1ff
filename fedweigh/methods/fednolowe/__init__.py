"""FedNolowe: normalised-loss weights from each client's training loss (no client step)."""
