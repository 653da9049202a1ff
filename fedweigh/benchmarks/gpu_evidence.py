"""What only a GPU can settle, in one command under a time budget (``fedweigh benchmark gpu-evidence``).

GPU time comes rarely and briefly (15 minutes, machine start included), so
the measurements that need one are prepared here and run in order of value
per minute:

* ``overhead``: the federation overhead of section 1 on the GPU, with Ray's
  actors and with the in-process backend (never run on a GPU), on the code
  of today (array codec, malloc arenas);
* ``vit-lora``: a federated round of ViT-B/16 + LoRA on CIFAR-10, simulation
  and bare loop, with random weights (the lent machine reaches no hub; a
  round's time does not depend on the weights);
* ``flood``: FLood less compressed (``experiments/flood_cifar10_gpu.toml``:
  T and the rounds 4x those of the CPU file), its main arms at seed 1;
* ``fednolowe-round``: five rounds of FedAvg in the CIFAR-10 / VGG-9 setting
  (``experiments/fednolowe_cifar10.toml``), to time a round on a GPU;
* ``fednolowe``: its 100-round FedNolowe run (never run: 4-7 hours on the CPU);
* ``feddle``: ``experiments/feddle_fmnist_200.toml``, Feddle-ID and FedBuff
  at 200 rounds (the file's untuned values).

Each case is a list of steps (one simulation, or one run of an experiment
file through the experiment runner). A step runs only if its estimated GPU
time fits in what is left of the budget; otherwise it is recorded as skipped
with the reason, and the next step is tried. After each step the report so
far goes to ``progress`` (the command writes its JSON then), so a time limit
keeps what was measured. Experiment runs keep their folders: the same
command again on the same machine skips the runs already finished.

Where Ray is not installed (a lent GPU machine: ``fedweigh.benchmarks.gpu_bundle``
leaves it behind), every run is in-process and Ray's step of ``overhead`` is
skipped with that reason; where the dataset folder is the bundle's slice, a
file that trains on more of it than the slice holds is skipped, never run on
a part of what it asks for.

``quick`` (the smoke mode) runs every case on the CPU at a tiny scale
(scikit-learn's digits, an MLP or the tiny ViT, two rounds, one step a case)
to check that the command works; its numbers are not measurements.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import os
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fedweigh.benchmarks.common import APP_DIR, BenchmarkError, Setting
from fedweigh.settings import IN_PROCESS_BACKEND

__all__ = [
    "CASE_NAMES",
    "DEFAULT_BUDGET_SECONDS",
    "Case",
    "Context",
    "Step",
    "build_cases",
    "gpu_evidence",
    "load_arm",
    "order_cases",
    "ranked_cases",
    "ray_installed",
    "require_gpu",
    "run_cases",
]

DEFAULT_BUDGET_SECONDS = 720.0
"""12 minutes: a 15-minute lease less the machine's start and the transfers."""

# --- estimated GPU seconds, each from a measurement (the H100 lent on 2026-11-27, or this 2-core CPU) ----------
RUN_START_SECONDS = 25.0
"""A simulation's start on the H100: 12.2 s before round 1 and 12.7 s of round 1 (actor, CUDA, data)."""
GPU_SPEEDUP_SMALL_CNN = 4.0
"""CPU round time / GPU round time of a small CNN on CIFAR-10: the FedOUI setting's bare loop took 0.45 s a
round on the 2-core CPU (benchmarks/results/overhead.json, 60 against 10 rounds) and 0.112 s on the H100."""
GPU_SPEEDUP_VGG9 = 40.0
"""The same for VGG-9 at batch 32 (3.5 M parameters, 5 local epochs): assumed, not measured; the
``fednolowe`` case's first step measures it."""
OVERHEAD_RAY_SECONDS = 75.0
"""FedOUI CIFAR-10, 60 rounds, bare loop and Ray simulation: 21.0 + 51.5 s measured on the H100."""
OVERHEAD_IN_PROCESS_SECONDS = 60.0
"""The same in-process: the bare loop's 21 s, the simulation at the CPU's 1.05x of it plus its start."""
VIT_ROUNDS = 5
VIT_SECONDS = 100.0
"""ViT-B/16 + LoRA, 5 rounds of 5 clients x 100 images, simulation and bare loop: a step at batch 32 took
0.075 s on the H100 (4 a client), evaluation of 500 images at 224 x 224 about 1 s, two starts of 25 s."""
FLOOD_CPU_SECONDS = {"fedavg": 150.0, "flood": 270.0, "asw-scale-control": 209.0, "asw": 290.0}
"""Wall seconds of each arm's 50-round run, seed 1, on the 2-core CPU (docs/results/flood-cifar10/results.csv)."""
FLOOD_ROUND_FACTOR = 4
"""The GPU file's rounds (200) against the CPU file's (50)."""
FEDNOLOWE_CPU_ROUND_SECONDS = 195.0
"""A FedAvg round of the CIFAR-10 / VGG-9 file on the 2-core CPU: 147 and 242 s (docs/results.md, FedNolowe)."""
FEDNOLOWE_TIMING_ROUNDS = 5
FEDNOLOWE_ROUNDS = 100
"""The file's own."""
FEDNOLOWE_FILE = "experiments/fednolowe_cifar10.toml"
FEDDLE_CPU_SECONDS = {"feddle-id-s20": 122.0, "fedbuff-s20": 92.0}
"""Wall seconds of the 100-round runs at σ = 20, seed 1, on the 2-core CPU (docs/results/feddle-fmnist)."""
FEDDLE_ROUND_FACTOR = 2
"""200 rounds against the measured 100."""
SMOKE_STEP_SECONDS = 15.0
"""A smoke step on the 2-core CPU (digits, two rounds): measured 5-20 s."""

