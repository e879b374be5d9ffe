"""ZeRO-3's step with less host work (``pipeline.engine.zero3_step``): real DeepSpeed ZeRO-3 engines
(CPU, gloo; CUDA where there is one) train to the same bits with and without it (fp32 and bf16,
flat parameters with a leaf per layer stack and plain parameters with a leaf per block, gradient
clipping on and off, a non-finite gradient on the way, and two ranks), the cached parameter lists
are DeepSpeed's own, the autograd functions skip only an identity binding, and DeepSpeed is left untouched where its functions are not the expected
ones. Run as a module it is one rank of the two-process test."""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest
import torch

from infclip.pipeline.engine import zero3_step
from infclip.pipeline.engine.zero3_step import (_CACHE, cached_iter_params, cuda_current_stream, identity_bound_apply,
                                                lighten_zero3, modules_preorder, restore_deepspeed_zero3)
from infclip.pipeline.model.param_layout import mark_zero3_leaf_layers, param_groups

from tests._ranks import run_two_ranks

from .test_flat_params import pair
from .test_model_speed import batch

deepspeed = pytest.importorskip("deepspeed")
from deepspeed.runtime.zero import (parameter_offload, partition_parameters,  # noqa: E402
                                    partitioned_param_coordinator, stage3)
from deepspeed.runtime.zero.linear import LinearFunctionForZeroStage3  # noqa: E402

REPLACED = [(partitioned_param_coordinator, "iter_params"), (parameter_offload, "iter_params"),
            (partition_parameters, "print_rank_0"), (partitioned_param_coordinator, "print_rank_0"),
            (parameter_offload, "print_rank_0"), (stage3, "print_rank_0")]


@pytest.fixture(autouse=True)
def deepspeed_as_written():
    """Each test starts and ends with DeepSpeed's own functions (the replacements are process-wide)."""
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    restore_deepspeed_zero3()
    yield
    restore_deepspeed_zero3()


def _config(dtype: torch.dtype, clip: float) -> dict:
    ds = {"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1, "torch_adam": True}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    if clip:
        ds["gradient_clipping"] = clip
    if dtype == torch.bfloat16:
        ds["bf16"] = {"enabled": True}
    return ds


def _engine(model, ds: dict, leaf, lighten: bool):
    mark_zero3_leaf_layers(model, leaf)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=ds)
    engine.module.bind_flat_views_in_forward()
    if lighten:
        assert lighten_zero3(engine)
    else:
        restore_deepspeed_zero3()
    return engine


def _loss(engine, dtype, rows=3, offset=0):
    pv, ids, mask = (t[offset:offset + rows].to(engine.device) for t in batch(offset + rows))
    img, txt, scale, _ = engine(pv.to(dtype), ids, mask)
    return torch.nn.functional.cross_entropy((scale * img @ txt.T).float(), torch.arange(rows, device=engine.device))


def _real(opt, group: int) -> torch.Tensor:
    """Positions of a flat fp32 partition that hold parameters (the last rank's partition of a
    parameter ends in padding, uninitialised memory that differs between any two engines)."""
    rank = torch.distributed.get_rank()
    keep, offset = [], 0
    for p in opt.fp16_groups[group]:
        size = p.partition_numel()
        keep.append(torch.arange(offset, offset + max(0, min(size, p.ds_numel - rank * size))))
        offset += size
    return torch.cat(keep)


def _state(engine) -> dict:
    """Every number the step leaves behind: gathered weights, fp32 master partitions, Adam state."""
    opt = engine.optimizer
    out = {}
    for i, t in enumerate(opt.fp32_partitioned_groups_flat):
        real = _real(opt, i)
        out[f"fp32.{i}"] = t.detach().cpu()[real].clone()
        for key, value in opt.optimizer.state[t].items():
            value = torch.as_tensor(value).detach().cpu()
            out[f"adam.{i}.{key}"] = (value[real] if value.shape == t.shape else value).clone()
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        out.update({f"w.{k}": v.detach().cpu().clone() for k, v in engine.module.state_dict().items()})
    return out


def _train(model, ds, leaf, lighten, dtype, steps=4, bad_step=None, bad=float("nan"), rows=3, offset=0):
    """Losses, global gradient norms (as text: NaN compares) and :func:`_state` after ``steps``
    steps; at ``bad_step`` the loss is scaled by ``bad`` (non-finite gradients)."""
    engine = _engine(model, ds, leaf, lighten)
    try:
        losses, norms, weights = [], [], []
        for step in range(steps):
            loss = _loss(engine, dtype, rows, offset)
            engine.backward(loss * (bad if step == bad_step else 25.0))  # large: the clip at 1.0 acts
            engine.step()
            losses.append(loss.item())
            norms.append(repr(float(engine.get_global_grad_norm())))
            weights.append(engine.optimizer.fp32_partitioned_groups_flat[0].detach().cpu().clone())
        return losses, norms, _state(engine), weights
    finally:
        engine.destroy()


