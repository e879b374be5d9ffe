"""Flat per-block parameters (``model.flat_parameters``): the same model with fewer tensors.

Checked against the unflattened model built from the same weights: features and gradients,
state-dict keys and values both ways, a real DeepSpeed ZeRO-2 engine training both (CPU, gloo;
fp32 and bf16) with the views bound once and reused, views bound anew where they must be,
compiled towers (no recompilation from the views), a checkpoint consolidated and loaded
for evaluation, and the configurations it refuses."""

from __future__ import annotations

import pytest
import torch

from infclip.ops.config import ConfigError
from infclip.pipeline.model.flat_params import ALIGN, expand_flat_entries, flat_blocks
from infclip.pipeline.model.model import CLIPTowers
from infclip.pipeline.model.param_layout import param_groups

from .test_model_speed import batch, blocks, cfg


def pair(flat=True, **over):
    torch.manual_seed(0)
    plain = CLIPTowers(cfg(**over), eos_token_id=1, pad_token_id=0).train()
    flat = CLIPTowers(cfg(flat_parameters=flat, **over), eos_token_id=1, pad_token_id=0).train()
    flat.load_state_dict(plain.state_dict())
    return plain, flat


def loss_of(model, rows=3):
    img, txt, scale, _ = model(*batch(rows))
    return torch.nn.functional.cross_entropy(scale * img @ txt.T, torch.arange(rows))


def named_grads(model):
    return expand_flat_entries({n: p.grad for n, p in model.named_parameters() if p.grad is not None}, model)


def test_same_features_gradients_and_state_dict_with_fewer_tensors():
    plain, flat = pair()
    assert len(list(flat.parameters())) == len(list(plain.parameters())) - 14 * 5  # 5 blocks: 16 -> 2 each
    assert len(flat_blocks(flat)) == 5
    # the same keys in the same order, and the values of the unflattened model
    want, got = plain.state_dict(), flat.state_dict()
    assert list(got) == list(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    loss_of(plain).backward()
    loss_of(flat).backward()
    want, got = named_grads(plain), named_grads(flat)
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-7, msg=name)
    # every view starts on an ALIGN-element boundary of its flat tensor
    for block in flat_blocks(flat):
        for members in block._flat_layout.values():
            assert all(m.offset % ALIGN == 0 for m in members)
    # the optimizer groups: a block's matrices decay, its vectors do not
    decay, no_decay = (set(map(id, g["params"])) for g in param_groups(flat))
    block = flat_blocks(flat)[0]
    assert id(block.flat_matrices) in decay and id(block.flat_vectors) in no_decay


def test_flat_towers_same_features_gradients_and_state_dict_in_six_tensors():
    """``flat_parameters: "tower"``: each tower's weights in two tensors (the patch and token
    embeddings and the projections included), the same model otherwise."""
    plain, flat = pair("tower")
    assert sorted(n for n, _ in flat.named_parameters()) == [
        "logit_bias", "logit_scale", "text.flat_matrices", "text.flat_vectors", "vision.flat_matrices",
        "vision.flat_vectors"]
    assert flat_blocks(flat) == [flat.vision, flat.text]
    want, got = plain.state_dict(), flat.state_dict()
    assert list(got) == list(want)  # buffers (position ids) where the unflattened towers write them
    for name in want:
        assert torch.equal(got[name], want[name]), name
    loss_of(plain).backward()
    loss_of(flat).backward()
    want, got = named_grads(plain), named_grads(flat)
    assert set(got) == set(want) == {n for n, _ in plain.named_parameters()} - {"logit_bias"}  # CLIP: no bias
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-7, msg=name)
    decay, no_decay = (set(map(id, g["params"])) for g in param_groups(flat))
    assert {id(flat.vision.flat_matrices), id(flat.text.flat_matrices)} <= decay
    assert {id(flat.vision.flat_vectors), id(flat.text.flat_vectors), id(flat.logit_scale)} <= no_decay


@pytest.mark.parametrize("flat", [True, "tower"])
def test_state_dict_loads_both_ways_and_follows_new_tensors(flat):
    plain, flat = pair(flat)
    other = CLIPTowers(cfg(), eos_token_id=1, pad_token_id=0).train()
    other.load_state_dict(flat.state_dict())  # flat -> plain
    with torch.no_grad():
        ref = plain(*batch())
        for model in (flat, other):
            for a, b in zip(model(*batch())[:2], ref[:2]):
                torch.testing.assert_close(a, b)
        # a flat parameter given new storage (as DeepSpeed does with .data) is what encode_* read
        block = flat_blocks(flat)[0]
        block.flat_matrices.data = block.flat_matrices.data * 0.5
        halved = flat.encode_image(batch()[0])
        assert not torch.allclose(halved, ref[0], atol=1e-4)
        flat.double()  # .to() makes new tensors too
        assert flat.encode_image(batch()[0].double()).dtype == torch.float64


