"""The patch embedding as one GEMM (pipeline/model/patch_embed.py) against torch's convolution."""

import pytest
import torch
from torch import nn

from infclip.pipeline.model.patch_embed import patch_gemm, use_patch_gemm


@pytest.mark.parametrize("channels, size, patch, out, bias", [
    (3, (32, 32), (8, 8), 16, False),
    (3, (37, 29), (8, 8), 12, False),  # pixels past the last whole patch are dropped
    (1, (20, 30), (5, 10), 7, True),   # non-square patches, a bias
    (4, (14, 14), (14, 14), 5, True),  # one patch
])
def test_gemm_matches_the_convolution_and_its_gradients(channels, size, patch, out, bias):
    torch.manual_seed(0)
    conv = nn.Conv2d(channels, out, patch, stride=patch, bias=bias).double()
    x = torch.randn(3, channels, *size, dtype=torch.float64, requires_grad=True)
    want = conv(x)
    got = patch_gemm(conv, x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)
    g = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, [x, conv.weight] + ([conv.bias] if bias else []), g)
    got_grads = torch.autograd.grad(got, [x, conv.weight] + ([conv.bias] if bias else []), g)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b)
    # transformers' flatten(2).transpose(1, 2) of the result is free: a view
    assert got.flatten(2).data_ptr() == got.data_ptr()


def test_only_non_overlapping_convolutions_are_replaced():
    tower = nn.Sequential(nn.Conv2d(3, 8, 4, stride=4, bias=False), nn.Conv2d(8, 8, 3, stride=1, padding=1),
                          nn.Conv2d(8, 8, 2, stride=2, groups=2), nn.Conv2d(8, 8, 2, stride=2, padding=1))
    assert use_patch_gemm(tower) == 1
    assert "forward" in tower[0].__dict__ and all("forward" not in m.__dict__ for m in tower[1:])
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(tower[0](x), nn.functional.conv2d(x, tower[0].weight, stride=4))


def _towers(patch_embedding: str, **over):
    from infclip.pipeline.model.model import CLIPTowers

    from .test_model_speed import cfg

    torch.manual_seed(0)
    return CLIPTowers(cfg(patch_embedding=patch_embedding, **over), eos_token_id=1, pad_token_id=0).double().train()


def test_towers_train_the_same_with_either_patch_embedding():
    """``model.patch_embedding``: "gemm" (the default) and "conv" give the same features and
    gradients from the same weights, with the same state-dict keys."""
    from .test_model_speed import batch

    gemm, conv = _towers("gemm"), _towers("conv")
    assert "forward" in gemm.vision.vision_model.embeddings.patch_embedding.__dict__
    assert "forward" not in conv.vision.vision_model.embeddings.patch_embedding.__dict__
    assert list(gemm.state_dict()) == list(conv.state_dict())
    pv, ids, mask = batch(3)
    pv = pv.double()
    losses = []
    for model in (gemm, conv):
        img, txt, scale, _ = model(pv, ids, mask)
        loss = torch.nn.functional.cross_entropy(scale * img @ txt.T, torch.arange(3))
        loss.backward()
        losses.append((img.detach(), loss.detach()))
    torch.testing.assert_close(losses[0], losses[1])
    for (name, p), (_, q) in zip(gemm.named_parameters(), conv.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_compiled_tower_has_no_convolution():
    """Under torch.compile the patch embedding is traced as the GEMM (no convolution in the graph)."""
    from .test_model_speed import batch

    ops = []

    def record(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    model = _towers("gemm")
    pv, _, _ = batch(2)
    torch.compile(model._image_features, backend=record)(pv.double())
    assert ops and not any("conv" in op for op in ops)
    assert any("matmul" in op or "linear" in op for op in ops)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("patch", [14, 16, 32])
def test_bf16_gemm_on_cuda_matches_cudnn(patch):
    """On the GPU in bf16 (what training runs): the GEMM against cuDNN's convolution, forward and
    weight gradient, to bf16 rounding (both accumulate in fp32)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 768, patch, stride=patch, bias=False).cuda().bfloat16()
    x = torch.randn(64, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    want = conv(x)
    got = patch_gemm(conv, x)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    g = torch.randn_like(want)
    (want_w,) = torch.autograd.grad(want, [conv.weight], g)
    (got_w,) = torch.autograd.grad(got, [conv.weight], g)
    scale = want_w.float().abs().max()
    torch.testing.assert_close(got_w.float() / scale, want_w.float() / scale, rtol=0, atol=2e-2)


def test_what_the_gemm_does_not_cover_goes_to_the_convolution():
    """An unbatched image and one smaller than the kernel behave as the convolution does (the
    first is taken, the second refused); ``padding="valid"`` convolutions are patch convolutions too."""
    conv = nn.Conv2d(3, 4, 4, stride=4, padding="valid")
    assert use_patch_gemm(nn.Sequential(conv)) == 1
    x = torch.randn(3, 8, 8)
    torch.testing.assert_close(conv(x), nn.functional.conv2d(x, conv.weight, conv.bias, stride=4))
    with pytest.raises(RuntimeError):
        conv(torch.randn(1, 3, 2, 2))
    y = torch.randn(2, 3, 9, 13)
    torch.testing.assert_close(conv(y), nn.functional.conv2d(y, conv.weight, conv.bias, stride=4))
