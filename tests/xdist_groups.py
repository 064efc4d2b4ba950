"""xdist groups (``--dist loadgroup`` in pyproject addopts): tests that share a costly one-off set-up run in
one worker, so only that worker pays it."""

from __future__ import annotations

import pytest

MATPLOTLIB = pytest.mark.xdist_group("matplotlib")
"""Tests that render a plot: importing matplotlib and building its first figure costs ~1.6 s of CPU in each
process that does it (measured: the first plotting test 2.44 s, the same test after another plot 0.84 s)."""
