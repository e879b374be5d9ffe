"""A training run: :func:`~pipeline.train.train.train` wires it; its loop, step, checkpoints and reports."""
