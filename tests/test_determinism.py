"""One run config and seed, one result: every strategy, run twice on CPU, writes the same files.

Everything a run records is meant to follow from its config and seed (client
sampling by partition, client seeds by (seed, round, partition), replies
summed in partition order): so two runs must give the same ``metrics.jsonl``
and ``summary.json`` once the wall-time fields are dropped
(:func:`fedweigh.results.without_timing`; the summary's ``run_dir`` differs
by construction), and the same ``model.pt``, byte for byte. The two runs get
different node ids, as two runs on a SuperLink do. They go through the real
ServerApp and ClientApp in this process (``loopback``); the first run of each
strategy is the uninterrupted run ``test_resume.py`` resumes against. Two real
``flwr run`` simulations of one config are compared in ``test_simulation.py``.
"""

from __future__ import annotations

import json

import pytest
from conftest import QUICK_RUN, STRATEGY_OPTIONS

from fedweigh.methods.registry import METHODS
from fedweigh.results import MODEL_FILE, SUMMARY_FILE, read_metrics, without_timing

pytestmark = pytest.mark.xdist_group("in-process-runs")  # with test_resume.py: the first runs are shared


def comparable(folder) -> tuple[str, str]:
    """``metrics.jsonl`` and ``summary.json`` without wall times (and the summary without its folder)."""
    rows = read_metrics(folder)
    summary = without_timing(json.loads((folder / SUMMARY_FILE).read_text()))
    summary.pop("run_dir")
    return json.dumps(without_timing(rows)), json.dumps(summary)


@pytest.mark.parametrize("strategy", sorted(METHODS))
def test_the_same_config_and_seed_give_the_same_files(in_process_runs, strategy):
    config = {**QUICK_RUN, "strategy": strategy, **STRATEGY_OPTIONS.get(strategy, {})}
    first = in_process_runs(strategy, config)
    second = in_process_runs(f"{strategy}-again", config, node_seed=1)
    assert comparable(second) == comparable(first)
    assert (second / MODEL_FILE).read_bytes() == (first / MODEL_FILE).read_bytes()
    rows = read_metrics(first)
    assert [row["round"] for row in rows] == [1, 2, 3] and all(row["aggregated"] for row in rows)
