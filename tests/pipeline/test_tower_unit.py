"""The tower unit's gradient reduction trigger (pipeline/engine/tower_unit.py) on a plain module: it runs
once per backward, after the last parameter gradient has accumulated, and refuses backwards that
would leave a tower's gradients unreduced. Its use on real ZeRO-3 engines (gradients equal to
ZeRO-0's, with and without checkpointing) is in tests/pipeline/test_chunked.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from infclip.pipeline.engine.tower_unit import TowerReduction


def _tower():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))


def _recording(tower):
    calls = []

    def reduce(module, grad_input, grad_output):
        calls.append({n: None if p.grad is None else p.grad.clone() for n, p in module.named_parameters()})

    return TowerReduction("t", tower, reduce), calls


def test_reduces_once_per_backward_after_every_gradient_accumulated():
    tower = _tower()
    reduction, calls = _recording(tower)
    x = torch.randn(5, 4)  # takes no gradient, like pixels or token ids
    for step in range(3):
        tower(x).square().sum().backward()
        assert len(calls) == step + 1
        seen = calls[-1]
        assert set(seen) == {n for n, _ in tower.named_parameters()}
        for name, p in tower.named_parameters():  # the reduction saw each finished gradient
            assert seen[name] is not None and torch.equal(seen[name], p.grad), name
        reduction.check_complete()
        tower.zero_grad(set_to_none=True)
    reduction.remove()
    tower(x).sum().backward()
    assert len(calls) == 3  # hooks gone


def test_frozen_parameters_are_not_waited_for():
    tower = _tower()
    tower[0].bias.requires_grad_(False)
    reduction, calls = _recording(tower)
    tower(torch.randn(2, 4)).sum().backward()
    assert len(calls) == 1
    reduction.check_complete()


def test_unused_parameter_is_refused_by_name():
    tower = _tower()
    reduction, calls = _recording(tower)
    tower[0](torch.randn(2, 4)).sum().backward()  # the second Linear gets no gradient
    assert calls == []
    with pytest.raises(RuntimeError, match=r"2 parameters got no gradient.*2\.weight, 2\.bias"):
        reduction.check_complete()
    reduction.check_complete()  # reported once; the next backward starts afresh


def test_parameter_accumulated_twice_in_one_backward_is_refused():
    tower = _tower()
    reduction, _ = _recording(tower)
    x = torch.randn(2, 4)
    with pytest.raises(RuntimeError, match=r"'0\.(weight|bias)' accumulated a gradient twice"):
        # two graphs through the first Linear, backward on one, then the other before the tower completes
        tower[0](x).sum().backward()
        tower[0](x).sum().backward()


def test_config_names_the_unit_and_refuses_locked_towers():
    from infclip.ops.config import ConfigError
    from infclip.pipeline.model.config import ModelConfig

    assert ModelConfig.from_dict({"zero3_leaf_layers": "tower"}).zero3_leaf_layers == "tower"
    with pytest.raises(ConfigError, match=r"'zero3_leaf_layers' must be true or false or one of \['stack', 'tower'\], got 'towers'"):
        ModelConfig.from_dict({"zero3_leaf_layers": "towers"})
    with pytest.raises(ConfigError, match=r"\"tower\" does not support locked towers"):
        ModelConfig.from_dict({"zero3_leaf_layers": "tower", "lock_image": True})
