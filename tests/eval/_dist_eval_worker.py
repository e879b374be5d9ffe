"""One rank of the 2-process evaluation test (started by torch.distributed.run).

Builds the tiny model (same seed on every rank), wraps it in a ZeRO-3 DeepSpeed engine (its
parameters are then partitioned over the ranks), and evaluates ``engine.module`` with the
sharded evaluator; each rank writes the report it got to ``<out>/rank<R>.json``.
"""

import json
import sys

import torch


def main(tokenizer_dir: str, shards: str, out: str, zero_stage: str) -> None:
    import deepspeed

    from infclip.eval.config import EvalConfig
    from infclip.eval.evaluator import Evaluator
    from infclip.pipeline.data.shards import DIGITS_CLASSNAMES
    from infclip.pipeline.data.tokenizer import load_tokenizer
    from infclip.pipeline.model.config import ModelConfig
    from infclip.pipeline.model.model import CLIPTowers
    from tests.eval.conftest import TINY_MODEL

    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    tok = load_tokenizer(tokenizer_dir)
    torch.manual_seed(0)
    model = CLIPTowers.from_config(ModelConfig.from_dict(TINY_MODEL), tok)
    cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10 ** 6,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
           "zero_optimization": {"stage": int(zero_stage)}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=cfg)
    section = {"shards": shards, "classnames": DIGITS_CLASSNAMES, "retrieval_shards": shards,
               "batch_size": 50, "templates": ["a photo of the number {}", "{}"]}
    evaluator = Evaluator(EvalConfig.from_dict(section), tokenizer=tok)
    report = evaluator.evaluate(engine, step=1)
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(report, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
