"""Feddle: model-atlas merging searched on server-held data; Center and Fed+FT, its baselines on that data."""
