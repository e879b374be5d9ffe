"""The training step without host waits. ``pipeline.engine.zero_step``: the replaced pieces give
DeepSpeed's own values (norms finite, infinite, NaN and DeepSpeed's -1 sentinel), a real ZeRO-2
engine trains to the same bits with and without them (gradient clipping active), ZeRO-0's
overflow check read once gives DeepSpeed's answer and the same training (a NaN step skipped
alike), and the optimizers it must not touch are left alone. ``pipeline.engine.engine.with_engine_defaults``: DeepSpeed's
throughput timer no longer synchronises the device each step."""

from __future__ import annotations

import types

import pytest
import torch

from infclip.pipeline.engine.zero_step import clip_scale, keep_step_on_device, mask_nonfinite_, restore_deepspeed_mask
from infclip.pipeline.model.param_layout import param_groups

from .test_flat_params import loss_of, pair

deepspeed = pytest.importorskip("deepspeed")
from deepspeed.runtime import utils as ds_utils  # noqa: E402
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer  # noqa: E402

NORMS = [0.0, 0.3, 1.0, 7.5, 1e30, float("inf"), float("-inf"), float("nan"), -1.0]


def test_mask_gives_deepspeeds_values():
    values = torch.tensor(NORMS)
    want, got = values.clone(), values.clone()
    ds_utils.mask_nan_or_inf_with_val_inplace(want, device="cpu")
    mask_nonfinite_(got, device="cpu")
    assert torch.equal(got, want)
    assert got[5:8].tolist() == [-1.0, -1.0, -1.0]  # it did mask


@pytest.mark.parametrize("clip_grad", [0.0, 1.0, 0.25])
@pytest.mark.parametrize("loss_scale", [1.0, 1024.0])
def test_clip_gives_deepspeeds_gradients(clip_grad, loss_scale):
    """DeepSpeed's own ``unscale_and_clip_grads`` (its host ``if``) against the device-only one,
    bit for bit, on a flat gradient and on a list of sub-partitions."""
    from infclip.pipeline.engine.zero_step import _unscale_and_clip_grads

    torch.manual_seed(0)
    grads = torch.randn(37) * 3
    for norm in NORMS:
        opt = types.SimpleNamespace(clip_grad=clip_grad, loss_scale=loss_scale, device="cpu")
        want = [grads.clone(), [grads[:5].clone(), grads[5:].clone()]]
        got = [grads.clone(), [grads[:5].clone(), grads[5:].clone()]]
        DeepSpeedZeroOptimizer.unscale_and_clip_grads(opt, want, torch.tensor(norm))
        _unscale_and_clip_grads(opt, got, torch.tensor(norm))
        assert torch.equal(got[0], want[0]), norm
        assert all(torch.equal(g, w) for g, w in zip(got[1], want[1])), norm
        if clip_grad and (norm != norm or norm in (float("inf"), float("-inf"), -1.0)):
            assert torch.equal(got[0], torch.zeros_like(grads))  # an invalid norm zeroes the step


def test_clip_scale_is_the_clip_coefficient():
    assert clip_scale(torch.tensor(0.5), 1.0, 1.0).item() == 1.0  # below the clip: no change
    assert clip_scale(torch.tensor(4.0), 1.0, 1.0).item() == pytest.approx(4.0 + 1e-6)
    assert clip_scale(torch.tensor(-1.0), 2.0, 1.0).item() == float("inf")


