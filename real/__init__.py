"""real package: the PyTorch engine. This module stays free of torch so that the command line
can offer the engine's choices without loading it."""

#: ``EngineConfig.drafter`` choices: model drafters, prompt lookup, lookup + model hybrids.
DRAFTERS = ("conv", "tf", "ngram", "ngram+conv", "ngram+tf")
