"""ops/launch.py on the CPU: what a launch is keyed by (a key finer than Triton's specialisation,
never coarser: a reused compiled kernel must be one Triton would have picked), and that launches
through it under the interpreter (which compiles nothing) run the kernel every time. The direct
launches themselves run on the GPU (tests/ops/test_gluon_gpu.py)."""

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

import infclip.ops.contrastive_loss_triton as tri
from infclip.ops import launch as fast


def _key(*args, **constexprs):
    return fast.launch_key(tri._fill_kernel, 1, args, constexprs)


def test_same_specialisation_same_key():
    a, b = torch.zeros(64), torch.ones(64)  # both 16-byte aligned
    assert _key(a, 7, 0.5, BLOCK=64) == _key(b, 7, -3.25, BLOCK=64)  # floats are not specialised


@pytest.mark.parametrize("other", [
    lambda buf: (buf, 8, 0.5),  # an integer's value (Triton: == 1, divisible by 16, i64)
    lambda buf: (buf, 1, 0.5),
    lambda buf: (buf[1:], 7, 0.5),  # a pointer no longer 16-byte aligned
    lambda buf: (buf.double(), 7, 0.5),  # the pointee's dtype
    lambda buf: (buf, True, 0.5),  # a bool where an int was
    lambda buf: (buf, None, 0.5),
])
def test_what_changes_the_key(other):
    buf = torch.zeros(64)
    assert _key(buf, 7, 0.5, BLOCK=64) != _key(*other(buf), BLOCK=64)


def test_constexprs_options_and_grid_rank_change_the_key():
    buf = torch.zeros(64)
    base = _key(buf, 7, 0.5, BLOCK=64)
    assert base != _key(buf, 7, 0.5, BLOCK=128)
    assert base != _key(buf, 7, 0.5, BLOCK=64, num_warps=8)
    assert base != fast.launch_key(tri._fill_kernel, 2, (buf, 7, 0.5), dict(BLOCK=64))
    assert base != fast.launch_key(tri._scale_into, 1, (buf, 7, 0.5), dict(BLOCK=64))


def test_tensor_descriptors_keyed_by_shape_strides_block_and_dtype():
    x = torch.zeros(256, 128, dtype=torch.bfloat16)

    def key(t, block):
        return fast.launch_key(tri._fill_kernel, 1, (TensorDescriptor.from_tensor(t, block),), {})

    assert key(x, [64, 64]) == key(torch.ones(256, 128, dtype=torch.bfloat16), [64, 64])
    assert key(x, [64, 64]) != key(x[:128], [64, 64])  # shape
    assert key(x, [64, 64]) != key(x, [64, 32])  # block
    assert key(x, [64, 64]) != key(torch.zeros(256, 256, dtype=torch.bfloat16)[:, :128], [64, 64])  # strides
    assert key(x, [64, 64]) != key(x.half(), [64, 64])  # dtype


def test_arguments_it_cannot_key_take_the_normal_path():
    assert _key(torch.zeros(64), [7], 0.5, BLOCK=64) is None
    assert _key(torch.zeros(64), 7, 0.5, BLOCK=[64]) is None  # unhashable


def test_interpreted_launches_run_every_time():
    """Under the interpreter there is no compiled kernel to reuse: each launch runs the kernel
    (a second launch with new arguments writes its own values) and none takes the fast path."""
    before = fast.FAST["launches"]
    for n, value in ((5, 2.5), (9, -1.0), (9, 4.0)):
        buf = torch.full((16, ), 7.0)
        fast.launch(tri._fill_kernel, (1, ), buf, n, value, BLOCK=16, num_warps=4)
        want = torch.zeros(16)
        want[n] = value
        want[n + 1:] = 7.0
        assert torch.equal(buf, want)
    assert fast.FAST["launches"] == before


def test_empty_hook_chains_are_no_hooks():
    """Triton 3.5+ keeps its launch hooks as chains, empty by default: an empty chain must not
    keep every launch on the normal path (it did, h200_fa), a chain with a hook must."""
    from triton import knobs

    chain = knobs.runtime.launch_enter_hook
    assert not fast._hooks_set(tri._fill_kernel)
    if hasattr(chain, "add"):
        def hook(*args):
            return None

        chain.add(hook)
        try:
            assert fast._hooks_set(tri._fill_kernel)
        finally:
            chain.remove(hook)
