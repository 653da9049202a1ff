"""Benchmarks of fedweigh (not tests): what federation, the methods and scale cost.

``fedweigh benchmark <name|all> [--quick] [--output FILE]`` runs them and
writes a JSON report and a markdown table (see ``docs/benchmarks.md``):

* ``overhead`` (:mod:`.overhead`): a FedAvg simulation against the same
  training done by a bare PyTorch loop in one process;
* ``checkpoint`` (:mod:`.checkpoint`): what each round's checkpoint makes
  the round wait for;
* ``gpu-overhead`` (:mod:`.gpu`): the same on a CUDA GPU, with fractional
  GPUs per ClientApp actor, and the pretrained models' step there;
* ``methods`` (:mod:`.methods`): each strategy's round time against FedAvg's;
* ``scale`` (:mod:`.scale`): 100 against 1,000 virtual clients, 10 per round;
* ``aggregation`` (:mod:`.aggregation`): the strategy base's aggregation
  against Flower's FedAvg aggregation on the same replies;
* ``gpu-evidence`` (:mod:`.gpu_evidence`): what only a GPU settles, in
  order of value per minute under a time budget (a CPU smoke mode with
  ``--quick``).
"""