def _train(model, ds, on_device: bool, steps: int = 4):
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=ds)
    try:
        if on_device:
            assert keep_step_on_device(engine)
        losses, norms = [], []
        for _ in range(steps):
            loss = loss_of(engine)
            engine.backward(loss * 50)  # large gradients: the clip at 1.0 is active
            engine.step()
            losses.append(loss.item())
            norms.append(float(engine.get_global_grad_norm()))
        return losses, norms, {k: v.clone() for k, v in engine.module.state_dict().items()}
    finally:
        engine.destroy()


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_engine_trains_to_the_same_bits(stage, monkeypatch):
    from deepspeed.runtime.zero import stage_1_and_2

    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    # DeepSpeed's own mask for the reference run (an engine built earlier in this process may
    # have replaced it); monkeypatch puts back whatever was there after the test
    monkeypatch.setattr(stage_1_and_2, "mask_nan_or_inf_with_val_inplace", stage_1_and_2.mask_nan_or_inf_with_val_inplace)
    restore_deepspeed_mask()
    assert stage_1_and_2.mask_nan_or_inf_with_val_inplace is ds_utils.mask_nan_or_inf_with_val_inplace
    ds = {"train_micro_batch_size_per_gpu": 3, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1, "torch_adam": True}},
          "zero_optimization": {"stage": stage}}
    runs = {}
    for on_device in (False, True):
        runs[on_device] = _train(pair()[1], ds, on_device)
    (l0, n0, s0), (l1, n1, s1) = runs[False], runs[True]
    assert min(n0) > 1.0  # the clip did act
    assert l1 == l0 and n1 == n0
    for name, value in s0.items():
        assert torch.equal(s1[name], value), name


def test_gradient_norm_gives_deepspeeds_values():
    """The one-call gradient norm against DeepSpeed's loop on a real ZeRO-2 engine's partition:
    the same bits for finite gradients, DeepSpeed's -1 for a NaN one, and the inf-norm left to
    DeepSpeed."""
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    ds = {"train_micro_batch_size_per_gpu": 3, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
          "zero_optimization": {"stage": 2}}
    model = pair()[1]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=ds)
    try:
        from infclip.pipeline.engine.zero_step import _grad_norm_direct

        assert keep_step_on_device(engine)
        opt = engine.optimizer
        assert opt.get_grad_norm_direct.__func__ is _grad_norm_direct
        engine.backward(loss_of(engine) * 50)
        grads = [[(torch.randn_like(p) * 3).to(dtype) for p in params]
                 for params in opt.params_in_partition for dtype in (torch.float32, torch.bfloat16)]
        assert len(grads) >= 2 and sum(len(g) for g in grads) > 10
        for group, params in zip(grads, [p for p in opt.params_in_partition for _ in range(2)]):
            for norm_type in (2, 2.0, float("inf")):
                want = DeepSpeedZeroOptimizer.get_grad_norm_direct(opt, group, params, norm_type)
                got = opt.get_grad_norm_direct(group, params, norm_type)
                assert got.dtype == want.dtype and torch.equal(got, want), norm_type
            exact = torch.sqrt(sum(g.double().pow(2).sum() for g in group)).float()  # fp32 and bf16 gradients
            torch.testing.assert_close(opt.get_grad_norm_direct(group, params), exact, rtol=1e-6, atol=0)
            group[1][0] = float("nan")
            assert DeepSpeedZeroOptimizer.get_grad_norm_direct(opt, group, params).item() == -1.0
            assert opt.get_grad_norm_direct(group, params).item() == -1.0
    finally:
        engine.destroy()


def test_every_engine_of_a_process_keeps_its_step_on_the_device():
    """The replacement is process-wide in DeepSpeed's ZeRO-1/2 module: a second engine built
    after the first had its step replaced must be accepted too (it was refused, running
    DeepSpeed's host waits, in every same-process comparison after the first engine)."""
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    restore_deepspeed_mask()
    ds = {"train_micro_batch_size_per_gpu": 3, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
          "zero_optimization": {"stage": 2}}
    for _ in range(2):
        model = pair()[1]
        engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=ds)
        try:
            assert keep_step_on_device(engine)
        finally:
            engine.destroy()


