"""Paired differences against a reference arm, and the tail of u of the final model (UFL spec §11)."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_experiments import DEFAULTS, experiment_table, failure, planned, write_run

from fedweigh.cli import main
from fedweigh.data.tensors import ImageTensors
from fedweigh.experiments.paired import paired_difference
from fedweigh.experiments.report import write_report
from fedweigh.experiments.runs import (
    CLIENTS_UNRECORDED,
    NO_CLIENTS,
    ClientSequence,
    Collapse,
    final_u_tail,
    recorded_clients,
)
from fedweigh.experiments.sampling import SamplingMismatchError
from fedweigh.experiments.spec import ExperimentError, load_experiment
from fedweigh.methods.ufl.client import model_uncertainty, u_tail
from fedweigh.methods.ufl.protocol import UFLSettings
from fedweigh.models.mlp import DigitsMLP
from fedweigh.preflight import check_run
from fedweigh.results import FINAL_U_ABOVE_1, FINAL_U_P95, SUMMARY_FILE
from fedweigh.settings import SettingsError

# ------------------------------------------------------------------ paired differences


def test_paired_difference_by_hand():
    # differences on seeds 1-3: +0.10, +0.10, -0.05 (seed 4 has no reference, so it is left out)
    d = paired_difference({1: 0.9, 2: 0.8, 3: 0.5, 4: 0.1}, {1: 0.8, 2: 0.7, 3: 0.55})
    assert d.mean == pytest.approx(0.05)
    std = math.sqrt((0.05**2 + 0.05**2 + 0.1**2) / 2)  # deviations from the mean 0.05
    assert d.sem == pytest.approx(std / math.sqrt(3))
    assert (d.wins, d.ties, d.losses, d.pairs) == (2, 0, 1, 3)
    assert str(d) == f"+0.0500 ± {std / math.sqrt(3):.4f}"


def test_one_pair_has_no_standard_error_and_no_common_seed_gives_none():
    one = paired_difference({1: 0.5}, {1: 0.5, 2: 0.1})
    assert (one.mean, one.sem, one.ties) == (0.0, None, 1) and str(one) == "+0.0000"
    assert paired_difference({1: 0.5}, {2: 0.5}) is None
    # 0.05000000000000002 and -0.05000000000000004: a mean of -1e-17 is written as the zero it is to 4 digits
    assert str(paired_difference({1: 0.5, 2: 0.6}, {1: 0.45, 2: 0.65})) == "+0.0000 ± 0.0500"


accuracies = st.dictionaries(st.integers(0, 9), st.floats(0.0, 1.0), min_size=1, max_size=10)


@given(accuracies, accuracies)
def test_swapping_the_arms_negates_the_mean_and_swaps_wins_and_losses(arm, reference):
    forward, backward = paired_difference(arm, reference), paired_difference(reference, arm)
    if forward is None:
        assert backward is None and not set(arm) & set(reference)
        return
    assert backward.mean == pytest.approx(-forward.mean, abs=1e-12)
    assert (backward.wins, backward.ties, backward.losses) == (forward.losses, forward.ties, forward.wins)
    assert forward.pairs == len(set(arm) & set(reference))
    assert paired_difference(arm, arm).ties == len(arm) and paired_difference(arm, arm).mean == 0.0


def test_reference_arm_must_name_an_arm_of_the_file():
    table = experiment_table()
    table["experiment"]["reference-arm"] = "fedprox"
    message = failure(table)
    assert "reference-arm = 'fedprox': not an arm of the file" in message and "fedavg, fedoui" in message
    table["experiment"]["reference-arm"] = "fedavg"
    assert load_experiment(table, DEFAULTS).spec.experiment.reference_arm == "fedavg"
    assert [arm.name for arm in load_experiment(table, DEFAULTS, arms=["fedoui"]).arms] == ["fedoui"]


def grid_with_reference(tmp_path, reference: str | None):
    changes = {}
    if reference is not None:
        table = experiment_table()
        table["experiment"]["reference-arm"] = reference
        changes["experiment"] = table["experiment"]
    experiment, runs = planned(tmp_path, **changes)
    curves = {"fedavg": [[0.2, 0.3, 0.5], [0.3, 0.4, 0.6]], "fedoui": [[0.25, 0.35, 0.45], [0.3, 0.5, 0.65]]}
    for run in runs:
        write_run(run.run_dir, curves[run.arm][run.seed - 1], rounds=3)
    return experiment, runs


def test_summary_has_the_paired_table_against_the_reference_arm(tmp_path):
    experiment, runs = grid_with_reference(tmp_path, "fedavg")
    summary = write_report(experiment, runs, tmp_path, plots=False).summary_md.read_text()
    # final: fedoui - fedavg = -0.05 (seed 1), +0.05 (seed 2): mean 0, sem = 0.1 / sqrt(2) / sqrt(2) = 0.05
    # mean over rounds: (1.05 - 1.0) / 3 and (1.45 - 1.3) / 3 = 0.01667, 0.05: mean 0.03333, sem 0.01667
    assert "Paired differences against fedavg" in summary
    assert "| fedoui | 2 | +0.0000 ± 0.0500 (1/0/1) | +0.0333 ± 0.0167 (2/0/0) |" in summary
    assert "| fedavg | 2 |" not in summary


def test_no_reference_arm_no_paired_table_and_a_missing_reference_is_said(tmp_path):
    experiment, runs = grid_with_reference(tmp_path / "none", None)
    assert (
        "Paired differences"
        not in write_report(experiment, runs, tmp_path / "none", plots=False).summary_md.read_text()
    )
    experiment, runs = grid_with_reference(tmp_path / "gone", "fedavg")
    for run in runs:
        if run.arm == "fedavg":
            (run.run_dir / SUMMARY_FILE).unlink()
    summary = write_report(experiment, runs, tmp_path / "gone", plots=False).summary_md.read_text()
    assert "the reference arm fedavg has no finished run" in summary


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        ([["fedoui", "fedprox"]], "paired-comparisons = ['fedoui', 'fedprox']: 'fedprox' not an arm of the file"),
        ([["fedoui", "fedoui"]], "each pair must name two different arms"),
        ([["fedoui", "fedavg"], ["fedoui", "fedavg"]], "each pair once"),
        ([["fedoui", "fedavg", "uniform"]], "paired-comparisons"),
    ],
)
def test_paired_comparisons_must_name_two_different_arms_of_the_file(pairs, expected):
    table = experiment_table()
    table["experiment"]["paired-comparisons"] = pairs
    assert expected in failure(table)


def test_summary_has_the_paired_comparisons_the_file_asks_for(tmp_path):
    table = experiment_table()
    table["experiment"]["paired-comparisons"] = [["fedoui", "fedavg"], ["fedavg", "fedoui"]]
    experiment, runs = planned(tmp_path, experiment=table["experiment"])
    curves = {"fedavg": [[0.2, 0.3, 0.5], [0.3, 0.4, 0.6]], "fedoui": [[0.25, 0.35, 0.45], [0.3, 0.5, 0.65]]}
    for run in runs:
        write_run(run.run_dir, curves[run.arm][run.seed - 1], rounds=3)
    summary = write_report(experiment, runs, tmp_path, plots=False).summary_md.read_text()
    assert "Paired differences against" not in summary  # no reference-arm: only the pairs asked for
    assert "(`paired-comparisons`)" in summary
    # the same numbers as the reference-arm table's row for fedoui (test above), and their negation
    assert "| fedoui − fedavg | 2 | +0.0000 ± 0.0500 (1/0/1) | +0.0333 ± 0.0167 (2/0/0) |" in summary
    assert "| fedavg − fedoui | 2 | +0.0000 ± 0.0500 (1/0/1) | -0.0333 ± 0.0167 (0/0/2) |" in summary
    only_one = load_experiment(experiment_table(experiment=table["experiment"]), DEFAULTS, arms=["fedoui"])
    assert (
        "paired-comparisons"
        not in write_report(only_one, runs[1::2], tmp_path / "one", plots=False).summary_md.read_text()
    )


# ------------------------------------------------------------------ runs read from an earlier report


def _table_lines(summary: str) -> list[str]:
    return [line for line in summary.splitlines() if line.startswith("| ")]


def _without_clients_column(rows: list[dict[str, str]], path):
    """``rows`` written as a ``results.csv`` from before the ``clients`` column."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=[c for c in rows[0] if c != "clients"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _csv_rows(path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_seeds_whose_folders_are_gone_come_back_from_the_earlier_results_csv(tmp_path):
    experiment, runs = grid_with_reference(tmp_path / "grid", "fedavg")
    whole = write_report(experiment, runs, tmp_path / "whole", plots=False)
    for run in runs:
        if run.seed == 1:  # seed 1 ran long ago; only its report is left
            for file in run.run_dir.iterdir():
                file.unlink()
    partial = write_report(experiment, runs, tmp_path / "partial", plots=False).summary_md.read_text()
    assert "Not in the table" in partial and "| fedoui | 1 |" in partial

    merged = write_report(experiment, runs, tmp_path / "merged", plots=False, earlier=[whole.results_csv])
    text = merged.summary_md.read_text()
    # every table, the paired one included, is what the report over all the folders had
    assert _table_lines(text) == _table_lines(whole.summary_md.read_text())
    assert "| fedoui | 2 | +0.0000 ± 0.0500 (1/0/1) | +0.0333 ± 0.0167 (2/0/0) |" in text
    assert "Not in the table" not in text
    assert f"- fedavg-seed1: {whole.results_csv}" in text and f"- fedoui-seed1: {whole.results_csv}" in text
    assert "fedavg-seed2: " not in text.split("Read from earlier reports")[1]
    # results.csv: the same rows, the recorded ones pointing at the folders they were run in
    assert _csv_rows(merged.results_csv) == _csv_rows(whole.results_csv)
    # seed 1's rounds are gone, but results.csv kept which clients they trained: both seeds are checked
    assert merged.sampling.ok and merged.sampling.lines == (
        "seed 1: the same clients in all 3 rounds for fedavg (earlier report), fedoui (earlier report)",
        "seed 2: the same clients in all 3 rounds for fedavg, fedoui",
    )