def _models(flat: bool, dtype):
    """The same towers twice (flat parameters or plain), in ``dtype``."""
    return [pair()[1 if flat else 0].to(dtype) for _ in range(2)]


def _assert_same(want, got):
    (l0, n0, s0, _), (l1, n1, s1, _) = want, got
    assert l1 == l0 and n1 == n0
    assert list(s1) == list(s0)
    for name, value in s0.items():
        assert torch.equal(s1[name], value), name


FP32, BF16, SLOW = torch.float32, torch.bfloat16, pytest.mark.slow


# The 8 combinations take 2.5 s each on 2 cores: the default run keeps four that cover every
# pair of settings (clip x layout, clip x dtype, layout x dtype); the other four run with -m slow.
@pytest.mark.parametrize("clip, flat, leaf, dtype", [
    pytest.param(1.0, True, "stack", FP32, id="clip-flat-stack-fp32"),
    pytest.param(1.0, False, True, BF16, id="clip-plain-blocks-bf16"),
    pytest.param(0.0, True, "stack", BF16, id="noclip-flat-stack-bf16"),
    pytest.param(0.0, False, True, FP32, id="noclip-plain-blocks-fp32"),
    pytest.param(1.0, True, "stack", BF16, id="clip-flat-stack-bf16", marks=SLOW),
    pytest.param(1.0, False, True, FP32, id="clip-plain-blocks-fp32", marks=SLOW),
    pytest.param(0.0, True, "stack", FP32, id="noclip-flat-stack-fp32", marks=SLOW),
    pytest.param(0.0, False, True, BF16, id="noclip-plain-blocks-bf16", marks=SLOW)])
def test_lightened_engine_trains_to_the_same_bits(dtype, flat, leaf, clip):
    ds = _config(dtype, clip)
    a, b = _models(flat, dtype)
    want = _train(a, ds, leaf, False, dtype)
    got = _train(b, ds, leaf, True, dtype)
    _assert_same(want, got)
    assert got[0][-1] < got[0][0]  # it trained
    if clip:
        assert min(float(n) for n in got[1]) > 1.0  # the clip acted


# NaN in fp32 and inf in bf16 in the default run, the other two with -m slow
@pytest.mark.parametrize("bad, dtype", [
    pytest.param(float("nan"), FP32, id="fp32-nan"), pytest.param(float("inf"), BF16, id="bf16-inf"),
    pytest.param(float("inf"), FP32, id="fp32-inf", marks=SLOW),
    pytest.param(float("nan"), BF16, id="bf16-nan", marks=SLOW)])
def test_a_nonfinite_gradient_is_handled_as_deepspeed_does(bad, dtype):
    """DeepSpeed's ZeRO-3 skips the step whose gradient norm is not finite (its host check stays);
    the lightened engine does the same, then trains on."""
    ds = _config(dtype, 1.0)
    a, b = _models(True, dtype)
    want = _train(a, ds, "stack", False, dtype, bad_step=1)
    got = _train(b, ds, "stack", True, dtype, bad_step=1)
    _assert_same(want, got)
    weights = got[3]
    assert torch.equal(weights[1], weights[0]) and not torch.equal(weights[2], weights[1])  # skipped, then on
    assert got[1][1] == "inf" and got[1][2] not in ("inf", "nan")


def test_cached_parameter_lists_are_deepspeeds():
    """For every module DeepSpeed's hooks hand to ``iter_params``, with and without recursion, the
    cached list is DeepSpeed's own, also after an external parameter is registered (read live)."""
    original = partitioned_param_coordinator.iter_params
    _, model = pair()
    engine = _engine(model, _config(torch.float32, 0.0), "stack", True)
    try:
        assert partitioned_param_coordinator.iter_params is cached_iter_params
        assert parameter_offload.iter_params is cached_iter_params
        modules = [m for m in engine.module.modules() if hasattr(m, "ds_id")]
        assert modules and all(_CACHE in vars(m) for m in modules)
        stack = next(m for m in modules if m.__class__.__name__ == "ModuleList")
        assert len(list(cached_iter_params(stack, True))) > len(list(cached_iter_params(stack, False)))
        for _ in range(2):  # built at the first call, then from the cache
            for m in modules:
                for recurse in (False, True):
                    assert list(cached_iter_params(m, recurse)) == list(original(m, recurse)), (m, recurse)
        outsider = engine.module.vision.vision_model.post_layernorm.weight
        deepspeed.zero.register_external_parameter(stack, outsider)
        assert list(cached_iter_params(stack, True)) == list(original(stack, True))
        assert list(cached_iter_params(stack, True))[-1] is outsider
    finally:
        engine.destroy()


