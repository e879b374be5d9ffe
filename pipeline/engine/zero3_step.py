"""DeepSpeed's ZeRO-3 training step with less host work.

Design: at micro-batch 256 (ViT-B/32, one H200, flat parameters, a ZeRO-3 leaf per layer stack)
the ZeRO-3 step is bound by the host, not the GPU: DeepSpeed 0.19 recomputes, in Python, things
that cannot change once the engine is built. Its parameter coordinator asks for a module's
parameters (``iter_params``: ``named_parameters`` plus the module's external parameters) at every
fetch, release and end of step; for a leaf module that is a recursive ``named_modules`` walk over
every submodule of the leaf (~18k ``named_modules`` calls a step in the towers), and
``partition_all_parameters`` walks the whole model three times a step. Its ``print_rank_0``
(called ~300 times a step with ``force=False``, so printing nothing) asks the process group for
the rank before looking at ``force``.

:func:`lighten_zero3` replaces, for one engine, those pieces by equivalents doing less Python:

* ``iter_params(module, recurse)`` keeps the module's own ``named_parameters(recurse=recurse)``
  in a tuple built at its first call, and chains the module's external parameters (DeepSpeed's
  ``_external_params`` dict, which its forward hooks may still extend) read live at each call.
  The same parameters in the same order: ``named_parameters`` depends only on the module tree
  and its ``_parameters`` dicts, which do not change after the engine is built (DeepSpeed
  partitions a parameter by replacing its ``.data``, never the Parameter; flat-parameter views
  live in modules' ``__dict__``, not in ``_parameters``). Only the engine's own modules take the
  cached path (they carry the cache); any other module, and any call while torch.compile traces,
  goes to DeepSpeed's function.
* ``print_rank_0`` looks at ``debug``/``force`` before asking for the rank: it prints the same
  messages (none unless forced) on the same rank.
* On CUDA, the accelerator's ``current_stream()`` (~350 calls a step: ZeRO-3 records every
  gradient and freed parameter on the current stream) names the current device itself:
  ``torch.cuda.current_stream(None)`` finds that index through torch's generic device-type
  lookup (``_get_device_index`` -> ``_get_device_attr`` -> ``torch.cuda.is_available``), while an
  ``int`` is taken as it is. ``torch.cuda.current_device()`` is the index that lookup returns,
  so the stream is the same.

* ``torch.autograd.Function.apply`` of the autograd functions ZeRO-3 runs per layer and per
  hooked module (DeepSpeed's ``LinearFunctionForZeroStage3``, which ZeRO-3 installs as
  ``torch.nn.functional.linear``, and each hooked module's ``pre_bwd_fn``/``post_bwd_fn``) binds
  the arguments to ``inspect.signature(cls.forward)`` at every call, because these functions
  define ``setup_context`` (~180 calls a step in the towers, ~8.6k of the step's ~81k Python
  calls). When ``forward`` takes only positional-or-keyword parameters and the call passes
  exactly that many positional arguments and no keywords, that binding returns the arguments
  as they are (every parameter bound, no default applied). Those classes get an ``apply``
  that skips the binding in exactly that case and otherwise calls torch's own; the rest (dead
  functorch wrappers unwrapped, ``_FunctionBase.apply``, functorch transforms and
  torch.compile to torch's path) is torch's code. ``forward`` is compared with the one
  checked at each call (read live); torch's ``Function.apply`` must be the source this was
  written against (torch 2.13), else these classes are left alone.

* The engine's forward prologue and epilogue (``_forward_prologue``/``_forward_epilogue``) mark
  every module's parameter dict as in or out of a forward, walking ``self.module.modules()``:
  a chain of nested ``named_modules`` generators (~5k generator resumptions a step for the
  towers' ~300 modules, the walk ~0.5-1 ms on this CPU). The engine gets the same two methods
  (DeepSpeed's code, checked by the hash of its source) walking the same modules in the same
  order with one recursive function (:func:`modules_preorder`): read live at every call, so a
  submodule attached after ``deepspeed.initialize`` is marked as DeepSpeed marks it.

It applies to DeepSpeed's ``DeepSpeedZeroOptimizer_Stage3`` with no parameter or optimizer
offload (ZeRO-Infinity's NVMe swapping has its own ordering needs and is left as DeepSpeed wrote
it). If DeepSpeed's code changes shape (a replaced function is missing or takes other arguments)
nothing is replaced and the reason is logged at debug level.

Host waits (each drains the GPU's queue, so the host's work after it is idle GPU time):
:func:`lighten_zero3` also removes three kinds, each by an equivalent that gives the same bits.

* One-rank fetch: with one rank per partition group DeepSpeed "gathers" a module's parameters
  through a no-gather handle: each parameter's ``.data`` becomes a view of its own partition
  (``.to(device)``: no copy when the partition is on the device), then ``wait()`` synchronises
  the current stream (the allgather stream in the fetch, the compute stream in ``_post_step``'s
  all-gather of persistent parameters). Nothing was enqueued, so nothing is waited for: the
  handles' ``wait`` (process-wide, :func:`wait_unless_copied`) marks the parameters available
  without the synchronisation when every parameter of the handle belongs to a lightened engine,
  is not quantised, and its ``.data`` shares its partition's storage; any other handle (an
  offloaded or quantised partition, another engine's parameters) waits as DeepSpeed does.
  Device order is unchanged: the fetch still makes the compute stream wait for the allgather
  stream. The fetch also records an event after each wait and, with more than two unfinished,
  waits on the host for the oldest (a bound on all-gather buffers in flight); once ``wait`` no
  longer synchronises, that would drain the queue instead. With every parameter its own
  one-rank partition a fetch allocates nothing, so that cap is lifted for the engine's
  coordinator (kept with several ranks). An earlier attempt that skipped the waits without
  lifting the cap measured slower (``pipeline.engine.zero_step``'s docstring).
* The gradient norm (``get_grad_norm_direct``) marks a non-finite norm with
  ``torch.tensor(-1.0, device=...)``: a copy from pageable host memory, which waits for the
  stream. The engine's optimizer gets the same method (DeepSpeed 0.19.8's source, checked by
  hash) building that -1 with ``torch.full`` on the device: same value, dtype and device.
* The gradient epilogue (``independent_gradient_partition_epilogue``) ends with
  ``reduce_and_partition_stream.synchronize()``. With ``overlap_comm: false`` that stream is the
  compute stream itself: the reduction's kernels were queued on it, so everything queued later
  already runs after them, and the host reads none of their results. The optimizer gets the same
  method (source checked by hash) that synchronises only when that stream is not the current
  stream (``overlap_comm: true``: as DeepSpeed does).

Not replaced: the ``bool()`` of ``is_invalid_grad_norm`` in the step (one host wait per step),
which decides whether the step is skipped (bf16 and fp32 too, not only fp16's loss scale):
DeepSpeed's FusedAdam counts its steps on the host (``state['step']``, the bias correction of the
next step), so a skip decided on the device would leave that count, the LR scheduler's step and
``skipped_steps`` wrong until the host reads the decision.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import logging
import types
import weakref
from typing import Any, Iterator

import torch

__all__ = ["lighten_zero3", "cached_iter_params", "cuda_current_stream", "identity_bound_apply",
           "print_rank_0_if_forced", "restore_deepspeed_zero3", "wait_unless_copied"]

logger = logging.getLogger(__name__)

_CACHE = "_infclip_param_lists"
"""Attribute (in a module's ``__dict__``) holding ``{recurse: tuple of parameters}``; its presence
marks the module as one of a lightened engine's."""

_ORIGINAL: dict = {}
"""DeepSpeed's own functions, by (module name, attribute), as first seen before replacing."""


def _modules() -> dict:
    from deepspeed.runtime.zero import (parameter_offload, partition_parameters, partitioned_param_coordinator,
                                        stage3)

    return {"coordinator": partitioned_param_coordinator, "offload": parameter_offload,
            "partition": partition_parameters, "stage3": stage3}


def _original(where: str, name: str):
    """DeepSpeed's ``name`` in module ``where`` (the one this module replaced, if it did)."""
    return _ORIGINAL.get((where, name)) or getattr(_modules()[where], name)


def cached_iter_params(module: torch.nn.Module, recurse: bool = False) -> Iterator[torch.nn.Parameter]:
    """DeepSpeed's ``iter_params``: ``module.named_parameters(recurse=recurse)``'s parameters, then
    the module's external parameters. The first part is built once per module and ``recurse``
    (module docstring: it cannot change); the external ones are read at every call."""
    lists = module.__dict__.get(_CACHE)
    if lists is None or torch.compiler.is_compiling():
        return _original("coordinator", "iter_params")(module, recurse)
    own = lists.get(recurse)
    if own is None:
        own = lists[recurse] = tuple(p for _, p in module.named_parameters(recurse=recurse))
    external = module.__dict__["_external_params"]
    return itertools.chain(own, external.values()) if external else iter(own)


def print_rank_0_if_forced(message, debug=False, force=False):
    """DeepSpeed ZeRO's ``print_rank_0``: ``message`` printed by rank 0 when ``debug`` or
    ``force``; the rank is only asked for when it may print."""
    if debug or force:
        _original("partition", "print_rank_0")(message, debug=debug, force=force)


def _stage3_print_rank_0_if_forced(message, debug=False, force=False):
    """``print_rank_0`` of DeepSpeed's stage3 module (it logs instead of printing), as above."""
    if debug or force:
        _original("stage3", "print_rank_0")(message, debug=debug, force=force)


def cuda_current_stream(self, device_index=None):
    """DeepSpeed's CUDA accelerator's ``current_stream``: ``torch.cuda.current_stream`` of
    ``device_index``, the current device when None, found directly (module docstring)."""
    return torch.cuda.current_stream(torch.cuda.current_device() if device_index is None else device_index)


def _lighten_cuda_stream() -> str:
    """Give DeepSpeed's CUDA accelerator :func:`cuda_current_stream` ('' when done or nothing to
    do off CUDA, else why not)."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    try:
        from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator
    except ImportError:  # pragma: no cover - part of DeepSpeed
        return ""
    if not isinstance(accelerator, CUDA_Accelerator):
        return ""
    method = getattr(type(accelerator), "current_stream", None)
    if method is None or list(inspect.signature(method).parameters) != ["self", "device_index"]:
        return "DeepSpeed's CUDA_Accelerator.current_stream is not the one this module replaces"
    accelerator.current_stream = types.MethodType(cuda_current_stream, accelerator)
    return ""


_ARITY = "_infclip_positional_forward"
"""Attribute (in an autograd function class's ``__dict__``) holding ``(forward, n)``: the
``forward`` whose ``n`` parameters are all positional-or-keyword; its presence marks the classes
given :func:`identity_bound_apply`."""

_FUNCTION_APPLY_SHA = {"bbc5d31817220a84", "0fb1db0ba4a6a7e9"}
"""sha256 (first 16 hex digits) of the sources of torch's ``Function.apply`` this module's fast path
reproduces: torch 2.13, and torch 2.11 (the device machine's), whose ``bind_default_args`` returns
the bound positional arguments only and passes the keywords on as given; with exactly ``n``
positional arguments and no keywords both give ``super().apply(*args)``. Before 2.11's digest was
listed the fast path was never taken on the device."""

_FAST_APPLY_CLASSES: "weakref.WeakSet[type]" = weakref.WeakSet()
"""The autograd function classes given :func:`identity_bound_apply` (for the restore)."""


def _source_digest(function) -> str:
    """sha256 (first 16 hex digits) of ``function``'s source: what the hashes above pin (raises
    as ``inspect.getsource`` does when the source is not available)."""
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


def _torch_function_apply(cls, *args, **kwargs):
    """torch's own ``Function.apply`` of ``cls``."""
    return torch.autograd.Function.__dict__["apply"].__func__(cls, *args, **kwargs)


def identity_bound_apply(cls, *args, **kwargs):
    """torch's ``Function.apply`` for an autograd function whose ``forward`` takes ``n``
    positional-or-keyword parameters: called with exactly ``n`` positional arguments and no
    keywords, binding them to ``forward``'s signature (what torch does when ``setup_context`` is
    defined) gives them back unchanged, so it is skipped; any other call is torch's own."""
    checked = cls.__dict__.get(_ARITY)
    if (checked is None or kwargs or len(args) != checked[1] or cls.forward is not checked[0]
            or torch._C._are_functorch_transforms_active() or torch.compiler.is_compiling()):
        return _torch_function_apply(cls, *args, **kwargs)
    # torch's Function.apply from here on, its binding done
    args = torch._functorch.utils.unwrap_dead_wrappers(args)
    return super(torch.autograd.Function, cls).apply(*args)


def _positional_arity(forward) -> int | None:
    """The number of parameters of ``forward`` when all are positional(-or-keyword) (then binding
    exactly that many positional arguments is the identity), else None."""
    try:
        params = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return len(params) if all(p.kind in kinds for p in params) else None


def _give_identity_bound_apply(cls) -> bool:
    """Give the autograd function class ``cls`` :func:`identity_bound_apply` (whether it did)."""
    if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)):
        return False
    if cls.__dict__.get(_ARITY) is not None:
        return True
    own = [k for k in cls.__mro__ if "apply" in vars(k)]
    if not own or own[0] is not torch.autograd.Function:  # a class with its own apply keeps it
        return False
    from torch.autograd.function import _is_setup_context_defined

    arity = _positional_arity(cls.forward)
    if arity is None or not _is_setup_context_defined(cls.setup_context):
        return False
    setattr(cls, _ARITY, (cls.forward, arity))
    cls.apply = classmethod(identity_bound_apply)
    _FAST_APPLY_CLASSES.add(cls)
    return True