def test_an_earlier_row_that_trained_other_clients_fails_the_report(tmp_path):
    experiment, runs = grid_with_reference(tmp_path / "grid", "fedavg")
    whole = write_report(experiment, runs, tmp_path / "whole", plots=False)
    recorded = {row["run_name"]: row["clients"] for row in _csv_rows(whole.results_csv)}
    assert recorded["fedavg-seed1"] == recorded["fedoui-seed1"] != ""
    # fedoui-seed1 is rerun with another client in round 2; fedavg-seed1 is known only from the earlier file
    for file in runs[0].run_dir.iterdir():
        file.unlink()
    write_run(runs[1].run_dir, [0.3, 0.5, 0.6], sampled={2: [1, 3]}, rounds=3)
    with pytest.raises(SamplingMismatchError, match="seed 1, fedoui and fedavg"):
        write_report(experiment, runs, tmp_path / "merged", plots=False, earlier=[whole.results_csv])
    summary = (tmp_path / "merged" / "summary.md").read_text()
    assert "WARNING: client sampling differs" in summary
    assert "trained different clients within the first 3 rounds" in summary


def test_an_earlier_run_that_sampled_no_client_is_not_called_unchecked(tmp_path):
    # a Center-like run trains on the server's data alone: its clients cell is empty, and that is not a gap
    experiment, runs = grid_with_reference(tmp_path / "grid", "fedavg")
    write_run(runs[1].run_dir, [0.25, 0.35, 0.45], sampled={1: [], 2: [], 3: []}, rounds=3)
    whole = write_report(experiment, runs, tmp_path / "whole", plots=False)
    assert [row["clients"] == NO_CLIENTS for row in _csv_rows(whole.results_csv)] == [False, True, False, False]
    for run in runs[:2]:
        for file in run.run_dir.iterdir():
            file.unlink()
    merged = write_report(experiment, runs, tmp_path / "merged", plots=False, earlier=[whole.results_csv])
    assert merged.sampling.unrecorded == () and merged.sampling.verdict == "identical across arms"
    assert merged.sampling.lines == ("seed 2: the same clients in all 3 rounds for fedavg, fedoui",)


