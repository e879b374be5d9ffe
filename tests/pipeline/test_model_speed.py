"""The step's speed features, checked for what they must not change: FLOP count against torch's
own counter, "auto" checkpointing's decision, compiled towers == eager towers (gradients), and
parameter alignment inside a real DeepSpeed engine."""

from __future__ import annotations

import pytest
import torch

from infclip.pipeline.model.config import ModelConfig, activation_bytes, forward_flops
from infclip.pipeline.model.model import CLIPTowers
from infclip.pipeline.model.param_layout import misaligned_parameters, param_groups


def blocks(vision: int, text: int) -> dict:
    """cfg's towers with ``vision`` and ``text`` blocks (cfg's own: 2 and 3)."""
    return {"vision": {"image_size": 40, "patch_size": 8, "hidden_size": 32, "layers": vision, "heads": 2,
                       "intermediate_size": 48},
            "text": {"context_length": 12, "hidden_size": 16, "layers": text, "heads": 2, "vocab_size": 100}}


def cfg(**over) -> ModelConfig:
    data = {"embed_dim": 24, **blocks(2, 3), "compile": False, "gradient_checkpointing": False}
    data.update(over)
    return ModelConfig.from_dict(data, source="test.json")


def batch(n: int = 3):
    g = torch.Generator().manual_seed(1)
    pv = torch.randn(n, 3, 40, 40, generator=g)
    ids = torch.randint(3, 100, (n, 12), generator=g)
    mask = torch.ones(n, 12, dtype=torch.long)
    ids[0, 6], mask[0, 7:] = 1, 0  # one caption with EOS and padding
    return pv, ids, mask


def grads_after_step(model: CLIPTowers) -> dict:
    pv, ids, mask = batch()
    img, txt, scale, _ = model(pv, ids, mask)
    (scale * (img @ txt.T).logsumexp(dim=1).sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("patch_dropout", [0.0, 0.5, 0.7])
def test_forward_flops_equals_torch_flop_counter(patch_dropout):
    """The MFU numerator: every matrix FLOP of a training forward, counted by torch itself (eager
    attention so that QK^T and the weighted sum are plain matmuls the counter sees); with patch
    dropout the image blocks see 12 or 7 of the 25 patches."""
    from torch.utils.flop_counter import FlopCounterMode

    c = cfg(attn_implementation="eager", patch_dropout=patch_dropout)
    model = CLIPTowers(c, eos_token_id=1, pad_token_id=0).train()
    pv, ids, mask = batch(3)
    with FlopCounterMode(display=False) as counter:
        model(pv, ids, mask)
    assert counter.get_total_flops() == 3 * forward_flops(c)


def test_activation_bytes_counts_attention_only_for_eager():
    sdpa, eager = cfg(), cfg(attn_implementation="eager")
    assert activation_bytes(sdpa, 10) == 10 * activation_bytes(sdpa, 1)
    # eager keeps the attention scores and probabilities: 2 h s^2 elements per block
    extra = 2 * (2 * 2 * 26 ** 2 + 3 * 2 * 12 ** 2) * 2
    assert activation_bytes(eager, 1) - activation_bytes(sdpa, 1) == extra


@pytest.mark.parametrize("fraction, expect", [(1.0, False), (1e-12, True)])
def test_auto_checkpointing_decides_at_first_training_forward(fraction, expect):
    model = CLIPTowers(cfg(gradient_checkpointing="auto", checkpointing_memory_fraction=fraction),
                       eos_token_id=1, pad_token_id=0).train()
    encoder = model.vision.vision_model.encoder
    assert encoder.gradient_checkpointing is False
    with torch.no_grad():  # a no-grad forward (the chunked backbone's feature pass) decides nothing
        model(*batch())
    assert not model._planned
    model(*batch())
    assert encoder.gradient_checkpointing is expect
    assert model.text.text_model.encoder.gradient_checkpointing is expect


@pytest.mark.parametrize("grad_ckpt, compiled, patch_dropout",
                         [(False, "towers", 0.0), (True, "blocks", 0.0), (False, "towers", 0.5)])
def test_compiled_towers_give_the_eager_gradients(grad_ckpt, compiled, patch_dropout):
    """torch.compile (aot_eager: traced graphs, autograd through AOTAutograd, no kernel generation)
    of whole towers, or of each block under checkpointing, changes no gradient; patch dropout
    traced into the tower's graph draws the same subsets from the same seed."""
    torch.manual_seed(0)
    c = dict(gradient_checkpointing=grad_ckpt, patch_dropout=patch_dropout)
    eager = CLIPTowers(cfg(**c), eos_token_id=1, pad_token_id=0).train()
    fast = CLIPTowers(cfg(**c, compile=True, compile_backend="aot_eager"), eos_token_id=1, pad_token_id=0).train()
    fast.load_state_dict(eager.state_dict())
    torch.manual_seed(5)
    want = grads_after_step(eager)
    torch.manual_seed(5)
    got = grads_after_step(fast)
    assert fast.compiled == compiled and eager.compiled is None
    assert want.keys() == got.keys() and len(want) == len(list(eager.parameters())) - 1  # all but the bias
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)
    assert list(fast.state_dict()) == list(eager.state_dict())  # no _orig_mod keys


