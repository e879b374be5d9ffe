"""Patch dropout (pipeline/model/patch_dropout.py): which tokens are kept, how many, how uniformly."""

from fractions import Fraction

import pytest
import torch

from infclip.pipeline.model.patch_dropout import drop_patches, kept_patches, use_patch_dropout


@pytest.mark.parametrize("patches", [1, 7, 49, 100, 196, 256])
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99])
def test_kept_patches_rounds_down_exactly_and_keeps_one(patches, fraction):
    exact = int(patches * (1 - Fraction(str(fraction))))  # floor of the exact rational
    assert kept_patches(patches, fraction) == max(1, exact)


def _labelled_tokens(b: int, n: int, d: int) -> torch.Tensor:
    """[b, n, d] tokens whose first channel says (row, position): 1000 row + position."""
    tokens = torch.randn(b, n, d)
    tokens[:, :, 0] = 1000 * torch.arange(b)[:, None] + torch.arange(n)[None, :]
    return tokens


def test_drop_patches_keeps_the_class_token_and_distinct_patches_of_its_own_row():
    b, n, d, keep = 8, 50, 6, 17
    tokens = _labelled_tokens(b, n, d)
    torch.manual_seed(0)
    out = drop_patches(tokens, keep)
    assert out.shape == (b, 1 + keep, d)
    assert torch.equal(out[:, 0], tokens[:, 0])
    label = out[:, 1:, 0].long()
    rows, positions = label // 1000, label % 1000
    assert torch.equal(rows, torch.arange(b)[:, None].expand(b, keep))
    assert positions.min() >= 1 and positions.max() <= n - 1  # never the class token again
    for r in range(b):
        kept = positions[r]
        assert kept.unique().numel() == keep
        assert torch.equal(out[r, 1:], tokens[r, kept])  # whole tokens, every channel
    assert len({tuple(sorted(p.tolist())) for p in positions}) == b  # each row its own subset


def test_drop_patches_is_seeded_and_draws_anew_each_call():
    tokens = _labelled_tokens(4, 65, 3)
    torch.manual_seed(1)
    first, second = drop_patches(tokens, 16), drop_patches(tokens, 16)
    torch.manual_seed(1)
    again = drop_patches(tokens, 16)
    assert torch.equal(first, again)
    assert not torch.equal(first, second)


def test_drop_patches_chooses_every_patch_equally_often():
    b, n, keep = 4000, 17, 4  # 16 patches, 4 kept: each expected 1,000 times, sd ~27
    tokens = _labelled_tokens(1, n, 1).expand(b, n, 1)
    torch.manual_seed(2)
    positions = drop_patches(tokens, keep)[:, 1:, 0].long().flatten()
    counts = torch.bincount(positions, minlength=n)[1:]
    assert counts.sum() == b * keep
    assert (counts - 1000).abs().max() < 150, counts.tolist()


def test_dropped_tokens_get_no_gradient():
    tokens = torch.randn(3, 10, 4, requires_grad=True)
    torch.manual_seed(3)
    out = drop_patches(tokens, 5)
    out.sum().backward()
    per_token = tokens.grad[:, :, 0]
    assert torch.equal(per_token[:, 0], torch.ones(3))
    assert torch.equal(per_token[:, 1:].sum(dim=1), torch.full((3,), 5.0))
    assert set(per_token.unique().tolist()) == {0.0, 1.0}


def test_keeping_every_patch_returns_the_tokens_unchanged():
    tokens = torch.randn(2, 9, 3)
    assert drop_patches(tokens, 8) is tokens


class _Embeddings(torch.nn.Module):
    """A stand-in for a ViT embedding module: [B, C] -> [B, 1 + N, D] labelled tokens."""

    def forward(self, pixels: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return scale * _labelled_tokens(pixels.shape[0], 37, 2)


def test_use_patch_dropout_drops_in_training_only_and_passes_arguments_on():
    emb = _Embeddings()
    use_patch_dropout(emb, 0.5)
    pixels = torch.zeros(3, 1)
    assert emb(pixels, scale=2.0).shape == (3, 1 + 18, 2)
    emb.eval()
    full = emb(pixels, scale=2.0)
    assert full.shape == (3, 37, 2) and torch.equal(full[:, :, 0], 2.0 * _labelled_tokens(3, 37, 2)[:, :, 0])


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5])
def test_use_patch_dropout_refuses_a_fraction_outside_0_1(fraction):
    with pytest.raises(ValueError, match="patch dropout must be in \\[0, 1\\)"):
        use_patch_dropout(_Embeddings(), fraction)


def test_no_patch_dropout_leaves_the_module_alone():
    emb = _Embeddings()
    use_patch_dropout(emb, 0.0)
    assert "forward" not in vars(emb)