def _lighten_function_apply(engine: Any) -> str:
    """Give ZeRO-3's per-call autograd functions :func:`identity_bound_apply` ('' when done, else
    why not)."""
    try:
        digest = _source_digest(torch.autograd.Function.__dict__["apply"].__func__)
    except (OSError, TypeError, KeyError):
        return "the source of torch's Function.apply is not available"
    if digest not in _FUNCTION_APPLY_SHA:
        return "torch's Function.apply is not the one this module reproduces"
    from deepspeed.runtime.zero import linear

    _give_identity_bound_apply(linear.LinearFunctionForZeroStage3)
    for module in engine.module.modules():
        for name in ("pre_bwd_fn", "post_bwd_fn"):
            if name in module.__dict__:
                _give_identity_bound_apply(module.__dict__[name])
    return ""


def modules_preorder(root: torch.nn.Module) -> list:
    """``list(root.modules())``: each module once, in ``named_modules``' order (a module is
    yielded, then its children's subtrees; one seen before is skipped with its subtree), found
    by one recursive function instead of a chain of generators."""
    out = [root]
    seen = {root}

    def visit(module):
        for child in module._modules.values():
            if child is not None and child not in seen:
                seen.add(child)
                out.append(child)
                visit(child)

    visit(root)
    return out


_ENGINE_METHOD_SHA = {"_forward_prologue": "7f3289ffc96f30e2", "_forward_epilogue": "2ffc78bd3da0c8c0"}
"""sha256 (first 16 hex digits) of the source of the DeepSpeed engine methods reproduced below
(DeepSpeed 0.19.8)."""

