"""real package: the PyTorch engine. This module stays free of torch so that the command line
can offer the engine's choices without loading it."""

#: ``EngineConfig.drafter`` choices: model drafters (conv: the seed's token-only conv drafter;
#: feat: the conv drafter conditioned on the target's hidden states; tf: a tiny transformer),
#: prompt lookup, lookup + model hybrids.
DRAFTERS = ("conv", "tf", "feat", "ngram", "ngram+conv", "ngram+tf", "ngram+feat")
