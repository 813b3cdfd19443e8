"""The lab: studies, benchmarks, GPU session scripts and results checkers around ``rla``.

It imports ``rla``; ``rla`` never imports it (``tests/repo/test_imports.py``). lab/README.md is the index.
"""