def _towers(patch_dropout: float, patch_embedding: str = "gemm", **over):
    from infclip.pipeline.model.config import ModelConfig
    from infclip.pipeline.model.model import CLIPTowers

    cfg = ModelConfig.from_dict({
        "embed_dim": 12, "patch_dropout": patch_dropout, "compile": False, "patch_embedding": patch_embedding, **over,
        "vision": {"image_size": 30, "patch_size": 6, "hidden_size": 16, "layers": 2, "heads": 2},
        "text": {"context_length": 8, "hidden_size": 16, "layers": 1, "heads": 2, "vocab_size": 40}})
    torch.manual_seed(0)
    return CLIPTowers(cfg, eos_token_id=1, pad_token_id=0)


@pytest.mark.parametrize("patch_embedding", ["gemm", "conv"])
def test_the_image_tower_runs_the_kept_tokens_in_training_and_every_patch_in_evaluation(patch_embedding):
    """Training features == the tower's own layers run by hand on drop_patches of the full
    embeddings (25 patches, 10 kept: 0.6 dropped), drawn from the same seed; evaluation features
    == those of the same weights without patch dropout."""
    model, plain = _towers(0.6, patch_embedding), _towers(0.0, patch_embedding)
    plain.load_state_dict(model.state_dict())
    pixels = torch.randn(5, 3, 30, 30)
    vm = plain.vision.vision_model
    with torch.no_grad():
        tokens = vm.embeddings(pixels)
        assert tokens.shape == (5, 26, 16)
        torch.manual_seed(7)
        kept = drop_patches(tokens, 10)
        hidden = vm.encoder(inputs_embeds=vm.pre_layrnorm(kept)).last_hidden_state
        want = torch.nn.functional.normalize(plain.vision.visual_projection(vm.post_layernorm(hidden[:, 0])), dim=-1)
        model.train()
        torch.manual_seed(7)
        got = model.encode_image(pixels)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        model.eval()
        full = model.encode_image(pixels)
        torch.testing.assert_close(full, plain.eval().encode_image(pixels), rtol=0, atol=0)
        assert (full - got).abs().max() > 1e-3


@pytest.mark.parametrize("value", [1.0, -0.5])
def test_a_patch_dropout_outside_0_1_is_a_config_error_naming_the_key(value):
    from infclip.ops.config import ConfigError
    from infclip.pipeline.model.config import ModelConfig

    with pytest.raises(ConfigError, match="'patch_dropout' must be in \\[0, 1\\)"):
        ModelConfig.from_dict({"patch_dropout": value})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_towers_on_cuda_draw_new_subsets_each_step_and_the_same_from_a_seed(mode):
    """Inductor generates its own random numbers, and "reduce-overhead" replays CUDA graphs: each
    training step must still draw new subsets (a graph replaying one draw would drop the same
    patches every step), the same seed the same subsets (resume), and evaluation see every patch.
    The gradients accumulate over all six backwards, as nothing clears them here."""
    model = _towers(0.5, compile=True, compile_mode=mode, flat_parameters=True).cuda().train()  # as the presets
    plain = _towers(0.0).cuda().eval()
    plain.load_state_dict(model.state_dict())
    g = torch.Generator(device="cuda").manual_seed(0)
    pixels = torch.randn(6, 3, 30, 30, device="cuda", generator=g)
    ids = torch.randint(3, 40, (6, 8), device="cuda", generator=g)
    ids[:, -1] = 1

    def step() -> torch.Tensor:
        img, txt, scale, _ = model(pixels, ids, torch.ones_like(ids))
        (scale * (img @ txt.T)).logsumexp(dim=1).sum().backward()
        return img.detach().clone()

    def steps(seed: int) -> list:
        torch.manual_seed(seed)
        return [step() for _ in range(3)]

    first, again = steps(11), steps(11)
    assert model.compiled == "towers"
    assert all(torch.isfinite(f).all() for f in first)
    assert (first[0] - first[1]).abs().max() > 1e-3 and (first[1] - first[2]).abs().max() > 1e-3
    for a, b in zip(first, again):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model.encode_image(pixels), plain.encode_image(pixels), rtol=1e-5, atol=1e-6)



@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_replays_draw_new_subsets_each_step_and_the_same_from_a_seed():
    """drop_patches and a layer after it compiled with CUDA graphs ("reduce-overhead"), trained a
    step at a time: the replays draw new subsets, the same seed the same ones. The layer's
    gradients accumulate over the steps out of the graphs' memory
    (``pipeline.model.model.copy_gradients_out_of_graphs``, as the towers' do)."""
    from infclip.pipeline.model.model import copy_gradients_out_of_graphs

    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 4).cuda()
    copy_gradients_out_of_graphs(layer.parameters())
    fn = torch.compile(lambda t: layer(drop_patches(t, 12)).sum(dim=1), mode="reduce-overhead")
    tokens = torch.randn(6, 26, 16, device="cuda")

    def step() -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        out = fn(tokens)
        out.sum().backward()
        return out.detach().clone()

    def steps(seed: int) -> list:
        torch.manual_seed(seed)
        return [step() for _ in range(5)]  # graphs recorded by the third call, then replayed

    first, again = steps(11), steps(11)
    for a, b in zip(first, first[1:]):
        assert (a - b).abs().max() > 1e-4
    for a, b in zip(first, again):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
