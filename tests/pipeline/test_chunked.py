"""Chunked backbone (GradCache) == one-graph backbone: loss and every parameter gradient.

With dropout on, the reference runs the same chunks forward WITH grad in one graph (so it draws
the same dropout masks in the same order) and back-propagates the loss once; the chunked path
must replay those masks from the saved RNG state. Without dropout the reference is one forward
over the whole batch. Through DeepSpeed engines (ZeRO 0, 2, 3; gloo, one process) the full
gradients are read with ``deepspeed.utils.safe_get_full_grad`` before the optimizer step.
"""

from __future__ import annotations


import pytest
import torch

from infclip.ops import ContrastiveLoss, ContrastiveLossConfig
from infclip.pipeline.model.config import ModelConfig
from infclip.pipeline.model.model import CLIPTowers
from infclip.pipeline.model.param_layout import mark_zero3_leaf_layers
from infclip.pipeline.train.chunked import chunked_forward_backward

B, CHUNK = 10, 4  # uneven last chunk (4, 4, 2)


def tiny_model(dropout: float, seed: int = 0, patch_dropout: float = 0.0) -> CLIPTowers:
    cfg = ModelConfig.from_dict({
        "embed_dim": 16, "patch_dropout": patch_dropout,
        "vision": {"image_size": 16, "patch_size": 8, "hidden_size": 16, "layers": 1, "heads": 2,
                   "attention_dropout": dropout},
        "text": {"context_length": 8, "hidden_size": 16, "layers": 1, "heads": 2, "vocab_size": 50,
                 "attention_dropout": dropout},
    })
    torch.manual_seed(seed)
    return CLIPTowers(cfg, eos_token_id=1, pad_token_id=0, bos_token_id=2)


def batch():
    g = torch.Generator().manual_seed(1)
    pv = torch.randn(B, 3, 16, 16, generator=g)
    ids = torch.randint(3, 50, (B, 8), generator=g)
    lengths = torch.randint(3, 8, (B,), generator=g)
    mask = (torch.arange(8)[None] < lengths[:, None]).long()
    ids[torch.arange(B), lengths - 1] = 1
    ids[mask == 0] = 0
    return pv, ids, mask


def make_loss(kind: str):
    crit = ContrastiveLoss(ContrastiveLossConfig(loss=kind, impl="chunked_torch"))
    return lambda img, txt, scale, bias: crit(img, txt, scale, bias if kind == "siglip" else None)


def reference_grads(model, loss_fn, pv, ids, mask, chunk):
    """One graph; forward chunk by chunk (same RNG draws as the chunked path)."""
    torch.manual_seed(123)
    outs = [model(pv[i:i + chunk], ids[i:i + chunk], mask[i:i + chunk]) for i in range(0, B, chunk)]
    img = torch.cat([o[0] for o in outs])
    txt = torch.cat([o[1] for o in outs])
    loss = loss_fn(img, txt, outs[-1][2], outs[-1][3])
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["clip", "siglip"])
@pytest.mark.parametrize("dropout, patch_dropout", [(0.0, 0.0), (0.3, 0.0), (0.0, 0.5)])
def test_chunked_matches_one_graph_plain_torch(kind, dropout, patch_dropout):
    pv, ids, mask = batch()
    loss_fn = make_loss(kind)
    ref = tiny_model(dropout, patch_dropout=patch_dropout)
    ref.train()
    # without dropout the reference is a single full-batch forward; with it (attention dropout, or
    # the patch subsets of patch dropout), the same chunks
    random = dropout > 0 or patch_dropout > 0
    ref_loss, ref_grads = reference_grads(ref, loss_fn, pv, ids, mask, CHUNK if random else B)
    model = tiny_model(dropout, patch_dropout=patch_dropout)
    model.train()
    torch.manual_seed(123)
    res = chunked_forward_backward(model, pv, ids, mask, loss_fn, CHUNK)
    assert res.num_chunks == 3
    torch.testing.assert_close(res.loss, ref_loss, rtol=1e-5, atol=1e-6)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == ref_grads.keys()
    assert ("logit_bias" in grads) == (kind == "siglip")
    for name, g in ref_grads.items():
        # fp32 sums in a different order: a few ulps of the largest gradient
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert grads["logit_scale"].abs().item() > 0


@pytest.mark.parametrize("dropout, patch_dropout", [(0.3, 0.0), (0.0, 0.5)])
def test_dropout_replay_is_what_makes_it_match(dropout, patch_dropout):
    """Sanity check of the test itself: without restoring the RNG the gradients differ."""
    pv, ids, mask = batch()
    loss_fn = make_loss("clip")
    ref = tiny_model(dropout, patch_dropout=patch_dropout)
    _, ref_grads = reference_grads(ref, loss_fn, pv, ids, mask, CHUNK)
    model = tiny_model(dropout, patch_dropout=patch_dropout)
    torch.manual_seed(999)  # different draws from the reference's
    chunked_forward_backward(model, pv, ids, mask, loss_fn, CHUNK)
    name = "vision.vision_model.encoder.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(dict(model.named_parameters())[name].grad, ref_grads[name], atol=1e-6)


