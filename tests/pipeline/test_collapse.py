"""Training collapse: the watch on loss/scale sequences, the config keys, and real tiny runs.

The real runs are the tiny digits config in this process (a gloo world of one, log every step,
a window of 10 steps): at lr 0.1 the towers collapse within a few steps (every logit equal, the
loss ln(32) to 4 decimals, the logit scale coming to rest); at the default lr they sit on the
ln(B) plateau for ~25 steps with the scale moving, which must not be flagged.
"""

from __future__ import annotations

import logging
import math
import os
import re
import subprocess
import sys

import pytest

from infclip.ops.config import ConfigError
from infclip.pipeline.config import TrainConfig
from infclip.pipeline.engine.engine import contrastive_batch
from infclip.pipeline.errors import USER_ERRORS, TrainingCollapseError
from infclip.pipeline.train.checkpoint import list_tags
from infclip.pipeline.train.collapse import CollapseWatch, chance_loss

from .test_train import ROOT, free_port, run_inproc, tb_scalars, world_of_one  # noqa: F401  (fixture)

B = 1024
LN_B = math.log(B)
WATCH_LOGGER = "infclip.pipeline.train.collapse"


def feed(watch, losses, scales, every=10):
    """Feed log steps every, 2 every, ...; returns {step: verdict or None}."""
    return {every * (i + 1): watch.observe(every * (i + 1), loss, scale, 5e-4)
            for i, (loss, scale) in enumerate(zip(losses, scales))}


def warnings_of(caplog):
    return [r for r in caplog.records if r.name == WATCH_LOGGER and r.levelno == logging.WARNING]


# ----------------------------------------------------------------------------- the watch alone

def test_collapse_detected_at_the_first_whole_window(caplog):
    """Healthy for 20 log steps, then stuck at ln(B) with the scale frozen from step 210: the
    first window that lies entirely in the stuck stretch ends at step 310."""
    watch = CollapseWatch(100, batch=B)
    losses = [5.0 - 0.01 * i for i in range(20)] + [LN_B + 0.001 * (-1) ** i for i in range(40)]
    scales = [14.29 + 0.1 * i for i in range(21)] + [16.29] * 39
    verdicts = feed(watch, losses, scales)
    flagged = sorted(s for s, v in verdicts.items() if v is not None)
    assert flagged[0] == 310 and flagged == list(range(310, 601, 10))
    first = verdicts[310]
    assert first.step == 310 and first.steps == 100 and first.batch == B and first.level == pytest.approx(LN_B)
    (record,) = warnings_of(caplog)
    message = record.getMessage()
    assert message.startswith("training collapse at step 310: the loss (6.93")
    assert "within 1% of ln(1024) = 6.9315, chance level" in message and "last 100 steps" in message
    assert "logit scale is frozen at 16.29" in message and "lr 0.0005" in message
    assert "learning rate too high for the warm-up" in message and "docs/training.md, 'Collapse'" in message


def test_short_runs_are_judged_over_half_their_length():
    from infclip.pipeline.train.collapse import effective_window

    assert effective_window(100, 3000) == 100
    assert effective_window(100, 32) == 16  # the study's 65,536 batch: 32 steps
    assert effective_window(100, 12) == 10 and effective_window(0, 32) == 0
    # a 32-step run pinned at ln B from its 4th step is named within the run
    watch = CollapseWatch(effective_window(100, 32), loss="clip", batch=65536)
    flagged = [s for s in range(1, 33)
               if watch.observe(s, 11.09 if s > 3 else 11.16, scale=14.0 if s > 3 else 14.25, lr=2e-3)]
    assert flagged[0] == 20  # the first whole 16-step window after the scale stopped (step 4)


def test_needs_a_whole_window_of_log_steps():
    """Stuck from the very first log step: nothing is said before the log steps reach back a
    whole window (first log step 10, so the first verdict is at 110), and a window spanning one
    log step less is not enough."""
    watch = CollapseWatch(100, batch=B)
    verdicts = feed(watch, [LN_B] * 12, [14.29] * 12)
    assert [s for s, v in verdicts.items() if v is not None] == [110, 120]


def test_healthy_descending_loss_is_not_flagged(caplog):
    watch = CollapseWatch(100, batch=B)
    losses = [LN_B * math.exp(-0.01 * i) for i in range(100)]
    scales = [14.29 * (1 + 0.003 * i) for i in range(100)]
    assert all(v is None for v in feed(watch, losses, scales).values())
    assert not warnings_of(caplog)


def test_converged_run_with_the_scale_at_its_clamp_is_not_flagged():
    """Loss flat far below chance and the scale frozen at max_logit_scale: a trained model."""
    watch = CollapseWatch(100, batch=B)
    assert all(v is None for v in feed(watch, [1.2] * 50, [100.0] * 50).values())


