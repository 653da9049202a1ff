"""FedOUI: OUI-guided client weighting, and the cosine "FedAlign" baseline it is compared with.

Everything of the FedOUI paper (``../papers/004_75a76cd2df97b857.txt``,
spec ``specs/fedoui.md``) lives here:

* the **OUI** (Overfitting-Underfitting Indicator) of a batch of
  pre-activations, :func:`oui` (spec §2.1, paper Eqs. 1-4);
* the **server rule** (spec §4): a Beta distribution fitted to the round's OUI
  values (method of moments with the unbiased variance; Beta MLE, then rank
  percentiles as fallbacks), a bilateral typicality score
  ``s_k = 2 min(F(o_k), 1 - F(o_k))`` and weights
  ``w_k ∝ max(n_k, 1)^rho (max(s_k, 0) + eps)^gamma``: :func:`fedoui_weights`
  and :class:`OUIBetaRule`;
* the **client step** ``"oui"`` (spec §3): after local training, one no-grad,
  eval-mode forward pass of the trained model over a fixed per-client probe
  batch, with a hook on the model's ``probe_layer``: :class:`OUIProbe`;
* the paper's third baseline, **"FedAlign" as the authors ran it** (spec §7):
  ``w_k ∝ n_k^rho (max(0, cos(Δ_k, Δ̄)) + eps)^eta`` with ``Δ_k`` the client's
  update and ``Δ̄`` the round's size-weighted mean update. This is *not*
  Mendieta et al.'s FedAlign (the paper's ref. [9], a local regulariser); the
  name follows the authors' code, whose results the paper's tables report:
  :func:`update_cosines`, :func:`alignment_weights`, :class:`AlignmentRule`,
  :class:`FedAlign`;
* the builders registered as ``"fedoui"`` and ``"fedalign"``.

The settings sections (``[tool.flwr.app.config.fedoui]`` and ``.fedalign``)
are :class:`fedweigh.settings.FedOUISettings` and
:class:`fedweigh.settings.FedAlignSettings`; they live in the settings module
because they derive from its section base class.

Example
-------
>>> import numpy as np
>>> ouis = np.array([0.12646484375, 0.25732421875, 0.31005859375, 0.31787109375, 0.37158203125])
>>> weights, scores, fit = fedoui_weights(ouis, np.array([210, 226, 66, 40, 17]))
>>> fit.method, round(fit.alpha, 2), round(fit.beta, 2)
('moments', 6.1, 15.94)
>>> weights.round(4)
array([0.0538, 0.689 , 0.1534, 0.0854, 0.0184])
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from fedweigh.client.steps import ClientStep, Metrics, StepContext, register_step, with_steps
from fedweigh.strategies.base import RecipeValue, WeightedFedAvg
from fedweigh.strategies.replies import ClientReply
from fedweigh.strategies.weighting import RoundSignals, RuleOutcome, SignalCheck, WeightingRule, in_unit_interval

if TYPE_CHECKING:
    from fedweigh.settings import Settings

OUI = "oui"
"""Metric key of a client's OUI value."""
PROBE_SIZE_METRIC = "oui-probe-size"
"""Metric key of the number of probe samples the OUI was measured on."""
ALIGNMENT = "alignment"
"""Server signal of FedAlign: cosine of each client's update with the mean update."""

CDF_CLIP = 1e-4
"""OUIs are clipped to ``[CDF_CLIP, 1 - CDF_CLIP]`` before the Beta CDF (spec §4 step 3)."""
SHAPE_FLOOR = 1e-6
"""Lower bound of the moment estimates of alpha and beta (spec §4 step 2)."""
UNIFORM_BELOW = 1e-12
"""Raw weights summing to at most this give uniform weights (spec §4 step 4)."""
PROBE_SEED_STRIDE = 10007
"""The probe generator of partition ``k`` is seeded with ``seed + PROBE_SEED_STRIDE * k`` (spec §3)."""


