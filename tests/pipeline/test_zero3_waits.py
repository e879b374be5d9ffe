"""The host waits ``pipeline.engine.zero3_step`` removes from DeepSpeed's ZeRO-3 step, and the one the
text tower had (``CLIPTowers._text_attention_mask``): on real ZeRO-3 engines (CPU, gloo) with an
accelerator made to synchronise as CUDA's does (a counting stream), DeepSpeed's step waits at
every one-rank fetch, in the gradient epilogue and for the norm's -1, the lightened step at none
of them, and both train to the same bits (a non-finite gradient skipped by both); each piece is
left as DeepSpeed wrote it where its source differs, and the restore puts DeepSpeed's back."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from infclip.pipeline.engine import zero3_step
from infclip.pipeline.engine.zero3_step import lighten_zero3, restore_deepspeed_zero3, wait_unless_copied

from .test_model_speed import batch, cfg
from .test_zero3_step import _assert_same, _config, _engine, _loss, _models, _state
from .test_zero3_step import deepspeed_as_written  # noqa: F401  (autouse: DeepSpeed's own functions around each test)

deepspeed = pytest.importorskip("deepspeed")
from deepspeed.runtime.zero import partition_parameters as pp  # noqa: E402
from deepspeed.runtime.zero import stage3  # noqa: E402

_CAP = zero3_step._EVENT_CAP


class CountingStream:
    """A stream whose host synchronisations are counted (by the caller's name)."""

    def __init__(self):
        self.waits: list = []

    def synchronize(self):
        import sys

        self.waits.append(sys._getframe(1).f_code.co_name)

    def wait_stream(self, other):  # device order only: no host wait
        pass


@pytest.fixture
def cuda_like(monkeypatch):
    """The CPU accelerator made to take CUDA's paths: data dependencies not resolved by the
    device, one current stream whose ``synchronize`` is counted; ``torch.tensor(..., device=)``
    calls (copies from host memory, a wait on CUDA) counted too."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    stream = CountingStream()
    monkeypatch.setattr(type(accelerator), "resolves_data_dependency", lambda self: False)
    monkeypatch.setattr(type(accelerator), "current_stream", lambda self, device_index=None: stream)
    monkeypatch.setattr(type(accelerator), "default_stream", lambda self, device_index=None: stream)
    stream.copies = []
    tensor = torch.tensor

    def counted(*args, **kwargs):
        if kwargs.get("device") is not None:
            import sys

            stream.copies.append(sys._getframe(1).f_code.co_name)
        return tensor(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", counted)
    return stream


def _on_stream(engine, stream) -> None:
    """The engine's reduce and allgather streams are the current stream (``overlap_comm: false``
    on CUDA: both are the default stream)."""
    engine.optimizer.reduce_and_partition_stream = stream
    coordinator = engine.optimizer.parameter_offload.param_coordinator
    coordinator._PartitionedParameterCoordinator__allgather_stream = stream


def _train_counting(model, ds, lighten, stream, dtype=torch.float32, steps=3, bad_step=None):
    """:func:`tests.pipeline.test_zero3_step._train` with the streams counted: (losses, norms,
    state, weights) and the waits of each step."""
    engine = _engine(model, ds, "stack", lighten)
    _on_stream(engine, stream)
    try:
        losses, norms, weights, waits = [], [], [], []
        for step in range(steps):
            stream.waits.clear()
            stream.copies.clear()
            loss = _loss(engine, dtype)
            engine.backward(loss * (float("nan") if step == bad_step else 25.0))
            engine.step()
            waits.append((list(stream.waits), list(stream.copies)))
            losses.append(loss.item())
            norms.append(repr(float(engine.get_global_grad_norm())))
            weights.append(engine.optimizer.fp32_partitioned_groups_flat[0].detach().cpu().clone())
        return (losses, norms, _state(engine), weights), waits
    finally:
        engine.destroy()


# bf16 (the presets' dtype) in the default run, fp32 with -m slow (2.4 s each on 2 cores)
@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, marks=pytest.mark.slow), torch.bfloat16],
                         ids=["fp32", "bf16"])
def test_lightened_step_waits_nowhere_and_trains_to_the_same_bits(cuda_like, dtype):
    ds = _config(dtype, 1.0)
    a, b = _models(True, dtype)
    want, ds_waits = _train_counting(a, ds, False, cuda_like, dtype)
    got, light_waits = _train_counting(b, ds, True, cuda_like, dtype)
    _assert_same(want, got)
    for syncs, copies in ds_waits:  # DeepSpeed's: every fetch, the epilogue, each group's -1
        assert syncs.count("wait") >= 2 and syncs.count("independent_gradient_partition_epilogue") == 1
        assert "get_grad_norm_direct" in copies  # torch.tensor(-1.0, device=...) in each group's norm
    assert [syncs for syncs, _ in light_waits] == [[]] * 3
    assert not any("get_grad_norm_direct" in copies for _, copies in light_waits)
    # the first two steps build Adam's state and check ZeRO-3's recorded trace across ranks, once
    assert light_waits[2] == ([], [])


def test_a_nonfinite_gradient_is_still_skipped(cuda_like):
    """The norm's -1 built on the device: a NaN gradient gives the same skipped step (weights
    unchanged, norm inf), then training goes on, bit for bit as DeepSpeed's step."""
    ds = _config(torch.float32, 1.0)
    a, b = _models(True, torch.float32)
    want, _ = _train_counting(a, ds, False, cuda_like, steps=4, bad_step=2)
    got, waits = _train_counting(b, ds, True, cuda_like, steps=4, bad_step=2)
    _assert_same(want, got)
    weights = got[3]
    assert torch.equal(weights[2], weights[1]) and not torch.equal(weights[3], weights[2])
    assert got[1][2] == "inf" and waits[2] == ([], [])


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf")], ids=["finite", "nan", "inf"])
def test_grad_norm_is_deepspeeds(bad):
    """``get_grad_norm_direct`` of the lightened optimizer against DeepSpeed's own, on the same
    gradients: the same value (-1 for a non-finite norm), dtype and device."""
    _, model = _models(True, torch.float32)
    engine = _engine(model, _config(torch.float32, 1.0), "stack", True)
    try:
        opt = engine.optimizer
        assert vars(opt)["get_grad_norm_direct"].__func__ is not None
        engine.backward(_loss(engine, torch.float32))
        opt.independent_gradient_partition_epilogue()
        for i, group in enumerate(opt.fp16_groups):
            grads = [g.clone() for g in opt.averaged_gradients[i]]
            if bad is not None:
                grads[0].view(-1)[0] = bad
            want = stage3.DeepSpeedZeroOptimizer_Stage3.get_grad_norm_direct(opt, grads, group)
            got = opt.get_grad_norm_direct(grads, group)
            assert got.dtype == want.dtype and got.device == want.device and got.shape == want.shape
            assert torch.equal(got, want)
            assert (float(got) == -1.0) == (bad is not None) and math.isfinite(float(got))
    finally:
        engine.destroy()


