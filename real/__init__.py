"""real package: the PyTorch engine. This module stays free of torch so that the command line
can offer the engine's choices without loading it."""

#: ``EngineConfig.drafter`` choices: model drafters (conv: the seed's token-only conv drafter;
#: feat: the conv drafter conditioned on the target's hidden states; tf: a tiny transformer),
#: prompt lookup, lookup + model hybrids; block: one forward proposes a block of tokens, with a
#: confidence head (real.block_drafter).
DRAFTERS = ("conv", "tf", "feat", "block", "ngram", "ngram+conv", "ngram+tf", "ngram+feat")
