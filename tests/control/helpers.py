"""Small builders shared by the control tests."""

from __future__ import annotations

from control.types import Observation

#: Every registered controller, in the registry's order (what ``controller_names`` must list).
CONTROLLER_NAMES = (
    "fixed",
    "hf-heuristic",
    "confidence-stop",
    "ema-hysteresis",
    "analytic",
    "dspark",
    "clairvoyant",
    "rate-oracle",
    "vllm-dsd",
    "vllm-adaptive-k",
    "vllm-adaptive-verification",
    "sglang-adaptive",
)


def obs(
    drafted: int,
    accepted: int,
    *,
    now_s: float = 0.0,
    draft_s: float = 0.0,
    verify_s: float = 0.0,
    emitted: int = -1,
    ends: tuple[int, ...] = (),
    lossy: int = 0,
    conf: tuple[float, ...] = (),
) -> Observation:
    return Observation(
        now_s=now_s,
        drafted=drafted,
        accepted=accepted,
        confidences=conf,
        draft_s=draft_s,
        verify_s=verify_s,
        lossy_accepts=lossy,
        emitted=emitted,
        sentence_ends=ends,
    )


def run(ctrl, observations) -> list:
    """decide/observe over ``observations``; returns the decisions made before each round
    plus the one after the last."""
    out = []
    for o in observations:
        out.append(ctrl.decide(o.now_s))
        ctrl.observe(o)
    out.append(ctrl.decide(0.0))
    return out
