"""GPU tests of the loss's CUDA-graph replay (ops/graphs.py; device machine only): a replayed
call gives the eager call's numbers on new inputs, survives two forwards before their backwards,
stays out of distributed schemes, batches over the limit and outer captures, and a call that
cannot be captured runs eagerly; the captures of a cache share one memory pool and warm-up stream
(new shapes do not grow the memory) and replays on two streams do not overlap."""

import pytest
import torch
import torch.nn.functional as F

from infclip.ops import contrastive_loss
from infclip.ops import registered
from infclip.ops.graphs import GraphCache

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


def _leaves(b, d, loss, seed, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    img = F.normalize(torch.randn(b, d, device="cuda", generator=g), dim=-1)
    txt = F.normalize(img + 0.7 * torch.randn(b, d, device="cuda", generator=g), dim=-1)
    scale = torch.full((1,), 10.0 + seed, device="cuda")
    bias = torch.full((1,), -4.0 - seed, device="cuda") if loss == "siglip" else None
    return [x.to(dtype) if x.dim() == 2 else x for x in (img, txt)] + [scale, bias]


def _grads(leaves, upstream=1.0, **kw):
    """Loss and gradients, each call made on an idle stream (the replay's condition)."""
    xs = [x.detach().clone().requires_grad_() if x is not None else None for x in leaves]
    torch.cuda.synchronize()
    out = contrastive_loss(*xs, **kw)
    g = torch.full_like(out, upstream)
    torch.cuda.synchronize()
    out.backward(g)
    return [out.detach()] + [x.grad for x in xs if x is not None]


def _assert_same(got, want):
    """The same kernels with the same arguments: equal up to the order of the fp32 atomic sums,
    which can move a 16-bit gradient by one unit in its last place (2^-8 relative in bf16)."""
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        rtol = 2e-5 if g.dtype == torch.float32 else 2.0 ** -7
        torch.testing.assert_close(g.float(), w.float(), rtol=rtol, atol=2e-5 * max(w.abs().max().item(), 1e-3))


@pytest.mark.parametrize("loss,eps", [("clip", 0.0), ("clip", 0.1), ("siglip", 0.0)])
@pytest.mark.parametrize("b,budget", [(1000, 64.0), (1000, 0.0), (4096, 64.0), (12288, 0.0)])
def test_replay_matches_eager(b, budget, loss, eps):
    """The first call captures, the next ones replay on new inputs: each equals the eager call."""
    registered._GRAPHS.clear()
    kw = dict(loss=loss, impl="triton", label_smoothing=eps, logits_budget_mb=budget)
    for seed in range(3):
        leaves = _leaves(b, 640, loss, seed)
        _assert_same(_grads(leaves, 1.37, graph_max_batch=16384, **kw),
                     _grads(leaves, 1.37, graph_max_batch=0, **kw))
    kinds = sorted(key[0] for key, entry in registered._GRAPHS.calls.items() if entry is not None)
    assert kinds == ["backward", "forward"]


def test_two_forwards_then_backwards():
    """Gradient accumulation: two forwards replayed before either backward; each backward gets
    its own forward's saved values, not the last replay's."""
    registered._GRAPHS.clear()
    a, b = _leaves(2048, 768, "clip", 1), _leaves(2048, 768, "clip", 2)
    want_a, want_b = _grads(a, graph_max_batch=0), _grads(b, graph_max_batch=0)
    _grads(a, graph_max_batch=16384)  # capture
    xa = [x.detach().clone().requires_grad_() for x in a[:3]]
    xb = [x.detach().clone().requires_grad_() for x in b[:3]]
    torch.cuda.synchronize()
    la = contrastive_loss(*xa, graph_max_batch=16384)
    torch.cuda.synchronize()
    lb = contrastive_loss(*xb, graph_max_batch=16384)
    torch.cuda.synchronize()
    lb.backward()
    torch.cuda.synchronize()
    la.backward()
    assert len(registered._GRAPHS.calls) == 2
    _assert_same([la.detach()] + [x.grad for x in xa], want_a)
    _assert_same([lb.detach()] + [x.grad for x in xb], want_b)


def test_backward_of_a_replayed_forward_replays():
    """The backward right after a replayed forward replays too, though the forward's work is
    still queued (the call is bound by its host, not by queued work of its own)."""
    registered._GRAPHS.clear()
    leaves = _leaves(8192, 768, "clip", 0)
    _grads(leaves, graph_max_batch=8192)  # capture both
    backward = next(e for k, e in registered._GRAPHS.calls.items() if k[0] == "backward")
    replays = backward.replays
    xs = [x.detach().clone().requires_grad_() for x in leaves[:3]]
    torch.cuda.synchronize()
    out = contrastive_loss(*xs, graph_max_batch=8192)
    torch.cuda._sleep(50_000_000)  # the stream is busy when the backward starts
    out.backward()
    assert backward.replays == replays + 1
    _assert_same([out.detach()] + [x.grad for x in xs], _grads(leaves, graph_max_batch=0))
    assert not registered._REPLAYED  # the forward's mark was taken by its backward


def test_limit_busy_stream_and_outer_capture():
    """Batches over graph_max_batch, calls behind queued work, and calls inside another capture
    run eagerly."""
    registered._GRAPHS.clear()
    leaves = _leaves(4096, 256, "clip", 0)
    _grads(leaves, graph_max_batch=4095)
    assert not registered._GRAPHS.calls
    xs = [x.detach().clone().requires_grad_() for x in leaves[:3]]
    torch.cuda._sleep(50_000_000)  # ~30 ms of queued GPU work
    busy = contrastive_loss(*xs, graph_max_batch=4096)
    busy.backward()
    assert not registered._GRAPHS.calls
    _assert_same([busy.detach()] + [x.grad for x in xs], _grads(leaves, graph_max_batch=0))
    _grads(leaves, graph_max_batch=4096)
    assert len(registered._GRAPHS.calls) == 2
    registered._GRAPHS.clear()
    img, txt, scale, _ = [x.detach().clone() if x is not None else None for x in leaves]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        contrastive_loss(img, txt, scale, graph_max_batch=0)  # warm-up off the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    outer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer):
        out = contrastive_loss(img, txt, scale, graph_max_batch=8192)
    assert not registered._GRAPHS.calls
    outer.replay()
    torch.testing.assert_close(out, contrastive_loss(img, txt, scale, graph_max_batch=0), rtol=2e-5, atol=0)


def test_default_replays_on_an_idle_stream_and_zero_never():
    """graph_max_batch's default (16,384) captures a call of 1,024 rows on an idle stream, and its
    replay gives the eager call's loss and gradients; 0 never captures; a batch above the default
    runs eagerly."""
    from infclip.ops.config import DEFAULT_GRAPH_MAX_BATCH

    registered._GRAPHS.clear()
    eager = _grads(_leaves(1024, 256, "clip", 0), graph_max_batch=0)
    assert not registered._GRAPHS.calls
    torch.cuda.synchronize()
    first = _grads(_leaves(1024, 256, "clip", 0))
    assert len(registered._GRAPHS.calls) == 2  # the forward's capture and the backward's
    torch.cuda.synchronize()
    again = _grads(_leaves(1024, 256, "clip", 0))
    _assert_same(first, again)
    _assert_same(again, eager)
    registered._GRAPHS.clear()
    torch.cuda.synchronize()
    _grads(_leaves(DEFAULT_GRAPH_MAX_BATCH + 8, 64, "clip", 0))
    assert not registered._GRAPHS.calls


def test_cache_keeps_the_last_captures():
    cache = GraphCache(size=2)
    x = torch.randn(64, device="cuda")

    def run(t):
        return (t * 2 + 1,)

    for n in (8, 16, 32):
        t = x[:n].clone()
        (out,) = cache.call(("f", n), run, [t])
        torch.testing.assert_close(out, t * 2 + 1)
    assert list(cache.calls) == [("f", 16), ("f", 32)]
    t = x[:16] - 5  # a replay on new values of a kept shape
    (out,) = cache.call(("f", 16), run, [t])
    torch.testing.assert_close(out, t * 2 + 1)
    assert list(cache.calls) == [("f", 32), ("f", 16)]


def test_call_that_cannot_be_captured_runs_eagerly():
    """A call with a host sync runs eagerly from its failed capture on, and the failure leaves
    random numbers on the device working."""
    cache = GraphCache()
    calls = []

    def run(t):  # a host sync: not capturable
        calls.append(float(t.sum()))
        return (t + 1,)

    for value in (1.0, 2.0):
        t = torch.full((4,), value, device="cuda")
        (out,) = cache.call(("sync",), run, [t])
        torch.testing.assert_close(out, t + 1)
    assert cache.calls[("sync",)] is None
    assert calls[-1] == 8.0
    # the failed capture left the device's random numbers usable (torch's generator is unmarked)
    torch.manual_seed(3)
    first = torch.rand(8, device="cuda")
    torch.manual_seed(3)
    torch.testing.assert_close(torch.rand(8, device="cuda"), first)


def test_new_captures_share_one_pool():
    """Capturing new shapes (each evicting the oldest) leaves the allocated memory where it was:
    one pool for all captures, warm-ups on the caller's stream (a side stream per capture added a
    cuBLAS workspace each time, which torch keeps until the process ends)."""
    cache = GraphCache(size=2)
    w = torch.randn(128, 128, device="cuda")

    def run(a):  # a cuBLAS GEMM: its workspace is per stream
        return (a @ w,)

    def call(n):
        a = torch.randn(n, 128, device="cuda")
        (out,) = cache.call(("mm", n), run, [a])
        torch.testing.assert_close(out, a @ w)

    for n in (8, 16):
        call(n)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for n in range(24, 88, 8):  # 8 new shapes
        call(n)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before < 2 ** 20
    assert list(cache.calls) == [("mm", 72), ("mm", 80)]
    assert cache.calls[("mm", 72)].graph.pool() == cache.calls[("mm", 80)].graph.pool()


def test_replays_on_two_streams_do_not_overlap():
    """Two captures sharing a pool reuse each other's intermediates: a replay on another stream,
    launched with no synchronisation by the caller, waits for the last one (else the second
    graph's writes would land in the first one's intermediates while it runs)."""
    cache = GraphCache()
    x = torch.randn(1 << 22, device="cuda")

    def slow(t):  # ~100 dependent passes over 16 MiB intermediates
        for _ in range(50):
            t = (t * 1.0001).sin() + 0.5
        return (t.sum(),)

    def quick(t):
        return ((t * 3 + 1).cos().sum(),)

    want_slow, want_quick = slow(x)[0], quick(x)[0]
    for name, run in (("slow", slow), ("quick", quick)):  # both captured (same pool)
        cache.call((name,), run, [x])
    side = torch.cuda.Stream()
    for _ in range(5):
        torch.cuda.synchronize()
        (got_slow,) = cache.call(("slow",), slow, [x])
        with torch.cuda.stream(side):  # x is ready (synchronised above); no wait by the caller
            (got_quick,) = cache.call(("quick",), quick, [x])
        torch.cuda.current_stream().wait_stream(side)
        torch.testing.assert_close(got_slow, want_slow)
        torch.testing.assert_close(got_quick, want_quick)