def test_an_earlier_results_csv_without_the_clients_column_is_left_out_of_the_check(tmp_path):
    experiment, runs = grid_with_reference(tmp_path / "grid", "fedavg")
    whole = write_report(experiment, runs, tmp_path / "whole", plots=False)
    rows = _csv_rows(whole.results_csv)
    old = _without_clients_column(rows, tmp_path / "old.csv")  # as reports wrote it before the column existed
    for run in runs[:2]:  # seed 1
        for file in run.run_dir.iterdir():
            file.unlink()
    merged = write_report(experiment, runs, tmp_path / "merged", plots=False, earlier=[old])
    assert merged.sampling.lines == (
        "seed 2: the same clients in all 3 rounds for fedavg, fedoui",
        "not checked, read from an earlier report that did not record their clients: fedavg-seed1, fedoui-seed1",
    )
    cells = [row["clients"] for row in _csv_rows(merged.results_csv)]
    assert cells[:2] == [CLIENTS_UNRECORDED] * 2 and cells[2] == cells[3] != ""
    # the summary does not call seed 1 identical: it says which runs it compared and which it could not
    text = merged.summary_md.read_text()
    assert "Client sampling: identical across the arms compared." in text
    assert "- not checked, read from an earlier report that did not record their clients: fedavg-seed1" in text

    for run in runs[2:]:  # seed 2's folders go too: nothing is left to compare
        for file in run.run_dir.iterdir():
            file.unlink()
    rows_only = write_report(experiment, runs, tmp_path / "rows-only", plots=False, earlier=[old])
    assert rows_only.sampling.ok and not rows_only.sampling.compared
    assert "Client sampling: not checked." in rows_only.summary_md.read_text()
    assert rows_only.sampling.unrecorded == ("fedavg-seed1", "fedoui-seed1", "fedavg-seed2", "fedoui-seed2")