# --- what each answer is worth (a judgement, stated so that the order can be argued with) ---------------------
VALUES = {
    "flood": 8.0,  # the open result: does the gain fail because of the compressed schedule or the method?
    "overhead": 3.0,  # the in-process backend's claim (1.05x) has never been checked on a GPU
    "fednolowe": 3.0,  # never run: 4-7 hours a run on the CPU; only a GPU gets it
    "fednolowe-round": 1.5,  # a round's GPU time: what the next lease needs to plan the 100-round runs
    "vit-lora": 1.5,  # the step is measured; a whole round adds the evaluation and the messages
    "feddle": 0.5,  # 200 rounds fit on the CPU (about 4 minutes a run): a GPU only shortens it
}

CASE_NAMES = tuple(VALUES)
"""Every case's name (``--cases``)."""

SMOKE_SETTINGS = {
    "dataset": "digits",
    "model": "mlp",
    "partitioner": "iid",
    "train-subset": 0,
    "test-subset": 0,
    "fraction-train": 0.5,
    "min-train-nodes": 2,
    "local-epochs": 1,
    "num-server-rounds": 2,
    "evaluate-every": 1,
    "simulation-backend": "in-process",
}
"""Every smoke run: scikit-learn's digits (no download), an MLP, two rounds, in the simulation's process."""
SMOKE_EXPERIMENT_SETTINGS = {**SMOKE_SETTINGS, "server-data-size": 60, "test-holdout": 60}
"""The same for the experiment files' runs; Feddle's server data taken from digits' 360 test images."""
SMOKE_SUPERNODES = 4


def ray_installed() -> bool:
    """Whether Ray can be imported here (the lent GPU machines lack it: ``fedweigh.benchmarks.gpu_bundle``)."""
    return importlib.util.find_spec("ray") is not None


NO_RAY = (
    "Ray is not installed here (the GPU bundle leaves it behind: its wheel is over what a device call carries); "
    "the in-process steps run"
)


@dataclass(frozen=True)
class Context:
    """Where and at what scale the steps run; without Ray every run is in-process."""

    sim: Any
    quick: bool
    runs_dir: Path
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    ray: bool = field(default_factory=ray_installed)


@dataclass(frozen=True)
class Step:
    """One simulation (or one experiment run): its estimated GPU seconds and what runs it.

    ``run`` returns the step's result, with a one-line ``headline``; it raises
    :class:`BenchmarkError` when the step cannot run here (its data missing).
    """

    name: str
    seconds: float
    run: Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class Case:
    """A question only a GPU settles, its value, how its cost was estimated, and its steps in order."""

    name: str
    question: str
    value: float
    estimate: str
    steps: tuple[Step, ...]
    alike: bool = False  # steps of one kind: a finished step's time raises the estimate of the next
    ranked_by: float | None = None  # the value per minute that orders it, if not its own (a smoke case: the GPU's)

    @property
    def seconds(self) -> float:
        return sum(step.seconds for step in self.steps)

    @property
    def value_per_minute(self) -> float:
        if self.ranked_by is not None:
            return self.ranked_by
        return self.value / max(self.seconds / 60, 1e-9)


