"""The FedNolowe paper's metrics: weighted F1, top-5 accuracy, the round train loss, the rolling std.

Hand-computed values, scikit-learn's own functions on random labels, and one
in-process run whose metrics.jsonl must hold them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from loopback import run_in_process
from sklearn.metrics import f1_score, top_k_accuracy_score
from torch import nn

from fedweigh.client.training import TOP_K, evaluate, macro_f1, per_class_f1, top_k_correct, weighted_f1
from fedweigh.data.tensors import ImageTensors
from fedweigh.experiments.runs import ROLLING_WINDOW, other_scores, rolling_std, train_loss_scores
from fedweigh.protocol import TRAIN_LOSS
from fedweigh.results import (
    CLIENT_NUM_EXAMPLES,
    TOP5_ACCURACY,
    TRAIN_LOSS_UNWEIGHTED,
    WEIGHTED_F1,
    read_metrics,
    round_train_loss,
)

labels = st.lists(st.integers(0, 6), min_size=1, max_size=60)


# ------------------------------------------------------------------ F1


def test_weighted_f1_by_hand():
    # class 0: TP 1, predicted 1, actual 3 -> F1 1/2; class 1: TP 1, predicted 2, actual 1 -> 2/3;
    # class 2: only predicted -> F1 0, support 0
    predicted, target = torch.tensor([0, 1, 1, 2]), torch.tensor([0, 1, 0, 0])
    scores, support = per_class_f1(predicted, target)
    assert scores.tolist() == pytest.approx([0.5, 2 / 3, 0.0]) and support.tolist() == [3, 1, 0]
    assert weighted_f1(predicted, target) == pytest.approx((3 * 0.5 + 1 * 2 / 3) / 4)
    assert macro_f1(predicted, target) == pytest.approx((0.5 + 2 / 3 + 0.0) / 3)


def test_weighted_f1_differs_from_macro_f1_when_classes_are_unbalanced():
    # a perfect minority class and a poor majority class: weighted F1 follows the majority
    target = torch.tensor([0] * 8 + [1] * 2)
    predicted = torch.tensor([0] * 4 + [2] * 4 + [1] * 2)
    assert weighted_f1(predicted, target) == pytest.approx((8 * (8 / 12) + 2 * 1.0) / 10)
    assert macro_f1(predicted, target) == pytest.approx((8 / 12 + 1.0 + 0.0) / 3)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_f1_scores_are_scikit_learns(data):
    target = data.draw(labels)
    predicted = data.draw(st.lists(st.integers(0, 6), min_size=len(target), max_size=len(target)))
    p, t = torch.tensor(predicted), torch.tensor(target)
    assert weighted_f1(p, t) == pytest.approx(f1_score(target, predicted, average="weighted"), abs=1e-12)
    assert macro_f1(p, t) == pytest.approx(f1_score(target, predicted, average="macro"), abs=1e-12)


# ------------------------------------------------------------------ top-k


def test_top_k_correct_by_hand():
    logits = torch.tensor([[0.1, 0.5, 0.4], [0.7, 0.2, 0.1], [0.25, 0.35, 0.4]])
    assert top_k_correct(logits, torch.tensor([2, 2, 0]), 1) == 0
    assert top_k_correct(logits, torch.tensor([2, 2, 0]), 2) == 1  # sample 0's label is second
    assert top_k_correct(logits, torch.tensor([2, 2, 0]), 3) == 3


@pytest.mark.parametrize("k", [0, 4])
def test_top_k_beyond_the_classes_is_refused(k):
    with pytest.raises(ValueError, match=f"k = {k}; accepted: 1 to the number of classes"):
        top_k_correct(torch.zeros(2, 3), torch.tensor([0, 1]), k)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.permutations(range(10)), min_size=30, max_size=30),  # distinct logits per row: no ties to break
    st.lists(st.integers(0, 9), min_size=30, max_size=30),
)
def test_top_5_accuracy_is_scikit_learns(ranks, target):
    logits = np.array(ranks, dtype=np.float64) / 3.0
    expected = top_k_accuracy_score(target, logits, k=5, labels=list(range(10)), normalize=False)
    assert top_k_correct(torch.tensor(logits), torch.tensor(target), 5) == expected


class TableModel(nn.Module):
    """Returns the logits of row ``pixel`` of a table: the image's one pixel is its index."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", table)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x[:, 0, 0, 0].long()]


def fixed_logits_evaluation(num_classes: int, count: int = 41):
    generator = torch.Generator().manual_seed(num_classes)
    logits = torch.randn(count, num_classes, generator=generator, dtype=torch.float64).float()
    target = torch.randint(0, num_classes, (count,), generator=generator)
    images = torch.arange(count, dtype=torch.uint8).view(count, 1, 1, 1)
    result = evaluate(
        TableModel(logits), ImageTensors(images, target), lambda x, train, generator: x, torch.device("cpu"), 7
    )
    return result, logits.numpy(), target.numpy()


def test_evaluation_records_weighted_f1_and_top_5_as_scikit_learn_computes_them():
    result, logits, target = fixed_logits_evaluation(10)
    predicted = logits.argmax(axis=1)
    assert result.accuracy == pytest.approx(float(np.mean(predicted == target)))
    assert result.weighted_f1 == pytest.approx(f1_score(target, predicted, average="weighted"), abs=1e-12)
    assert result.macro_f1 == pytest.approx(f1_score(target, predicted, average="macro"), abs=1e-12)
    assert result.top5_accuracy == pytest.approx(top_k_accuracy_score(target, logits, k=5, labels=list(range(10))))
    assert result.accuracy < result.top5_accuracy < 1.0