def test_views_are_bound_again_after_an_in_place_load_or_a_no_grad_forward():
    plain, flat = pair()
    with torch.no_grad():  # views bound here record no graph: training must not reuse them
        flat(*batch())
    loss_of(flat).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in flat.parameters())
    flat.zero_grad()
    with torch.no_grad():
        for p in plain.parameters():
            p.mul_(0.9)
    flat.load_state_dict(plain.state_dict())  # copied into the flat tensors in place
    loss_of(flat).backward()
    loss_of(plain).backward()
    grads, ref = named_grads(flat), named_grads(plain)
    assert sorted(grads) == sorted(ref)
    for name, g in ref.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("flat, bf16", [(True, False), ("tower", False), (True, True)])
def test_deepspeed_zero2_trains_the_flat_model_as_the_plain_one(flat, bf16):
    deepspeed = pytest.importorskip("deepspeed")
    from infclip.pipeline.model.param_layout import misaligned_parameters
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    ds = {"train_micro_batch_size_per_gpu": 3, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1, "torch_adam": True}},
          "zero_optimization": {"stage": 2}, "bf16": {"enabled": bf16}}
    # bf16 (the presets' precision: DeepSpeed's bf16 weights and fp32 master copy) gives the same bits
    tol = {"rtol": 0, "atol": 0} if bf16 else {"rtol": 1e-5, "atol": 1e-6}
    losses, states = {}, {}
    for name, model in zip(("plain", "flat"), pair(flat)):
        engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=ds)
        assert misaligned_parameters(engine.module) == []
        steps, bound = [], []
        for _ in range(4):
            loss = loss_of(engine)
            engine.backward(loss)
            engine.step()
            steps.append(loss.item())
            if name == "flat":  # the views bound in a forward, by object
                block = flat_blocks(engine.module)[0]
                bound.append([m.module.__dict__[m.attr] for ms in block._flat_layout.values() for m in ms])
        if name == "flat":  # bound once DeepSpeed gave the parameters their buffers, then reused
            assert all(a is b is c for a, b, c in zip(*bound[1:]))
        losses[name], states[name] = steps, engine.module.state_dict()
        engine.destroy()
    assert losses["flat"][-1] < losses["flat"][0]  # it trains
    torch.testing.assert_close(torch.tensor(losses["flat"]), torch.tensor(losses["plain"]), **tol)
    assert list(states["flat"]) == list(states["plain"])
    for name, value in states["plain"].items():
        torch.testing.assert_close(states["flat"][name], value, **tol, msg=name)


GRAPHS: list = []


def _counting_backend(gm, example_inputs):
    GRAPHS.append(gm)
    return gm.forward


def _count_graphs() -> str:
    """Registers (once) the backend that records each compiled graph in GRAPHS, starts both
    afresh, and returns its name."""
    import torch._dynamo

    if "infclip_counting_flat" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(_counting_backend, name="infclip_counting_flat")
    torch._dynamo.reset()
    GRAPHS.clear()
    return "infclip_counting_flat"


@pytest.mark.parametrize("flat", [True, "tower"])
def test_compiled_flat_towers_keep_their_graphs_across_steps(flat):
    """The views are made anew before every forward: the compiled towers must take them as
    inputs, not recompile for each new tensor."""
    plain, flat = pair(flat, compile=True, compile_backend=_count_graphs(), **blocks(1, 1))
    opt = torch.optim.SGD(flat.parameters(), lr=0.1)
    loss_of(plain).backward()
    for step in range(3):
        opt.zero_grad()
        loss_of(flat).backward()
        if step == 0:
            first = len(GRAPHS)
            want, got = named_grads(plain), named_grads(flat)
            for name in want:
                torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)
        opt.step()
    assert flat.compiled == "towers" and first >= 2 and len(GRAPHS) == first


