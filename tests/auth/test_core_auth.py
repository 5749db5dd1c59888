"""tests/test_roundtrip.py with auth on (see conftest.py here)."""

from test_roundtrip import *  # noqa: F403
