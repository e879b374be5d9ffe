"""One rank of the 2-process zero.Init test (started by torch.distributed.run, gloo).

Each rank seeds its RNG differently on purpose: the towers built partitioned must still hold
rank 0's initialisation on every rank. Writes ``<out>/rank<R>.json`` with what the test checks.
"""

import json
import sys

import torch


def checksum(p: torch.Tensor) -> float:
    """Position-weighted sum in fp64: equal only for (practically) equal tensors."""
    return float((p.detach().double().reshape(-1) * torch.arange(1, p.numel() + 1, dtype=torch.float64)).sum())


def _stats(module):
    import deepspeed

    params = dict(module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        return {name: {"numel": p.numel(), "mean": p.float().mean().item(), "std": p.float().std(correction=0).item(),
                       "checksum": checksum(p)} for name, p in params.items()}


def main(out: str) -> None:
    import deepspeed
    import torch.distributed as dist
    from transformers import CLIPVisionModelWithProjection

    from infclip.pipeline.model.model import CLIPTowers, _hf_configs, _new_tower
    from infclip.pipeline.model.param_layout import param_groups as _param_groups
    from tests.pipeline.test_chunked import batch, tiny_model

    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    ds = {"train_micro_batch_size_per_gpu": 5, "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True, "weight_decay": 0.1}},
          "zero_optimization": {"stage": 3}}
    report = {}

    # (a) a tower built partitioned, transformers' init at an unusual scale (factor 5)
    cfg = tiny_model(0.0).cfg
    vision_cfg, _ = _hf_configs(cfg, 50, {"eos_token_id": 1})
    vision_cfg.initializer_factor = 5.0
    torch.manual_seed(100 + rank)
    tower = _new_tower(CLIPVisionModelWithProjection, vision_cfg, ds)
    report["tower_shards"] = {n: [p.ds_tensor.numel(), p.ds_numel] for n, p in tower.named_parameters()
                              if hasattr(p, "ds_tensor")}
    report["tower"] = _stats(tower)

    # (b) the whole CLIPTowers through the pipeline's path in bf16 (zero.Init makes the towers'
    # parameters bf16; the logit scale and bias must follow), then a DeepSpeed engine and one step
    ds = {**ds, "bf16": {"enabled": True}}
    torch.manual_seed(200 + rank)
    model = CLIPTowers(cfg, eos_token_id=1, pad_token_id=0, bos_token_id=2, zero3_config=ds)
    report["model_partitioned"] = sorted(n for n, p in model.named_parameters() if hasattr(p, "ds_tensor"))
    groups = _param_groups(model, decay_1d=False)
    report["group_sizes"] = [len(g["params"]) for g in groups]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=groups, config=ds)
    report["model"] = _stats(engine.module)
    pv, ids, mask = batch()
    lo = rank * 5
    img, txt, scale, _ = engine(pv[lo:lo + 5].bfloat16(), ids[lo:lo + 5], mask[lo:lo + 5])
    logits = (scale * img @ txt.T).float()
    labels = torch.arange(5)
    loss = 0.5 * (torch.nn.functional.cross_entropy(logits, labels) + torch.nn.functional.cross_entropy(logits.T, labels))
    engine.backward(loss)
    engine.step()
    report["loss"] = float(loss)
    report["after_step"] = _stats(engine.module)
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
