"""quickstart-fedweigh: Flower's PyTorch quickstart with the fedweigh methods."""
