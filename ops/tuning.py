"""Tuning of the Triton loss path."""

from __future__ import annotations

import os

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
"""Triton's interpreter (CPU) runs the kernels: read once at import, as Triton reads it when it
defines the kernels (tests/conftest.py sets it before the first import of ops)."""