def test_fetch_wait_skipped_only_when_nothing_was_copied(cuda_like):
    """A no-gather handle of a lightened engine's parameter that only points it at its own
    partition does not synchronise; a parameter of no lightened engine, or one whose data is not
    its partition's storage (a copy), waits as DeepSpeed does."""
    _, model = _models(True, torch.float32)
    engine = _engine(model, _config(torch.float32, 0.0), "stack", True)
    try:
        assert pp.NoGatherHandle.wait is wait_unless_copied and pp.NoGatherCoalescedHandle.wait is wait_unless_copied
        params = [p for p in engine.module.parameters() if p.ds_status == pp.ZeroParamStatus.NOT_AVAILABLE][:3]
        assert len(params) == 3
        for chosen in ([params[0]], params[1:]):  # NoGatherHandle, NoGatherCoalescedHandle
            handle = pp._no_gather_coalesced(chosen)
            handle.wait()
            handle.wait()  # complete: nothing more
            assert cuda_like.waits == [] and all(p.ds_status == pp.ZeroParamStatus.AVAILABLE for p in chosen)
            for p in chosen:
                p.partition()
        outsider = params[0]
        del outsider.__dict__[zero3_step._LIGHT_PARAM]
        pp._no_gather_coalesced([outsider]).wait()
        assert cuda_like.waits == ["wait"]
        outsider.partition()
        outsider.__dict__[zero3_step._LIGHT_PARAM] = True
        handle = pp._no_gather_coalesced([params[1]])
        params[1].data = params[1].data.clone()  # as if copied to the device
        handle.wait()
        assert cuda_like.waits == ["wait", "wait"]
        params[1].partition()
    finally:
        engine.destroy()