def test_one_overflow_read_gives_deepspeeds_answer():
    """The FP16 wrapper's overflow check read once: DeepSpeed's answer for gradients that are
    finite, hold a NaN or an infinity in the first or the last tensor, or are missing."""
    from deepspeed.runtime.utils import CheckOverflow

    from infclip.pipeline.engine.zero_step import _has_overflow_serial

    torch.manual_seed(0)
    for bad, where in [(None, 0), (float("nan"), 0), (float("inf"), 2), (float("-inf"), 1)]:
        params = [torch.nn.Parameter(torch.randn(5, 3, dtype=torch.bfloat16)) for _ in range(3)]
        for q in params[:2] + params[2:] * (where == 2):
            q.grad = torch.randn_like(q)
        if bad is not None:
            params[where].grad.view(-1)[4] = bad
        checker = CheckOverflow()
        assert _has_overflow_serial(checker, params) == checker.has_overflow_serial(params) == (bad is not None)
    assert _has_overflow_serial(CheckOverflow(), []) is False


def _train_zero0(model, ds, on_device: bool, nan_step: int):
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=ds)
    try:
        if on_device:
            assert keep_step_on_device(engine)
        losses, weights = [], []
        for step in range(4):
            loss = loss_of(engine)
            engine.backward(loss * (float("nan") if step == nan_step else 50.0))
            engine.step()
            losses.append(loss.item())
            weights.append({k: v.clone() for k, v in engine.module.state_dict().items()})
        return losses, weights
    finally:
        engine.destroy()


def test_zero0_bf16_engine_trains_to_the_same_bits():
    """ZeRO-0 with bf16 weights (DeepSpeed's FP16 optimizer wrapper) with its overflow check read
    once: the same losses and weights as DeepSpeed's per-tensor reads, the NaN step skipped alike."""
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    ds = {"train_micro_batch_size_per_gpu": 3, "gradient_clipping": 1.0, "bf16": {"enabled": True},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1, "torch_adam": True}},
          "zero_optimization": {"stage": 0}}
    runs = {}
    for on_device in (False, True):
        model = pair()[1].to(torch.bfloat16)
        runs[on_device] = _train_zero0(model, ds, on_device, nan_step=1)
    (l0, w0), (l1, w1) = runs[False], runs[True]
    assert l1[:1] + l1[2:] == l0[:1] + l0[2:]  # (the NaN step's own loss is finite: it is the gradient)
    for step, (a, b) in enumerate(zip(w0, w1)):
        for name, value in a.items():
            assert torch.equal(b[name], value), (step, name)
    assert all(torch.equal(w1[1][k], w1[0][k]) for k in w1[0])  # the NaN step was skipped
    assert any(not torch.equal(w1[2][k], w1[1][k]) for k in w1[0])  # and training went on


def test_left_alone_where_the_host_must_decide():
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    ds = {"train_micro_batch_size_per_gpu": 3,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
          "zero_optimization": {"stage": 0}}
    model = pair()[0]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=ds)
    try:
        assert keep_step_on_device(engine) is False  # not ZeRO-1/2's optimizer
        assert "unscale_and_clip_grads" not in vars(engine.optimizer)
    finally:
        engine.destroy()
    fp16 = types.SimpleNamespace(optimizer=DeepSpeedZeroOptimizer.__new__(DeepSpeedZeroOptimizer))
    fp16.optimizer.dtype = torch.float16
    assert keep_step_on_device(fp16) is False


def test_engine_defaults_take_deepspeeds_timer_waits_out_of_the_step(monkeypatch):
    """DeepSpeed's throughput timer synchronises the device at every forward and step; the
    engine's defaults turn it off (counted through the accelerator DeepSpeed calls)."""
    from deepspeed.accelerator import get_accelerator

    from infclip.pipeline.engine.engine import with_engine_defaults
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    accel = get_accelerator()
    waits = []
    monkeypatch.setattr(accel, "synchronize", lambda *a, **k: waits.append(1))
    ds = {"train_micro_batch_size_per_gpu": 3, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
          "zero_optimization": {"stage": 2}}
    counts = {}
    for name, config in (("deepspeed", ds), ("defaults", with_engine_defaults(ds, True))):
        model = pair()[1]
        engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=config)
        try:
            waits.clear()
            for _ in range(4):  # the timer starts timing (and waiting) at its third step
                engine.backward(loss_of(engine))
                engine.step()
            counts[name] = len(waits)
        finally:
            engine.destroy()
    assert counts["deepspeed"] >= 4 and counts["defaults"] == 0, counts