_LIGHT_ENGINES: "weakref.WeakSet" = weakref.WeakSet()
"""Engines given the methods below (for the restore)."""


def _forward_prologue(self, inputs, kwargs):
    """DeepSpeed 0.19.8's ``DeepSpeedEngine._forward_prologue``, walking the modules with
    :func:`modules_preorder` (module docstring)."""
    from deepspeed.runtime import engine as ds

    return_modified = False

    if not self.autotuning_profile_model_info():
        ds.see_memory_usage("Engine before forward", force=self.memory_breakdown())

    flops_profiler_active = (self.flops_profiler_enabled()
                             and self.global_steps == self.flops_profiler_profile_step() and self.global_rank == 0)

    if flops_profiler_active:
        self.flops_profiler.start_profile(ignore_list=None)

    if self.module.training and self.random_ltd_enabled():
        self.random_ltd_scheduler.update_seq(self.global_steps)

    if self.training_dataloader is None:
        self.tput_timer.start()

    self._start_timers(self.engine_timers.forward_timers)

    if self.zero_optimization_partition_weights():
        # Enable automated discovery of external parameters by indicating that
        # we are in a forward pass.
        for module in modules_preorder(self.module):
            ds.ensure_zero_ordered_dict(module)
            module._parameters._in_forward = True

    if self.fp16_auto_cast():
        inputs = self._cast_inputs_half(inputs)
        return_modified = True

    if return_modified:
        return inputs, kwargs