def test_fetch_event_cap_lifted_on_one_rank_only(monkeypatch):
    _, model = _models(True, torch.float32)
    engine = _engine(model, _config(torch.float32, 0.0), "stack", False)
    coordinator = engine.optimizer.parameter_offload.param_coordinator
    try:
        deepspeeds = getattr(coordinator, _CAP)
        assert deepspeeds == 2
        assert lighten_zero3(engine) and getattr(coordinator, _CAP) > 2**40
        restore_deepspeed_zero3()
        assert getattr(coordinator, _CAP) == deepspeeds
        import torch.distributed as dist

        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)  # partitions over two ranks
        assert lighten_zero3(engine) and getattr(coordinator, _CAP) == deepspeeds
    finally:
        engine.destroy()


@pytest.mark.parametrize("what", ["handle", "optimizer"])
def test_refused_where_deepspeeds_source_differs(what, monkeypatch, caplog, cuda_like):
    """Other DeepSpeed sources: that piece is left as DeepSpeed wrote it (logged), the rest is
    still lightened; DeepSpeed's own waits then remain."""
    table = "_HANDLE_SHA" if what == "handle" else "_OPTIMIZER_SHA"
    monkeypatch.setattr(zero3_step, table, {k: "0" * 16 for k in getattr(zero3_step, table)})
    _, model = _models(True, torch.float32)
    engine = _engine(model, _config(torch.float32, 1.0), "stack", False)
    _on_stream(engine, cuda_like)
    try:
        with caplog.at_level(logging.DEBUG, logger="infclip.pipeline.engine.zero3_step"):
            assert lighten_zero3(engine)
        assert "is not the one this module reproduces" in caplog.text
        if what == "handle":
            assert pp.NoGatherHandle.wait is not wait_unless_copied
            assert "get_grad_norm_direct" in vars(engine.optimizer)
        else:
            assert pp.NoGatherHandle.wait is wait_unless_copied
            assert "get_grad_norm_direct" not in vars(engine.optimizer)
        engine.backward(_loss(engine, torch.float32))
        engine.step()
        if what == "handle":
            assert "wait" in cuda_like.waits and "independent_gradient_partition_epilogue" not in cuda_like.waits
        else:
            assert "wait" not in cuda_like.waits and "independent_gradient_partition_epilogue" in cuda_like.waits
            assert "get_grad_norm_direct" in cuda_like.copies
    finally:
        engine.destroy()


def test_restore_gives_deepspeeds_back():
    original = {n: getattr(pp, n).wait for n in ("NoGatherHandle", "NoGatherCoalescedHandle")}
    _, model = _models(True, torch.float32)
    engine = _engine(model, _config(torch.float32, 0.0), "stack", True)
    try:
        assert {"get_grad_norm_direct", "independent_gradient_partition_epilogue"} <= set(vars(engine.optimizer))
        restore_deepspeed_zero3()
        assert {n: getattr(pp, n).wait for n in original} == original
        assert not {"get_grad_norm_direct", "independent_gradient_partition_epilogue"} & set(vars(engine.optimizer))
    finally:
        engine.destroy()


