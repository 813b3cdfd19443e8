"""What a row's source evidence read of an engine's code, held as code: each :class:`Fact` is a piece
of text some engine function (or file) must contain for the evidence to stand, checked against the
package in hand by :func:`check`, so a version that changed it fails loudly instead of leaving a value
standing on nothing. ``rla.engines.sglang_families`` (SGLang's family code), ``rla.engines.vllm_families``
(vLLM's Qwen3.5 attention) and ``rla.engines.vllm_moe`` (vLLM's fused-MoE path) hold such facts."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rla.engines.source import EngineCodeError, EnginePackage, file_provenance, function_source

__all__ = ["Fact", "check"]


@dataclass(frozen=True)
class Fact:
    """``text`` is in ``function`` of ``file`` (the whole file where ``function`` is empty), spaces
    and line breaks aside: what it means for ``family``'s rounding is ``meaning``."""

    family: str
    file: str
    function: str
    text: str
    meaning: str


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).replace("( ", "(").replace(" )", ")").strip()


def check(pkg: EnginePackage, facts, family: str | None, engine: str, what: str, again: str) -> dict[str, dict]:
    """Check every fact of ``facts`` (of ``family``, or all) in ``pkg``; -> provenance per fact
    (``"<file>:<function>"``). Raises ``ValueError`` when ``family`` has none (``engine``: whose facts), and
    :class:`EngineCodeError` naming each fact that no longer holds (``what`` was read of the engine's
    code; ``again``: the evidence that must be read again)."""
    chosen = [f for f in facts if family in (None, f.family)]
    if not chosen:
        raise ValueError(f"no {engine} facts for family {family!r}; families are {sorted({f.family for f in facts})}")
    out, moved = {}, []
    for f in chosen:
        if f.function:
            text, prov = function_source(pkg, f.file, f.function)
        else:
            text, prov = pkg.read_text(f.file), file_provenance(pkg, f.file)
        if _flat(f.text) not in _flat(text):
            moved.append(f"{f.file} {f.function or '(file)'} no longer says {f.text!r} ({f.meaning})")
        out[f"{f.file}:{f.function}"] = prov.as_dict()
    if moved:
        raise EngineCodeError(f"{pkg.name} {pkg.version}: what docs/families.md read of {what} moved; "
                              f"{again} must be read again:\n  " + "\n  ".join(moved))
    return out