def _forward_epilogue(self):
    """DeepSpeed 0.19.8's ``DeepSpeedEngine._forward_epilogue``, walking the modules with
    :func:`modules_preorder` (module docstring)."""
    from deepspeed.runtime import engine as ds

    if self.zero_optimization_partition_weights():
        # Disable automated discovery of external parameters
        for module in modules_preorder(self.module):
            if isinstance(module._parameters, ds.ZeROOrderedDict):
                module._parameters._in_forward = False

    self._stop_timers(self.engine_timers.forward_timers)

    flops_profiler_active = (self.flops_profiler_enabled()
                             and self.global_steps == self.flops_profiler_profile_step() and self.global_rank == 0)

    if flops_profiler_active:
        self.flops_profiler.stop_profile()

    if not self.autotuning_profile_model_info():
        ds.see_memory_usage("Engine after forward", force=self.memory_breakdown())


_ENGINE_METHODS = {"_forward_prologue": _forward_prologue, "_forward_epilogue": _forward_epilogue}


def _lighten_engine_methods(engine: Any) -> str:
    """Give ``engine`` the forward prologue and epilogue above ('' when done, else why not)."""
    for name in _ENGINE_METHODS:
        if name in vars(engine):
            return f"the engine has its own {name}"
        try:
            digest = _source_digest(getattr(type(engine), name))
        except (AttributeError, OSError, TypeError):
            return f"the source of DeepSpeed's {name} is not available"
        if digest != _ENGINE_METHOD_SHA[name]:
            return f"DeepSpeed's {name} is not the one this module reproduces"
    for name, method in _ENGINE_METHODS.items():
        object.__setattr__(engine, name, types.MethodType(method, engine))
    _LIGHT_ENGINES.add(engine)
    return ""


