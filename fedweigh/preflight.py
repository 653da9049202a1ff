"""The one check before training: settings, names, combinations, the data split.

:func:`check_run` is called once before anything trains: by ``fedweigh
simulate`` before it starts a SuperLink, by the experiment runner for every
run of a grid before the first one, and by the ServerApp (which plain
``flwr run`` may start) before it sends any message. It raises one
:class:`~fedweigh.settings.SettingsError` listing every problem, each naming
the setting, the value and what is accepted:

1. types, ranges and names (:func:`parse_settings`, with the
   :class:`~fedweigh.settings.Catalog` of every registry);
2. the dataset (:func:`dataset_problems`): found, and a local folder read
   in full: readable parquet files, labels, images of one size;
3. combinations (:func:`combination_problems`): an ``aggregation`` chosen
   for a strategy whose server update ignores weights, a strategy without
   the server data it needs, simulated delays that ``max-staleness`` would
   leave out entirely, client steps that cannot run on the chosen model, and
   a model (or OUI probe batch) far too large for this machine's memory
   (checked on the model built on PyTorch's ``meta`` device: no memory, no
   weights);
4. the run folder (:func:`run_folder_problems`): a folder that holds a run
   already is never written by another; a ``resume-from`` folder must hold a
   checkpoint that loads, fits the model and has rounds left, made with the
   same settings but those that may change (:func:`resume_problems`);
5. the federation and the data, when the number of partitions is known
   (:func:`federation_problems`): ``min-train-nodes``, ``min-round-replies``,
   ``fedbuff.buffer-size`` (a buffer no run of that length can fill), a
   resumed run's federation size, the split, and the server's own data
   (found, labelled, not empty, and brought to the clients' input shape);
6. the trackers ``tracking`` names (:func:`fedweigh.tracking.tracking_problems`):
   their packages installed, so that a missing one is named, with what to
   install, before anything trains.

Example
-------
>>> parse_settings({"aggregation": "fednolowe", "strategy": "fedprox"}).aggregation
'fednolowe'
>>> check_run({"aggregation": "fedoui", "oui.probe-layer": "conv1"})
Traceback (most recent call last):
...
fedweigh.settings.SettingsError: invalid run config:
  - aggregation = 'fedoui' runs the client step 'oui', which cannot run on model = 'mlp': \
oui.probe-layer = 'conv1' is not a submodule of DigitsMLP; accepted: flatten, fc1, relu1, fc2
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fedweigh.client.mc_dropout import ensure_mc_dropout
from fedweigh.client.registry import STEP_CLASSES
from fedweigh.components import batch_transform, data_spec, input_of, new_model, server_and_test_data
from fedweigh.data.federated import dataset_info, partition_sizes
from fedweigh.data.sources import check_local_dataset, validate_dataset_setting
from fedweigh.faults import STALL_TIMEOUT_LIMIT
from fedweigh.methods.catalog import STEPS
from fedweigh.methods.registry import METHODS, RULES, RunPlan, plan_run
from fedweigh.models import model_names, model_options
from fedweigh.models.finetuning import exchanged_state
from fedweigh.models.weights import WeightsUnavailable, fetch
from fedweigh.options import FLOAT32_MAX
from fedweigh.protocol import TrainRecipe
from fedweigh.results import CHECKPOINT_FILE, CONFIG_FILE, Checkpoint
from fedweigh.run_folder import recorded_partitions, recorded_settings, run_files, shaping_differences
from fedweigh.settings import Catalog, Settings, SettingsError, flatten, validate
from fedweigh.strategies.build import train_instruction
from fedweigh.strategies.sampling import sample_size
from fedweigh.strategies.updates import WeightedMean
from fedweigh.tracking import tracking_problems


def catalog() -> Catalog:
    """Every name a run config may use, from the registries."""
    return Catalog(
        strategies=list(METHODS),
        rules=list(RULES),
        steps=list(STEPS),
        models={name: model_options(name) for name in model_names()},
        dataset=validate_dataset_setting,
    )


def parse_settings(run_config: Mapping[str, Any]) -> Settings:
    """Types, ranges and names of a run config; raises :class:`SettingsError` listing every problem."""
    return validate(run_config, catalog())


def combination_problems(settings: Settings) -> list[str]:
    """Settings that are valid alone but not together, each naming both settings."""
    plan = plan_run(settings)
    problems = []
    update = plan.update
    if settings.aggregation and not update.uses_weights:
        problems.append(
            f"aggregation = {settings.aggregation!r} cannot be combined with strategy = {settings.strategy!r}: "
            f"its server update '{update.name}' does not use aggregation weights; accepted: aggregation = '' "
            "(the strategy's own)"
        )
    problems += _server_data_problems(settings, update.name, update.server_data)
    if settings.trimmed_mean > 0 and update is not WeightedMean:
        problems.append(
            f"trimmed-mean = {settings.trimmed_mean!r} replaces the weighted mean, but strategy = "
            f"{settings.strategy!r} updates the model with '{update.name}'; accepted: trimmed-mean = 0 with this "
            "strategy (update-norm-bound works with every strategy but fedmr), or a strategy whose server update is "
            "the mean"
        )
    problems += _adam_problems(settings, update.name)
    if settings.delay_std > 0 and settings.max_staleness == 0:
        problems.append(
            f"delay-std = {settings.delay_std!r} holds every reply back by a half-normal number of rounds, but "
            "max-staleness = 0 leaves out every reply that arrives late; accepted: max-staleness >= 1 "
            f"(about {math.ceil(3 * settings.delay_std)} keeps 99.7% of them)"
        )
    if "stall" in settings.faults.kind_list and settings.round_timeout > STALL_TIMEOUT_LIMIT:
        problems.append(
            f"faults.kinds = {settings.faults.kinds!r} makes stalling clients reply round-timeout + 1 s late, and "
            f"round-timeout = {settings.round_timeout!r} s: every round with a stalling client would wait that long; "
            f"accepted: round-timeout <= {STALL_TIMEOUT_LIMIT:g} with stall faults (e.g. round-timeout = 30)"
        )
    try:
        plan.rule.build(settings)
    except ValueError as err:
        problems.append(f"{plan.rule_origin}: {err}")
    if settings.mixed_precision == "fp16" and settings.device == "cpu":
        problems.append(
            "mixed-precision = 'fp16' needs a CUDA device, but device = 'cpu'; accepted: mixed-precision = 'bf16' "
            "or 'off' on a CPU, or device = 'cuda' / 'auto' on GPU machines"
        )
    if settings.model_pretrained:
        try:
            fetch(settings.model, settings.model_weights)  # downloads once, into the cache the clients read
        except WeightsUnavailable as err:
            problems.append(str(err))
    try:
        with torch.device("meta"):  # the architecture, fine-tuning included, without memory or weights
            model = new_model(settings, pretrained_weights=False)
    except ValueError as err:
        info = dataset_info(settings.dataset)
        shape = f"{info.in_channels}x{info.image_size}x{info.image_size}"
        accepted = "" if "accepted" in str(err) else f"; accepted: a model for dataset = {settings.dataset!r} ({shape})"
        return [*problems, f"model = {settings.model!r} cannot be built as the settings say: {err}{accepted}"]
    except (TypeError, RuntimeError, OverflowError) as err:  # sizes too large for torch's 64-bit shapes
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return [
            *problems,
            f"model = {settings.model!r}{_model_sizes(settings)} cannot be built ({reason}); "
            "accepted: sizes that fit in memory",
        ]
    problems += _memory_problems(settings, plan, model)
    problems += update.model_problems(settings, model)
    if settings.normalization == "feature":
        try:
            batch_transform(settings)
        except ValueError as err:
            problems.append(f"model = {settings.model!r}: {err}")
    if settings.channel_statistics is not None:
        try:
            batch_transform(settings)
        except ValueError as err:
            problems.append(
                f"normalization-mean = {settings.normalization_mean!r} and normalization-std = "
                f"{settings.normalization_std!r} do not fit model = {settings.model!r} on dataset = "
                f"{settings.dataset!r}: {err}; accepted: one value per channel of the model's input"
            )
    if settings.final_uncertainty:
        try:
            ensure_mc_dropout(model, settings.ufl.dropout)
        except ValueError as err:
            problems.append(
                f"final-uncertainty = {settings.final_uncertainty} needs MC dropout, which model = {settings.model!r} "
                f"cannot give: {err}; accepted: 0 (off) with this model"
            )
    if plan.steps:
        instruction = train_instruction(settings, plan)
        for name, origin in plan.steps:
            try:
                STEP_CLASSES[name].check_model(model, instruction)
            except ValueError as err:
                problems.append(
                    f"{origin} runs the client step '{name}', which cannot run on model = {settings.model!r}: {err}"
                )
    return problems


def _adam_problems(settings: Settings, update: str) -> list[str]:
    """Adam learning rates whose first step, lr / (1 - beta1), torch cannot hold in a float32 (it raised mid-run)."""
    server_beta1 = TrainRecipe.adam_beta1  # the server's own Adam (Center, Fed+FT, Feddle) keeps the defaults
    rates = [("learning-rate", settings.learning_rate, settings.adam_beta1)] if settings.optimizer == "adam" else []
    rates += {
        "center": [("center.learning-rate", settings.center.learning_rate, server_beta1)],
        "fedft": [("fedft.learning-rate", settings.fedft.learning_rate, server_beta1)],
        "feddle": [("feddle.head-lr", settings.feddle.head_lr, server_beta1)]
        + (
            [("feddle.search-lr", settings.feddle.search_lr, server_beta1)]
            if settings.feddle.search_optimizer == "adam"
            else []
        ),
    }.get(update, [])
    problems = []
    for key, rate, beta1 in rates:
        if rate / (1.0 - beta1) > FLOAT32_MAX:
            beta = " and adam-beta1" if key == "learning-rate" else ""
            problems.append(
                f"{key} = {rate!r} makes Adam's first step lr / (1 - beta1) = {rate / (1.0 - beta1):.3g}, more than "
                f"torch's float32 holds; accepted: {key} <= {FLOAT32_MAX * (1.0 - beta1):.3g} (with this beta1{beta})"
            )
    return problems


def _model_sizes(settings: Settings) -> str:
    """`` with model-hidden = '...'``: the settings that make the model larger, those that are set."""
    sizes = {
        "model-width": settings.model_width,
        "model-hidden": settings.model_hidden,
        "model-input-size": settings.model_input_size,
    }
    named = [f"{key} = {value!r}" for key, value in sizes.items() if value]
    return f" with {', '.join(named)}" if named else ""


def machine_memory() -> int | None:
    """This machine's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def model_memory(model: torch.nn.Module, input_shape: tuple[int, ...]) -> tuple[int, int]:
    """``(bytes of parameters and buffers, bytes of the activations of one image)`` of a model on the meta device.

    The activations are the outputs of every leaf module in one forward pass
    of one image; 0 when the model cannot run on the meta device.
    """
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    outputs: list[int] = []

    def record(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            outputs.append(output.numel() * output.element_size())

    leaves = [module for module in model.modules() if not list(module.children())]
    hooks = [module.register_forward_hook(record) for module in leaves]
    training = model.training
    try:
        with torch.no_grad():
            model.eval()(torch.empty(input_shape, device="meta"))
    except Exception:  # noqa: BLE001 - an estimate: a model that cannot run on meta is not judged by it
        outputs = []
    finally:
        for hook in hooks:
            hook.remove()
        model.train(training)
    return weights, sum(outputs)


def _memory_problems(settings: Settings, plan: RunPlan, model: torch.nn.Module) -> list[str]:
    """A model, or the OUI probe batch, that cannot fit in this machine's memory (sizes far off, not a budget)."""
    available = machine_memory()
    if not available:
        return []
    info, needs = dataset_info(settings.dataset), input_of(settings)
    size = needs.size or info.image_size
    image = (1, needs.channels or info.in_channels, size, size)
    weights, activations = model_memory(model, image)
    per_image = activations + 4 * math.prod(image)
    gib = 2**30
    problems = []
    training = 3 * weights + 2 * per_image  # weights, gradients, optimizer state; one image forward and back
    if training > available:
        problems.append(
            f"model = {settings.model!r}{_model_sizes(settings)} needs about {training / gib:,.1f} GiB to train "
            f"(weights {weights / gib:,.1f} GiB, one image's activations {per_image / gib:,.1f} GiB), more than "
            f"this machine's {available / gib:,.1f} GiB; accepted: a model that fits (smaller sizes)"
        )
    probe = settings.oui.probe_size * per_image
    if "oui" in [name for name, _ in plan.steps] and weights + probe > available:
        problems.append(
            f"oui.probe-size = {settings.oui.probe_size} images need about {probe / gib:,.1f} GiB in one batch, "
            f"more than this machine's {available / gib:,.1f} GiB; accepted: a probe batch that fits "
            f"(at most about {max(2, int((available - weights) // max(per_image, 1))):,} images)"
        )
    return problems


def _server_data_problems(settings: Settings, update: str, kinds: tuple[str, ...]) -> list[str]:
    """A strategy whose server update needs data of its own that the settings do not give it."""
    if not kinds or (update == "feddle" and not settings.feddle.search):
        return []
    given = "id" if settings.server_data == "id" else ("ood" if settings.server_data else "")
    if given in kinds:
        return []
    accepted = " or ".join(
        {"id": "'id' (held out of the test split)", "ood": "a dataset (out-of-distribution)"}[kind] for kind in kinds
    )
    extra = "; or feddle.search = false (its fallback step alone)" if update == "feddle" else ""
    return [
        f"strategy = {settings.strategy!r} trains on the server's own data, but server-data = "
        f"{settings.server_data!r}; accepted: server-data = {accepted}{extra}"
    ]


def dataset_problems(settings: Settings) -> list[str]:
    """The data the ``dataset`` setting names: found, readable, labelled, of one image size (empty when fine).

    A local folder is read in full (:func:`fedweigh.data.sources.check_local_dataset`),
    once per process; any source is described (classes, channels, size).
    """
    try:
        check_local_dataset(settings.dataset)
        dataset_info(settings.dataset)
    except ValueError as err:
        text = str(err)
        if text.startswith("invalid setting dataset = "):
            return [text.removeprefix("invalid setting ")]
        return [f"dataset = {settings.dataset!r}: {text}"]
    return []


def _split_settings(settings: Settings) -> str:
    """``partitioner = 'dirichlet', dirichlet-alpha = 0.5, ...``: the settings that shape the split, as set."""
    by_partitioner = {
        "dirichlet": ("dirichlet-alpha", "min-partition-size", "dirichlet-self-balancing", "partition-top-up"),
        "soft-capped-dirichlet": ("dirichlet-alpha", "min-partition-size"),
        "niid-bench-dirichlet": ("dirichlet-alpha", "min-partition-size"),
        "pathological": ("classes-per-client",),
        "shard": ("shards-per-client",),
    }
    keys = [*by_partitioner.get(settings.partitioner, ()), "train-subset", "rare-clients", "noisy-clients"]
    values = settings.model_dump(by_alias=True)
    shown = [f"{key} = {values[key]!r}" for key in keys if values[key] or key == "dirichlet-alpha"]
    return ", ".join([f"partitioner = {settings.partitioner!r}", *shown])


def data_problems(settings: Settings, num_partitions: int) -> list[str]:
    """Why the data cannot be split ``num_partitions`` ways, or the server's data not used (empty when fine)."""
    accepted = (
        "accepted: at most as many partitions as the training samples allow "
        "(fewer SuperNodes, a larger train-subset, partition-top-up = true, or a different partitioner)"
    )
    prefix = f"dataset = {settings.dataset!r} with {num_partitions} partitions ({_split_settings(settings)})"
    try:
        sizes = partition_sizes(data_spec(settings, num_partitions))
    except (IndexError, ValueError) as err:  # Flower Datasets' partitioners fail this way
        return [f"{prefix} cannot be split: {err}; {accepted}"]
    empty = [index for index, size in enumerate(sizes) if size == 0]
    if empty:
        return [f"{prefix} leaves partitions {empty[:10]} empty; {accepted}"]
    if settings.server_data or settings.test_holdout:
        try:
            server_and_test_data(settings, num_partitions)
        except ValueError as err:
            return [str(err)]
    return []


def run_folder_problems(settings: Settings) -> list[str]:
    """A run folder this run must not write, or a checkpoint it cannot resume (empty when fine).

    Without ``resume-from``: a folder ``output-dir/run-name`` that holds a run
    already (:func:`fedweigh.run_folder.run_files`) is refused, naming the two
    ways on. With it: :func:`resume_problems`.
    """
    if settings.resume_from:
        return resume_problems(settings)
    if not settings.run_name:  # the ServerApp makes a new, time-stamped name
        return []
    folder = Path(settings.output_dir).expanduser() / settings.run_name
    found = run_files(folder)
    if not found:
        return []
    return [
        f"run-name = {settings.run_name!r}: {folder} already holds a run ({', '.join(found)}), which this run "
        f"would overwrite; accepted: another run-name, or resume-from = {str(folder)!r} to continue that run"
    ]


def resume_problems(settings: Settings) -> list[str]:
    """Why the run in ``resume-from`` cannot be continued with these settings (empty when it can).

    The folder's checkpoint must load (:meth:`~fedweigh.results.Checkpoint.load`),
    hold fewer rounds than ``num-server-rounds``, and fit the model; every
    setting that shapes the run must equal the one in the folder's
    ``config.json`` (all but :data:`~fedweigh.run_folder.RESUME_MAY_CHANGE`),
    each that differs named.
    """
    folder = Path(settings.resume_from).expanduser()
    where = f"resume-from = {settings.resume_from!r}"
    if not (folder / CHECKPOINT_FILE).is_file():
        return [f"{where}: no {CHECKPOINT_FILE} there; accepted: the folder of an earlier run of this app"]
    try:
        checkpoint = Checkpoint.load(folder / CHECKPOINT_FILE)
    except ValueError as err:
        return [str(err).removeprefix("setting ")]
    problems = []
    if checkpoint.round >= settings.num_server_rounds:
        problems.append(
            f"{where}: the run there already holds {checkpoint.round} rounds, and num-server-rounds = "
            f"{settings.num_server_rounds}; accepted: num-server-rounds above {checkpoint.round} to run more rounds"
        )
    recorded = recorded_settings(folder)
    if recorded is None:
        return [
            *problems,
            f"{where}: {folder / CONFIG_FILE} is missing or unreadable, so the settings of the run there cannot be "
            "compared with these; accepted: the folder of an earlier run of this app, as that run wrote it",
        ]
    differences = shaping_differences(recorded, flatten(settings.model_dump(by_alias=True)))
    for key, was, now in differences:
        problems.append(
            f"{key} = {now!r}, but the run in {folder} was made with {key} = {was!r}, and a resumed run keeps "
            f"every setting that shapes it; accepted: {key} = {was!r} (or a new run, without resume-from)"
        )
    if not differences:
        problems += _checkpoint_model_problems(settings, checkpoint, where)
    return problems


def _checkpoint_model_problems(settings: Settings, checkpoint: Checkpoint, where: str) -> list[str]:
    """The checkpoint's tensors against the model the settings build (names and shapes, on the meta device)."""
    try:
        with torch.device("meta"):
            model = new_model(settings, pretrained_weights=False)
    except (ValueError, TypeError, RuntimeError, OverflowError):
        return []  # combination_problems says why the model cannot be built
    wanted = {name: tuple(tensor.shape) for name, tensor in exchanged_state(model).items()}
    held = {name: tuple(array.shape) for name, array in checkpoint.arrays.items()}
    if wanted == held:
        return []
    missing, extra = sorted(set(wanted) - set(held)), sorted(set(held) - set(wanted))
    resized = [
        f"{name} {held[name]} not {wanted[name]}"
        for name in sorted(set(wanted) & set(held))
        if held[name] != wanted[name]
    ]
    parts = [f"{len(missing)} missing {missing[:3]}"] * bool(missing) + [f"{len(extra)} extra {extra[:3]}"] * bool(
        extra
    )
    parts += [f"shapes {', '.join(resized[:3])}"] * bool(resized)
    return [
        f"{where}: its checkpoint's model does not fit model = {settings.model!r}{_model_sizes(settings)} "
        f"({'; '.join(parts)}); accepted: the model settings the run was made with"
    ]


def federation_problems(settings: Settings, num_partitions: int, with_data: bool = True) -> list[str]:
    """What cannot work with a federation of ``num_partitions`` nodes (empty when fine).

    ``min-train-nodes`` above it; ``min-round-replies`` above the clients a
    round samples (a round could then never close at its deadline); a FedBuff
    buffer larger than the updates all rounds can bring (it would never step);
    a resumed
    run on a federation of another size than its own (other partitions); and,
    ``with_data``, the data split (:func:`data_problems`) when all else is fine.
    """
    problems = []
    if settings.min_train_nodes > num_partitions:
        problems.append(
            f"min-train-nodes = {settings.min_train_nodes} waits for more nodes than the federation's "
            f"{num_partitions}; accepted: min-train-nodes <= {num_partitions} (or more SuperNodes)"
        )
    sampled = sample_size(num_partitions, settings.fraction_train, settings.min_train_nodes)
    if settings.round_deadline > 0 and settings.min_round_replies > sampled:
        problems.append(
            f"min-round-replies = {settings.min_round_replies} is more than the {sampled} clients a round samples "
            f"(fraction-train = {settings.fraction_train!r} of {num_partitions} nodes, at least min-train-nodes = "
            f"{settings.min_train_nodes}), so no round could close at its round-deadline = "
            f"{settings.round_deadline!r} s; accepted: min-round-replies <= {sampled}"
        )
    problems += _buffer_problems(settings, sampled, num_partitions)
    recorded = recorded_partitions(settings.resume_from) if settings.resume_from else None
    if recorded is not None and recorded != num_partitions:
        problems.append(
            f"resume-from = {settings.resume_from!r}: the run there was split into {recorded} partitions, one per "
            f"node, and this federation has {num_partitions}; accepted: a federation of {recorded} nodes "
            f"(fedweigh simulate --num-supernodes {recorded}), as the run had"
        )
    if problems or not with_data:
        return problems
    return data_problems(settings, num_partitions)


def _buffer_problems(settings: Settings, sampled: int, num_partitions: int) -> list[str]:
    """A FedBuff buffer larger than all the updates the run can ever receive: it would never step."""
    buffer_size = settings.fedbuff.buffer_size
    arriving = settings.num_server_rounds * sampled
    if METHODS[settings.strategy].update.name != "fedbuff" or buffer_size <= arriving:
        return []
    return [
        f"strategy = {settings.strategy!r} with fedbuff.buffer-size = {buffer_size} would never step: at most "
        f"num-server-rounds = {settings.num_server_rounds} x {sampled} clients a round (fraction-train = "
        f"{settings.fraction_train!r} of {num_partitions} nodes, at least min-train-nodes = "
        f"{settings.min_train_nodes}) = {arriving} updates ever arrive; accepted: fedbuff.buffer-size <= {arriving}, "
        "or 0 (a step every round on what arrived)"
    ]


def check_run(run_config: Mapping[str, Any], num_partitions: int | None = None) -> Settings:
    """Everything that can be checked before training; the settings, or one error listing every problem.

    Parameters
    ----------
    run_config : Mapping
        The full flat run config (the app's defaults with overrides applied).
    num_partitions : int, optional
        The federation's size; without it the data split is not checked.
    """
    settings = parse_settings(run_config)
    problems = (dataset_problems(settings) or combination_problems(settings)) + tracking_problems(settings)
    problems += run_folder_problems(settings)
    if num_partitions is not None:
        problems += federation_problems(settings, num_partitions, with_data=not problems)
    if problems:
        raise SettingsError(problems)
    return settings