# ----------------------------------------------------------------------------------------------- the steps


def _overhead_step(ctx: Context, setting: Setting, share: float) -> dict[str, Any]:
    from fedweigh.benchmarks.gpu import client_cpus
    from fedweigh.benchmarks.overhead import federation_overhead

    if ctx.quick:
        result = federation_overhead(setting, ctx.sim, ray_floor=False)
    else:
        result = federation_overhead(
            setting, ctx.sim, gpus_per_client=share, cpus_per_client=client_cpus(share, ctx.cpus)
        )
    round_ratio = f", round ratio {result['round_ratio']:.2f}x" if result.get("round_ratio") else ""
    return {
        **result,
        "headline": f"{result['simulation_seconds']:.1f} s against the bare loop's {result['bare_seconds']:.1f} s "
        f"({result['ratio']:.2f}x{round_ratio})",
    }


def _ray_overhead_step(ctx: Context, setting: Setting) -> dict[str, Any]:
    if not ctx.ray:
        raise BenchmarkError(NO_RAY)
    return _overhead_step(ctx, setting, 1.0)


def _smoke_setting(name: str, **overrides: Any) -> Setting:
    return Setting(name, {"strategy": "fedavg", **SMOKE_SETTINGS, **overrides}, SMOKE_SUPERNODES)


def _vit_setting() -> Setting:
    """Section 1's FedOUI CIFAR-10 federation (20 clients, 5 a round) with ViT-B/16 + LoRA, 100 images a client."""
    from fedweigh.benchmarks.common import fedoui_cifar10

    base = fedoui_cifar10(VIT_ROUNDS)
    vit = {
        "model": "vit-b16",
        "model-pretrained": False,  # random weights: the lent machine reaches no hub
        "train-subset": 2000,
        "test-subset": 500,
        "partitioner": "iid",
        "eval-batch-size": 128,
    }
    return Setting("vit-b16-lora-cifar10", {**base.run_config, **vit}, base.num_supernodes)


def _shared_dataset(path: str) -> str:
    """A ``../shared/datasets/<name>`` path of an experiment file, found where :func:`dataset_folder` looks."""
    from fedweigh.benchmarks.common import dataset_folder

    return dataset_folder(Path(path).name) if "/" in path else path


def _federation(ctx: Context, share: float) -> dict[str, Any]:
    """The ``[experiment]`` values of a run here: a tiny federation on the CPU, else the GPU shared ``share``-wise."""
    if ctx.quick:
        return {"num-supernodes": SMOKE_SUPERNODES, "cpus-per-client": 1, "gpus-per-client": 0.0}
    from fedweigh.benchmarks.gpu import client_cpus

    return {"cpus-per-client": client_cpus(share, ctx.cpus), "gpus-per-client": share}


def _accuracy(text: str | None) -> str:
    """An accuracy of results.csv, four digits (``–`` where the run has none)."""
    return f"{float(text):.4f}" if text else "–"


def _arm_result(results_csv: Path, arm: str, seed: int) -> dict[str, Any]:
    with results_csv.open(encoding="utf-8", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["arm"] == arm and row["seed"] == str(seed)]
    if not rows:
        raise RuntimeError(f"{results_csv} has no row for arm {arm!r}, seed {seed}")
    keys = ("status", "rounds", "final_accuracy", "last10_accuracy", "late_max_accuracy", "mean_accuracy")
    return {key: rows[0].get(key) for key in (*keys, "wall_seconds", "run_dir")}


def load_arm(ctx: Context, file: str, arm: str, rounds: int | None, share: float) -> Any:
    """``file``'s ``arm`` at seed 1 as this context runs it (an :class:`Experiment`; raises if it is invalid)."""
    from fedweigh.experiments.spec import load_experiment
    from fedweigh.launch.runconfig import load_app_config

    raw = tomllib.loads((APP_DIR / file).read_text(encoding="utf-8"))
    raw["experiment"] = {**raw["experiment"], **_federation(ctx, share)}
    settings: dict[str, Any] = {"dataset": _shared_dataset(raw["base"]["dataset"])}
    if not ctx.ray:
        settings["simulation-backend"] = IN_PROCESS_BACKEND
    if not ctx.quick:
        _check_slice(file, raw["base"], settings["dataset"])
    if ctx.quick:  # the MLP takes none of the file's model options (model-width, ...)
        raw["base"] = {key: value for key, value in raw["base"].items() if not key.startswith("model-")}
        settings, rounds = dict(SMOKE_EXPERIMENT_SETTINGS), None
    return load_experiment(raw, load_app_config(APP_DIR), seeds=[1], arms=[arm], rounds=rounds, settings=settings)