# ----------------------------------------------------------------------------------------------
# Host waits: the one-rank fetch, the gradient norm's -1, the gradient epilogue
# ----------------------------------------------------------------------------------------------
_LIGHT_PARAM = "_infclip_light"
"""Attribute set on a lightened engine's parameters: their no-gather handles may skip the wait."""

_HANDLE_SHA = {("NoGatherHandle", "__init__"): "401cee9c0bdb6b96", ("NoGatherHandle", "wait"): "b86a33702302c9ff",
               ("NoGatherCoalescedHandle", "__init__"): "81c2cdda2e7d898a",
               ("NoGatherCoalescedHandle", "wait"): "e8a53706e84e13f0"}
"""sha256 (first 16 hex digits) of the sources of DeepSpeed 0.19.8's no-gather handle methods
:func:`wait_unless_copied` reproduces (the constructors: where the handle keeps its parameters)."""

_OPTIMIZER_SHA = {"get_grad_norm_direct": "5ba2252d5f16b541", "independent_gradient_partition_epilogue": "f1575b87b3d6c083"}
"""sha256 (first 16 hex digits) of the sources of DeepSpeed 0.19.8's ZeRO-3 optimizer methods
reproduced below (under DeepSpeed's ``instrument_w_nvtx``)."""

_DEEPSPEED_WAITS: dict = {}
"""DeepSpeed's own ``wait`` of each no-gather handle class, as first seen before replacing."""

_LIGHT_OPTIMIZERS: "weakref.WeakSet" = weakref.WeakSet()
"""Optimizers given the methods below (for the restore)."""


def _undecorated(function):
    """``function`` without DeepSpeed's ``instrument_w_nvtx`` wrapper (which keeps no
    ``__wrapped__``): the function it closes over."""
    if getattr(function, "__name__", "") == "wrapped_fn" and function.__closure__:
        for cell in function.__closure__:
            if inspect.isfunction(cell.cell_contents):
                return cell.cell_contents
    return function


def _handle_params(handle: Any) -> list:
    """The parameters of one of DeepSpeed's no-gather handles (its private attributes)."""
    if "_NoGatherHandle__param" in vars(handle):
        return [vars(handle)["_NoGatherHandle__param"]]
    return list(vars(handle).get("_NoGatherCoalescedHandle__params", ()))


def _not_copied(param: Any) -> bool:
    """Whether the no-gather handle only pointed ``param`` at its own partition: a lightened
    engine's parameter, not quantised, its ``.data`` sharing the partition's storage."""
    part = getattr(param, "ds_tensor", None)
    return (param.__dict__.get(_LIGHT_PARAM, False) and part is not None and not hasattr(part, "ds_quant_scale")
            and param.data.device == part.device
            and param.data.untyped_storage().data_ptr() == part.untyped_storage().data_ptr())


def wait_unless_copied(self, **kwargs) -> None:
    """DeepSpeed's no-gather ``wait()`` (``NoGatherHandle`` and ``NoGatherCoalescedHandle``) without
    the stream synchronisation when nothing was copied (module docstring); DeepSpeed's own
    otherwise."""
    complete = f"_{type(self).__name__}__complete"
    if vars(self).get(complete):  # DeepSpeed's wait returns at once too (each parameter asks)
        return None
    params = _handle_params(self)
    if not params or not all(_not_copied(p) for p in params):
        return _DEEPSPEED_WAITS[type(self).__name__](self, **kwargs)
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    coalesced = type(self).__name__ == "NoGatherCoalescedHandle"
    for param in params:
        if coalesced:
            assert param.ds_status == ZeroParamStatus.INFLIGHT, f"expected param {param.ds_summary()} to be inflight"
        param.ds_status = ZeroParamStatus.AVAILABLE
    setattr(self, complete, True)
    return None