def test_top_5_accuracy_is_not_defined_below_5_classes():
    assert TOP_K == 5
    result, _, _ = fixed_logits_evaluation(3)
    assert math.isnan(result.top5_accuracy) and not math.isnan(result.weighted_f1)


# ------------------------------------------------------------------ round train loss


def clients(*pairs):
    return [{TRAIN_LOSS: loss, CLIENT_NUM_EXAMPLES: n} for loss, n in pairs]


def test_round_train_loss_weighted_by_sample_count_and_unweighted():
    losses = round_train_loss(clients((0.5, 100), (2.0, 300), (1.0, 600)))
    assert losses[TRAIN_LOSS] == pytest.approx((50 + 600 + 600) / 1000)  # 1.25
    assert losses[TRAIN_LOSS_UNWEIGHTED] == pytest.approx(3.5 / 3)
    assert round_train_loss([]) == {TRAIN_LOSS: None, TRAIN_LOSS_UNWEIGHTED: None}


def test_equal_sample_counts_make_both_train_losses_equal():
    losses = round_train_loss(clients((0.3, 50), (0.9, 50)))
    assert losses[TRAIN_LOSS] == pytest.approx(0.6) == losses[TRAIN_LOSS_UNWEIGHTED]


def test_train_loss_scores_average_the_rounds_that_recorded_one():
    rows = [
        {TRAIN_LOSS: 1.0, TRAIN_LOSS_UNWEIGHTED: 2.0},
        {TRAIN_LOSS: None, TRAIN_LOSS_UNWEIGHTED: None},  # a skipped round
        {TRAIN_LOSS: 0.5, TRAIN_LOSS_UNWEIGHTED: 1.0},
    ]
    assert train_loss_scores(rows) == {"mean_train_loss": 0.75, "mean_train_loss_unweighted": 1.5}
    assert train_loss_scores([{"accuracy": 0.5}]) == {}


# ------------------------------------------------------------------ rolling std


def test_rolling_std_by_hand():
    assert ROLLING_WINDOW == 5  # the FedNolowe paper's window
    # windows [1..5] and [2..6] of 1, 2, 3, 4, 5, 6 both have sample std sqrt(2.5)
    assert rolling_std([1, 2, 3, 4, 5, 6]) == pytest.approx(math.sqrt(2.5))
    # window 3 over 0, 0, 3, 0: stds sqrt(3), sqrt(3) -> sqrt(3)
    assert rolling_std([0, 0, 3, 0], window=3) == pytest.approx(math.sqrt(3))
    assert rolling_std([0.7] * 8) == 0.0
    assert math.isnan(rolling_std([0.1, 0.2, 0.3, 0.4]))


@given(st.lists(st.floats(0, 1), min_size=5, max_size=40), st.integers(2, 6))
def test_rolling_std_is_the_mean_of_the_windows_sample_stds(values, window):
    assume(len(values) >= window)
    expected = np.mean([np.std(values[i : i + window], ddof=1) for i in range(len(values) - window + 1)])
    assert rolling_std(values, window) == pytest.approx(expected, abs=1e-12)
    assert rolling_std([v + 0.25 for v in values], window) == pytest.approx(expected, abs=1e-9)  # blind to level


def test_rolling_std_needs_a_window_of_two():
    with pytest.raises(ValueError, match="window = 1; accepted: 2 or more"):
        rolling_std([0.1, 0.2], window=1)


def test_other_scores_hold_the_papers_metrics():
    rows = [
        {"accuracy": a, "loss": 1.0, "macro_f1": 0.5, WEIGHTED_F1: w, TOP5_ACCURACY: t}
        for a, w, t in [(0.1, 0.2, 0.5), (0.3, 0.4, 0.7), (0.2, 0.3, 0.6), (0.4, 0.5, 0.8), (0.5, 0.6, 0.9)]
    ]
    scores = other_scores(rows)
    assert scores["final_weighted_f1"] == 0.6 and scores["mean_weighted_f1"] == pytest.approx(0.4)
    assert scores["final_top5_accuracy"] == 0.9 and scores["mean_top5_accuracy"] == pytest.approx(0.7)
    assert scores["rolling_std_accuracy"] == pytest.approx(np.std([0.1, 0.3, 0.2, 0.4, 0.5], ddof=1))
    fewer = other_scores(rows[:4])  # fewer evaluations than the window: no rolling std
    assert "rolling_std_accuracy" not in fewer and "mean_weighted_f1" in fewer
    no_top5 = [{k: v for k, v in row.items() if k != TOP5_ACCURACY} for row in rows]  # fewer than 5 classes
    assert "mean_top5_accuracy" not in other_scores(no_top5)


# ------------------------------------------------------------------ recorded by a run


def test_a_run_records_the_papers_metrics_every_round(tmp_path):
    folder = run_in_process(
        {"num-server-rounds": 2, "fraction-train": 0.5, "seed": 3, "output-dir": str(tmp_path), "run-name": "m"}
    )
    for row in read_metrics(folder):
        assert 0.0 <= row[WEIGHTED_F1] <= 1.0 and row["accuracy"] <= row[TOP5_ACCURACY] <= 1.0
        losses = np.array([client[TRAIN_LOSS] for client in row["clients"]])
        sizes = np.array([client[CLIENT_NUM_EXAMPLES] for client in row["clients"]])
        assert row[TRAIN_LOSS] == pytest.approx(float(np.sum(losses * sizes) / sizes.sum()))
        assert row[TRAIN_LOSS_UNWEIGHTED] == pytest.approx(float(losses.mean()))