def _check_slice(file: str, base: Mapping[str, Any], folder: str) -> None:
    """Raise :class:`BenchmarkError` where ``folder`` is a draw of the dataset smaller than what ``file`` trains on.

    The GPU bundle carries a slice of CIFAR-10 (``fedweigh.benchmarks.gpu_bundle.SLICE``); a file that asks for
    more of it than the slice holds is skipped with this reason, never run on a part of what it asks for.
    """
    from fedweigh.benchmarks.gpu_bundle import is_slice

    if (drawn := is_slice(folder)) is None:
        return
    asked = {split: int(base.get(f"{split}-subset", 0)) for split in ("train", "test")}
    if all(0 < asked[split] <= drawn[split] for split in asked):
        return
    wanted = ", ".join(f"{split}-subset = {asked[split] or 'all'}" for split in asked)
    raise BenchmarkError(
        f"{file} asks for {wanted}, and {folder} holds a draw of {drawn['train']} / {drawn['test']} of its "
        f"{drawn['of']['train']} / {drawn['of']['test']} images (the GPU bundle's slice: the whole dataset is "
        "over what a device call carries beside the tree); give FEDWEIGH_DATASETS the whole dataset to run it"
    )


def _experiment_step(ctx: Context, file: str, arm: str, rounds: int | None, share: float, folder: str) -> dict:
    """One arm of ``file`` at seed 1 through the experiment runner, on the shared simulation."""
    from fedweigh.experiments.runner import run_experiment
    from fedweigh.launch.runconfig import load_app_config

    experiment = load_arm(ctx, file, arm, rounds, share)
    defaults = load_app_config(APP_DIR)
    output_dir = ctx.runs_dir / folder
    outcome = run_experiment(
        experiment, output_dir, APP_DIR, defaults, port=ctx.sim.port, simulation=ctx.sim, out=io.StringIO()
    )
    if outcome.failed:
        raise RuntimeError(f"{arm} ended unfinished; its log: {output_dir / 'logs' / (arm + '-seed1.log')}")
    result = _arm_result(outcome.report.results_csv, arm, 1)
    return {
        "file": file,
        "arm": arm,
        "seed": 1,
        **result,
        "headline": f"{arm}: final {_accuracy(result['final_accuracy'])}, last 10 rounds "
        f"{_accuracy(result['last10_accuracy'])}, {float(result['wall_seconds']):.0f} s",
    }


# ----------------------------------------------------------------------------------------------- the cases


def _overhead_case(ctx: Context) -> Case:
    from fedweigh.benchmarks.common import fedoui_cifar10

    if ctx.quick:
        steps = (Step("digits-in-process", SMOKE_STEP_SECONDS, lambda: _overhead_step(ctx, _smoke_setting("d"), 0)),)
    else:
        steps = (
            Step("fedoui-cifar10", OVERHEAD_RAY_SECONDS, lambda: _ray_overhead_step(ctx, fedoui_cifar10(60))),
            Step(
                "fedoui-cifar10-in-process",
                OVERHEAD_IN_PROCESS_SECONDS,
                lambda: _overhead_step(ctx, fedoui_cifar10(60).in_process(), 1.0),
            ),
        )
    return Case(
        "overhead",
        "What Flower adds to a round on a GPU, with Ray's actors and in-process (never run on a GPU)",
        VALUES["overhead"],
        "Ray: measured on the H100 (21.0 + 51.5 s); in-process: the bare loop's 21 s and the CPU's 1.05x",
        steps,
    )


def _vit_case(ctx: Context) -> Case:
    if ctx.quick:
        setting = _smoke_setting("vit-tiny", model="vit-tiny")
        steps = (Step("vit-tiny-digits", SMOKE_STEP_SECONDS, lambda: _overhead_step(ctx, setting, 0)),)
    else:
        setting = _vit_setting() if ctx.ray else _vit_setting().in_process()
        steps = (Step(setting.name, VIT_SECONDS, lambda: _overhead_step(ctx, setting, 1.0)),)
    return Case(
        "vit-lora",
        "A federated round of ViT-B/16 + LoRA on CIFAR-10 (random weights: no hub reachable; times do not depend "
        "on them)",
        VALUES["vit-lora"],
        "the H100's 0.075 s a step at batch 32, 5 rounds of 5 clients x 100 images, two starts",
        steps,
    )