def test_loss_at_chance_with_the_scale_moving_is_not_flagged():
    """The plateau every CLIP run starts on: loss at ln(B), the scale moving (0.2% a log step)."""
    watch = CollapseWatch(100, batch=B)
    verdicts = feed(watch, [LN_B] * 50, [14.29 * (1 - 0.002 * i) for i in range(50)])
    assert all(v is None for v in verdicts.values())


def test_flat_loss_far_from_chance_is_not_flagged_for_clip():
    """Flat and scale frozen, but 5% above ln(B) (a model at init with lr 0 is ~3% above on the
    tiny towers) or far below it: not the collapse the warning names."""
    for loss in (LN_B * 1.05, LN_B * 0.95, 2.0):
        watch = CollapseWatch(100, batch=B)
        assert all(v is None for v in feed(watch, [loss] * 30, [14.29] * 30).values()), loss


def test_loss_tolerance_and_scale_tolerance_are_the_thresholds():
    inside, outside = LN_B * 1.009, LN_B * 1.011
    assert any(feed(CollapseWatch(100, batch=B), [inside] * 12, [14.29] * 12).values())
    assert not any(feed(CollapseWatch(100, batch=B), [outside] * 12, [14.29] * 12).values())
    assert any(feed(CollapseWatch(100, batch=B, loss_tolerance=0.02), [outside] * 12, [14.29] * 12).values())
    creeping = [14.29 * (1 + 5e-5 * i) for i in range(12)]  # 0.05% over the window: frozen at 1e-3
    assert any(feed(CollapseWatch(100, batch=B), [LN_B] * 12, creeping).values())
    assert not any(feed(CollapseWatch(100, batch=B, scale_tolerance=1e-4), [LN_B] * 12, creeping).values())


def test_warning_once_per_run_and_the_first_collapse_kept(caplog):
    watch = CollapseWatch(50, batch=B)
    verdicts = feed(watch, [LN_B] * 40, [14.29] * 40)
    assert sum(v is not None for v in verdicts.values()) == 35  # every window from step 60 on ...
    assert len(warnings_of(caplog)) == 1  # ... one warning
    assert watch.first is verdicts[60]


def test_only_the_reporting_rank_warns(caplog):
    watch = CollapseWatch(50, batch=B, report=False)
    assert any(feed(watch, [LN_B] * 10, [14.29] * 10).values())
    assert not warnings_of(caplog)


def test_window_zero_or_a_batch_of_one_disables(caplog):
    for watch in (CollapseWatch(0, batch=B), CollapseWatch(100, batch=1)):
        assert not watch.enabled
        assert all(v is None for v in feed(watch, [LN_B] * 30, [14.29] * 30).values())
    assert not warnings_of(caplog)


def test_zero_learning_rate_is_named():
    watch = CollapseWatch(20, batch=B)
    verdict = None
    for step in range(10, 60, 10):
        verdict = watch.observe(step, LN_B, 14.29, 0.0) or verdict
    assert verdict is not None and verdict.lr_zero
    assert "the learning rate was 0 at every log step of the window" in verdict.message()


def test_window_shorter_than_log_every_spans_two_log_steps():
    watch = CollapseWatch(5, batch=B)
    assert watch.observe(50, LN_B, 14.29) is None
    verdict = watch.observe(100, LN_B, 14.29)
    assert verdict is not None and verdict.steps == 50


def test_siglip_flat_at_or_above_the_constant_predictor_and_scale_frozen():
    level = chance_loss("siglip", B)
    assert level == pytest.approx(-math.log(1 / B) - (B - 1) * math.log(1 - 1 / B))  # B H(1/B)
    assert LN_B + 0.99 < level < LN_B + 1.0
    stuck = CollapseWatch(100, loss="siglip", batch=B)
    verdicts = feed(stuck, [level * 1.3 + 0.001 * (-1) ** i for i in range(15)], [10.0] * 15)  # bias off: above
    assert verdicts[110] is not None and "B H(1/B), B = 1024" in verdicts[110].message()
    below = CollapseWatch(100, loss="siglip", batch=B)  # a trained model: flat, frozen, far below
    assert not any(feed(below, [level * 0.5] * 15, [10.0] * 15).values())
    falling = CollapseWatch(100, loss="siglip", batch=B)  # above the level but still learning
    assert not any(feed(falling, [level * 2 * (1 - 0.01 * i) for i in range(15)], [10.0] * 15).values())
    moving = CollapseWatch(100, loss="siglip", batch=B)
    assert not any(feed(moving, [level] * 15, [10.0 * (1 + 0.01 * i) for i in range(15)]).values())


def test_contrastive_batch_is_global_under_a_distributed_scheme():
    assert contrastive_batch(256, 8, "gather") == contrastive_batch(256, 8, "ring") == 2048
    assert contrastive_batch(256, 8, "none") == 256
    assert contrastive_batch(32, 1, "gather") == 32


