"""Pretrain CLIP from one DeepSpeed JSON: ``deepspeed launch/pretrain.py --ds_config ds_configs/vitl14.json``.

Thin entry point: parse argv, read the config, build the periodic zero-shot evaluator when the
config has an ``eval`` section, train, close the process group. Also runs without a launcher
(``python launch/pretrain.py --ds_config ds_configs/tiny_cpu.json``: single-process env
defaults are filled in so DeepSpeed does not go looking for MPI), under
``deepspeed --num_gpus N``, ``deepspeed --hostfile hostfile`` and ``--launcher openmpi`` (rank
discovery through mpi4py).

A stop signal (``train.save_on_signal``: SIGTERM, SIGUSR1, SIGINT) ends the run after the step in
progress with a checkpoint, one line and exit code 0. A user error (config, data, checkpoint, a
run folder in use or holding another run, a changed setup on resume, a diverged run) ends the
process with one line ``pretrain.py: error: ...`` and exit code 2; ``--debug`` shows its traceback.
Anything else is a bug and keeps its traceback (as does a user error under ``--debug``: exit code
1). A run that finished, or stopped on a user error, leaves through
:func:`pipeline.engine.dist.exit_process`: without the interpreter's finalization, where gloo's threads
could turn its exit code into an abort.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

# runs from a plain checkout too (the launcher puts launch/, not the repo root, on sys.path)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from infclip.pipeline.config import load_config  # noqa: E402
from infclip.pipeline.engine.dist import check_hostfile, exit_process  # noqa: E402
from infclip.pipeline.errors import UserErrorExit, exit_on_user_error  # noqa: E402
from infclip.pipeline.train.train import single_process_env, train  # noqa: E402


def _evaluator(run_cfg, source):
    if run_cfg.eval is None:
        return None
    try:
        from infclip.eval import build_evaluator
    except ImportError as exc:
        logging.getLogger("pretrain").warning("config has an 'eval' section but eval.build_evaluator is not "
                                              "available (%s): training without periodic evaluation", exc)
        return None
    evaluator = build_evaluator(run_cfg.eval, run_cfg, source=source)
    if evaluator is not None:
        evaluator.log_table = False  # the training log has one line per evaluation; the report is a file
    return evaluator


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--ds_config", "--deepspeed_config", dest="ds_config",
                        default="ds_configs/tiny_cpu.json", help="the run's JSON (DeepSpeed keys + project sections)")
    parser.add_argument("--resume", default=None, help="'latest' or a checkpoint directory")
    parser.add_argument("--overwrite", action="store_true",
                        help="start afresh in a train.output_dir that holds another run's checkpoints, removing them")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set train.steps=20 (repeatable; value is JSON)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help="set by the deepspeed launcher")
    parser.add_argument("--deepspeed", action="store_true",
                        help="accepted as DeepSpeed documents it (DeepSpeed is always on here)")
    parser.add_argument("--check-hostfile", metavar="HOSTFILE", default=None,
                        help="check a hostfile as the deepspeed launcher reads it, print its hosts and exit (run it "
                             "before 'deepspeed --hostfile HOSTFILE': the launcher's own errors are tracebacks)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of user errors too")
    args = parser.parse_args(argv)
    if args.check_hostfile is not None:
        with exit_on_user_error("pretrain.py", args.debug):
            hosts = check_hostfile(args.check_hostfile)
        print(f"{args.check_hostfile}: {len(hosts)} host(s), {sum(hosts.values())} slot(s): "
              + ", ".join(f"{h} slots={n}" for h, n in hosts.items()))
        return 0

    single_process_env()
    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s [rank{rank}] %(name)s: %(message)s")
    import torch.distributed as dist
    try:
        with exit_on_user_error("pretrain.py", args.debug):
            run_cfg = load_config(args.ds_config, args.overrides)
            result = train(run_cfg, resume=args.resume, evaluator=_evaluator(run_cfg, args.ds_config),
                           overwrite=args.overwrite)
        if result.stopped_by is not None:
            logging.getLogger("pretrain").info("stopped by %s after step %d, its checkpoint saved in %s; continue "
                                               "with --resume latest", result.stopped_by, result.step,
                                               os.path.join(result.output_dir, "ckpt"))
        else:
            logging.getLogger("pretrain").info("finished at step %d; run directory %s", result.step,
                                               result.output_dir)
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except UserErrorExit as exc:  # its one line is on stderr already
        code = exc.code
    except Exception:  # a failure that is not the user's: its traceback, and exit code 1
        traceback.print_exc()
        code = 1
    # here the traceback is dropped, and with it what it kept (loaders and their worker processes)
    exit_process(code)
