"""The towers replayed as CUDA graphs (``model.compile_mode: "reduce-overhead"``) in DeepSpeed
engines, driven as a training run drives them (``pipeline.train.step.forward_backward``, then
``engine.step()``): gradients accumulated over micro-steps at ZeRO-0, 1 and 2, with plain and with
flat blocks, against the same engines with the towers compiled without CUDA graphs. Without
``pipeline.model.model.copy_gradients_out_of_graphs`` the second micro-step's backward fails there
("accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run": autograd
had kept the first backward's gradients in the graphs' memory). GPU only:
``pytest -m gpu tests/pipeline/test_cuda_graphs.py``."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from infclip.pipeline.engine.dist import single_process_env
from infclip.pipeline.engine.engine import with_engine_defaults
from infclip.pipeline.engine.zero_step import keep_step_on_device
from infclip.pipeline.model.model import CLIPTowers
from infclip.pipeline.model.param_layout import param_groups
from infclip.pipeline.train.step import forward_backward

from .test_model_speed import cfg

deepspeed = pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROWS, ACCUMULATE, STEPS = 6, 2, 3


def _batches():
    g = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(ACCUMULATE * STEPS):
        pixels = torch.randn(ROWS, 3, 40, 40, device="cuda", generator=g).bfloat16()
        ids = torch.randint(3, 100, (ROWS, 12), device="cuda", generator=g)
        ids[:, -1] = 1
        yield pixels, ids, torch.ones_like(ids)


def _loss(img, txt, scale, bias):
    logits = scale.float() * img.float() @ txt.float().T
    labels = torch.arange(len(logits), device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def _train(mode: str, stage: int, flat: bool):
    """Losses of every micro-step, the weights before and after, and what was compiled."""
    single_process_env()
    torch.manual_seed(0)
    model = CLIPTowers(cfg(compile=True, compile_mode=mode, flat_parameters=flat), eos_token_id=1, pad_token_id=0)
    ds = with_engine_defaults({
        "train_micro_batch_size_per_gpu": ROWS, "gradient_accumulation_steps": ACCUMULATE, "gradient_clipping": 1.0,
        "bf16": {"enabled": True}, "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}, compiled=True)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=ds)
    try:
        keep_step_on_device(engine)
        before = {k: v.float().cpu() for k, v in engine.module.state_dict().items()}
        losses = []
        for pixels, ids, mask in _batches():
            loss, _, _ = forward_backward(engine, pixels, ids, mask, _loss)
            engine.step()
            losses.append(float(loss))
        assert engine.global_steps == STEPS
        after = {k: v.float().cpu() for k, v in engine.module.state_dict().items()}
        return losses, before, after, engine.module.compiled
    finally:
        engine.destroy()


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_cuda_graph_towers_accumulate_gradients_as_the_towers_without_graphs(stage, flat):
    losses, before, after, compiled = _train("reduce-overhead", stage, flat)
    want_losses, want_before, want_after, want_compiled = _train("default", stage, flat)
    assert compiled == want_compiled == "towers"
    assert all(math.isfinite(x) for x in losses)
    torch.testing.assert_close(losses, want_losses, rtol=1e-3, atol=1e-4)
    for name, value in want_after.items():
        torch.testing.assert_close(before[name], want_before[name], rtol=0, atol=0, msg=name)
        torch.testing.assert_close(after[name], value, rtol=2e-2, atol=2e-3, msg=name)
    moved = max((after[n] - before[n]).abs().max().item() for n in after)
    assert moved > 1e-3  # the steps did train
