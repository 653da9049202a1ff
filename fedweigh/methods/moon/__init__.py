"""MOON: model-contrastive federated learning (Li, He and Song, arXiv 2103.16257)."""
