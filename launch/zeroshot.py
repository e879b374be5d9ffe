"""Evaluate a trained CLIP offline: ``python launch/zeroshot.py --checkpoint RUN/ckpt --images DIR --classnames FILE``.

Thin entry point: load the model (a DeepSpeed checkpoint of any ZeRO stage, consolidated on the
CPU, or an exported HF folder), run zero-shot classification (``--images`` class folders,
``--shards`` labelled shards, or ``--wds-dir`` a CLIP_benchmark webdataset folder) and/or
retrieval (``--retrieval-shards``, or a CLIP_benchmark retrieval folder), print the table and write
the JSON report (and the confusion PNG beside it). With no data flag, the run's own ``eval``
section is used. ``--export-hf OUT`` writes the checkpoint as HF towers instead, ``--export-openclip
OUT`` as an OpenCLIP model folder.

Checkpoint files are read weights-only (a file holding any other object is refused, naming it). A
user error (missing or half-written checkpoint, bad config or data) ends the process with one line
``zeroshot.py: error: ...`` and exit code 2; ``--debug`` shows its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from infclip.eval import (EvalConfig, Evaluator, build_evaluator, clip_benchmark_section, export_hf,  # noqa: E402
                          export_openclip, format_table, load_model)
from infclip.ops.config import ConfigError  # noqa: E402
from infclip.pipeline.errors import exit_on_user_error  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True,
                   help="DeepSpeed checkpoint folder (or tag folder, or run folder), or an exported HF folder")
    p.add_argument("--tag", default=None, help="checkpoint tag (default: the 'latest' file)")
    p.add_argument("--config", default=None, help="the run's JSON (default: found beside the checkpoint)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: found beside the checkpoint)")
    p.add_argument("--export-hf", default=None, metavar="OUT", help="write HF towers + tokenizer to OUT and exit")
    p.add_argument("--export-openclip", default=None, metavar="OUT",
                   help="write an OpenCLIP model folder (weights, open_clip_config.json, tokenizer) to OUT and exit")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--images", default=None, help="image folder, one sub-folder per class")
    data.add_argument("--shards", default=None, help="labelled webdataset shards (brace URL; json 'label' or .cls)")
    data.add_argument("--wds-dir", default=None, metavar="DIR",
                      help="a CLIP_benchmark webdataset folder (DIR/test/*.tar; classnames.txt and "
                           "zeroshot_classification_templates.txt for classification, else retrieval)")
    p.add_argument("--split", default="test", help="sub-folder of --wds-dir holding the shards")
    p.add_argument("--classnames", default=None, help="class names file, one per line")
    p.add_argument("--templates", default=None, help="templates file, one per line with {} (default: built-in set)")
    p.add_argument("--retrieval-shards", default=None, help="held-out image-text shards (brace URL)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--max-samples", type=int, default=None)
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--out", default="zeroshot_report.json", help="JSON report path (PNG beside it)")
    p.add_argument("--debug", action="store_true", help="show the traceback of user errors too")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    with exit_on_user_error("zeroshot.py", args.debug):
        return _run(args)


def _run(args) -> int:
    if args.export_hf:
        export_hf(args.checkpoint, args.export_hf, args.tag, config=args.config, tokenizer=args.tokenizer)
        print(f"exported {args.checkpoint} -> {args.export_hf}")
        return 0
    if args.export_openclip:
        export_openclip(args.checkpoint, args.export_openclip, args.tag, config=args.config, tokenizer=args.tokenizer)
        print(f"exported {args.checkpoint} -> {args.export_openclip} (open_clip: local-dir:{args.export_openclip})")
        return 0
    import torch

    from infclip.pipeline.config import load_config

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    loaded = load_model(args.checkpoint, args.tag, config=args.config, tokenizer=args.tokenizer, device=device)
    if args.images or args.shards or args.retrieval_shards or args.wds_dir:
        section = {"images": args.images, "shards": args.shards, "classnames": args.classnames,
                   "templates": args.templates, "retrieval_shards": args.retrieval_shards,
                   "batch_size": args.batch_size, "max_samples": args.max_samples}
        section = {k: v for k, v in section.items() if v is not None}
        if args.wds_dir:  # the folder's own shards, class names and templates; flags given win
            bench = clip_benchmark_section(args.wds_dir, args.split)
            if "retrieval_shards" in bench and args.retrieval_shards:
                raise ConfigError("--wds-dir is a retrieval set: leave out --retrieval-shards")
            section = {**bench, **section}
        cfg = EvalConfig.from_dict(section, source="command line")
        evaluator = Evaluator(cfg, tokenizer=loaded.tokenizer, workers=args.workers)
        if loaded.run_config and loaded.run_config.get("data"):
            from infclip.pipeline.data.config import DataConfig  # the run's preprocessing, parsed like training did

            data = DataConfig.from_dict(loaded.run_config["data"], source=loaded.info.get("config"))
            evaluator.image_mean, evaluator.image_std = list(data.image_mean), list(data.image_std)
            evaluator.image_key, evaluator.caption_key = data.image_key, data.caption_key
    else:
        if not loaded.run_config or not loaded.run_config.get("eval"):
            raise ConfigError("no eval data: pass --images, --shards, --wds-dir or --retrieval-shards (the run config "
                              "has no 'eval' section to fall back on)")
        run_cfg = load_config(data=loaded.run_config)
        evaluator = build_evaluator(run_cfg.eval, run_cfg, source=loaded.info.get("config"),
                                    tokenizer=loaded.tokenizer)
        if evaluator is None:
            raise ConfigError("the run config's 'eval' section names no data")
        evaluator.workers = args.workers
    evaluator.log_table = False  # printed below
    report = evaluator.evaluate(loaded.model, step=loaded.info.get("global_steps"), report_path=args.out,
                                extra={"checkpoint": loaded.source})
    print(format_table(report))
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