def _lighten_fetch_waits(engine: Any) -> str:
    """Give DeepSpeed's no-gather handles :func:`wait_unless_copied` and mark ``engine``'s
    parameters ('' when done, else why not)."""
    from deepspeed.runtime.zero import partition_parameters as pp

    for (name, method), digest in _HANDLE_SHA.items():
        cls = getattr(pp, name, None)
        try:
            current = getattr(cls, method)
            if current is wait_unless_copied:  # replaced before: check DeepSpeed's
                current = _DEEPSPEED_WAITS[name]
            if _source_digest(_undecorated(current)) != digest:
                return f"DeepSpeed's {name}.{method} is not the one this module reproduces"
        except (AttributeError, OSError, TypeError):
            return f"the source of DeepSpeed's {name}.{method} is not available"
    for name in ("NoGatherHandle", "NoGatherCoalescedHandle"):
        cls = getattr(pp, name)
        _DEEPSPEED_WAITS.setdefault(name, cls.wait)
        cls.wait = wait_unless_copied
    for param in engine.module.parameters():
        param.__dict__[_LIGHT_PARAM] = True
    return _lift_fetch_event_cap(engine)


_EVENT_CAP = "_PartitionedParameterCoordinator__max_ongoing_fetch_events"
_LIFTED_CAPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
"""Coordinators whose fetch-event cap was lifted -> DeepSpeed's cap (for the restore)."""


def _lift_fetch_event_cap(engine: Any) -> str:
    """On one rank, lift the cap of ``engine``'s parameter coordinator on fetch events not yet
    reached by the GPU ('' when done or nothing to do, else why not).

    After each parameter's ``wait()`` the fetch records an event, and with more than two of them
    unfinished it waits on the host for the oldest: a bound on the all-gather buffers in flight.
    With DeepSpeed's synchronising ``wait`` the events are reached at once; without it they trail
    the GPU's queue and that wait would drain it. With every parameter its own (one-rank)
    partition, a fetch allocates nothing (the parameter becomes a view of its partition), so the
    cap bounds nothing and is lifted; with several ranks it stays."""
    import torch.distributed as dist

    coordinator = getattr(getattr(engine.optimizer, "parameter_offload", None), "param_coordinator", None)
    if not isinstance(getattr(coordinator, _EVENT_CAP, None), int):
        return "DeepSpeed's parameter coordinator has no fetch-event cap where this module expects it"
    for param in engine.module.parameters():
        group = getattr(param, "ds_process_group", None)
        if dist.is_initialized() and dist.get_world_size(group) != 1:
            return ""  # gathered from several ranks: the cap bounds the buffers in flight
    _LIFTED_CAPS.setdefault(coordinator, getattr(coordinator, _EVENT_CAP))
    setattr(coordinator, _EVENT_CAP, 2**62)
    return ""


def _get_grad_norm_direct(self, gradients, params, norm_type=2):
    """DeepSpeed 0.19.8's ``DeepSpeedZeroOptimizer_Stage3.get_grad_norm_direct``, the -1 of a
    non-finite norm built on the device (module docstring)."""
    from deepspeed.runtime.zero import stage3 as ds

    self._assert_same_partition_group(params)
    process_group = self._get_param_partition_group(params[0])
    norm_type = float(norm_type)
    if norm_type == ds.inf:
        total_norm = max(g.data.abs().max() for g in gradients)
        total_norm_cuda = ds.get_accelerator().FloatTensor([float(total_norm)])
        ds.dist.all_reduce(total_norm_cuda, op=ds.dist.ReduceOp.MAX, group=process_group)

        # Take max across all GPUs.
        self._model_parallel_all_reduce(tensor=total_norm_cuda, op=ds.dist.ReduceOp.MAX)
        autoep_ep_group = self._autoep_expert_parallel_group(params)
        if ds.pg_utils.is_parallel(autoep_ep_group):
            ds.dist.all_reduce(total_norm_cuda, op=ds.dist.ReduceOp.MAX, group=autoep_ep_group)
        total_norm = total_norm_cuda[0]
    else:
        counts_every_rank = self._grad_norm_counts_every_rank(params, process_group)
        grad_norms = []
        for g, p in zip(gradients, params):
            if counts_every_rank or ds.is_model_parallel_parameter(p) or (self.model_parallel_rank == 0):
                grad_norms.append(
                    g.to(ds.get_accelerator().device_name(), non_blocking=True).to(ds.get_norm_dtype()).norm(norm_type))

        # Sum across all model parallel GPUs.
        if len(grad_norms) == 0:
            total_norm_cuda = torch.tensor(0, dtype=gradients[0].dtype).to(ds.get_accelerator().device_name()).to(
                ds.get_norm_dtype())
        else:
            total_norm_cuda = torch.sum(torch.pow(torch.stack(grad_norms), norm_type))

        ds.dist.all_reduce(total_norm_cuda, op=ds.dist.ReduceOp.SUM, group=process_group)

        if not counts_every_rank:
            self._model_parallel_all_reduce(tensor=total_norm_cuda, op=ds.dist.ReduceOp.SUM)
        autoep_ep_group = self._autoep_expert_parallel_group(params)
        if ds.pg_utils.is_parallel(autoep_ep_group):
            ds.dist.all_reduce(total_norm_cuda, op=ds.dist.ReduceOp.SUM, group=autoep_ep_group)

        total_norm = total_norm_cuda**(1. / norm_type)

    norm_is_inf = total_norm.isinf()
    norm_is_nan = total_norm.isnan()
    inf_or_nan = norm_is_nan.logical_or(norm_is_inf)

    # DeepSpeed: torch.tensor(-1.0, device=self.device, dtype=torch.float), a host-to-device copy
    err = torch.full((), -1.0, device=self.device, dtype=torch.float)
    total_norm = torch.where(inf_or_nan, err, total_norm)

    return total_norm


