"""SCAFFOLD: local steps corrected by control variates (Karimireddy et al., arXiv 1910.06378)."""