def test_chunk_sizes_one_and_larger_than_batch():
    pv, ids, mask = batch()
    loss_fn = make_loss("clip")
    ref = tiny_model(0.0)
    ref_loss, ref_grads = reference_grads(ref, loss_fn, pv, ids, mask, B)
    for chunk in (1, B + 5):
        model = tiny_model(0.0)
        res = chunked_forward_backward(model, pv, ids, mask, loss_fn, chunk)
        torch.testing.assert_close(res.loss, ref_loss, rtol=1e-5, atol=1e-6)
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert grads.keys() == ref_grads.keys()
        for n, g in ref_grads.items():
            # atol relative to the largest entry: the embedding gradients reach ~50, where one fp32
            # rounding step is 4e-6, and chunking reorders their sums
            torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-6 * max(1.0, g.abs().max().item()), msg=n)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_forward_backward(model, pv, ids, mask, loss_fn, 0)


# ------------------------------------------------------------------------------ through DeepSpeed

@pytest.fixture(scope="module")
def dist_world_of_one():
    import deepspeed
    import torch.distributed as dist

    if not dist.is_initialized():
        from infclip.pipeline.train.train import single_process_env

        single_process_env()
        deepspeed.init_distributed(dist_backend="gloo")
    assert dist.get_world_size() == 1
    yield


def _engine(stage: int, dropout: float):
    import deepspeed

    model = tiny_model(dropout)
    cfg = {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
           "zero_optimization": {"stage": stage}, "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    engine.train()
    return engine


def _full_grads(engine):
    from deepspeed.utils import safe_get_full_grad

    out = {}
    for n, p in engine.module.named_parameters():
        g = safe_get_full_grad(p)
        if g is not None:
            out[n] = g.detach().clone().float()
    return out


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_chunked_matches_one_graph_deepspeed(dist_world_of_one, stage):
    pv, ids, mask = batch()
    loss_fn = make_loss("clip")
    dropout = 0.3

    ref = _engine(stage, dropout)
    torch.manual_seed(123)
    outs = [ref(pv[i:i + CHUNK], ids[i:i + CHUNK], mask[i:i + CHUNK]) for i in range(0, B, CHUNK)]
    ref_loss = loss_fn(torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs]), outs[-1][2], outs[-1][3])
    ref.backward(ref_loss)
    ref_grads = _full_grads(ref)
    ref.step()

    eng = _engine(stage, dropout)
    torch.manual_seed(123)
    res = chunked_forward_backward(eng, pv, ids, mask, loss_fn, CHUNK, engine=eng)
    grads = _full_grads(eng)
    torch.testing.assert_close(res.loss, ref_loss.detach(), rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys() and "logit_scale" in grads
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=f"ZeRO-{stage} {name}")
    eng.step()
    # the optimizer stepped once and moved the weights the same way
    for (n, p), (_, q) in zip(eng.module.named_parameters(), ref.module.named_parameters()):
        if stage == 3:
            break  # partitioned parameters: compared through gradients above
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("unit", [True, "stack", "tower"])
@pytest.mark.parametrize("grad_ckpt", [False, True])
def test_zero3_leaf_layers_match_zero0(dist_world_of_one, grad_ckpt, unit):
    """ZeRO-3 with each transformer block gathered as one unit (model.zero3_leaf_layers, the
    default), each tower's stack of blocks (``"stack"``) or each whole tower (``"tower"``, its
    gradients reduced once accumulated) gives ZeRO-0's gradients, with and without activation
    checkpointing (reentrant: the blocks recompute inside the stack's backward), over two steps
    (the second runs on DeepSpeed's recorded prefetch trace)."""
    import deepspeed

    from infclip.pipeline.engine.tower_unit import reduce_when_accumulated

    pv, ids, mask = batch()
    loss_fn = make_loss("clip")
    grads = {}
    for stage, leaf in ((0, False), (3, True)):
        model = tiny_model(0.0)
        model.vision.vision_model.encoder.layers.append(type(model.vision.vision_model.encoder.layers[0])(
            model.vision.config))  # two blocks, so the leaf hooks run in sequence
        model.set_gradient_checkpointing(grad_ckpt)
        if leaf:
            assert mark_zero3_leaf_layers(model, unit) == (3 if unit is True else 2)
        cfg = {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
               "zero_optimization": {"stage": stage}, "steps_per_print": 10**9}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        assert len(reduce_when_accumulated(engine)) == (2 if leaf and unit == "tower" else 0)
        engine.train()
        for step in range(2):
            img, txt, scale, bias = engine(pv, ids, mask)
            engine.backward(loss_fn(img, txt, scale, bias))
            grads[stage, step] = _full_grads(engine)
            engine.step()
    for step in range(2):
        assert grads[3, step].keys() == grads[0, step].keys()
        for name, g in grads[0, step].items():
            torch.testing.assert_close(grads[3, step][name], g, rtol=1e-4, atol=1e-6, msg=f"step {step} {name}")
