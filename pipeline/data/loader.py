"""The loader of one stream in the training process (:class:`ShardLoader`): a DataLoader over the
workers' stream (:mod:`pipeline.data.stream`), its skip counts, and where it stands for a resume.

Training crops leave the workers as uint8 and are normalised here, on the training device when the
loader is given one: a quarter of the bytes through the worker queues and the host-to-device copy,
and the float work off the workers' cores (with GPU decoding, the decode stage does it). Eval
batches are normalised float32 from the workers.

Skips: :class:`ShardLoader` sums the batches' ``num_skipped`` into ``loader.stats``, by reason into
``loader.skipped_by_reason``, and counts and drops each worker's last record; so a stream that gives
no batch at all still says why (:meth:`ShardLoader.no_batch_reason`, which
:class:`pipeline.train.loop.Batches` raises with). Not reported: the skips among samples read ahead
(shuffle buffer) when an epoch capped by ``samples_per_epoch`` ends.

Determinism and resume: every random choice is seeded from (seed, epoch, rank, logical worker)
or, for the crop, from (seed, epoch, shard file name, sample key), never from process state or
the shards' location (the same shards in another folder give the same run). The training stream
of a rank is a round-robin over its W logical workers that skips a worker once its data ran out
and goes on with the others (the DataLoader's own order), so an epoch delivers every full batch
every worker can make, also when the workers hold unequal data (shard counts that do not divide,
shards of unequal size, a shard that cannot be read). Without ``resampled``, a rank never runs
more workers than it has shards. A resume needs the loader's :meth:`ShardLoader.position` (the
batches each logical worker delivered this epoch, and the worker the round-robin goes on with;
the run's checkpoint keeps it, :class:`pipeline.train.run_state.RunState`): each logical worker skips
the raw samples of its own delivered batches (no image decode; the skips among them are not
counted again: the run that made those batches reported them), and DataLoader worker d plays
logical worker (d + next_worker) mod W, so the round-robin goes on where it stood; a worker whose
data ran out before that point reads its shards again, finds them spent, and its turn is skipped
as in the uninterrupted stream. Without a position, ``start_batch=k`` assumes the balanced split
(worker r delivered the batches i < k with i mod W = r; next_worker k mod W), which is exact while
every worker had data to that point. Exact when the config (workers, buffer, batch, world size,
seed, shards) is the same; a corrupt image inside the skipped prefix shifts the resumed stream by
one sample (skipping does not decode). With ``samples_per_epoch`` a rank stops after its
``batches_per_epoch`` batches (fewer when all its workers run out before). Ranks may get
different numbers of batches per epoch (:class:`pipeline.train.loop.Batches` ends the epoch for all
when one runs out: a shard count not divisible by the world size is warned about).
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import torch

from . import cores as placement
from .cores import CorePlan, enter_cores
from .spec import END_OF_STREAM, SKIPS, WORKER, StreamSpec
from .stream import ShardStream

__all__ = ["ShardLoader", "make_loader", "measure_loader_throughput"]


class ShardLoader:
    """Iterable over batches (a DataLoader over :class:`~pipeline.data.stream.ShardStream`) that sums skip counts.

    Each batch is a dict: ``pixel_values`` [B, 3, H, W] normalised (float32 on the CPU, or, for a
    training loader given a device, the model's dtype on that device: the workers send uint8
    crops, copied and normalised there), ``input_ids`` and
    ``attention_mask`` int64 [B, L], ``num_skipped`` int64 [] (skips since the worker's previous
    batch), ``worker_s`` float64 [] (the worker's seconds making it); eval loaders add ``caption`` (list of B str), ``key`` (list of B str) and, with
    labels, ``label`` int64 [B] (-1 where the sample's json has none).

    ``stats``: ``{"batches", "samples", "skipped", "worker_s"}`` accumulated over iteration in this
    process (``worker_s``: the workers' time spent making those batches); ``skipped`` includes the
    skips after a worker's last batch, counted when its stream ends. ``skipped_by_reason``: the
    same skips by reason (``missing_image``, ``missing_caption``, ``tar_error``, ``bad_image``,
    ...); ``unbatched``: usable samples left over when a worker's stream ended (less than a batch,
    dropped); ``by_worker``: the same per logical worker. :meth:`no_batch_reason` puts them in words.
    ``batches_per_epoch``: batches this rank yields per epoch when known (``samples_per_epoch``
    set; fewer when its workers run out of data first), else None: the loader stops there.
    Iterating again replays the same stream.

    The batches are a round-robin over the ``num_workers`` logical workers that skips a worker
    once its data ran out (the DataLoader's own order), so every full batch of every worker is
    read. :meth:`position` is where the stream stands (batches each logical worker delivered,
    and the worker the round-robin goes on with), which :meth:`seek` on a new loader of the same
    (epoch, rank) resumes from exactly.
    """

    def __init__(self, dataloader: torch.utils.data.DataLoader, spec: StreamSpec, *,
                 batches_per_epoch: Optional[int], normalize: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 stage: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None,
                 cores: Optional[CorePlan] = None) -> None:
        self.dataloader, self._spec = dataloader, spec
        self.cores = cores
        """Where the training thread and the loader's threads run while the stream is iterated
        (:mod:`pipeline.data.cores`); None: where the scheduler puts them."""
        self.normalize = normalize
        self.stage = stage
        """The GPU decode stage (:class:`pipeline.data.gpu_decode.DecodeStage`), run a batch or two
        ahead by a background thread; None: batches as the workers send them."""
        self.batches_per_epoch = batches_per_epoch
        self.epoch, self.start_batch, self.batch_size = spec.epoch, spec.start_batch, spec.batch_size
        self.image_keys, self.caption_key = list(spec.image_keys), spec.caption_key
        self.num_workers, self.rank = spec.num_logical_workers, spec.rank
        self.stats = {"batches": 0, "samples": 0, "skipped": 0, "worker_s": 0.0}
        self.skipped_by_reason: Dict[str, int] = {}
        self.unbatched = 0
        self.by_worker: List[Dict[str, Any]] = [{"batches": 0, "skipped": {}, "unbatched": 0}
                                                for _ in range(self.num_workers)]
        self._worker_batches = list(spec.worker_start)
        self._next_worker = int(spec.first_worker)

    def position(self) -> Dict[str, Any]:
        """Where this epoch's stream stands after the batches yielded so far: ``worker_batches``
        (per logical worker, batches it delivered this epoch, those before ``start_batch``
        included) and ``next_worker`` (the logical worker the round-robin goes on with). Plain
        values, for the run's checkpoint."""
        return {"worker_batches": list(self._worker_batches), "next_worker": self._next_worker}

    def seek(self, position: Dict[str, Any]) -> None:
        """Resume at ``position`` (a :meth:`position` of a loader of the same epoch, rank and data
        setup, whose batch count is this loader's ``start_batch``): each logical worker skips the
        samples of its own delivered batches and the round-robin starts at ``next_worker``. A
        worker whose data ran out before that point finds out by reading its shards again (its
        place in the round-robin is then skipped, as in the uninterrupted stream). Call before
        iterating. Without a seek a loader assumes the balanced split of ``start_batch`` (what
        every worker having data to that point gives)."""
        try:
            counts = [int(c) for c in position["worker_batches"]]
            nxt = int(position["next_worker"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a loader position: {position!r} ({exc!r})") from None
        w = self.num_workers
        misfit = None
        if len(counts) != w or min(counts, default=0) < 0 or sum(counts) != self.start_batch:
            misfit = (f"its worker_batches must be {w} count(s), none negative, summing to start_batch "
                      f"{self.start_batch}")
        elif not 0 <= nxt < w:
            misfit = f"its next_worker must be a worker of the {w}"
        if misfit:
            raise ValueError(f"loader position {position!r} does not fit this stream: {misfit}")
        self._spec.worker_start, self._spec.first_worker = counts, nxt
        self._worker_batches, self._next_worker = list(counts), nxt

    def no_batch_reason(self) -> str:
        """Why the stream gave no batch, in words: the skip counts by reason (with what to check)
        or the usable samples that were too few for a batch, and with several workers each
        worker's counts. Complete once the stream ended."""
        skipped = sum(self.skipped_by_reason.values())
        counts = ", ".join(f"{r}={n}" for r, n in sorted(self.skipped_by_reason.items()))
        if skipped == 0 and self.unbatched == 0:
            head = "no sample was read (are the shards empty?)"
        elif self.unbatched:
            head = (f"{self.unbatched} usable sample(s), fewer than one micro-batch of {self.batch_size} "
                    f"(with the world size and loader workers each rank's worker needs a full micro-batch)")
            if skipped:
                head += f"; skipped: {counts}"
        elif set(self.skipped_by_reason) == {"tar_error"}:
            head = f"no sample could be read: {counts}"
        else:
            head = f"all {skipped} samples skipped: {counts}"
        hints = {
            "missing_image": f"check data.image_key ({';'.join(self.image_keys) or '?'}): no member of those samples "
                             "has one of its extensions",
            "missing_caption": f"check data.caption_key ({self.caption_key!r}): those samples have no non-empty "
                               "caption member of that extension",
            "tar_error": "shards that cannot be read (not tar files, cut short, unreachable URLs): see the "
                         "'skipping tar_error' warnings",
            "bad_image": "images that cannot be decoded: see the 'skipping bad_image' warnings",
        }
        found = [hints[r] for r in sorted(self.skipped_by_reason) if r in hints]
        text = head + ("; " + "; ".join(found) if found else "")
        if self.num_workers > 1:
            text += " (by loader worker: " + "; ".join(
                f"{w}: {self._worker_words(w)}" for w in range(self.num_workers)) + ")"
        return text

    def _worker_words(self, w: int) -> str:
        mine = self.by_worker[w]
        parts = [f"{mine['batches']} batch(es)"] if mine["batches"] else []
        parts += [f"{r}={n}" for r, n in sorted(mine["skipped"].items())]
        if mine["unbatched"]:
            parts.append(f"{mine['unbatched']} usable sample(s) left over")
        return ", ".join(parts) or "no sample"

    def _account(self, record: Dict[str, Any]) -> bool:
        """Count a worker's record's skips; True for the record that ends a worker's stream."""
        mine = self.by_worker[int(record.pop(WORKER, 0))]
        skips = record.pop(SKIPS, None) or {}
        for reason, n in skips.items():
            self.skipped_by_reason[reason] = self.skipped_by_reason.get(reason, 0) + int(n)
            mine["skipped"][reason] = mine["skipped"].get(reason, 0) + int(n)
        self.stats["skipped"] += sum(int(n) for n in skips.values())
        if END_OF_STREAM in record:
            self.unbatched += int(record["unbatched"])
            mine["unbatched"] += int(record["unbatched"])
            return True
        return False

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        spec = self._spec
        self._worker_batches, self._next_worker = list(spec.worker_start), int(spec.first_worker)
        left = None if self.batches_per_epoch is None else self.batches_per_epoch - self.start_batch
        if left is not None and left <= 0:
            return
        workers = iter(self.dataloader)  # here: it draws from the global RNG
        loader_cpus = self.cores.loader if self.cores is not None else None
        _move_thread(getattr(workers, "_pin_memory_thread", None), loader_cpus)
        training_before = enter_cores(self.cores.training if self.cores is not None and placement.PIN_TRAINING_THREAD
                                      else None)
        records: Iterator[Dict[str, Any]] = workers
        if self.stage is not None:
            from .gpu_decode import prefetched

            records = prefetched(workers, self.stage, lambda r: END_OF_STREAM not in r,
                                 lanes=getattr(self.stage, "lanes", 1), cpus=loader_cpus)
        try:
            yield from self._batches(records, left)
        finally:
            close = getattr(records, "close", None)
            if callable(close):
                close()
            _end_workers(workers)
            enter_cores(training_before)

    def _batches(self, records: Iterator[Dict[str, Any]], left: Optional[int]) -> Iterator[Dict[str, Any]]:
        if self.stage is not None:  # only the GPU decode stage's batches carry a ready event
            from .gpu_decode import wait_for_batch
        for batch in records:
            worker = int(batch.get(WORKER, 0))
            if self._account(batch):  # a worker's stream ended: its last skips, not a batch
                continue
            self._worker_batches[worker] += 1
            self._next_worker = (worker + 1) % self.num_workers
            self.by_worker[worker]["batches"] += 1
            self.stats["batches"] += 1
            self.stats["samples"] += int(batch["pixel_values"].shape[0])
            self.stats["worker_s"] += float(batch["worker_s"])
            if self.normalize is not None:
                batch["pixel_values"] = self.normalize(batch["pixel_values"])
            ready = batch.pop("ready", None)
            if ready is not None:  # made on the stage's side stream: the step's stream waits for it
                stream = torch.cuda.current_stream(batch["pixel_values"].device)
                batch["stall_ms"] = wait_for_batch(ready, stream)
                for key in ("pixel_values", "input_ids", "attention_mask"):
                    batch[key].record_stream(stream)
            yield batch
            if left is not None:
                left -= 1
                if left <= 0:  # samples_per_epoch: this rank's share of the epoch is done
                    return


def _end_workers(it: Any) -> None:
    """End a DataLoader iterator's worker processes now, whoever still holds the iterator.

    The workers ignore the stop signals (:func:`_ignore_stop_signals`), so multiprocessing's
    exit-time ``terminate()`` does not end them: a crash whose traceback keeps the iterator alive
    would leave the interpreter's exit waiting on them for ever. A worker still alive after
    torch's own shutdown (asked to stop, joined with a timeout) is killed."""
    shutdown = getattr(it, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()
    for proc in getattr(it, "_workers", None) or ():
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def _move_thread(thread: Any, cpus: Optional[Sequence[int]]) -> None:
    """Put a started ``threading.Thread`` of this process onto ``cpus`` (Linux: a thread is a task
    of its own); nothing without either."""
    tid = getattr(thread, "native_id", None)
    if tid and cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # ended meanwhile
            pass


def _init_worker(cpus: Optional[Sequence[int]], worker_id: int) -> None:
    """Each loader worker's start: deaf to the stop signals, and on ``cpus`` when given."""
    _ignore_stop_signals(worker_id)
    enter_cores(cpus)


def _ignore_stop_signals(worker_id: int) -> None:
    """In each loader worker: SIGTERM, SIGINT and SIGUSR1 ignored. torch's worker handler ends a
    worker on a SIGTERM from anyone but its parent, so a signal sent to the whole process group
    (SLURM, a Ctrl-C in the terminal) would kill the workers under a run that is stopping with a
    checkpoint (``train.save_on_signal``); the run ends its workers itself, and a worker whose
    parent is gone exits on its own (torch's watchdog)."""
    import signal

    for name in ("SIGTERM", "SIGINT", "SIGUSR1"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)


def worker_start_method() -> Optional[str]:
    """How loader workers start: forked (the default) until this process has used CUDA, then from
    a fork server. A forked child clears the other threads' frames, and a CUDA tensor one of them
    held (the GPU decode stage's batches in flight) would be freed there, where CUDA cannot run:
    the worker aborts. A fork server's children come from a process that never touched CUDA."""
    return "forkserver" if torch.cuda.is_initialized() else None


def make_loader(spec: StreamSpec, workers: int, prefetch_factor: int,
                normalize: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                stage: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None,
                cores: Optional[CorePlan] = None) -> ShardLoader:
    """The loader of ``spec``'s stream: a DataLoader of ``workers`` processes (0: in this one) over
    :class:`~pipeline.data.stream.ShardStream`, its workers deaf to the stop signals; ``normalize``,
    ``stage`` and ``cores`` as :class:`ShardLoader` takes them."""
    kwargs: Dict[str, Any] = {}
    if workers > 0:
        init = functools.partial(_init_worker, cores.loader if cores is not None else None)
        kwargs.update(prefetch_factor=prefetch_factor, persistent_workers=False, worker_init_fn=init,
                      multiprocessing_context=worker_start_method())
    dl = torch.utils.data.DataLoader(ShardStream(spec), batch_size=None, num_workers=workers,
                                     pin_memory=torch.cuda.is_available(), **kwargs)
    return ShardLoader(dl, spec, batches_per_epoch=spec.batches_per_rank, normalize=normalize, stage=stage,
                       cores=cores)


def measure_loader_throughput(loader: Iterable[Dict[str, Any]], num_batches: int, warmup: int = 1) -> float:
    """Images per second the loader delivers, timed over ``num_batches`` after ``warmup`` batches.

    The warm-up batches absorb worker start-up. Stops early if the loader runs out (then the
    rate is over the batches seen); raises if no batch was timed.
    """
    it = iter(loader)
    for _ in range(warmup):
        if next(it, None) is None:
            raise ValueError("loader ran out during warm-up")
    images, timed = 0, 0
    start = time.perf_counter()
    for batch in it:
        images += int(batch["pixel_values"].shape[0])
        timed += 1
        if timed >= num_batches:
            break
    elapsed = time.perf_counter() - start
    if timed == 0:
        raise ValueError("loader gave no batch after warm-up")
    return images / max(elapsed, 1e-9)