def _arm_steps(ctx: Context, file: str, arms: Mapping[str, float], rounds: int | None, share: float, folder: str):
    if ctx.quick:
        arms = {next(iter(arms)): SMOKE_STEP_SECONDS}
    return tuple(
        Step(arm, seconds, lambda arm=arm: _experiment_step(ctx, file, arm, rounds, share, f"{folder}-{arm}"))
        for arm, seconds in arms.items()
    )


def _scaled_arms_case(
    ctx: Context, name: str, file: str, cpu_seconds: Mapping[str, float], round_factor: int, question: str
) -> Case:
    """Arms of ``file`` at seed 1, each estimated from its CPU run: x ``round_factor`` rounds, / the GPU speedup."""
    arms = {arm: RUN_START_SECONDS + round_factor * cpu / GPU_SPEEDUP_SMALL_CNN for arm, cpu in cpu_seconds.items()}
    return Case(
        name,
        question,
        VALUES[name],
        f"each arm's CPU run x {round_factor} (the rounds) / {GPU_SPEEDUP_SMALL_CNN:.0f} (a small CNN's GPU speedup) "
        f"+ {RUN_START_SECONDS:.0f} s start",
        _arm_steps(ctx, file, arms, None, 1.0, name),
        alike=True,
    )


def _fednolowe_case(ctx: Context, name: str, arm: str, rounds: int, question: str) -> Case:
    """An arm of the CIFAR-10 / VGG-9 file for ``rounds`` rounds."""
    seconds = RUN_START_SECONDS + rounds * FEDNOLOWE_CPU_ROUND_SECONDS / GPU_SPEEDUP_VGG9
    return Case(
        name,
        question,
        VALUES[name],
        f"the CPU's 195 s a FedAvg round / an assumed 40x for VGG-9 on a GPU, {rounds} rounds + 25 s start",
        _arm_steps(ctx, FEDNOLOWE_FILE, {arm: seconds}, rounds, 1.0, name),
    )


def build_cases(ctx: Context) -> list[Case]:
    """Every case at the context's scale, in the order of the issue."""
    return [
        _scaled_arms_case(
            ctx,
            "flood",
            "experiments/flood_cifar10_gpu.toml",
            FLOOD_CPU_SECONDS,
            FLOOD_ROUND_FACTOR,
            "FLood less compressed (T and the rounds 4x): does the gain come back, and does ASW differ from the "
            "loss-scale control?",
        ),
        _overhead_case(ctx),
        _fednolowe_case(
            ctx,
            "fednolowe-round",
            "fedavg",
            FEDNOLOWE_TIMING_ROUNDS,
            "A round of the CIFAR-10 / VGG-9 file on the GPU (5 rounds of FedAvg): what its 100-round runs cost",
        ),
        _fednolowe_case(
            ctx,
            "fednolowe",
            "fednolowe",
            FEDNOLOWE_ROUNDS,
            "FedNolowe on CIFAR-10 / VGG-9, 100 rounds, seed 1 (never run: 4-7 h on the CPU)",
        ),
        _scaled_arms_case(
            ctx,
            "feddle",
            "experiments/feddle_fmnist_200.toml",
            FEDDLE_CPU_SECONDS,
            FEDDLE_ROUND_FACTOR,
            "Feddle-ID and Nguyen et al.'s FedBuff at 200 rounds, σ = 20 (the file's untuned values)",
        ),
        _vit_case(ctx),
    ]


def order_cases(cases: list[Case]) -> list[Case]:
    """Highest value per estimated GPU minute first (ties keep their order)."""
    return sorted(cases, key=lambda case: -case.value_per_minute)


def ranked_cases(ctx: Context) -> list[Case]:
    """The context's cases in the order of the GPU's estimates (a smoke run keeps the GPU run's order)."""
    on_gpu = {case.name: case.value_per_minute for case in build_cases(replace(ctx, quick=False))}
    return order_cases([replace(case, ranked_by=on_gpu[case.name]) for case in build_cases(ctx)])


# ----------------------------------------------------------------------------------------------- running them


