"""FedNova: client updates normalised by their local steps (Wang et al., arXiv 2007.07481)."""
