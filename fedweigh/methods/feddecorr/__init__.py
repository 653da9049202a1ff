"""FedDecorr: a penalty on the correlation of the representation's dimensions (Shi et al., arXiv 2210.00226)."""