def test_runs_whose_clients_were_not_recorded_stay_unchecked_through_a_chain_of_reports(tmp_path):
    # report 1 has no clients column; report 2 includes it; report 3 includes report 2, seed 1's and 2's folders gone
    experiment, runs = grid_with_reference(tmp_path / "grid", "fedavg")
    rows = _csv_rows(write_report(experiment, runs, tmp_path / "whole", plots=False).results_csv)
    old = _without_clients_column(rows, tmp_path / "old.csv")
    for run in runs[:2]:
        for file in run.run_dir.iterdir():
            file.unlink()
    second = write_report(experiment, runs, tmp_path / "second", plots=False, earlier=[old])
    for run in runs[2:]:
        for file in run.run_dir.iterdir():
            file.unlink()
    third = write_report(experiment, runs, tmp_path / "third", plots=False, earlier=[second.results_csv])
    assert third.sampling.unrecorded == ("fedavg-seed1", "fedoui-seed1")
    assert third.sampling.verdict == "identical across the arms compared"
    both = "fedavg (earlier report), fedoui (earlier report)"
    assert third.sampling.lines[0] == f"seed 2: the same clients in all 3 rounds for {both}"

    # a results.csv written when an empty cell stood for both cases: its finished rows count as not recorded
    legacy = tmp_path / "legacy.csv"
    with legacy.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows([row | {"clients": ""} if row["seed"] == "1" else row for row in rows])
    from_legacy = write_report(experiment, runs, tmp_path / "from-legacy", plots=False, earlier=[legacy])
    assert from_legacy.sampling.unrecorded == ("fedavg-seed1", "fedoui-seed1")


