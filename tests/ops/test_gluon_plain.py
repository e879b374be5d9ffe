"""Which gradient blocks take the Gluon kernels' plain epilogue (ops/gluon_kernels.plain_block; CLIP:
_clip_grad_ws_kernel's 128 x 128 PLAIN tiles, SigLIP: its kernel's 64 x 128): that epilogue has no
select for the positives and no masks for the bounds, so a block it takes must hold no positive
(i - j == diag) and only whole tiles; any other block goes to the epilogue with both. Checked against
the positives the block actually holds, on the CPU."""

import pytest
import torch

from infclip.ops import gluon_kernels
from infclip.ops.tuning import TUNING


def _holds_a_positive(m: int, n: int, diag: int) -> bool:
    return bool(((torch.arange(m)[:, None] - torch.arange(n)[None, :]) == diag).any())


_TILES = {"clip": gluon_kernels.GRAD_PLAIN_TILES, "siglip": gluon_kernels.GRAD_TILES}


@pytest.mark.parametrize("loss,m,n", [("clip", 256, 384), ("clip", 128, 128), ("clip", 384, 256),
                                      ("siglip", 64, 128), ("siglip", 192, 256), ("siglip", 320, 128)])
def test_plain_exactly_where_no_positive_lies_in_the_block(loss, m, n):
    for diag in range(-n - 3, m + 4):
        assert gluon_kernels.plain_block(m, n, diag, tiles=_TILES[loss]) == (not _holds_a_positive(m, n, diag)), diag


@pytest.mark.parametrize("loss,m,n", [("clip", 250, 384), ("clip", 256, 300), ("clip", 3001, 2904),
                                      ("clip", 192, 256), ("siglip", 100, 128), ("siglip", 64, 200)])
def test_partial_tiles_never_take_the_plain_kernel(loss, m, n):
    assert not any(gluon_kernels.plain_block(m, n, diag, tiles=_TILES[loss]) for diag in (-n - 100, -n, m, m + 100))


def test_the_switch_turns_it_off(monkeypatch):
    assert gluon_kernels.plain_block(256, 256, 1000)
    assert not gluon_kernels.plain_block(256, 256, 1000, plain=False)
    monkeypatch.setattr(TUNING, "gluon_grad_plain", False)
    assert not gluon_kernels.plain_block(256, 256, 1000)
    assert gluon_kernels.plain_block(256, 256, 1000, plain=True)
