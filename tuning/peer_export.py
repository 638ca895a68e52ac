"""A controller config as what a user pastes into vLLM or SGLang, and back.

``export_config(controller, config, "vllm" | "sglang")`` gives the server's settings for the
controllers it can run: vLLM's ``--speculative-config`` JSON (``num_speculative_tokens``,
``num_speculative_tokens_per_batch_size``, ``enable_adaptive_k`` and its knobs, or
``enable_adaptive_verification``), SGLang's flags and ``--speculative-adaptive-config`` JSON.
Nothing is approximated silently:

- a controller the server has no setting for (``dspark``'s per-sequence planning, the lab's
  other heuristics, the other server's peers, lossy threshold verification) is a one-line
  :class:`DSparkError` that says why and what to tune instead;
- a field the lab models but the server does not let a user set (the lab's estimator of
  adaptive verification) gives one ``not expressible`` note when it differs from its
  default: the server runs its own.

``parse_vllm`` / ``parse_sglang`` map a server's settings back to a controller config, so an
export round-trips exactly (tested: export, parse, simulate, same summary).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from control import make_config
from control.errors import ConfigError, DSparkError
from control.peer_common import dsd_rows, table_fields

TARGETS = ("vllm", "sglang")

#: vLLM's Adaptive K keys and the config fields they set.
ADAPTIVE_K_KEYS = {
    "adaptive_k_ema_alpha": "ema_alpha",
    "adaptive_k_c_draft": "c_draft",
    "adaptive_k_min_tokens": "min_tokens",
    "adaptive_k_cooldown_steps": "cooldown_steps",
    "adaptive_k_bs_penalty": "bs_penalty",
    "adaptive_k_alpha_prior": "alpha_prior",
}
#: SGLang's ``--speculative-adaptive-config`` keys (the config fields of the same names).
SGLANG_KEYS = (
    "candidate_steps",
    "ema_alpha",
    "warmup_batches",
    "update_interval",
    "down_hysteresis",
    "up_hysteresis",
)
#: Fields of adaptive verification that model vLLM's internals (no user setting), and why.
VERIFICATION_INTERNAL = {
    "acceptance_source": "vLLM reads the drafter's confidence head when it has one, else its "
    "online estimator",
    "memory_rounds": "vLLM's per-request estimates are its own",
    "pooled_memory_rounds": "vLLM's online estimator is its own",
    "prior_trials": "vLLM's online estimator is its own",
    "alpha_prior": "vLLM's online estimator is its own",
    "cost_forget": "vLLM profiles its step costs at start-up and keeps them",
    "profile_prior_rounds": "vLLM profiles its step costs at start-up and keeps them",
}
#: Why the controllers no server runs cannot be exported.
_NO_EQUIVALENT = {
    "dspark": "its per-sequence goodput planning (one cap per round, each sequence stopping on "
    "its own evidence, costs learned online, SLO trims) has no server setting",
    "hf-heuristic": "Hugging Face's assistant schedule has no server setting",
    "confidence-stop": "a drafter-confidence stop has no server setting",
    "ema-hysteresis": "the lab's EMA ladder is not SGLang's policy (tune sglang-adaptive)",
    "analytic": "the lab's analytic choice of k has no server setting",
    "clairvoyant": "a reference told the future runs in the simulator only",
    "rate-oracle": "a reference told true rates runs in the simulator only",
}


@dataclass(frozen=True)
class Export:
    """What to paste: ``config`` (the JSON object), the server ``flags`` around it, and
    ``notes`` (one line per setting the server cannot express)."""

    target: str
    controller: str
    config: dict
    flags: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def json(self) -> str:
        return json.dumps(self.config)

    def text(self) -> str:
        """The printout: comment lines, the flags, the JSON, the notes."""
        if self.target == "vllm":
            head = [
                (
                    f"# vLLM ({self.controller}): --speculative-config; add your drafter's "
                    '"method" and "model" keys'
                ),
                self.json,
            ]
        else:
            head = [
                (
                    f"# SGLang ({self.controller}): launch flags; add your drafter's "
                    "--speculative-draft-model-path"
                ),
                " ".join(self.flags),
            ]
            if self.config:
                head += ["# adaptive_spec.json (--speculative-adaptive-config):", self.json]
        return "\n".join(head + [f"# not expressible in {self.target}: {n}" for n in self.notes])


def _refuse(controller: str, target: str, why: str) -> DSparkError:
    return DSparkError(f"controller '{controller}' cannot be expressed in {target}: {why}")


def _strict_fixed_k(controller: str, config: Any, target: str) -> int:
    if config.mode != "strict":
        raise _refuse(controller, target, "threshold (lossy) verification has no server setting")
    if config.k == 0:
        raise _refuse(controller, target, "k = 0 is plain serving: start it without speculation")
    return config.k


def _table(config: Any) -> list[list[int]]:
    return [list(r) for r in dsd_rows(config)]


def _vllm(controller: str, config: Any) -> Export:
    if controller == "fixed":
        return Export(
            "vllm",
            controller,
            {"num_speculative_tokens": _strict_fixed_k(controller, config, "vllm")},
        )
    if not controller.startswith("vllm-"):
        why = _NO_EQUIVALENT.get(controller, "vLLM has no such policy (tune a vllm-* peer)")
        raise _refuse(controller, "vllm", why)
    out: dict[str, Any] = {"num_speculative_tokens": config.num_speculative_tokens}
    if config.rows:
        out["num_speculative_tokens_per_batch_size"] = _table(config)
    notes: list[str] = []
    if controller == "vllm-adaptive-k":
        out["enable_adaptive_k"] = True
        out.update({k: getattr(config, f) for k, f in ADAPTIVE_K_KEYS.items()})
    elif controller == "vllm-adaptive-verification":
        out["enable_adaptive_verification"] = True
        default = type(config)()
        if config.rows and config.dsd_budget != "exact":
            notes.append(
                f"dsd_budget = '{config.dsd_budget}' (vLLM's budget with a table is N x K of "
                "the table; the server runs that)"
            )
        for name, why in VERIFICATION_INTERNAL.items():
            if getattr(config, name) != getattr(default, name):
                notes.append(f"{name} = {getattr(config, name)!r} ({why})")
    return Export("vllm", controller, out, notes=tuple(notes))


def _sglang_flags(steps: int, adaptive: bool) -> tuple[str, ...]:
    flags = [
        "--speculative-algorithm EAGLE",
        "--speculative-eagle-topk 1",
        f"--speculative-num-steps {steps}",
        f"--speculative-num-draft-tokens {steps + 1}",
    ]
    if adaptive:
        flags += ["--speculative-adaptive", "--speculative-adaptive-config adaptive_spec.json"]
    return tuple(flags)


def _sglang(controller: str, config: Any) -> Export:
    if controller == "fixed":
        k = _strict_fixed_k(controller, config, "sglang")
        return Export("sglang", controller, {}, _sglang_flags(k, False))
    if controller != "sglang-adaptive":
        why = _NO_EQUIVALENT.get(controller, "SGLang has no such policy (tune sglang-adaptive)")
        raise _refuse(controller, "sglang", why)
    out = {k: getattr(config, k) for k in SGLANG_KEYS}
    out["candidate_steps"] = list(config.candidate_steps)
    return Export("sglang", controller, out, _sglang_flags(config.num_steps, True))


def export_config(controller: str, config: Any, target: str) -> Export:
    """The settings of ``target`` ("vllm" or "sglang") that run ``controller`` with ``config``
    (a checked config, a mapping, or None for defaults); a one-line DSparkError when none do."""
    if target not in TARGETS:
        raise DSparkError(f"unknown export target '{target}'; allowed: {', '.join(TARGETS)}")
    cfg = make_config(controller, config)
    return _vllm(controller, cfg) if target == "vllm" else _sglang(controller, cfg)


# ----------------------------------------------------------------------------- parse back
def _expect(spec: Any, where: str) -> dict:
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(spec).__name__}")
    return spec


def parse_vllm(spec: Any, where: str = "--speculative-config") -> tuple[str, Any]:
    """``(controller, config)`` of a vLLM ``--speculative-config`` object: adaptive
    verification, Adaptive K, a Dynamic SD table, or a fixed ``num_speculative_tokens``."""
    spec = _expect(spec, where)
    if "num_speculative_tokens" not in spec:
        raise ConfigError(f"{where}: no num_speculative_tokens")
    fields: dict[str, Any] = {"num_speculative_tokens": spec["num_speculative_tokens"]}
    table = spec.get("num_speculative_tokens_per_batch_size")
    if table is not None:
        fields.update(table_fields(table, f"{where}.num_speculative_tokens_per_batch_size"))
    if spec.get("enable_adaptive_verification") or spec.get("adaptive_verification"):
        name = "vllm-adaptive-verification"
        fields.setdefault("rows", 0)
    elif spec.get("enable_adaptive_k"):
        name = "vllm-adaptive-k"
        fields.setdefault("rows", 0)
        fields.update({f: spec[k] for k, f in ADAPTIVE_K_KEYS.items() if k in spec})
    elif table is not None:
        name = "vllm-dsd"
    else:
        return "fixed", make_config("fixed", {"k": spec["num_speculative_tokens"]}, source=where)
    return name, make_config(name, fields, source=where)


def parse_sglang(
    num_steps: int, adaptive: Any = None, where: str = "--speculative-adaptive-config"
) -> tuple[str, Any]:
    """``(controller, config)`` of SGLang's ``--speculative-num-steps`` and, with
    ``--speculative-adaptive``, its adaptive config object (None: plain fixed steps)."""
    if adaptive is None:
        return "fixed", make_config("fixed", {"k": num_steps}, source=where)
    spec = _expect(adaptive, where)
    unknown = sorted(set(spec) - set(SGLANG_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key '{unknown[0]}'; allowed: {', '.join(SGLANG_KEYS)}")
    return "sglang-adaptive", make_config(
        "sglang-adaptive", {**spec, "num_steps": num_steps}, source=where
    )


def same_config(a: Any, b: Any) -> bool:
    """Field-by-field equality of two config dataclasses."""
    return dataclasses.asdict(a) == dataclasses.asdict(b)
