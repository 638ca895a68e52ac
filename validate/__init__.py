"""Validation: calibrate the simulator on the real engine and measure its prediction error.

The lab's third job (``dspark validate`` runs it). It sits above ``sim`` and ``real`` (which
never import each other) and beside ``tuning``: it may import ``control``, ``sim``, ``real``
and ``tuning``; only the command line (``dspark``) imports it.

- :mod:`validate.run`: the dispatcher over the parts and the batch-1 part's summary;
  :mod:`validate.batch1`: the batch-1 part's steps;
- :mod:`validate.batched` (measurement), :mod:`validate.batched_analysis` (prediction and
  comparison), :mod:`validate.batched_latency`: the batched part (continuous batching under
  Poisson arrivals);
- :mod:`validate.tp`, :mod:`validate.tp_runs`, :mod:`validate.tp_setup`: the tensor-parallel
  part;
- :mod:`validate.mirror`: the simulator set up as the engine's mirror;
- :mod:`validate.metrics`, :mod:`validate.tables`: the compared metrics and the error tables;
- :mod:`validate.config`, :mod:`validate.harness`: the configuration and what every part shares
  to run.
"""
