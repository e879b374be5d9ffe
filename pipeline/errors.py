"""The errors a user can cause, and how an entry point reports them: one line, non-zero exit.

Design: every mistake in what the user hands over (config, data, checkpoint, the setup a run is
resumed with) raises one of :data:`USER_ERRORS` with a message that names the key, file or step
at fault. ``launch/`` catches exactly these (:func:`exit_on_user_error`) and prints the message
as one line; any other exception is a bug of ours and keeps its traceback. ``--debug`` shows the
traceback for user errors too.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

from infclip.ops.config import ConfigError

__all__ = ["CheckpointError", "ResumeMismatchError", "RunFolderError", "DataError", "NonFiniteError",
           "NonFiniteLossError", "NonFiniteGradError", "NONFINITE_ADVICE", "PeerFailedError", "TrainingCollapseError",
           "USER_ERRORS", "UserErrorExit", "exit_on_user_error"]


class CheckpointError(ValueError):
    """A checkpoint cannot be used: a file is missing, empty, truncated or refused (it holds
    objects other than tensors and plain values), the tag is incomplete, or it does not fit the
    model. The message names the file or tag."""


class RunFolderError(ValueError):
    """``train.output_dir`` cannot take this run: a file, not writable, in use by a live run (its
    lock), or holding another run's checkpoints without ``--resume``; the message says what to do."""


class DataError(RuntimeError, ValueError):
    """The data cannot feed the run or the evaluation (an epoch without a single batch: too few
    samples for the micro-batch and world size, every sample skipped; an eval sample without a
    label, a label beyond the class names, no image at all); the message names the cause."""


class ResumeMismatchError(ValueError):
    """``--resume`` with a setup that would put the run at another data position (micro-batch,
    world size, data sources, seeds, loader workers); the message lists what changed."""


#: What the non-finite loss and gradient-norm errors advise.
NONFINITE_ADVICE = "lower the learning rate, check the data, or use bf16 instead of fp16"


class NonFiniteError(FloatingPointError):
    """Training produced NaN or infinity; the message names the step."""


class NonFiniteLossError(NonFiniteError):
    """The loss became NaN or infinite; the message names the step."""


class NonFiniteGradError(NonFiniteError):
    """The global gradient norm became NaN or infinite; the message names the step."""


class TrainingCollapseError(RuntimeError):
    """With ``train.on_collapse: "stop"``: the loss stayed at chance level with the logit scale
    frozen for a whole window (:mod:`pipeline.train.collapse`); the message names the step and the
    usual causes. Raised at that log step, so nothing after it is evaluated or saved."""


class PeerFailedError(RuntimeError):
    """Another rank failed in a step all ranks take together; its own error is in its log."""


#: What a user can cause and fix; launch/ reports these as one line.
USER_ERRORS = (ConfigError, CheckpointError, ResumeMismatchError, RunFolderError, DataError, NonFiniteError,
               TrainingCollapseError, PeerFailedError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
               PermissionError)


class UserErrorExit(SystemExit):
    """Raised by :func:`exit_on_user_error`: the process exits with code 2 after the message."""


@contextlib.contextmanager
def exit_on_user_error(prog: str, debug: bool = False, errors: tuple = USER_ERRORS) -> Iterator[None]:
    """Turn one of ``errors`` raised inside into ``prog: error: <message>`` on stderr and exit
    code 2 (with ``debug``: re-raise, traceback and all). Other exceptions pass untouched."""
    try:
        yield
    except errors as exc:
        if debug:
            raise
        message = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, OSError) and exc.filename is not None and str(exc.filename) not in message:
            message = f"{message}: {exc.filename}"
        sys.stderr.write(f"{prog}: error: {message} (--debug shows the traceback)\n")
        sys.stderr.flush()
        raise UserErrorExit(2) from None
