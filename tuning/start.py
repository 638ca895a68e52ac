"""Given starting points of a study (``[tune] start_from``): controller configs enqueued as its
first trials, after the seed's point and the defaults (:func:`tuning.space.start_points`), so
the tuner starts from the hand-written settings a user would otherwise deploy and can only
improve on them.

Each entry is a table of the controller's config fields. It must be a point of the search
space: every field it sets is either searched (and within the tuned range) or holds the value
the study's trials run, so the enqueued trial runs exactly the config written.
"""

from __future__ import annotations

from typing import Any

from control import make_config
from control.configio import to_dict
from control.errors import ConfigError
from tuning.space import config_to_params, flatten, params_to_config, unflatten


def start_from_params(
    controller: str,
    entries: tuple[dict, ...] | list[dict],
    fixed: dict[str, Any] | None = None,
    where: str = "tune.start_from",
) -> list[dict[str, Any]]:
    """Trial params of each entry (a mapping of ``controller``'s config fields, dotted or
    nested); one-line :class:`ConfigError` naming ``where[i]`` and the field when an entry is
    not a valid config, clashes with a pinned field of ``fixed``, sets a field outside its tuned
    range, or sets a field the study does not search to a value its trials do not run."""
    fixed = dict(fixed or {})
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{at} = {entry!r}: expected a table of {controller} config fields")
        want = make_config(controller, unflatten(flatten(dict(entry))), source=at)
        flat = flatten(to_dict(want))
        for k, v in fixed.items():
            if flat.get(k) != v:
                raise ConfigError(
                    f"{at}: {k} = {flat.get(k)!r} clashes with the pinned {k} = {v!r}"
                )
        try:
            params = config_to_params(controller, want, fixed)
        except ValueError as e:
            raise ConfigError(f"{at}: {e}") from None
        ran = flatten(to_dict(params_to_config(controller, params, fixed)))
        for k in sorted(set(flat) | set(ran)):
            if flat.get(k) != ran.get(k):
                raise ConfigError(
                    f"{at}: {k} = {flat.get(k)!r} is not searched by the study "
                    f"(its trials run {k} = {ran.get(k)!r})"
                )
        out.append(params)
    return out


__all__ = ["start_from_params"]
