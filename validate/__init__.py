"""``dspark validate``: calibrate the simulator on the real engine and measure its prediction error.

``dspark`` wires the packages: this subpackage imports both ``sim`` and ``real`` (which never
import each other).
"""