def _independent_gradient_partition_epilogue(self):
    """DeepSpeed 0.19.8's ``DeepSpeedZeroOptimizer_Stage3.independent_gradient_partition_epilogue``,
    synchronising the reduce stream only when it is not the current stream (module docstring)."""
    from deepspeed.runtime.zero import stage3 as ds

    self.report_ipg_memory_usage("In ipg_epilogue before reduce_ipg_grads", 0)
    for comm_dtype in ds.sort_dtypes(self.ipg_buckets.keys()):
        self._DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads(comm_dtype)
    self.report_ipg_memory_usage("In ipg_epilogue after reduce_ipg_grads", 0)

    accelerator = ds.get_accelerator()
    if not accelerator.resolves_data_dependency() and not self.reduce_and_partition_stream == accelerator.current_stream():
        self.reduce_and_partition_stream.synchronize()

    for param_id in self.params_already_reduced.keys():
        self.params_already_reduced[param_id] = False

    if not self.offload_optimizer:
        grad_partitions = self._DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition
        for i, sub_group in enumerate(self.fp16_groups):
            self.averaged_gradients[i] = [
                grad_partitions[param.ds_id] if param.requires_grad else torch.zeros_like(param.ds_tensor)
                for param in sub_group
            ]
    self._epilogue_ran_this_backward = True


_OPTIMIZER_METHODS = {"get_grad_norm_direct": _get_grad_norm_direct,
                      "independent_gradient_partition_epilogue": _independent_gradient_partition_epilogue}


def _lighten_optimizer_methods(optimizer: Any) -> str:
    """Give ``optimizer`` (ZeRO-3's) the two methods above ('' when done, else why not)."""
    from deepspeed.utils.nvtx import instrument_w_nvtx

    for name, digest in _OPTIMIZER_SHA.items():
        if name in vars(optimizer):
            return f"the optimizer has its own {name}"
        try:
            if _source_digest(_undecorated(getattr(type(optimizer), name))) != digest:
                return f"DeepSpeed's {name} is not the one this module reproduces"
        except (AttributeError, OSError, TypeError):
            return f"the source of DeepSpeed's {name} is not available"
    for name, method in _OPTIMIZER_METHODS.items():
        vars(optimizer)[name] = types.MethodType(instrument_w_nvtx(method), optimizer)
    _LIGHT_OPTIMIZERS.add(optimizer)
    return ""


_REPLACEMENTS = {
    ("coordinator", "iter_params"): (cached_iter_params, ["module", "recurse"]),
    ("offload", "iter_params"): (cached_iter_params, ["module", "recurse"]),
    ("partition", "print_rank_0"): (print_rank_0_if_forced, ["message", "debug", "force"]),
    ("coordinator", "print_rank_0"): (print_rank_0_if_forced, ["message", "debug", "force"]),
    ("offload", "print_rank_0"): (print_rank_0_if_forced, ["message", "debug", "force"]),
    ("stage3", "print_rank_0"): (_stage3_print_rank_0_if_forced, ["message", "debug", "force"]),
}
"""(DeepSpeed module, name) -> (replacement, the parameter names DeepSpeed's function must have)."""


