"""The ``dspark`` command line: wires control, sim, real, tuning and reports together."""
