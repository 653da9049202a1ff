"""Robust aggregation (off by default): the update-norm bound and the coordinate-wise trimmed mean."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from loopback import run_in_process

from fedweigh.preflight import check_run
from fedweigh.results import read_metrics
from fedweigh.strategies.averaging import weighted_average
from fedweigh.strategies.robust import bound_update_norms, trimmed_weighted_mean, update_norms
from fedweigh.strategies.updates import RoundUpdate, WeightedMean

FUZZ = settings(derandomize=True, deadline=None, database=None, max_examples=150)
finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)


def models_of(values: np.ndarray) -> list[dict[str, np.ndarray]]:
    return [{"w": row.astype(np.float32), "n": np.array(3, dtype=np.int64)} for row in values]


@st.composite
def rounds(draw, min_clients: int = 1):
    n = draw(st.integers(min_clients, 9))
    dim = draw(st.integers(1, 6))
    values = draw(hnp.arrays(np.float64, (n, dim), elements=finite))
    start = draw(hnp.arrays(np.float64, (dim,), elements=finite))
    raw = draw(hnp.arrays(np.float64, (n,), elements=st.floats(0.01, 1.0)))
    return values, start, raw / raw.sum()


# -- the update-norm bound ---------------------------------------------------------------------------------


@given(rounds(), st.floats(0.1, 5.0))
@FUZZ
def test_no_update_ends_longer_than_the_bound_and_those_within_it_are_untouched(case, bound):
    values, start, _ = case
    models, starts = models_of(values), [{"w": start.astype(np.float32), "n": np.array(0)}] * len(values)
    bounded, norms, factors = bound_update_norms(models, starts, bound)
    cap = bound * np.median(norms)
    after = update_norms(bounded, starts)
    assert np.all(after <= cap * (1 + 1e-5) + 1e-5)
    for model, out, factor in zip(models, bounded, factors, strict=True):
        if factor == 1.0:
            assert out is model  # bit for bit
        assert out["w"].dtype == np.float32 and out["n"] == 3  # dtypes kept, integer buffers untouched
    assert np.all((factors >= 0) & (factors <= 1.0))  # 0 when the median update is 0


def test_a_scaled_update_keeps_its_direction_and_loses_its_magnitude():
    start = {"w": np.array([1.0, 1.0], np.float32)}
    healthy = [{"w": np.array([2.0, 1.0], np.float32)}, {"w": np.array([1.0, 3.0], np.float32)}]
    poisoned = {"w": np.array([1e6, 2e6], np.float32)}
    bounded, norms, factors = bound_update_norms([*healthy, poisoned], [start] * 3, bound=1.0)
    assert norms[:2].tolist() == [1.0, 2.0] and factors[:2].tolist() == [1.0, 1.0]
    delta = bounded[2]["w"] - start["w"]
    assert np.linalg.norm(delta) == pytest.approx(2.0, rel=1e-5)  # the median of (1, 2, ~2.2e6)
    assert delta / np.linalg.norm(delta) == pytest.approx(np.array([1e6 - 1, 2e6 - 1]) / np.hypot(1e6 - 1, 2e6 - 1))


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError, match="update-norm-bound = 0"):
        bound_update_norms([], [], 0)


# -- the trimmed mean --------------------------------------------------------------------------------------


@given(rounds())
@FUZZ
def test_nothing_to_trim_is_the_weighted_mean_bit_for_bit(case):
    values, _, weights = case
    models = models_of(values)
    fraction = 0.99 / (2 * len(models))  # floor(fraction * n) == 0
    trimmed = trimmed_weighted_mean(models, weights, fraction)
    plain = weighted_average(models, weights)
    assert all(np.array_equal(trimmed[k], plain[k]) for k in plain)


@given(rounds(min_clients=3), st.integers(0, 1_000), st.floats(1e4, 1e7))
@FUZZ
def test_one_outlier_moves_a_trimmed_mean_no_further_than_the_honest_values_reach(case, which, magnitude):
    values, _, weights = case
    n = len(values)
    outlier = which % n
    values[outlier] = magnitude * np.sign(values[outlier] + 0.5)
    trimmed = trimmed_weighted_mean(models_of(values), weights, fraction=1.0 / n)
    honest = np.delete(values, outlier, axis=0).astype(np.float32)
    assert np.all(trimmed["w"] >= honest.min(axis=0) - 1e-3) and np.all(trimmed["w"] <= honest.max(axis=0) + 1e-3)
    assert trimmed["n"] == 3


def test_trimmed_mean_of_a_worked_example():
    values = np.array([[1.0], [2.0], [3.0], [100.0]])
    weights = np.array([0.1, 0.2, 0.3, 0.4])
    out = trimmed_weighted_mean(models_of(values), weights, fraction=0.25)  # drops 1.0 and 100.0
    assert out["w"][0] == pytest.approx((0.2 * 2 + 0.3 * 3) / 0.5)


def test_the_mean_update_uses_the_trimmed_mean_when_asked():
    models = models_of(np.array([[0.0], [1.0], [2.0], [1e6]]))
    update = RoundUpdate(
        server_round=1,
        global_model=models[0],
        models=models,
        model_rounds=[1] * 4,
        weights=np.full(4, 0.25),
        num_examples=np.ones(4),
    )
    assert WeightedMean()(update)["w"][0] == pytest.approx(250000.75)
    assert WeightedMean(trim=0.25)(update)["w"][0] == pytest.approx(1.5)


def test_trimmed_mean_is_refused_where_the_strategy_does_not_average():
    with pytest.raises(ValueError, match=r"trimmed-mean = 0.2 replaces the weighted mean, but strategy = 'fedasync'"):
        check_run({"strategy": "fedasync", "trimmed-mean": 0.2})


# -- end to end: a scaled client poisons the mean unless bounded ------------------------------------------

POISONED = {
    "strategy": "fedoui",
    "num-server-rounds": 3,
    "fraction-train": 1.0,
    "local-epochs": 1,
    "seed": 5,
    "faults.kinds": "scaled",
    "faults.fraction": 0.25,
}


@pytest.mark.parametrize(
    ("defence", "survives"),
    [({}, False), ({"update-norm-bound": 1.0}, True), ({"trimmed-mean": 0.25}, True)],
    ids=["none", "norm-bound", "trimmed-mean"],
)
def test_a_scaled_client_poisons_the_global_model_unless_a_defence_is_on(tmp_path, defence, survives):
    clean = read_metrics(
        run_in_process(
            {**POISONED, "faults.kinds": "", "faults.fraction": 0.0, "output-dir": str(tmp_path), "run-name": "clean"},
            num_nodes=8,
        )
    )
    rows = read_metrics(run_in_process({**POISONED, **defence, "output-dir": str(tmp_path), "run-name": "x"}, 8))
    assert all(len(row["faults"]) == 2 and row["aggregated"] for row in rows)
    final, reference = rows[-1]["accuracy"], clean[-1]["accuracy"]
    if survives:
        assert final > reference - 0.15 and rows[-1]["loss"] < 10
    else:
        assert rows[-1]["loss"] > 1e3  # a model scaled by 1e6 in the mean: its logits explode
    if "update-norm-bound" in defence:
        assert all(row["diagnostics"]["updates-bounded"] >= 2 for row in rows)
        scaled = {p for row in rows for p in row["faults"]}
        factors = [c["norm-factor"] for row in rows for c in row["clients"] if str(c["partition"]) in row["faults"]]
        assert scaled and factors and max(factors) < 1e-4
