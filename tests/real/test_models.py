"""Incremental decoding equals the teacher-forced forward pass (float64), for every model."""

import pytest
import torch

from real.models import ConvConfig, ConvDrafter
from tests.real.conftest import V, tiny_target


def _incremental(model, ids, chunks):
    """Logits of ``ids`` fed to ``model.step`` in chunks of the given sizes."""
    st = model.new_state(ids.shape[1] + 4, torch.float64, "cpu")
    out, pos = [], 0
    for n in chunks:
        out.append(model.step(ids[:, pos : pos + n], pos, st))
        pos += n
    return torch.cat(out)


@pytest.mark.parametrize(
    "make",
    [
        lambda: tiny_target(),
        lambda: ConvDrafter(
            ConvConfig(vocab_size=V, d_model=16, n_blocks=3, kernel=4, d_hidden=32)
        ).double(),
        lambda: ConvDrafter(
            ConvConfig(vocab_size=V, d_model=16, n_blocks=3, kernel=4, d_hidden=32, dilation_base=2)
        ).double(),
    ],
)
def test_step_equals_forward(make):
    torch.manual_seed(0)
    m = make().eval()
    ids = torch.randint(0, V, (1, 40))
    with torch.no_grad():
        full = m(ids)[0]
        for chunks in ([1] * 40, [7, 1, 1, 5, 2, 1, 10, 13], [40]):
            torch.testing.assert_close(_incremental(m, ids, chunks), full, rtol=1e-10, atol=1e-10)


def test_dilation_widens_the_receptive_field():
    """A token 20 positions back reaches the dilated model's output but not the plain one's."""
    torch.manual_seed(0)
    for base, reaches in ((1, False), (2, True)):
        m = (
            ConvDrafter(
                ConvConfig(
                    vocab_size=V, d_model=16, n_blocks=3, kernel=4, d_hidden=32, dilation_base=base
                )
            )
            .double()
            .eval()
        )
        ids = torch.randint(0, V, (1, 30))
        other = ids.clone()
        other[0, 9] = (other[0, 9] + 1) % V
        with torch.no_grad():
            changed = not torch.equal(m(ids)[0, -1], m(other)[0, -1])
        # plain: 3 blocks x (4 - 1) + 1 = 10 positions; dilated 1, 2, 4: 3 x 7 + 1 = 22
        assert changed == reaches, base


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1, 128), (7, 384), (2, 5, 16), (3, 1, 4096)])
def test_fused_rms_norm_is_bit_equal_to_the_formula(dtype, shape):
    """``RMSNorm`` takes ``F.rms_norm`` in full precision: the same bits as Llama's formula."""
    from real.models import RMSNorm

    g = torch.Generator().manual_seed(shape[-1])
    x = (
        torch.randn(shape, generator=g, dtype=dtype)
        * torch.rand(shape[:-1], generator=g)[..., None].to(dtype)
        * 30
    )
    norm = RMSNorm(shape[-1], 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(shape[-1], generator=g, dtype=dtype))
        formula = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
        assert torch.equal(norm(x), formula)


def test_conv_mix_is_bit_equal_to_the_glu_through_the_modules():
    """``ConvDrafter._mix`` (``F.glu`` on the weights) gives the bits of the module-by-module
    GLU: first half times the sigmoid of the second, projected back, residual added."""
    torch.manual_seed(1)
    m = ConvDrafter(ConvConfig(vocab_size=V, d_model=16, n_blocks=1, kernel=4, d_hidden=32))
    blk = m.blocks[0]
    x, u = torch.randn(5, 16), torch.randn(5, 16)
    with torch.no_grad():
        a, g = blk.proj_in(u).chunk(2, dim=-1)
        assert torch.equal(m._mix(blk, x, u), x + blk.proj_out(a * torch.sigmoid(g)))
