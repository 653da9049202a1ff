"""FedOUI's server half: a Beta fit of the round's OUIs, typicality scores, weights.

The FedOUI paper (Fernández-Hernández et al., "FedOUI: OUI-Guided Client
Weighting for Federated Aggregation", spec ``specs/fedoui.md`` §4) weighs each
client by how typical its OUI is among the round's: a Beta distribution fitted
to the OUI values (method of moments with the unbiased variance; Beta MLE,
then rank percentiles as fallbacks), a bilateral typicality score ``s_k = 2
min(F(o_k), 1 - F(o_k))`` and weights ``w_k ∝ max(n_k, 1)^rho (max(s_k, 0) +
eps)^gamma`` (:func:`~fedweigh.rules.base.score_weights`):
:func:`fedoui_weights` and :class:`OUIBetaRule`. The OUI itself is measured by
the clients (:mod:`fedweigh.methods.fedoui.client`) and arrives as the ``oui`` signal.

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
from typing import TYPE_CHECKING, Any

import numpy as np

from fedweigh.methods.declaration import Declaration, Method, RuleSpec
from fedweigh.methods.fedoui.protocol import OUI, FedOUISettings, OUIProbeSettings
from fedweigh.rules.base import RoundSignals, RuleOutcome, WeightingRule, check_exponents, score_weights
from fedweigh.strategies.library import MethodStrategy

if TYPE_CHECKING:
    from fedweigh.settings import Settings

CDF_CLIP = 1e-4
"""OUIs are clipped to ``[CDF_CLIP, 1 - CDF_CLIP]`` before the Beta CDF (spec §4 step 3)."""
SHAPE_FLOOR = 1e-6
"""Lower bound of the moment estimates of alpha and beta (spec §4 step 2)."""


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
    check_exponents(**{"gamma (score exponent)": gamma, "rho (size exponent)": rho})


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
    return score_weights(scores, num_examples, epsilon=epsilon, exponent=gamma, rho=rho), scores, fit


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
    signals = (OUI,)

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


def build_rule(settings: Settings) -> WeightingRule:
    """The rule ``[fedoui]`` describes."""
    options = settings.fedoui
    return OUIBetaRule(
        epsilon=options.epsilon,
        score_exponent=options.score_exponent,
        size_exponent=options.size_exponent,
        window=options.window,
    )


FEDOUI_RULE = RuleSpec("fedoui", build_rule, "fedoui", "FedOUI: Beta fit of the OUIs, w ∝ n_k (ε + typicality score)")
FEDOUI = Method("fedoui", FEDOUI_RULE, meaning="FedOUI: OUI-typicality weights")
_FEDOUI, _OUI = FedOUISettings(), OUIProbeSettings()


class FedOUI(MethodStrategy):
    """FedOUI: weights from the typicality of each client's OUI under a Beta fit of the round's OUIs.

    The client reports ``oui``, the Overfitting-Underfitting Indicator of a
    layer's pre-activations on a fixed probe batch after training
    (:func:`fedweigh.client.oui_signal`). ``w ∝ n^ρ (ε + s)^γ`` with ``s``
    the bilateral typicality score; ``window`` > 1 pools the last rounds'
    OUIs into the fit. Options as ``[fedoui]`` and ``[oui]``.
    """

    method = FEDOUI

    def __init__(
        self,
        *,
        epsilon: float = _FEDOUI.epsilon,
        window: int = _FEDOUI.window,
        score_exponent: float = _FEDOUI.score_exponent,
        size_exponent: float = _FEDOUI.size_exponent,
        probe_size: int = _OUI.probe_size,
        probe_layer: str = _OUI.probe_layer,
        probe_transform: str = _OUI.probe_transform,
        **kwargs: Any,
    ) -> None:
        fedoui = {
            "epsilon": epsilon,
            "window": window,
            "score_exponent": score_exponent,
            "size_exponent": size_exponent,
        }
        oui = {"probe_size": probe_size, "probe_layer": probe_layer, "probe_transform": probe_transform}
        super().__init__(options={"fedoui": fedoui, "oui": oui}, **kwargs)


DECLARATION = Declaration(methods=(FEDOUI,), rules=(FEDOUI_RULE,), strategies=(FedOUI,))
