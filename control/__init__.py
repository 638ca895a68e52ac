"""The shared speculative-decoding scheduler: pure, sans-IO, no clock.

``from control import make_controller, Observation, Decision``
"""

from control.base import Controller
from control.errors import ConfigError, DSparkError
from control.registry import (
    ENGINE_CONTROLLERS,
    controller_config_class,
    controller_names,
    make_config,
    make_controller,
)
from control.types import (
    POSITION_COLUMNS,
    RECORD_COLUMNS,
    Decision,
    Observation,
    PositionRecord,
    RoundRecord,
    records_from_rows,
    records_to_columns,
)

__all__ = [
    "ENGINE_CONTROLLERS",
    "POSITION_COLUMNS",
    "RECORD_COLUMNS",
    "ConfigError",
    "Controller",
    "DSparkError",
    "Decision",
    "Observation",
    "PositionRecord",
    "RoundRecord",
    "controller_config_class",
    "controller_names",
    "make_config",
    "make_controller",
    "records_from_rows",
    "records_to_columns",
]
