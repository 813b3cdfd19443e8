"""The engine versions whose wheels the tests read (``conftest.py`` downloads them into the engine
cache once); a module of its own so test files need not import ``conftest``, whose name is
shared by the folders' own conftest files."""

VLLM_VERSION = "0.33.0"
SGLANG_VERSION = "0.5.23"
VLLM_UNCALIBRATED_VERSION = "0.26.0"
"""A vLLM release with no calibrated row of its own (0.26 pins the GPU machine's torch)."""