def test_a_module_of_another_engine_gets_deepspeeds_answer():
    """The replacement is process-wide; a module that is not a lightened engine's (no cache) goes to
    DeepSpeed's function, which answers as it always did."""
    _, model = pair()
    engine = _engine(model, _config(torch.float32, 0.0), "stack", True)
    try:
        other = torch.nn.Linear(3, 2)
        other._external_params = {}
        other.ds_external_parameters = lambda: other._external_params.items()
        assert [id(p) for p in cached_iter_params(other, True)] == [id(other.weight), id(other.bias)]
        assert _CACHE not in vars(other)
        with pytest.raises(AttributeError):  # DeepSpeed's own failure for a module it never saw
            list(cached_iter_params(torch.nn.Linear(2, 2)))
    finally:
        engine.destroy()


def test_autograd_functions_skip_only_an_identity_binding(monkeypatch, caplog):
    """ZeRO-3's linear function and each hooked module's pre/post-backward functions get
    :func:`identity_bound_apply`: the step binds no argument to a signature, a direct call gives
    torch's outputs and gradients bit for bit, a call with fewer arguments or keywords is bound by
    torch as before, an unexpected torch ``Function.apply`` leaves the classes alone, and the
    restore gives torch's ``apply`` back."""
    import inspect

    torch_apply = torch.autograd.Function.__dict__["apply"].__func__
    _, model = pair()
    engine = _engine(model, _config(torch.float32, 0.0), "stack", False)
    hooked = [m.__dict__[n] for m in engine.module.modules() for n in ("pre_bwd_fn", "post_bwd_fn") if n in vars(m)]
    classes = [LinearFunctionForZeroStage3, *hooked]
    try:
        monkeypatch.setattr(zero3_step, "_FUNCTION_APPLY_SHA", set())
        with caplog.at_level(logging.DEBUG, logger="infclip.pipeline.engine.zero3_step"):
            assert lighten_zero3(engine)  # the other replacements still go in
        assert "Function.apply is not the one" in caplog.text
        assert not any("apply" in vars(c) for c in classes)
        restore_deepspeed_zero3()
        monkeypatch.undo()

        assert lighten_zero3(engine) and hooked
        assert all(vars(c)["apply"].__func__ is identity_bound_apply for c in classes)
        bound = []
        signature = inspect.signature
        monkeypatch.setattr(inspect, "signature", lambda f, *a, **k: bound.append(f) or signature(f, *a, **k))
        engine.backward(_loss(engine, torch.float32))
        engine.step()
        assert not [f for f in bound if any(f is c.forward for c in classes)]

        x, w, b = (torch.randn(*shape, requires_grad=True) for shape in [(4, 3), (2, 3), (2,)])
        results = []
        for call in (lambda: LinearFunctionForZeroStage3.apply(x, w, b),
                     lambda: torch_apply(LinearFunctionForZeroStage3, x, w, b)):
            out = call()
            out.square().sum().backward()
            results.append([out.detach(), *(t.grad.clone() for t in (x, w, b))])
            x.grad = w.grad = b.grad = None
        assert all(torch.equal(g, t) for g, t in zip(*results))
        bound.clear()
        assert torch.equal(LinearFunctionForZeroStage3.apply(x, w), x @ w.T)
        assert torch.equal(LinearFunctionForZeroStage3.apply(x, w, bias=b), x @ w.T + b)
        assert len([f for f in bound if f is LinearFunctionForZeroStage3.forward]) == 2  # torch's own path
    finally:
        engine.destroy()
    restore_deepspeed_zero3()
    assert not any("apply" in vars(c) for c in classes)
    assert LinearFunctionForZeroStage3.apply.__func__ is torch_apply


def test_forward_prologue_walks_the_modules_deepspeed_walks(monkeypatch):
    """The engine's forward prologue/epilogue walk ``modules()``'s modules in its order (a shared
    module once, None children skipped), read live: a submodule attached after
    ``deepspeed.initialize`` is marked in the forward and unmarked after it, as DeepSpeed does; an
    engine method of other source is left alone; the restore gives DeepSpeed's methods back."""
    tree = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()))
    tree[1].add_module("shared", tree[0])
    tree.add_module("nothing", None)
    tree.add_module("again", tree[1])
    assert modules_preorder(tree) == list(tree.modules())

    _, model = pair()
    engine = _engine(model, _config(torch.float32, 0.0), "stack", False)
    try:
        monkeypatch.setattr(zero3_step, "_ENGINE_METHOD_SHA", {"_forward_prologue": "", "_forward_epilogue": ""})
        assert lighten_zero3(engine) and "_forward_prologue" not in vars(engine)
        restore_deepspeed_zero3()
        monkeypatch.undo()
        assert lighten_zero3(engine)
        assert vars(engine)["_forward_prologue"].__func__ is zero3_step._forward_prologue
        assert modules_preorder(engine.module) == list(engine.module.modules())
        late = torch.nn.Identity()
        engine.module.vision.add_module("late", late)  # not converted by DeepSpeed's initialize
        seen = []
        engine.module.register_forward_pre_hook(lambda *_: seen.append(late._parameters._in_forward))  # after the engine's
        engine.backward(_loss(engine, torch.float32))
        engine.step()
        assert seen == [True] and late._parameters._in_forward is False
    finally:
        engine.destroy()
    restore_deepspeed_zero3()
    assert "_forward_prologue" not in vars(engine) and "_forward_epilogue" not in vars(engine)