GRAPHS: list = []


def _counting_backend(gm, example_inputs):
    GRAPHS.append(gm)
    return gm.forward


@pytest.mark.parametrize("grad_ckpt, compiled", [(False, "towers"), (True, "blocks")])
def test_compiled_towers_run_eagerly_in_evaluation(grad_ckpt, compiled):
    """Training runs the compiled graphs (a new training batch size compiles a new one);
    evaluation, at other batch sizes, compiles nothing and gives the eager features."""
    import torch._dynamo

    if "infclip_counting" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(_counting_backend, name="infclip_counting")
    torch._dynamo.reset()
    GRAPHS.clear()
    fast = CLIPTowers(cfg(gradient_checkpointing=grad_ckpt, compile=True, compile_backend="infclip_counting"),
                      eos_token_id=1, pad_token_id=0).train()
    eager = CLIPTowers(cfg(gradient_checkpointing=grad_ckpt), eos_token_id=1, pad_token_id=0)
    eager.load_state_dict(fast.state_dict())
    fast(*batch(3))
    assert fast.compiled == compiled and len(GRAPHS) >= 2
    trained = len(GRAPHS)
    fast.eval(), eager.eval()
    with torch.no_grad():
        for rows in (2, 5, 7):
            got, want = fast(*batch(rows)), eager(*batch(rows))
            for a, b in zip(got[:2], want[:2]):
                torch.testing.assert_close(a, b)
    assert len(GRAPHS) == trained  # nothing compiled for evaluation
    fast.train()
    fast(*batch(4))
    assert len(GRAPHS) > trained  # back in training: the compiled path (a new shape, a new graph)


def test_param_groups_keep_tower_weights_aligned_in_deepspeed(tmp_path):
    """DeepSpeed (bf16, ZeRO-2) packs each group into one flat buffer: with the 1-element logit
    scale and bias first, every tower weight starts 4 bytes off 16-byte alignment (slow cuBLAS
    and elementwise kernels on a GPU); param_groups puts them last."""
    deepspeed = pytest.importorskip("deepspeed")
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    ds = {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True, "check_grad_overflow": False},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
          "zero_optimization": {"stage": 2}}
    misaligned = {}
    for name, groups in (("plain order", lambda m: m.parameters()), ("param_groups", param_groups)):
        model = CLIPTowers(cfg(), eos_token_id=1, pad_token_id=0)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=groups(model), config=ds)
        misaligned[name] = misaligned_parameters(engine.module)
        engine.destroy()
    assert "vision.vision_model.encoder.layers.0.mlp.fc1.weight" in misaligned["plain order"]
    assert misaligned["param_groups"] == []
    groups = param_groups(CLIPTowers(cfg(), eos_token_id=1, pad_token_id=0))
    assert groups[1]["weight_decay"] == 0.0 and groups[1]["params"][-1].numel() == 1



CALLS: list = []
COMPILES: list = []