def test_overlap_comm_epilogue_still_synchronises(cuda_like):
    """With ``overlap_comm`` the reduce stream is its own: the epilogue waits for it as DeepSpeed's."""
    _, model = _models(True, torch.float32)
    engine = _engine(model, _config(torch.float32, 0.0), "stack", True)
    _on_stream(engine, cuda_like)
    side = CountingStream()
    engine.optimizer.reduce_and_partition_stream = side
    try:
        engine.backward(_loss(engine, torch.float32))
        assert side.waits == ["_independent_gradient_partition_epilogue"]
        engine.step()
    finally:
        engine.destroy()


# --- the text tower's mask -------------------------------------------------------------------
def _towers():
    from infclip.pipeline.model.model import CLIPTowers

    torch.manual_seed(0)
    return CLIPTowers(cfg(), eos_token_id=1, pad_token_id=0).train()


def test_text_mask_is_transformers_and_features_the_same_bits():
    """For SDPA the text tower gets transformers' own 4D mask, built without reading the device:
    equal to ``create_causal_mask``'s for a padded batch, and the features and gradients of the
    text tower bit for bit those of transformers' path."""
    from transformers.masking_utils import create_causal_mask

    model = _towers()
    _, ids, mask = batch()
    assert not bool(mask.all())  # the batch has padding
    text = model.text.text_model
    want = create_causal_mask(config=text.config, inputs_embeds=text.embeddings(input_ids=ids), attention_mask=mask,
                              past_key_values=None)
    got = model._text_attention_mask(mask)
    assert got.dtype == want.dtype == torch.bool and got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got, want)

    results = []
    for mine in (True, False):
        model.zero_grad(set_to_none=True)
        if not mine:
            model._text_attention_mask = lambda m: m  # transformers' own mask creation
        feats = model.encode_text(ids, mask)
        feats.square().sum().backward()
        results.append([feats.detach()] + [p.grad.clone() for p in model.text.parameters() if p.grad is not None])
        vars(model).pop("_text_attention_mask", None)
    assert len(results[0]) == len(results[1]) > 1
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_text_forward_reads_nothing_from_the_device(monkeypatch):
    """No ``bool()``/``item()`` of a tensor in the text forward (each a host wait on a GPU)."""
    model = _towers()
    _, ids, mask = batch()
    read = []
    for name in ("__bool__", "item", "tolist", "__int__", "__float__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name, **k: read.append(_n) or
                            _o(self, *a, **k))
    model.encode_text(ids, mask)
    monkeypatch.undo()
    assert read == []


def test_other_attention_implementations_get_the_2d_mask():
    from infclip.pipeline.model.model import CLIPTowers

    model = CLIPTowers(cfg(attn_implementation="eager"), eos_token_id=1, pad_token_id=0)
    _, _, mask = batch()
    assert model._text_attention_mask(mask) is mask
    assert _towers()._text_attention_mask(None) is None


def test_waits_kept_when_asked():
    """``keep_waits`` (for measuring) leaves those host waits as DeepSpeed wrote them."""
    _, model = _models(True, torch.float32)
    engine = _engine(model, _config(torch.float32, 0.0), "stack", False)
    try:
        assert lighten_zero3(engine, keep_waits=("fetch", "norm"))
        assert pp.NoGatherHandle.wait is not wait_unless_copied and "get_grad_norm_direct" not in vars(engine.optimizer)
        assert "_forward_prologue" in vars(engine)  # the rest is lightened
        restore_deepspeed_zero3()
        assert lighten_zero3(engine, keep_waits=("fetch",))
        assert pp.NoGatherHandle.wait is not wait_unless_copied and "get_grad_norm_direct" in vars(engine.optimizer)
    finally:
        engine.destroy()