# ---------------------------------------------------------------------------
# the OUI
# ---------------------------------------------------------------------------


def oui(pre_activations: torch.Tensor) -> float:
    """Overfitting-Underfitting Indicator of one batch of pre-activations.

    Every non-batch position is a unit (a ``[B, C, H, W]`` conv output has
    ``d = C*H*W`` units). A unit is *active* on a sample when its
    pre-activation is strictly positive (ReLU's on/off). With ``s_j`` the
    number of samples on which unit ``j`` is active, the OUI is the mean over
    units of the minority count ``min(s_j, B - s_j)`` divided by ``⌊B/2⌋``:
    0 when every unit is constant over the batch (always on, or dead), 1 when
    every unit is on for exactly half of the samples.

    Parameters
    ----------
    pre_activations : torch.Tensor
        Shape ``[B, ...]`` with at least one unit per sample (a 1-D tensor is
        ``B`` samples of one unit). Not modified.

    Returns
    -------
    float
        In ``[0, 1]``; an exact multiple of ``1 / (d ⌊B/2⌋)`` up to the one
        final division.

    Notes
    -----
    With fewer than two samples no unit can be split, so the OUI is 0.0
    (the authors' code does the same; spec §2.1). For odd ``B`` the minority
    count is at most ``⌊B/2⌋``, so the value stays in ``[0, 1]`` but can reach
    1 only for even ``B``.

    Raises
    ------
    ValueError
        If the tensor is 0-dimensional or has no units.

    Examples
    --------
    >>> import torch
    >>> oui(torch.tensor([[1.0, -1.0], [1.0, 2.0], [1.0, -3.0], [1.0, 0.5]]))
    0.5
    """
    values = torch.as_tensor(pre_activations)
    if values.dim() == 0:
        raise ValueError("pre_activations must have a batch dimension, got a scalar")
    batch = int(values.shape[0])
    units = values[0].numel() if batch > 0 else math.prod(values.shape[1:])
    if units == 0:
        raise ValueError(f"pre_activations of shape {tuple(values.shape)} have no units per sample")
    if batch < 2:
        return 0.0
    active = values.detach().reshape(batch, units) > 0
    on = active.sum(dim=0)
    minority = torch.minimum(on, batch - on)
    value = int(minority.sum().item()) / (units * (batch // 2))
    return min(max(value, 0.0), 1.0)


# ---------------------------------------------------------------------------
# Beta fit of the round's OUIs, typicality scores, weights
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BetaFit:
    """How the round's OUI distribution was modelled.

    Attributes
    ----------
    method : str
        ``"moments"`` (method of moments, unbiased variance), ``"mle"``
        (maximum likelihood, the first fallback) or ``"empirical"`` (rank
        percentiles, the last fallback; no Beta).
    alpha, beta : float or None
        The fitted shape parameters; ``None`` for ``"empirical"``.
    num_values : int
        How many OUI values the fit used (the round's, plus a window's).
    """

    method: str
    alpha: float | None
    beta: float | None
    num_values: int


def beta_moments(values: np.ndarray) -> tuple[float, float] | None:
    """Method-of-moments Beta fit with the unbiased (``ddof=1``) variance.

    ``m`` = mean, ``v`` = unbiased variance, ``c = m(1 - m)/v - 1``,
    ``alpha = m c``, ``beta = (1 - m) c`` (each at least 1e-6).

    Parameters
    ----------
    values : np.ndarray
        Points in ``(0, 1)`` (clip them first), shape ``(K,)``.

    Returns
    -------
    tuple of float, or None
        ``(alpha, beta)``, or None when the fit is invalid: fewer than two
        values, zero variance (all values identical, tested exactly: the
        rounded mean of identical values can differ from them and leave a
        spurious variance of 1e-33), or a variance of at least ``m(1 - m)``
        (over-dispersed: no Beta has these moments).

    Examples
    --------
    >>> alpha, beta = beta_moments(np.array([0.2, 0.3, 0.4]))
    >>> round(alpha, 6), round(beta, 6)
    (6.0, 14.0)
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2 or np.all(values == values[0]):
        return None  # identical values: zero variance, checked exactly (the rounded mean may differ from them)
    mean = float(values.mean())
    variance = float(values.var(ddof=1))
    if not (math.isfinite(mean) and math.isfinite(variance)) or variance <= 0:
        return None
    concentration = mean * (1.0 - mean) / variance - 1.0
    if not concentration > 0:
        return None
    return max(mean * concentration, SHAPE_FLOOR), max((1.0 - mean) * concentration, SHAPE_FLOOR)


def beta_mle(values: np.ndarray) -> tuple[float, float] | None:
    """Maximum-likelihood Beta fit on ``[0, 1]`` (``scipy.stats.beta.fit``, ``floc=0, fscale=1``).

    Returns
    -------
    tuple of float, or None
        ``(alpha, beta)``, or None when there are fewer than two values, the
        solver fails, or a shape is not finite and positive.
    """
    # scipy.stats is imported in the functions that use it, not at module
    # level: it costs most of a second, and only the server rule needs it.
    from scipy import stats

    values = np.asarray(values, dtype=np.float64)
    if values.size < 2:
        return None
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            alpha, beta, _, _ = stats.beta.fit(values, floc=0, fscale=1)
    except Exception:  # scipy raises FitSolverError, FitError or plain ValueError/RuntimeError
        return None
    alpha, beta = float(alpha), float(beta)
    if not (math.isfinite(alpha) and math.isfinite(beta) and alpha > 0 and beta > 0):
        return None
    return alpha, beta


def fit_oui_beta(values: np.ndarray, *, clip: float = 1e-3) -> BetaFit:
    """Fit a Beta to OUI values: moments, else MLE, else none (empirical).

    Parameters
    ----------
    values : np.ndarray
        OUIs in ``[0, 1]``; clipped to ``[clip, 1 - clip]`` for the fit.
    clip : float
        FedOUI's epsilon (spec §4 step 1).

    Examples
    --------
    >>> fit_oui_beta(np.array([0.3, 0.3, 0.3])).method
    'empirical'
    """
    clipped = np.clip(np.asarray(values, dtype=np.float64), clip, 1.0 - clip)
    for method, fit in (("moments", beta_moments), ("mle", beta_mle)):
        shapes = fit(clipped)
        if shapes is not None:
            return BetaFit(method, shapes[0], shapes[1], int(clipped.size))
    return BetaFit("empirical", None, None, int(clipped.size))


def bilateral_scores(ouis: np.ndarray, alpha: float, beta: float, *, cdf_clip: float = CDF_CLIP) -> np.ndarray:
    """Typicality ``s = 2 min(F(o), 1 - F(o))`` under Beta(alpha, beta) (paper Eq. 6).

    1 at the median, falling to 0 in both tails. The OUIs are clipped to
    ``[cdf_clip, 1 - cdf_clip]`` before the CDF.

    Examples
    --------
    >>> bilateral_scores(np.array([0.5]), 2.0, 2.0).tolist()
    [1.0]
    """
    from scipy import stats

    cdf = stats.beta.cdf(np.clip(np.asarray(ouis, dtype=np.float64), cdf_clip, 1.0 - cdf_clip), alpha, beta)
    return 2.0 * np.minimum(cdf, 1.0 - cdf)


def rank_percentile_scores(ouis: np.ndarray) -> np.ndarray:
    """Empirical fallback: ``p_k = rank_k / (K + 1)`` (average ranks), ``s_k = 2 min(p_k, 1 - p_k)``.

    Examples
    --------
    >>> rank_percentile_scores(np.array([0.1, 0.2, 0.3])).tolist()
    [0.5, 1.0, 0.5]
    """
    from scipy import stats

    ouis = np.asarray(ouis, dtype=np.float64)
    percentiles = stats.rankdata(ouis, method="average") / (ouis.size + 1)
    return 2.0 * np.minimum(percentiles, 1.0 - percentiles)


def _check_unit_values(name: str, values: np.ndarray) -> None:
    if values.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {values.shape}")
    if not np.all(np.isfinite(values)) or np.any(values < 0) or np.any(values > 1):
        raise ValueError(f"{name} = {values.tolist()} is invalid: OUIs must be finite and in [0, 1]")


def _check_parameters(epsilon: float, gamma: float, rho: float) -> None:
    if not (math.isfinite(epsilon) and 0.0 <= epsilon < 0.5):
        raise ValueError(f"epsilon = {epsilon!r} is invalid: accepted values are 0 <= epsilon < 0.5")
    for name, value in (("gamma (score exponent)", gamma), ("rho (size exponent)", rho)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} = {value!r} is invalid: accepted values are finite and >= 0")


def size_factors(num_examples: np.ndarray, rho: float) -> np.ndarray:
    """``max(n_k, 1)^rho``, divided by the largest (same weights once normalised, no overflow)."""
    sizes = np.maximum(np.asarray(num_examples, dtype=np.float64), 1.0)
    return (sizes / sizes.max()) ** rho


def _normalized_or_uniform(raw: np.ndarray) -> np.ndarray:
    total = float(raw.sum())
    if not total > UNIFORM_BELOW or not math.isfinite(total):
        return np.full(raw.size, 1.0 / raw.size)
    return raw / total


def fedoui_weights(
    ouis: np.ndarray,
    num_examples: np.ndarray,
    *,
    epsilon: float = 1e-3,
    gamma: float = 1.0,
    rho: float = 1.0,
    window_values: Sequence[float] | np.ndarray = (),
) -> tuple[np.ndarray, np.ndarray, BetaFit]:
    """FedOUI's aggregation weights for one round (spec §4).

    1. Fit Beta(alpha, beta) to the OUIs, clipped to ``[epsilon, 1 - epsilon]``
       (plus ``window_values``, OUIs of earlier rounds pooled into the fit
       only): moments with the unbiased variance, else MLE, else none.
    2. Score each current client: ``s_k = 2 min(F(o_k), 1 - F(o_k))``; if
       there is no Beta, or a score is not finite, rank percentiles among the
       current OUIs instead.
    3. ``w_k ∝ max(n_k, 1)^rho (max(s_k, 0) + epsilon)^gamma``, normalised
       (uniform if the raw weights sum to at most 1e-12).

    Parameters
    ----------
    ouis : np.ndarray
        This round's OUI per client, in ``[0, 1]``, shape ``(K,)``, K >= 1.
    num_examples : np.ndarray
        Training sample count per client, finite and >= 0, shape ``(K,)``.
    epsilon : float
        Stability constant and fit clip, ``0 <= epsilon < 0.5`` (paper: 1e-3).
    gamma : float
        Exponent of the score factor (paper: 1).
    rho : float
        Exponent of the size factor (paper: 1).
    window_values : sequence of float
        Earlier rounds' OUIs to pool into the fit; never scored.

    Returns
    -------
    weights : np.ndarray
        Finite, non-negative, summing to 1, shape ``(K,)``.
    scores : np.ndarray
        Typicality score per client in ``[0, 1]``, shape ``(K,)``.
    fit : BetaFit
        The fit used (``method="empirical"`` when the scores are rank
        percentiles).

    Raises
    ------
    ValueError
        On an OUI outside ``[0, 1]`` or not finite, mismatched shapes, a
        negative or non-finite sample count, or a parameter out of range.
    """
    ouis = np.asarray(ouis, dtype=np.float64)
    num_examples = np.asarray(num_examples, dtype=np.float64)
    pooled = np.asarray(window_values, dtype=np.float64).reshape(-1)
    _check_unit_values("ouis", ouis)
    _check_unit_values("window_values", pooled)
    if ouis.size == 0:
        raise ValueError("ouis is empty: need at least one client")
    if num_examples.shape != ouis.shape:
        raise ValueError(f"num_examples has shape {num_examples.shape}, expected {ouis.shape} like ouis")
    if not np.all(np.isfinite(num_examples)) or np.any(num_examples < 0):
        raise ValueError(f"num_examples = {num_examples.tolist()} is invalid: counts must be finite and >= 0")
    _check_parameters(epsilon, gamma, rho)

    fit = fit_oui_beta(np.concatenate([pooled, ouis]), clip=epsilon)
    scores = None
    if fit.alpha is not None and fit.beta is not None:
        scores = bilateral_scores(ouis, fit.alpha, fit.beta)
        if not np.all(np.isfinite(scores)):
            scores = None
    if scores is None:
        fit = BetaFit("empirical", None, None, fit.num_values)
        scores = rank_percentile_scores(ouis)
    raw = size_factors(num_examples, rho) * (np.maximum(scores, 0.0) + epsilon) ** gamma
    return _normalized_or_uniform(raw), scores, fit


class OUIBetaRule(WeightingRule):
    """FedOUI's server rule: :func:`fedoui_weights` on the clients' ``oui`` signal.

    Parameters
    ----------
    epsilon : float
        Stability constant and fit clip (``fedoui.epsilon``).
    score_exponent : float
        gamma (``fedoui.score-exponent``).
    size_exponent : float
        rho (``fedoui.size-exponent``).
    window : int
        1: fit the Beta on this round's OUIs only (the paper). k > 1: also pool
        the OUIs of the previous k - 1 aggregated rounds into the fit (still
        scoring only this round's clients). The history is the rule's
        :meth:`state`, so a resumed run continues exactly.

    Notes
    -----
    Diagnostics per round: ``beta-alpha``, ``beta-beta`` (None without a
    Beta), ``fit-method``, ``fit-size``, ``oui-mean``, ``oui-var`` (unbiased;
    0 for one client); per client: ``oui-score``.
    """

    name = "oui-beta"
    signals: ClassVar[Mapping[str, SignalCheck]] = {OUI: in_unit_interval}

    def __init__(
        self, *, epsilon: float = 1e-3, score_exponent: float = 1.0, size_exponent: float = 1.0, window: int = 1
    ) -> None:
        _check_parameters(epsilon, score_exponent, size_exponent)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window = {window!r} is invalid: accepted values are integers >= 1")
        self.epsilon = epsilon
        self.score_exponent = score_exponent
        self.size_exponent = size_exponent
        self.window = window
        self.history: list[list[float]] = []

    def __call__(self, round_signals: RoundSignals) -> RuleOutcome:
        ouis = np.asarray(round_signals.values[OUI], dtype=np.float64)
        pooled = [value for past in self.history for value in past]
        weights, scores, fit = fedoui_weights(
            ouis,
            round_signals.num_examples,
            epsilon=self.epsilon,
            gamma=self.score_exponent,
            rho=self.size_exponent,
            window_values=pooled,
        )
        if self.window > 1:
            self.history = [*self.history, [float(v) for v in ouis]][-(self.window - 1) :]
        diagnostics = {
            "beta-alpha": fit.alpha,
            "beta-beta": fit.beta,
            "fit-method": fit.method,
            "fit-size": fit.num_values,
            "oui-mean": float(ouis.mean()),
            "oui-var": float(ouis.var(ddof=1)) if ouis.size > 1 else 0.0,
            "oui-score": [float(s) for s in scores],
        }
        return RuleOutcome(weights, diagnostics)

    def state(self) -> dict[str, Any]:
        return {"history": [list(past) for past in self.history]}

    def load_state(self, state: Mapping[str, Any]) -> None:
        history = state.get("history", [])
        restored: list[list[float]] = []
        for past in history:
            values = np.asarray(past, dtype=np.float64)
            _check_unit_values("saved OUI history", values)
            restored.append([float(v) for v in values])
        self.history = restored[-(self.window - 1) :] if self.window > 1 else []


# ---------------------------------------------------------------------------
# client step: the OUI of the trained model on a fixed probe batch
# ---------------------------------------------------------------------------


def probe_indices(num_samples: int, probe_size: int, seed: int, partition_id: int) -> torch.Tensor:
    """Positions of a client's probe samples in its partition; the same every round.

    Drawn from a torch generator seeded with ``seed + 10007 * partition_id``:
    the first ``probe_size`` entries of a random permutation when the
    partition has that many samples, otherwise ``probe_size`` draws with
    replacement (so the probe always has ``probe_size`` samples).

    Examples
    --------
    >>> probe_indices(100, 4, seed=1, partition_id=3).tolist() == probe_indices(100, 4, 1, 3).tolist()
    True
    >>> len(probe_indices(3, 8, seed=1, partition_id=0))
    8
    """
    if num_samples < 1:
        raise ValueError(f"partition {partition_id} has no samples to probe")
    if probe_size < 1:
        raise ValueError(f"fedoui.probe-size = {probe_size!r} is invalid: accepted values are integers >= 1")
    generator = torch.Generator().manual_seed(seed + PROBE_SEED_STRIDE * partition_id)
    if num_samples >= probe_size:
        return torch.randperm(num_samples, generator=generator)[:probe_size]
    return torch.randint(0, num_samples, (probe_size,), generator=generator)


def resolve_probe_layer(model: nn.Module, layer: str) -> nn.Module:
    """The module to hook: ``layer`` if given, else the model's own ``probe_layer``."""
    name = layer or getattr(model, "probe_layer", "")
    if not name:
        raise ValueError(
            f"fedoui.probe-layer is empty and model {type(model).__name__} has no probe_layer attribute: "
            "set fedoui.probe-layer to the name of a submodule"
        )
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise ValueError(
            f"fedoui.probe-layer = {name!r} is not a submodule of {type(model).__name__}; accepted: "
            f"{', '.join(n for n, _ in model.named_modules() if n)}"
        ) from None


@torch.no_grad()
def probe_oui(model: nn.Module, layer: nn.Module, inputs: torch.Tensor) -> float:
    """OUI of ``layer``'s output when ``model`` runs on ``inputs`` in eval mode, without gradients.

    The forward hook is removed and every submodule's train/eval mode is
    restored afterwards, even if the forward pass fails.
    """
    captured: list[torch.Tensor] = []

    def keep_output(module: nn.Module, args: Any, output: Any) -> None:
        if not isinstance(output, torch.Tensor):
            raise ValueError(f"the probe layer {type(module).__name__} must output one tensor, got {type(output)}")
        captured.append(output.detach())

    modes = {module: module.training for module in model.modules()}
    handle = layer.register_forward_hook(keep_output)
    try:
        model.eval()
        model(inputs)
    finally:
        handle.remove()
        for module, training in modes.items():
            module.training = training
    if len(captured) != 1:
        raise ValueError(f"the probe layer ran {len(captured)} times in one forward pass; expected once")
    return oui(captured[0])


def _option(options: Mapping[str, Any], key: str, default: Any = None) -> Any:
    if key in options:
        return options[key]
    if default is None:
        raise ValueError(f"the train config lacks {key!r}; the fedoui strategy's recipe sets it")
    return default


@register_step("oui")
class OUIProbe(ClientStep):
    """After local training: the trained model's OUI on the client's fixed probe batch.

    Recipe options: ``oui.seed`` (the run seed; required), ``oui.probe-size``
    (B, default 32), ``oui.probe-layer`` (default: the model's
    ``probe_layer``). The probe images go through the evaluation transform
    (no augmentation), so the probe is the same every round (spec §3, A3).
    Replies ``{"oui": value, "oui-probe-size": B}``.
    """

    @classmethod
    def recipe(cls, settings: Settings) -> dict[str, RecipeValue]:
        return {
            "oui.seed": settings.seed,
            "oui.probe-size": settings.fedoui.probe_size,
            "oui.probe-layer": settings.fedoui.probe_layer,
        }

    def after_training(self, context: StepContext) -> Metrics:
        options = context.options
        seed = int(_option(options, "oui.seed"))
        probe_size = int(_option(options, "oui.probe-size", 32))
        layer = resolve_probe_layer(context.model, str(_option(options, "oui.probe-layer", "")))
        positions = probe_indices(len(context.data), probe_size, seed, context.partition_id)
        images = context.data.images[positions.to(context.data.images.device)]
        inputs = context.transform(images.to(context.device), train=False)
        return {OUI: probe_oui(context.model, layer, inputs), PROBE_SIZE_METRIC: float(probe_size)}


# ---------------------------------------------------------------------------
# FedAlign (cosine of each update with the round's mean update)
# ---------------------------------------------------------------------------


def update_cosines(
    models: Sequence[Mapping[str, np.ndarray]], reference: Mapping[str, np.ndarray], num_examples: np.ndarray
) -> np.ndarray:
    """``cos(Δ_k, Δ̄)`` for each client, over all floating tensors of the model.

    ``Δ_k = θ_k - θ`` (client model minus the global model it started from),
    ``Δ̄ = Σ_k (n_k / Σ n) Δ_k`` (the round's size-weighted mean update,
    including client k). The tensors are treated as one concatenated vector,
    computed tensor by tensor in float64 (no concatenated copy). A cosine is
    0 when either vector is zero; values are clipped to ``[-1, 1]``.

    Parameters
    ----------
    models : sequence of mappings
        Client models (same keys and shapes as ``reference``).
    reference : mapping
        The global model of the round.
    num_examples : np.ndarray
        Sample count per client, shape ``(K,)``.

    Examples
    --------
    >>> g = {"w": np.zeros(2)}
    >>> update_cosines([{"w": np.array([1.0, 0.0])}, {"w": np.array([0.0, 1.0])}], g, np.array([1, 1])).round(4)
    array([0.7071, 0.7071])
    """
    sizes = np.asarray(num_examples, dtype=np.float64)
    if len(models) == 0 or sizes.shape != (len(models),):
        raise ValueError(f"need one sample count per model, got {len(models)} models and shape {sizes.shape}")
    shares = sizes / sizes.sum() if sizes.sum() > 0 else np.full(len(models), 1.0 / len(models))
    dots = np.zeros(len(models))
    squared = np.zeros(len(models))
    mean_squared = 0.0
    for name, anchor in reference.items():
        if not np.issubdtype(np.asarray(anchor).dtype, np.floating):
            continue
        anchor64 = np.asarray(anchor, dtype=np.float64)
        deltas = [np.asarray(model[name], dtype=np.float64) - anchor64 for model in models]
        mean = sum(share * delta for share, delta in zip(shares, deltas, strict=True))
        mean_squared += float(np.vdot(mean, mean))
        for k, delta in enumerate(deltas):
            dots[k] += float(np.vdot(delta, mean))
            squared[k] += float(np.vdot(delta, delta))
    norms = np.sqrt(squared) * math.sqrt(mean_squared)
    cosines = np.divide(dots, norms, out=np.zeros(len(models)), where=norms > 0)
    return np.clip(cosines, -1.0, 1.0)


def alignment_weights(
    cosines: np.ndarray, num_examples: np.ndarray, *, epsilon: float = 1e-3, eta: float = 1.0, rho: float = 1.0
) -> np.ndarray:
    """``w_k ∝ max(n_k, 1)^rho (max(0, cos_k) + epsilon)^eta``, normalised (spec §7).

    Examples
    --------
    >>> alignment_weights(np.array([1.0, -0.5]), np.array([10, 10])).round(4)
    array([0.999, 0.001])
    """
    cosines = np.asarray(cosines, dtype=np.float64)
    num_examples = np.asarray(num_examples, dtype=np.float64)
    if cosines.ndim != 1 or cosines.size == 0 or num_examples.shape != cosines.shape:
        raise ValueError(f"need matching non-empty 1-D arrays, got {cosines.shape} and {num_examples.shape}")
    if not np.all(np.isfinite(cosines)) or np.any(np.abs(cosines) > 1):
        raise ValueError(f"cosines = {cosines.tolist()} is invalid: accepted values are finite and in [-1, 1]")
    if not np.all(np.isfinite(num_examples)) or np.any(num_examples < 0):
        raise ValueError(f"num_examples = {num_examples.tolist()} is invalid: counts must be finite and >= 0")
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon = {epsilon!r} is invalid: accepted values are finite and >= 0")
    for name, value in (("eta (alignment exponent)", eta), ("rho (size exponent)", rho)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} = {value!r} is invalid: accepted values are finite and >= 0")
    raw = size_factors(num_examples, rho) * (np.maximum(cosines, 0.0) + epsilon) ** eta
    return _normalized_or_uniform(raw)


class AlignmentRule(WeightingRule):
    """:func:`alignment_weights` on the ``alignment`` signal that :class:`FedAlign` derives.

    The signal comes from the server, not from the replies, so the rule asks
    the replies for nothing.
    """

    name = "update-alignment"
    signals: ClassVar[Mapping[str, SignalCheck]] = {}

    def __init__(self, *, epsilon: float = 1e-3, alignment_exponent: float = 1.0, size_exponent: float = 1.0) -> None:
        alignment_weights(np.ones(1), np.ones(1), epsilon=epsilon, eta=alignment_exponent, rho=size_exponent)
        self.epsilon = epsilon
        self.alignment_exponent = alignment_exponent
        self.size_exponent = size_exponent

    def __call__(self, round_signals: RoundSignals) -> RuleOutcome:
        if ALIGNMENT not in round_signals.values:
            raise ValueError(f"the {self.name} rule needs the '{ALIGNMENT}' server signal of the FedAlign strategy")
        cosines = round_signals.values[ALIGNMENT]
        weights = alignment_weights(
            cosines,
            round_signals.num_examples,
            epsilon=self.epsilon,
            eta=self.alignment_exponent,
            rho=self.size_exponent,
        )
        return RuleOutcome(weights, {"alignment-mean": float(np.mean(cosines))})


class FedAlign(WeightedFedAvg):
    """The cosine-alignment baseline of the FedOUI paper, as its authors ran it.

    Each round the server computes every valid client's ``cos(Δ_k, Δ̄)``
    (:func:`update_cosines`) as the ``alignment`` signal and weighs with
    :class:`AlignmentRule`. Local training is plain.
    """

    def server_signals(self, replies: list[ClientReply], reference: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        sizes = np.array([reply.num_examples for reply in replies], dtype=np.float64)
        return {ALIGNMENT: update_cosines([reply.arrays for reply in replies], reference, sizes)}


# ---------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------


def build_fedoui(settings: Settings, recipe: dict[str, RecipeValue], common: dict) -> WeightedFedAvg:
    """``strategy = "fedoui"``: :class:`OUIBetaRule` and the ``oui`` client step."""
    options = settings.fedoui
    rule = OUIBetaRule(
        epsilon=options.epsilon,
        score_exponent=options.score_exponent,
        size_exponent=options.size_exponent,
        window=options.window,
    )
    return WeightedFedAvg(rule, with_steps(recipe, settings, ["oui"]), **common)


def build_fedalign(settings: Settings, recipe: dict[str, RecipeValue], common: dict) -> WeightedFedAvg:
    """``strategy = "fedalign"``: :class:`FedAlign` with :class:`AlignmentRule`."""
    options = settings.fedalign
    rule = AlignmentRule(
        epsilon=options.epsilon, alignment_exponent=options.alignment_exponent, size_exponent=options.size_exponent
    )
    return FedAlign(rule, recipe, **common)
