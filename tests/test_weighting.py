"""Weighting rules: spec vectors, edge cases and invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedweigh.methods.catalog import SIGNALS
from fedweigh.rules.base import (
    ComplementShareRule,
    RoundSignals,
    SampleCountRule,
    UniformRule,
    complement_share_weights,
    normalized,
    sample_count_weights,
    uniform_weights,
)

positive_values = st.lists(st.floats(min_value=1e-6, max_value=1e6, allow_nan=False), min_size=1, max_size=30)


def test_sample_count_is_fedavg():
    np.testing.assert_allclose(sample_count_weights(np.array([10, 30, 60])), [0.1, 0.3, 0.6])


def test_uniform():
    np.testing.assert_allclose(uniform_weights(4), [0.25] * 4)


def test_normalized_all_zero_is_uniform_and_rejects_negative():
    np.testing.assert_allclose(normalized(np.zeros(3)), [1 / 3] * 3)
    with pytest.raises(ValueError, match=">= 0"):
        normalized(np.array([1.0, -1.0]))


def test_complement_share_spec_vector():
    # fednolowe spec §4.2: losses [0.1..0.5] give [0.2333, 0.2167, 0.2, 0.1833, 0.1667]
    weights = complement_share_weights(np.array([0.1, 0.2, 0.3, 0.4, 0.5]))
    np.testing.assert_allclose(weights, [0.23333, 0.21667, 0.2, 0.18333, 0.16667], atol=1e-5)


def test_complement_share_two_clients_is_inverse_loss():
    weights = complement_share_weights(np.array([1.0, 3.0]))
    np.testing.assert_allclose(weights, [0.75, 0.25])


def test_complement_share_edge_cases():
    np.testing.assert_allclose(complement_share_weights(np.array([7.0])), [1.0])
    np.testing.assert_allclose(complement_share_weights(np.zeros(4)), [0.25] * 4)
    np.testing.assert_allclose(complement_share_weights(np.array([5.0, 0.0, 0.0])), [0.0, 0.5, 0.5])
    for bad in ([1.0, np.nan], [1.0, np.inf], [1.0, -0.5]):
        with pytest.raises(ValueError):
            complement_share_weights(np.array(bad))


@settings(max_examples=200, deadline=None)
@given(positive_values)
def test_complement_share_invariants(values):
    values = np.array(values)
    weights = complement_share_weights(values)
    assert np.all(np.isfinite(weights)) and np.all(weights >= 0)
    assert abs(weights.sum() - 1) < 1e-9
    if len(values) > 1:
        assert np.all(weights <= 1 / (len(values) - 1) + 1e-12)
    np.testing.assert_allclose(complement_share_weights(values * 3.7), weights, atol=1e-12)
    order = np.random.default_rng(0).permutation(len(values))
    np.testing.assert_allclose(complement_share_weights(values[order]), weights[order], atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=10_000), min_size=1, max_size=30))
def test_rules_sum_to_one_and_follow_permutations(counts):
    counts = np.array(counts, dtype=float)
    signals = RoundSignals(counts, {"train_loss": counts / counts.max()})
    order = np.random.default_rng(1).permutation(len(counts))
    permuted = RoundSignals(counts[order], {"train_loss": signals.values["train_loss"][order]})
    for rule in (SampleCountRule(), UniformRule(), ComplementShareRule("train_loss")):
        weights = rule(signals).weights
        assert abs(weights.sum() - 1) < 1e-9 and np.all(weights >= 0)
        np.testing.assert_allclose(rule(permuted).weights, weights[order], atol=1e-12)


def test_complement_share_rule_declares_its_signal():
    rule = ComplementShareRule("uncertainty")
    assert rule.signals == ("uncertainty",)
    check = SIGNALS["uncertainty"].check  # the protocol says which values are valid
    assert check(1.0) and not check(float("nan")) and not check(-1.0)