def _aot_call_counting(gm, example_inputs):
    """aot_eager (the backward traced through AOTAutograd, as inductor does) that records each
    graph compiled and each forward graph call."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    COMPILES.append(gm)

    def forward(fw, _inputs):
        return make_boxed_func(lambda *args: (CALLS.append(fw), fw(*args))[1])

    return aot_autograd(fw_compiler=forward, bw_compiler=lambda bw, _i: make_boxed_func(bw.forward))(gm, example_inputs)


# (plain parameters, layer stacks): 2.5 s on 2 cores, and (plain, per-block units): 5 s, in the
# slow run; the default run keeps the stacks with flat parameters (the presets' layout) and
# per-block units with flat parameters
@pytest.mark.parametrize("flat,unit", [pytest.param(False, True, marks=pytest.mark.slow), (True, True),
                                       (True, "stack"), pytest.param(False, "stack", marks=pytest.mark.slow)])
def test_zero3_runs_every_block_compiled(flat, unit):
    """Under ZeRO-3 each leaf module's compute is compiled apart, its parameter fetch outside the
    graph. Per-block leaves: with 12 blocks, more than dynamo's default recompile limit of 8,
    every block of a training step runs a compiled graph, from the config the engine gets. Layer
    stacks: one graph per tower, two calls a step. With flat parameters the views are bound
    outside the compiled forward, after the fetch, and the graphs are not compiled anew for the
    new views of each step."""
    deepspeed = pytest.importorskip("deepspeed")
    import torch._dynamo

    from infclip.pipeline.engine.engine import with_engine_defaults
    from infclip.pipeline.model.param_layout import mark_zero3_leaf_layers
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    if "infclip_aot_counting" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(_aot_call_counting, name="infclip_aot_counting")
    torch._dynamo.reset()
    # set and restored by hand: monkeypatch's undo left dynamo's config without the key
    limit, torch._dynamo.config.recompile_limit = torch._dynamo.config.recompile_limit, 8
    # 12 blocks for per-block units (past the recompile limit); a stack of 2 is a stack (the
    # tracing of each grows with its blocks)
    c = cfg(compile=True, compile_backend="infclip_aot_counting", flat_parameters=flat,
            **(blocks(2, 2) if unit == "stack" else blocks(6, 6)))
    model = CLIPTowers(c, eos_token_id=1, pad_token_id=0)
    mark_zero3_leaf_layers(model, unit)
    ds = with_engine_defaults({"train_micro_batch_size_per_gpu": 3, "zero_optimization": {"stage": 3},
                                "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}, True)
    assert ds["zero_optimization"]["memory_efficient_linear"] is False
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=ds)
    engine.module.bind_flat_views_in_forward()
    try:
        for step in range(3):
            CALLS.clear()
            img, txt, scale, _ = engine(*batch(3))
            engine.backward((scale * (img @ txt.T)).logsumexp(dim=1).mean())
            engine.step()
            if unit == "stack":
                assert engine.module.compiled == "stacks" and len(CALLS) == 2
            else:
                assert engine.module.compiled == "blocks" and len(CALLS) == 12
            if step == 0:
                compiled = len(COMPILES)
        assert len(COMPILES) == compiled  # the new views of every step reuse the graphs
    finally:
        engine.destroy()
        torch._dynamo.config.recompile_limit = limit


def test_engine_defaults_keep_what_the_config_sets():
    from infclip.pipeline.engine.engine import with_engine_defaults

    off = {"throughput": {"enabled": False}}
    z3 = {"zero_optimization": {"stage": 3}}
    assert with_engine_defaults(z3, True) == {"zero_optimization": {"stage": 3, "memory_efficient_linear": False},
                                              "timers": off}
    assert with_engine_defaults(z3, False) == {**z3, "timers": off} and z3 == {"zero_optimization": {"stage": 3}}
    explicit = {"zero_optimization": {"stage": 3, "memory_efficient_linear": True},
                "timers": {"throughput": {"enabled": True, "synchronized": True}}}
    assert with_engine_defaults(explicit, True) == explicit
    assert with_engine_defaults({"zero_optimization": {"stage": 2}}, True) == {"zero_optimization": {"stage": 2},
                                                                               "timers": off}


def test_cuda_graphs_only_where_they_can_replay(monkeypatch):
    """``compile_mode: "reduce-overhead"``: refused with the chunked backbone (a ConfigError naming
    both keys), allowed when the chunk covers the micro-batch; towers compiled per block (here:
    checkpointing) get mode "default", whole towers keep CUDA graphs."""
    from infclip.ops.config import ConfigError
    from infclip.pipeline.config import load_config

    base = {"train_micro_batch_size_per_gpu": 8, "model": {"compile_mode": "reduce-overhead"},
            "data": {"train_shards": "shards/{0..1}.tar"}}
    with pytest.raises(ConfigError, match=r"compile_mode.*chunk_size.*4 < micro-batch 8"):
        load_config(data={**base, "train": {"chunk_size": 4}})
    assert load_config(data={**base, "train": {"chunk_size": 8}}).model.compile_mode == "reduce-overhead"

    modes = []
    monkeypatch.setattr(torch, "compile", lambda fn, backend=None, mode=None: modes.append(mode) or fn)
    for ckpt, want in ((True, "default"), (False, "reduce-overhead")):
        modes.clear()
        model = CLIPTowers(cfg(compile_mode="reduce-overhead", gradient_checkpointing=ckpt), eos_token_id=1,
                           pad_token_id=0)
        model._compile()
        assert model.compiled == ("blocks" if ckpt else "towers")
        assert modes and set(modes) == {want}


@pytest.mark.parametrize("flat", [False, True, "tower"])
@pytest.mark.parametrize("mode", ["reduce-overhead", "default"])
def test_cuda_graph_towers_copy_the_gradients_they_take_directly(flat, mode):
    """Whole towers under "reduce-overhead": each trainable parameter that the graphs take as it is
    (all but the flat tensors, which arrive as views) copies its gradient out of the graphs' memory
    before autograd accumulates it (what that fixes runs on a GPU: tests/pipeline/test_cuda_graphs.py);
    mode "default" adds no copy; frozen parameters get none. Gradients accumulated over two backwards
    equal the eager towers' (aot_eager: the graphs traced, no CUDA graphs on the CPU)."""
    torch.manual_seed(0)
    one = blocks(1, 1)  # what is copied does not depend on the number of blocks; tracing time does
    eager = CLIPTowers(cfg(flat_parameters=flat, **one), eos_token_id=1, pad_token_id=0).train()
    fast = CLIPTowers(cfg(flat_parameters=flat, compile=True, compile_backend="aot_eager", compile_mode=mode, **one),
                      eos_token_id=1, pad_token_id=0).train()
    fast.load_state_dict(eager.state_dict())
    if flat != "tower":  # a frozen parameter (flat towers hold none outside their two tensors)
        for model in (eager, fast):
            model.text.text_projection.weight.requires_grad_(False)
    want, got = grads_after_step(eager), grads_after_step(fast)
    want, got = grads_after_step(eager), grads_after_step(fast)  # accumulated over two backwards
    assert fast.compiled == "towers"
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)
    copied = {n for n, p in fast.named_parameters() if p._backward_hooks}
    outside = {n for n, p in fast.named_parameters() if p.requires_grad and n.split(".")[0] in ("vision", "text")
               and not n.endswith(("flat_matrices", "flat_vectors"))}
    assert copied == (outside if mode == "reduce-overhead" else set())
    if mode == "reduce-overhead":
        assert ("vision.vision_model.embeddings.position_embedding.weight" in copied) == (flat != "tower")
        assert "text.text_projection.weight" not in copied and "logit_scale" not in copied
        assert any("encoder.layers" in n for n in copied) == (flat is False)


