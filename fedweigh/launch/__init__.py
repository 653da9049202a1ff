"""Launching simulations on a local SuperLink: one module per job.

* :mod:`~fedweigh.launch.runconfig`: run-config values, the app's defaults, run names;
* :mod:`~fedweigh.launch.connection`: Flower's connection file;
* :mod:`~fedweigh.launch.commands`: the Flower command lines and what they print;
* :mod:`~fedweigh.launch.processes`: process trees, ports, clean shutdown;
* :mod:`~fedweigh.launch.ray`: Ray nodes and the shared local cluster;
* :mod:`~fedweigh.launch.superlink`: a local simulation SuperLink;
* :mod:`~fedweigh.launch.simulation`: runs submitted to it.

The command line that uses them is :mod:`fedweigh.cli`.
"""
