"""The projection chains that ``real.tp_profile`` times keep a forward's data dependencies."""

import torch
import torch.nn.functional as F

from real.tp_profile import _chain, _local_pair


def test_chain_feeds_each_layer_the_last_ones_output_in_layer_order():
    # an asynchronous all-reduce is waited for where its result is read: a chain whose layers
    # did not read each other's output (or whose MLP did not read attention's) let the
    # collectives run under later matmuls, which the engine's forward never does
    g = torch.Generator().manual_seed(0)
    d, dff, n_layers, steps = 8, 16, 3, 5

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64) / d

    ws = [[rand(3 * d, d), rand(d, d), rand(2 * dff, d), rand(d, dff)] for _ in range(n_layers)]
    x = torch.randn(2, d, generator=g, dtype=torch.float64)
    ref = x
    for i in range(steps):  # layer i mod L at step i, each reading the residual stream
        qkv, o, gate_up, down = ws[i % n_layers]
        h = ref + (ref @ qkv.T)[:, :d] @ o.T
        a, b = (h @ gate_up.T).chunk(2, dim=-1)
        ref = h + (F.silu(a) * b) @ down.T
    assert torch.allclose(_chain(_local_pair, ws, x, d, steps), ref, rtol=1e-12, atol=1e-14)
    # the layer order matters: the same layers reversed give another result
    assert not torch.allclose(_chain(_local_pair, ws[::-1], x, d, steps), ref)