def _run_step(step: Step, estimate: float, left: float, clock: Callable[[], float]) -> dict[str, Any]:
    record: dict[str, Any] = {"step": step.name, "estimated_seconds": round(estimate, 1)}
    if estimate > left:
        reason = f"does not fit: estimated {estimate:.0f} s, {max(left, 0):.0f} s of the budget left"
        return {**record, "status": "skipped", "reason": reason}
    started = clock()
    try:
        result = step.run()
    except BenchmarkError as err:  # cannot run here: its data is missing
        return {**record, "status": "skipped", "reason": str(err), "seconds": round(clock() - started, 1)}
    except Exception as err:  # noqa: BLE001  (one failed step must not lose the others)
        return {
            **record,
            "status": "failed",
            "reason": f"{type(err).__name__}: {err}",
            "seconds": round(clock() - started, 1),
        }
    seconds = round(clock() - started, 1)
    return {**record, "status": "done", "seconds": seconds, "headline": result.pop("headline", ""), "result": result}


def _case_status(steps: list[dict[str, Any]]) -> str:
    statuses = {step["status"] for step in steps}
    if statuses == {"done"}:
        return "done"
    if "done" in statuses:
        return "partial"
    return "failed" if "failed" in statuses else "skipped"


def _case_record(case: Case) -> dict[str, Any]:
    return {
        "case": case.name,
        "question": case.question,
        "value": case.value,
        "estimated_seconds": round(case.seconds, 1),
        "value_per_minute": round(case.value_per_minute, 3),
        "estimate": case.estimate,
        "status": "pending",
        "steps": [],
    }


def run_cases(
    cases: list[Case],
    budget: float,
    progress: Callable[[dict[str, Any]], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Run each case's steps in order while their estimates fit in ``budget`` seconds; report after each step.

    A case's steps come in the order of their use: once one does not fit, the
    case's later steps are skipped too, and what is left goes to the next case.
    """
    started = clock()
    records = [_case_record(case) for case in cases]
    report = {"budget_seconds": budget, "order": [case.name for case in cases], "cases": records}
    for case, record in zip(cases, records, strict=True):
        measured, stopped = 0.0, None
        for step in case.steps:
            estimate = max(step.seconds, measured) if case.alike else step.seconds
            if stopped is not None:
                outcome = {"step": step.name, "estimated_seconds": round(estimate, 1), "status": "skipped"}
                outcome["reason"] = f"step {stopped!r} of this case did not fit"
            else:
                outcome = _run_step(step, estimate, budget - (clock() - started), clock)
            if outcome["status"] == "done":
                measured = outcome["seconds"]
            elif outcome["reason"].startswith("does not fit"):
                stopped = step.name
            record["steps"].append(outcome)
            record["status"] = _case_status(record["steps"])
            report["elapsed_seconds"] = round(clock() - started, 1)
            if progress is not None:
                progress(report)
    return report


def require_gpu() -> None:
    """Raise :class:`BenchmarkError` (saying what runs on a CPU instead) where torch sees no CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        raise BenchmarkError(
            "the gpu-evidence benchmark needs a CUDA GPU, and torch sees none (torch.cuda.is_available() is False); "
            "on a CPU, `fedweigh benchmark gpu-evidence --quick` runs every case at a tiny scale"
        )


def gpu_evidence(
    sim: Any,
    quick: bool,
    budget: float | None = None,
    runs_dir: Path | None = None,
    cases: list[str] | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every case (or those named in ``cases``), ordered by value per minute, within ``budget`` seconds
    (default :data:`DEFAULT_BUDGET_SECONDS`).

    Without ``quick`` it needs a CUDA GPU; with it, it runs on the CPU at a tiny scale.
    """
    if budget is not None and not 0 < budget < float("inf"):
        raise BenchmarkError(f"budget = {budget!r}: accepted: a number of seconds > 0, e.g. 720")
    if unknown := sorted(set(cases or ()) - set(CASE_NAMES)):
        raise BenchmarkError(f"cases = {unknown}: unknown; accepted: names of {', '.join(CASE_NAMES)}")
    if not quick:
        require_gpu()
    default_runs = Path("outputs") / ("gpu-evidence-quick" if quick else "gpu-evidence")
    ctx = Context(sim=sim, quick=quick, runs_dir=Path(runs_dir or default_runs).resolve())
    chosen = [case for case in ranked_cases(ctx) if cases is None or case.name in cases]
    report = run_cases(chosen, DEFAULT_BUDGET_SECONDS if budget is None else budget, progress)
    return {**report, "runs_dir": str(ctx.runs_dir), "device": "cpu" if quick else "cuda", "partial": False}