def test_refused_with_zero3_init_and_with_locked_towers():
    """Flat blocks are made from whole tensors: under ZeRO-3 the towers must not be built
    partitioned (``zero3_init``), which the config's load says naming both keys."""
    from infclip.pipeline.config import load_config

    with pytest.raises(ConfigError, match="does not support locked towers"):
        cfg(flat_parameters=True, lock_image=True)
    with pytest.raises(ConfigError, match="needs 'model.zero3_init': false"):
        CLIPTowers(cfg(flat_parameters=True), eos_token_id=1, pad_token_id=0, zero3_config={"zero_optimization": {}})
    base = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 3},
            "data": {"train_shards": "shards/{0..1}.tar"}}
    with pytest.raises(ConfigError, match=r"flat_parameters.*ZeRO-3.*zero3_init"):
        load_config(data={**base, "model": {"flat_parameters": True}})
    loaded = load_config(data={**base, "model": {"flat_parameters": True, "zero3_init": False}})
    assert loaded.model.flat_parameters and loaded.zero_stage == 3
    zero2 = load_config(data={**base, "zero_optimization": {"stage": 2}, "model": {"flat_parameters": True}})
    assert zero2.model.zero3_init  # the default, which only ZeRO-3 reads
    # flat towers under ZeRO-3: the tower must be the unit that gathers its two tensors
    towers = {"flat_parameters": "tower", "zero3_init": False, "gradient_checkpointing": False}
    for unit in (True, "stack", False):
        with pytest.raises(ConfigError, match=r"flat_parameters' \"tower\" under ZeRO-3 needs 'model.zero3_leaf_layers'"):
            load_config(data={**base, "model": {**towers, "zero3_leaf_layers": unit}})
    assert load_config(data={**base, "model": {**towers, "zero3_leaf_layers": "tower"}}).model.flat_parameters == "tower"
    with pytest.raises(ConfigError, match="flat_parameters"):
        cfg(flat_parameters="towers")
    # a checkpointed block's recomputation would add into its tower's flat gradient once per block
    for ckpt in (True, "auto"):
        with pytest.raises(ConfigError, match=r"flat_parameters': \"tower\" needs 'gradient_checkpointing': false"):
            cfg(flat_parameters="tower", gradient_checkpointing=ckpt)


def _zero3_run(model, steps=4, leaf=True):
    """``model`` trained ``steps`` steps by a real ZeRO-3 engine (CPU, gloo): losses, and the
    gathered state dict with the unflattened names."""
    import deepspeed

    from infclip.pipeline.model.param_layout import mark_zero3_leaf_layers

    ds = {"train_micro_batch_size_per_gpu": 3, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1, "torch_adam": True}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    if leaf:
        mark_zero3_leaf_layers(model, leaf)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=ds)
    engine.module.bind_flat_views_in_forward()
    from infclip.pipeline.engine.tower_unit import reduce_when_accumulated

    assert len(reduce_when_accumulated(engine)) == (2 if leaf == "tower" else 0)
    losses = []
    for _ in range(steps):
        loss = loss_of(engine)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        state = {k: v.clone() for k, v in engine.module.state_dict().items()}
    engine.destroy()
    return losses, state


# each unit with and without checkpointing; the default run keeps each unit once and each
# checkpointing setting at least twice (1.5 s each on 2 cores), the rest with -m slow; flat towers
# (one unit each, no checkpointing)
@pytest.mark.parametrize("leaf, ckpt, flat", [(True, True, True), (False, False, True), ("stack", False, True),
                                              ("tower", True, True), ("tower", False, "tower"),
                                              pytest.param(True, False, True, marks=pytest.mark.slow),
                                              pytest.param("stack", True, True, marks=pytest.mark.slow),
                                              pytest.param("tower", False, True, marks=pytest.mark.slow)])
def test_deepspeed_zero3_trains_the_flat_model_as_the_plain_one(leaf, ckpt, flat):
    """ZeRO-3 partitions the flat tensors; each block (or each layer stack, or each flat tower)
    binds its views after DeepSpeed's gather. With leaf modules ZeRO-3 reduces a leaf's gradients
    in a hook on its inputs (a tower's once its parameters have accumulated): the flat tensors'
    gradients must be complete by then (a block reduced early would not train). With
    checkpointed blocks, a block's recomputation in backward (outside its stack's forward) binds
    its own views."""
    pytest.importorskip("deepspeed")
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    (want_losses, want), (got_losses, got) = (_zero3_run(m, leaf=leaf)
                                              for m in pair(flat, gradient_checkpointing=ckpt))
    assert got_losses[-1] < got_losses[0]
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-6)
    assert list(got) == list(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_zero3_flat_towers_compile_whole_and_keep_their_graphs():
    """Under ZeRO-3 with flat towers as the units, each tower's features compile to one graph
    (the binding of the gathered tensors' views outside it), kept across steps, and training
    matches the plain model's."""
    pytest.importorskip("deepspeed")
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    plain, _ = pair()
    torch.manual_seed(0)
    flat = CLIPTowers(cfg(flat_parameters="tower", compile=True, compile_backend=_count_graphs()),
                      eos_token_id=1, pad_token_id=0).train()
    flat.load_state_dict(plain.state_dict())
    want_losses, want = _zero3_run(plain, leaf="tower")
    got_losses, got = _zero3_run(flat, leaf="tower")
    assert flat.compiled == "towers"
    # one graph per tower over the four steps (the backend is the graph's own forward: no backward graphs)
    assert len(GRAPHS) == 2, [len(g.graph.nodes) for g in GRAPHS]
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-6)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_blocks_binding_in_forward_finish_their_gradients_before_the_input_hook():
    """Where ZeRO-3 reduces a leaf block's gradients (a full backward hook: it fires with the
    gradient of the block's inputs), the flat tensors' gradients must already be accumulated.
    Views bound in a forward pre-hook would come after it; bound inside the forward, before."""
    from infclip.pipeline.model.flat_params import BindingForward, bind_in_forward

    _, flat = pair()
    blocks, flat._flat_blocks = flat._flat_blocks, []  # as under ZeRO-3: no binding at the top
    bind_in_forward(blocks)
    bind_in_forward(blocks)  # idempotent
    assert all(isinstance(b.forward, BindingForward) and not isinstance(b.forward.inner, BindingForward)
               for b in blocks)
    events = []
    block = blocks[0]
    block.register_full_backward_hook(lambda *_: events.append("input hook"))
    for name in ("flat_matrices", "flat_vectors"):
        block._parameters[name].register_post_accumulate_grad_hook(lambda p, name=name: events.append(name))
    loss_of(flat).backward()
    assert sorted(events[:2]) == ["flat_matrices", "flat_vectors"] and events[2:] == ["input hook"]
    # no module attribute keeps a view (of a gathered tensor) after the forward
    assert "weight" not in block.mlp.fc1.__dict__


