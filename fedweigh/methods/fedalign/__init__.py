"""FedAlign, the FedOUI paper's baseline: weights from the alignment of each update with the mean update."""