def test_a_clients_cell_says_which_clients_or_why_none_are_known():
    sequence = ClientSequence.of([{"sampled": [1]}], {"fraction-train": 0.1})
    assert recorded_clients(str(sequence)) == (sequence, False)
    assert recorded_clients(NO_CLIENTS) == (None, False)
    assert recorded_clients(CLIENTS_UNRECORDED) == (None, True)
    assert recorded_clients("") == (None, True) and recorded_clients(None) == (None, True)


def test_client_sequences_differ_with_the_clients_their_order_and_the_sampling_settings():
    rows = [{"sampled": [0, 1]}, {"sampled": [2, 3]}]
    settings = {"fraction-train": 0.5, "min-train-nodes": 2, "delay-std": 0.0}
    one = ClientSequence.of(rows, settings)
    assert one == ClientSequence.of([dict(row) for row in rows], dict(settings))
    assert one.digest != ClientSequence.of(rows[::-1], settings).digest
    assert one.digest != ClientSequence.of([{"sampled": [0, 1]}, {"sampled": [2, 4]}], settings).digest
    assert one.digest == ClientSequence.of(rows, settings | {"delay-std": 1.0}).digest
    assert one.sampling != ClientSequence.of(rows, settings | {"delay-std": 1.0}).sampling
    assert ClientSequence.of([{"sampled": []}, {}], settings) is None  # Center samples no client
    assert ClientSequence.parse("") is None
    accepted = "accepted: empty, or 'none', 'unrecorded' or '<16 hex digits> over R rounds"
    with pytest.raises(ValueError, match=f"clients 'abc': {accepted}"):
        ClientSequence.parse("abc")


@given(
    st.lists(st.lists(st.integers(0, 999), max_size=20), min_size=1, max_size=30).filter(any),
    st.floats(0.01, 1.0),
    st.integers(0, 100),
)
def test_a_client_sequence_reads_back_from_the_text_results_csv_holds(sampled, fraction, minimum):
    sequence = ClientSequence.of(
        [{"sampled": s} for s in sampled], {"fraction-train": fraction, "min-train-nodes": minimum}
    )
    assert ClientSequence.parse(str(sequence)) == sequence and sequence.rounds == len(sampled)


def test_a_folder_with_a_finished_run_wins_over_the_earlier_row(tmp_path):
    experiment, runs = grid_with_reference(tmp_path / "grid", "fedavg")
    earlier = write_report(experiment, runs, tmp_path / "earlier", plots=False).results_csv
    rows = _csv_rows(earlier)
    for row in rows:
        row["final_accuracy"] = "0.999000"  # a stale copy says otherwise
    with earlier.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    merged = write_report(experiment, runs, tmp_path / "merged", plots=False, earlier=[earlier])
    assert [r.source for r in merged.results] == [None] * 4
    assert "0.999" not in merged.results_csv.read_text()


def test_an_earlier_results_csv_of_another_grid_is_refused_before_anything_is_written(tmp_path):
    experiment, runs = grid_with_reference(tmp_path / "grid", "fedavg")
    earlier = write_report(experiment, runs, tmp_path / "earlier", plots=False).results_csv
    rows = _csv_rows(earlier)

    def refused(change, *expected):
        changed = [dict(row) for row in rows]
        change(changed)
        path = tmp_path / "changed.csv"
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(changed[0]))
            writer.writeheader()
            writer.writerows(changed)
        with pytest.raises(ExperimentError) as caught:
            write_report(experiment, runs, tmp_path / "never", plots=False, earlier=[path])
        assert not (tmp_path / "never").exists()
        for text in expected:
            assert text in str(caught.value)

    refused(
        lambda r: r[0].update(experiment="other"),
        "changed.csv:\n",
        "line 2: a row of experiment 'other'; accepted: 'demo'",
    )
    refused(lambda r: r[2].update(best_accuracy="n/a"), "line 4: could not convert string to float: 'n/a'")
    refused(
        lambda r: r[1].update(rounds="5"),
        "fedoui-seed1: strategy 'fedoui' over 5 rounds; accepted: 'fedoui' over 3 rounds",
    )
    refused(lambda r: [row.pop("mean_accuracy") for row in r], "no column mean_accuracy")
    refused(lambda r: r[3].update(collapse="melted"), "line 5: collapse 'melted': accepted: empty, or 'round R")
    markers = "accepted: empty, or 'none', 'unrecorded' or"
    refused(lambda r: r[2].update(clients="every one"), f"line 4: clients 'every one': {markers}")
    with pytest.raises(ExperimentError, match="nowhere.csv: cannot be read"):
        write_report(experiment, runs, tmp_path / "never", plots=False, earlier=[tmp_path / "nowhere.csv"])


