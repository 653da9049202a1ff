"""Named comparisons: an experiment file in, a grid of real Flower runs, a table and plots out.

* :mod:`fedweigh.experiments.spec`: the experiment file, validated before anything runs;
* :mod:`fedweigh.experiments.grid`: the (arm, seed) runs, what is done, what to resume;
* :mod:`fedweigh.experiments.runner`: runs the grid on one simulation SuperLink, with progress;
* :mod:`fedweigh.experiments.report`: ``results.csv`` and ``summary.md``, built on
  :mod:`fedweigh.experiments.paired` (mean ± std over seeds, paired differences) and
  :mod:`fedweigh.experiments.sampling` (every arm of a seed trained the same clients);
* :mod:`fedweigh.experiments.plots`: accuracy, weights and signal plots.

Command line: ``fedweigh experiment run experiments/smoke_digits.toml`` (see
``docs/experiments.md``).
"""
