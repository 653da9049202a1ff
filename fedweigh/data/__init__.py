"""The data layer: sources, partitioning, decoded tensors, batches and transforms.

One concept per module:

* :mod:`~fedweigh.data.sources`: the ``dataset`` setting, resolved and loaded;
* :mod:`~fedweigh.data.files`: a local folder's split files, read and checked;
* :mod:`~fedweigh.data.description`: what a dataset is (classes, channels, size, statistics);
* :mod:`~fedweigh.data.partitioning`: the ``partitioner`` setting;
* :mod:`~fedweigh.data.tensors`: images decoded once into ``uint8`` tensors;
* :mod:`~fedweigh.data.transforms`: batch-level augmentation and normalisation;
* :mod:`~fedweigh.data.loader`: mini-batches with local sample indices;
* :mod:`~fedweigh.data.federated`: the cached entry points used by the apps.
"""