@given(
    st.integers(1, 10_000),
    st.floats(0.0, 1.0),
    st.none() | st.floats(-1e6, 1e6, allow_nan=False),
    st.booleans(),
)
def test_a_collapse_reads_back_from_the_text_results_csv_holds(number, accuracy, lam, recovered):
    text = str(Collapse(number, accuracy, lam, recovered))
    back = Collapse.parse(text)
    assert str(back) == text and (back.round, back.recovered) == (number, recovered)
    assert back.accuracy == pytest.approx(accuracy, abs=5e-5) and (back.lam is None) == (lam is None)
    assert Collapse.parse("") is None


def test_experiment_report_takes_include_results_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "demo.toml"
    path.write_text(
        '[experiment]\nname = "demo"\nseeds = [1]\nnum-supernodes = 4\nreference-arm = "a"\n'
        '[base]\nnum-server-rounds = 3\n[[arms]]\nname = "a"\nstrategy = "fedavg"\n'
        '[[arms]]\nname = "b"\nstrategy = "fednolowe"\n'
    )
    first, second = tmp_path / "first", tmp_path / "second"
    write_run(first / "runs" / "a-seed1", [0.2, 0.3, 0.5], rounds=3)
    write_run(first / "runs" / "b-seed1", [0.3, 0.4, 0.6], rounds=3)
    assert main(["experiment", "report", str(path), "--output-dir", str(first)]) == 0
    earlier = first / "results.csv"
    args = ["experiment", "report", str(path), "--output-dir", str(second)]
    assert main([*args, "--include-results", str(earlier)]) == 0
    summary = (second / "summary.md").read_text()
    assert "| b | 1 | +0.1000 (1/0/0) | +0.1000 (1/0/0) |" in summary and f"- a-seed1: {earlier}" in summary
    capsys.readouterr()
    assert main([*args, "--include-results", str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv: cannot be read" in capsys.readouterr().err


# ------------------------------------------------------------------ tail of u of the final model


def test_u_tail_by_hand():
    u = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0])  # p95: rank 0.95 * 4 = 3.8 -> 1.5 + 0.8 * 0.5
    p95, above = u_tail(u)
    assert p95 == pytest.approx(1.9) and above == pytest.approx(0.4)  # 1.0 itself is not above 1


def test_model_uncertainty_uses_the_models_own_dropout_and_is_seeded():
    torch.manual_seed(0)
    model = DigitsMLP(hidden=(16, 16), dropout=0.2)
    data = ImageTensors(torch.randint(0, 256, (20, 1, 8, 8), dtype=torch.uint8), torch.arange(20) % 10)
    transform = _identity_transform()
    options = UFLSettings(mc_passes=4)
    first = model_uncertainty(model, data, transform, torch.device("cpu"), options, seed=3)
    again = model_uncertainty(model, data, transform, torch.device("cpu"), options, seed=3)
    one_pass = model_uncertainty(model, data, transform, torch.device("cpu"), options, seed=3, passes=1)
    assert first.shape == (20,) and torch.equal(first, again) and not torch.equal(first, one_pass)
    assert not hasattr(model, "_mc_head_dropout")  # its own Dropout is sampled; nothing inserted
    assert (first >= 0).all()


def _identity_transform():
    def transform(images, train, generator=None):
        return images.float() / 255.0

    return transform


