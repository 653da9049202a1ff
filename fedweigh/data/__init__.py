"""The data layer: sources, partitioning, decoded tensors, batches and transforms.

One concept per module:

* :mod:`~fedweigh.data.sources`: the ``dataset`` setting, resolved and described;
* :mod:`~fedweigh.data.partitioning`: the ``partitioner`` setting;
* :mod:`~fedweigh.data.tensors`: images decoded once into ``uint8`` tensors;
* :mod:`~fedweigh.data.transforms`: batch-level augmentation and normalisation;
* :mod:`~fedweigh.data.loader`: mini-batches with local sample indices;
* :mod:`~fedweigh.data.federated`: the cached entry points used by the apps.
"""
