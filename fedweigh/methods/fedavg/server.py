"""FedAvg's rules (sample counts; the plain mean) and methods; the weighted mean is every method's default update.

>>> SAMPLE_COUNT.build(None).name, UNIFORM.build(None).name
('sample-count', 'uniform')
"""

from __future__ import annotations

from fedweigh.methods.costs import MethodCost, sample_count_weighting, uniform_weighting
from fedweigh.methods.declaration import Declaration, Method, RuleSpec
from fedweigh.rules.base import SampleCountRule, UniformRule
from fedweigh.strategies.updates import WeightedMean

SAMPLE_COUNT = RuleSpec("sample-count", lambda settings: SampleCountRule(), None, "FedAvg: w ∝ n_k")
UNIFORM = RuleSpec("uniform", lambda settings: UniformRule(), None, "w = 1/K")

FEDAVG = Method("fedavg", SAMPLE_COUNT, meaning="FedAvg")

DECLARATION = Declaration(
    methods=(FEDAVG, Method("uniform", UNIFORM, meaning="plain mean of the client models")),
    rules=(SAMPLE_COUNT, UNIFORM),
    updates=(WeightedMean,),
    costs={"fedavg": MethodCost(sample_count_weighting), "uniform": MethodCost(uniform_weighting)},
)