def _why_not(engine: Any) -> str:
    """Why ``engine``'s step is left as DeepSpeed wrote it ('' when it can be lightened)."""
    try:
        modules = _modules()
    except ImportError as exc:  # pragma: no cover - DeepSpeed is a dependency
        return f"DeepSpeed's ZeRO-3 modules do not import ({exc})"
    optimizer = getattr(engine, "optimizer", None)
    if not isinstance(optimizer, modules["stage3"].DeepSpeedZeroOptimizer_Stage3):
        return f"the optimizer is {type(optimizer).__name__}, not ZeRO-3's"
    if getattr(optimizer, "offload_optimizer", False) or getattr(optimizer, "offload_param", False):
        return "parameter or optimizer offload"
    if not isinstance(getattr(engine, "module", None), torch.nn.Module):
        return "the engine has no module"
    for (where, name), (replacement, params) in _REPLACEMENTS.items():
        current = getattr(modules[where], name, None)
        if current is replacement:
            continue
        if current is None or list(inspect.signature(current).parameters) != params:
            return f"DeepSpeed's {modules[where].__name__}.{name} is not the one this module replaces"
    if _original("offload", "iter_params") is not _original("coordinator", "iter_params"):
        return "DeepSpeed's parameter_offload.iter_params is not its coordinator's"
    return ""


def lighten_zero3(engine: Any, keep_waits: tuple = ()) -> bool:
    """Replace the per-step host work of ``engine``'s ZeRO-3 step listed in the module docstring.
    ``keep_waits`` names host waits left as DeepSpeed wrote them (for measuring): "fetch", "norm"
    (the gradient norm and epilogue). Returns whether it did; the reason it did not is logged at
    debug level."""
    why = _why_not(engine)
    if why:
        logger.debug("ZeRO-3 step left as DeepSpeed wrote it: %s", why)
        return False
    modules = _modules()
    for (where, name), (replacement, _) in _REPLACEMENTS.items():
        current = getattr(modules[where], name)
        if current is not replacement:
            _ORIGINAL.setdefault((where, name), current)
            setattr(modules[where], name, replacement)
    why = _lighten_cuda_stream()
    if why:
        logger.debug("ZeRO-3's current_stream left as DeepSpeed wrote it: %s", why)
    why = _lighten_function_apply(engine)
    if why:
        logger.debug("ZeRO-3's autograd functions left as torch applies them: %s", why)
    why = _lighten_engine_methods(engine)
    if why:
        logger.debug("the engine's forward prologue and epilogue left as DeepSpeed wrote them: %s", why)
    why = _lighten_fetch_waits(engine) if "fetch" not in keep_waits else "asked to keep it"
    if why:
        logger.debug("ZeRO-3's one-rank fetch left as DeepSpeed wrote it: %s", why)
    why = _lighten_optimizer_methods(engine.optimizer) if "norm" not in keep_waits else "asked to keep them"
    if why:
        logger.debug("ZeRO-3's gradient norm and epilogue left as DeepSpeed wrote them: %s", why)
    for module in engine.module.modules():
        # the modules DeepSpeed's hooks may hand to iter_params carry their external parameters
        if isinstance(module.__dict__.get("_external_params"), dict):
            module.__dict__.setdefault(_CACHE, {})
    return True


def restore_deepspeed_zero3() -> None:
    """Put DeepSpeed's own functions back in its modules, torch's ``apply`` back in the autograd
    function classes, DeepSpeed's ``wait`` back in its no-gather handles and DeepSpeed's methods
    back in the lightened engines and optimizers (everything
    :func:`lighten_zero3` replaces): for measuring DeepSpeed's step as written after an engine of
    the same process was lightened. Modules of lightened engines keep their cache, unused."""
    from deepspeed.accelerator import get_accelerator

    modules = _modules()
    for (where, name), original in _ORIGINAL.items():
        setattr(modules[where], name, original)
    vars(get_accelerator()).pop("current_stream", None)
    for cls in list(_FAST_APPLY_CLASSES):
        if cls.__dict__.get(_ARITY) is not None:
            delattr(cls, "apply")
            delattr(cls, _ARITY)
    _FAST_APPLY_CLASSES.clear()
    for engine in list(_LIGHT_ENGINES):
        for name, method in _ENGINE_METHODS.items():
            bound = vars(engine).get(name)
            if getattr(bound, "__func__", None) is method:
                del vars(engine)[name]
    _LIGHT_ENGINES.clear()
    from deepspeed.runtime.zero import partition_parameters as pp

    for name, wait in _DEEPSPEED_WAITS.items():
        setattr(getattr(pp, name), "wait", wait)
    for coordinator, cap in list(_LIFTED_CAPS.items()):
        setattr(coordinator, _EVENT_CAP, cap)
    _LIFTED_CAPS.clear()
    for optimizer in list(_LIGHT_OPTIMIZERS):
        for name in _OPTIMIZER_METHODS:
            vars(optimizer).pop(name, None)
    _LIGHT_OPTIMIZERS.clear()