def test_print_rank_0_prints_what_deepspeeds_does(capsys):
    from infclip.pipeline.engine.zero3_step import print_rank_0_if_forced

    print_rank_0_if_forced("quiet")
    print_rank_0_if_forced("forced", force=True)
    print_rank_0_if_forced("debugged", debug=True)
    assert capsys.readouterr().out == "forced\ndebugged\n"


@pytest.mark.parametrize("where, name", [(partitioned_param_coordinator, "iter_params"),
                                         (partition_parameters, "print_rank_0"), (stage3, "print_rank_0")])
def test_refused_when_a_replaced_function_changed(where, name, monkeypatch, caplog):
    """A DeepSpeed function taking other arguments than the one replaced: nothing is replaced
    anywhere, the engine's modules get no cache, and the reason is logged."""
    _, model = pair()
    engine = _engine(model, _config(torch.float32, 0.0), "stack", False)
    monkeypatch.setattr(where, name, lambda message, *args, extra=None, **kwargs: None)
    before = {(m.__name__, n): getattr(m, n) for m, n in REPLACED}
    try:
        with caplog.at_level(logging.DEBUG, logger="infclip.pipeline.engine.zero3_step"):
            assert lighten_zero3(engine) is False
        assert {(m.__name__, n): getattr(m, n) for m, n in REPLACED} == before
        assert not any(_CACHE in vars(m) for m in engine.module.modules())
        assert f"{name} is not the one this module replaces" in caplog.text
    finally:
        engine.destroy()


def test_refused_for_other_zero_stages(caplog):
    _, model = pair()
    ds = {**_config(torch.float32, 0.0), "zero_optimization": {"stage": 2}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=ds)
    try:
        with caplog.at_level(logging.DEBUG, logger="infclip.pipeline.engine.zero3_step"):
            assert lighten_zero3(engine) is False
        assert partitioned_param_coordinator.iter_params is not cached_iter_params
        assert "not ZeRO-3's" in caplog.text
    finally:
        engine.destroy()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_current_stream_is_torchs():
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side):
        with torch.cuda.stream(stream):
            assert cuda_current_stream(accelerator) == torch.cuda.current_stream() == stream
            assert cuda_current_stream(accelerator, 0) == torch.cuda.current_stream(0)


def _rank_worker(out: str) -> None:
    """One rank of :func:`test_two_ranks_train_to_the_same_bits`: the unpatched then the lightened
    engine, each rank its own rows of the batch; writes ``<out>/rank<R>.json``."""
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    runs = []
    for lighten in [bool(int(c)) for c in os.environ.get("Z3_SEQ", "01")]:
        torch.manual_seed(0)
        model = pair()[1]
        losses, norms, state, _ = _train(model, _config(torch.float32, 1.0), "stack", lighten, torch.float32,
                                         rows=3, offset=3 * rank)
        runs.append({"losses": losses, "norms": norms,
                     "state": {k: v.double().flatten().tolist() for k, v in state.items()}})
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(runs, f)
    dist.destroy_process_group()


# 20 s on 2 cores, in the slow run: the default run's 2-process ZeRO-3 chunked ring test
# (tests/pipeline/test_train.py) trains lightened engines on two ranks against ZeRO-0
@pytest.mark.slow
def test_two_ranks_train_to_the_same_bits(tmp_path):
    """Two gloo ranks (each parameter split in two partitions, gathered at each fetch, gradients
    reduce-scattered): the lightened engine's losses, norms, weights and Adam state are the
    unpatched engine's, on both ranks."""
    proc = run_two_ranks(["-m", "tests.pipeline.test_zero3_step", str(tmp_path)], timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    for rank in (0, 1):
        want, got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["losses"] == want["losses"] and got["norms"] == want["norms"]
        assert got["state"] == want["state"]
        assert got["losses"][-1] < got["losses"][0]
        assert len(got["state"]["fp32.0"]) < sum(len(v) for k, v in got["state"].items() if k.startswith("w."))


if __name__ == "__main__":
    _rank_worker(sys.argv[1])