def test_final_uncertainty_is_a_checked_setting():
    assert check_run({**DEFAULTS, "final-uncertainty": 5}).final_uncertainty == 5
    with pytest.raises(SettingsError, match="final-uncertainty"):
        check_run({**DEFAULTS, "final-uncertainty": -1})


def test_the_tail_of_u_goes_from_summary_json_to_results_csv_and_summary_md(tmp_path):
    assert final_u_tail({FINAL_U_P95: 2, FINAL_U_ABOVE_1: None}) == {FINAL_U_P95: 2.0}
    experiment, runs = grid_with_reference(tmp_path, None)
    tails = {("fedavg", 1): (2.0, 0.3), ("fedavg", 2): (2.2, 0.5), ("fedoui", 1): (1.5, 0.2), ("fedoui", 2): (1.5, 0.2)}
    for run in runs:
        summary = json.loads((run.run_dir / SUMMARY_FILE).read_text())
        p95, above = tails[run.arm, run.seed]
        (run.run_dir / SUMMARY_FILE).write_text(json.dumps({**summary, FINAL_U_P95: p95, FINAL_U_ABOVE_1: above}))
    report = write_report(experiment, runs, tmp_path, plots=False)
    with report.results_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [float(row[FINAL_U_P95]) for row in rows] == [2.0, 1.5, 2.2, 1.5]
    summary = report.summary_md.read_text()
    assert "Tail of u" in summary
    assert "| fedavg | 2.1000 ± 0.1414 | 0.4000 ± 0.1414 |" in summary
    assert "| fedoui | 1.5000 ± 0.0000 | 0.2000 ± 0.0000 |" in summary


# ------------------------------------------------------------------ normalization = "feature" (standardised digits)


def test_feature_normalization_is_sklearns_standard_scaler_on_the_train_split():
    from sklearn.preprocessing import StandardScaler

    from fedweigh.data.federated import feature_normalization
    from fedweigh.data.sources import load_digits

    train = np.stack(load_digits()["train"]["image"]).reshape(-1, 64).astype(np.float64) / 255.0
    scaler = StandardScaler().fit(train)
    mean, std = feature_normalization("digits")
    assert mean.shape == std.shape == (1, 8, 8)
    assert np.allclose(mean.numpy().reshape(-1), scaler.mean_, atol=1e-6)
    assert np.allclose(std.numpy().reshape(-1), scaler.scale_, atol=1e-6)
    assert std[0, 0, 0] == 1.0 and mean[0, 0, 0] == 0.0  # the corner pixel is always 0: scale 1, like the scaler


def test_the_feature_normalised_train_split_has_zero_mean_and_unit_std_per_pixel():
    from fedweigh.components import batch_transform
    from fedweigh.data.sources import load_digits
    from fedweigh.settings import validate

    images = torch.from_numpy(np.stack(load_digits()["train"]["image"]).astype(np.uint8)).unsqueeze(1)
    x = batch_transform(validate({**DEFAULTS, "normalization": "feature"}))(images, train=False)
    varying = images.reshape(len(images), -1).float().std(dim=0) > 0
    flat = x.reshape(len(x), -1).double()
    assert flat.mean(dim=0).abs().max() < 1e-5
    assert torch.allclose(flat.std(dim=0, unbiased=False)[varying], torch.ones(int(varying.sum()), dtype=torch.float64))
    assert (flat[:, ~varying] == 0).all()
    channel = batch_transform(validate(DEFAULTS))(images, train=False)
    assert not torch.allclose(channel, x)  # the default stays per channel


def test_normalization_names_what_it_accepts_and_refuses_a_model_that_resizes():
    from fedweigh.data.federated import dataset_info, feature_normalization
    from fedweigh.data.transforms import BatchTransform

    with pytest.raises(SettingsError, match="normalization.*'channel'.*'feature'"):
        check_run({**DEFAULTS, "normalization": "pixel"})
    with pytest.raises(ValueError, match="normalization = 'feature'.*accepted: normalization = 'channel'"):
        BatchTransform(dataset_info("digits"), False, size=224, per_feature=feature_normalization("digits"))
