"""Validation: calibrate the simulator on the real engine and measure its prediction error.

The lab's third job (``dspark validate`` runs it). It sits above ``sim`` and ``real`` (which
never import each other) and beside ``tuning``: it may import ``control``, ``sim``, ``real``
and ``tuning``; only the command line (``dspark``) imports it.
"""
