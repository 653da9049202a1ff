"""FedAsl, the FedNolowe paper's baseline: weights from the distance of each loss to the round's median."""