def test_a_layer_stack_finishes_every_blocks_gradients_before_its_input_hook():
    """With each tower's stack of blocks as the ZeRO-3 unit, the stack is called positionally
    (its full backward hook sees the hidden states) and binds all of its blocks' views in its
    forward: every flat tensor of the stack has its gradient before the hook on the stack's
    inputs fires, and no view outlives the forward."""
    from infclip.pipeline.model.flat_params import bind_in_forward
    from infclip.pipeline.model.layer_stack import layer_stacks, route_through_stack

    _, flat = pair()
    blocks, flat._flat_blocks = flat._flat_blocks, []
    layers = route_through_stack(flat.vision.vision_model.encoder)
    assert route_through_stack(flat.vision.vision_model.encoder) is layers  # idempotent
    bind_in_forward(blocks, layer_stacks(flat))
    events = []
    layers.register_full_backward_hook(lambda m, grad_in, grad_out: events.append(("input hook", grad_in[0] is None)))
    stack_blocks = list(layers)
    assert len(stack_blocks) >= 2
    for i, block in enumerate(stack_blocks):
        for name in ("flat_matrices", "flat_vectors"):
            block._parameters[name].register_post_accumulate_grad_hook(lambda p, i=i, name=name: events.append((i, name)))
    loss_of(flat).backward()
    assert events[-1] == ("input hook", False)  # fired with the hidden states' gradient
    assert sorted(events[:-1]) == [(i, n) for i in range(len(stack_blocks)) for n in ("flat_matrices", "flat_vectors")]
    assert all("weight" not in b.mlp.fc1.__dict__ and not b._flat_held for b in stack_blocks)


@pytest.mark.parametrize("leaf", ["stack", "tower"])
def test_zero3_binds_each_block_once_a_forward(leaf, monkeypatch):
    """Under ZeRO-3 (one rank: every flat tensor is whole once gathered, and the small vectors
    stay gathered between steps) each block binds its views once per forward, inside its own or
    its stack's forward; the model's binding before the forward leaves those blocks alone (it
    bound their persistent vectors only to have them replaced before any read). Training still
    matches the plain model (:func:`test_deepspeed_zero3_trains_the_flat_model_as_the_plain_one`)."""
    pytest.importorskip("deepspeed")
    import deepspeed

    from infclip.pipeline.model import flat_params
    from infclip.pipeline.model.param_layout import mark_zero3_leaf_layers
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    _, model = pair()
    mark_zero3_leaf_layers(model, leaf)
    ds = {"train_micro_batch_size_per_gpu": 3,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 10**4}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=ds)
    engine.module.bind_flat_views_in_forward()
    from infclip.pipeline.engine.tower_unit import reduce_when_accumulated

    reduce_when_accumulated(engine)
    blocks = engine.module._flat_blocks
    bound, persistent = [], []
    real_bind = flat_params._bind
    monkeypatch.setattr(flat_params, "_bind", lambda block: (bound.append(block), real_bind(block)))
    try:
        for _ in range(3):
            bound.clear()
            persistent.append(sum(b.flat_vectors.numel() == b._flat_numel["flat_vectors"] for b in blocks))
            loss = loss_of(engine)
            engine.backward(loss)
            engine.step()
            assert sorted(map(id, bound)) == sorted(map(id, blocks))
    finally:
        engine.destroy()
    assert persistent[-1] == len(blocks)  # the vectors stayed gathered between steps: the case skipped