@pytest.mark.parametrize("flat", [False, True])
def test_zero3_stacks_take_cuda_graphs_only_with_flat_blocks(monkeypatch, flat):
    """Under ZeRO-3 with layer stacks, ``compile_mode: "reduce-overhead"`` stays for stacks of
    flat blocks (their views are plain graph inputs, copied in at each replay) and falls back to
    "default" for stacks whose own parameters would be static inputs moved by every gather."""
    deepspeed = pytest.importorskip("deepspeed")
    from infclip.pipeline.model.param_layout import mark_zero3_leaf_layers
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    model = CLIPTowers(cfg(compile_mode="reduce-overhead", flat_parameters=flat), eos_token_id=1, pad_token_id=0)
    assert mark_zero3_leaf_layers(model, "stack") == 2
    ds = {"train_micro_batch_size_per_gpu": 3, "zero_optimization": {"stage": 3},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=ds)
    engine.module.bind_flat_views_in_forward()
    modes = []
    monkeypatch.setattr(torch, "compile", lambda fn, backend=None, mode=None: modes.append(mode) or fn)
    try:
        engine.module._compile()
        assert engine.module.compiled == "stacks" and len(modes) == 2
        assert set(modes) == {"reduce-overhead" if flat else "default"}
    finally:
        engine.destroy()
