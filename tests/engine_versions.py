"""The engine versions whose wheels the tests read (``conftest.py`` downloads them into the engine
cache once); a module of its own so test files need not import ``conftest``, whose name is
shared by the folders' own conftest files."""

VLLM_VERSION = "0.33.0"
SGLANG_VERSION = "0.5.23"
VLLM_UNCALIBRATED_VERSION = "0.26.0"
"""The other vLLM release whose wheel the tests read (0.26 pins the GPU machine's torch); it has
rows of its own since the live engine calibrated them, so the profile-version tests install its
metadata under :data:`VLLM_UNLISTED_VERSION`."""
VLLM_UNLISTED_VERSION = "0.34.0"
"""A vLLM version with no calibrated row, newer than every row: its nearest is ``vllm-0.33``."""