_VERDICT_WORKER = """
import os, torch.distributed as dist
from infclip.pipeline.engine.dist import cpu_group
from infclip.pipeline.train.loop import _rank0_verdict
dist.init_process_group("gloo")
rank, group = dist.get_rank(), cpu_group()
print("verdicts", [_rank0_verdict(flag, group) for flag in ((rank == 0), (rank == 1), True, False)], flush=True)
dist.barrier()
del group  # the last reference outside torch: destroying the group now joins its worker threads, which
dist.destroy_process_group()  # at interpreter exit could still be freeing the barrier's work (abort)
"""


def test_stop_takes_rank_zeros_verdict_on_every_rank():
    """``on_collapse: "stop"`` must stop every rank at the same log step, or the others would wait
    in the next collective: two real gloo ranks, each with its own verdict, both get rank 0's."""
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", _VERDICT_WORKER], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for rank, (proc, out) in enumerate(zip(procs, outs)):
        assert proc.returncode == 0, out
        assert "verdicts [True, False, True, False]" in out, (rank, out)


# ---------------------------------------------------------------------------------- config keys

def test_config_keys_defaults_and_bad_values():
    cfg = TrainConfig.from_dict({})
    assert (cfg.collapse_window, cfg.collapse_loss_tolerance, cfg.collapse_scale_tolerance, cfg.on_collapse) == \
        (100, 0.01, 0.001, "warn")
    for bad, key in (({"collapse_window": -1}, "collapse_window"), ({"collapse_window": 1.5}, "collapse_window"),
                     ({"collapse_loss_tolerance": 0.0}, "collapse_loss_tolerance"),
                     ({"collapse_loss_tolerance": 1.5}, "collapse_loss_tolerance"),
                     ({"collapse_scale_tolerance": -1e-3}, "collapse_scale_tolerance"),
                     ({"on_collapse": "halt"}, "on_collapse")):
        with pytest.raises(ConfigError, match=f"'{key}'"):
            TrainConfig.from_dict(bad, "run.json")
    assert TrainingCollapseError in USER_ERRORS  # launch/ reports it as one line


# ------------------------------------------------------------------------------- real tiny runs

COLLAPSING = {"optimizer.params.lr": 0.1, "optimizer.params.betas": [0.5, 0.9],
              "scheduler.params.warmup_num_steps": 1, "train.collapse_window": 10}


def test_real_collapse_is_warned_once_and_logged(world_of_one, digits_shards, tmp_path, caplog):
    """lr 0.1: the loss goes to ln(32) (every logit equal) within a few steps and the scale comes to
    rest; the warning names it once, ``train/collapsed`` turns 1 from that step, the run goes on."""
    caplog.set_level(logging.WARNING, logger=WATCH_LOGGER)
    out = tmp_path / "collapse"
    result = run_inproc(digits_shards, out, 40, **COLLAPSING, **{"train.save_final": False})
    assert result.step == 40
    (record,) = warnings_of(caplog)
    message = record.getMessage()
    step = int(re.match(r"training collapse at step (\d+): ", message).group(1))
    assert "within 1% of ln(32) = 3.4657, chance level" in message and "logit scale is frozen" in message
    assert abs(result.losses[step] - math.log(32)) < 1e-3
    collapsed = tb_scalars(out, "train/collapsed")
    assert sorted(collapsed) == list(range(1, 41))
    assert all(collapsed[s] == 0 for s in range(1, step)) and all(collapsed[s] == 1 for s in range(step, 41))


def test_real_collapse_with_on_collapse_stop_raises_and_saves_nothing(world_of_one, digits_shards, tmp_path):
    out = tmp_path / "stop"
    with pytest.raises(TrainingCollapseError, match=r"^training collapse at step \d+: .*ln\(32\)") as exc:
        run_inproc(digits_shards, out, 80, **COLLAPSING, **{"train.on_collapse": "stop", "train.save_every": 2})
    step = int(re.match(r"training collapse at step (\d+)", str(exc.value)).group(1))
    assert step < 80 and max(tb_scalars(out)) == step and tb_scalars(out, "train/collapsed")[step] == 1
    # the checkpoints before it are there; none of that step (even or odd), no final save
    last = int(list_tags(str(out / "ckpt"))[-1].removeprefix("global_step"))
    assert last == step - 2 + step % 2


def test_real_healthy_run_on_the_chance_plateau_is_not_flagged(world_of_one, digits_shards, tmp_path, caplog):
    """The default lr: ~25 steps on the ln(B) plateau (loss within 1% of ln 32), the scale moving."""
    caplog.set_level(logging.WARNING, logger=WATCH_LOGGER)
    out = tmp_path / "healthy"
    result = run_inproc(digits_shards, out, 30, **{"train.collapse_window": 10, "train.save_final": False})
    plateau = [s for s in range(5, 25) if abs(result.losses[s] - math.log(32)) < 0.01 * math.log(32)]
    assert len(plateau) >= 10, result.losses  # the plateau is there ...
    assert not warnings_of(caplog)  # ... and not taken for a collapse
    assert set(tb_scalars(out, "train/collapsed").values()) == {0.0}
