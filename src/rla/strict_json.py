"""JSON parsing for user files that refuses what ``json.loads`` lets through silently or crashes on.

- a key given twice in one object (``json.loads`` keeps the last, silently replacing a field):
  a :class:`DuplicateKeyError` naming the key (and, with ``text``, its line);
- nesting deeper than :data:`MAX_DEPTH` (``json.loads`` raises ``RecursionError`` near 1000):
  a ``ValueError`` saying so;
- ``NaN`` / ``Infinity`` constants (not JSON): a ``ValueError``.

All are ``ValueError`` subclasses, so a caller that names the file around ``json.JSONDecodeError``
(also a ``ValueError``) names it around these too.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["loads", "DuplicateKeyError", "MAX_DEPTH", "short"]

MAX_DEPTH = 200
"""Objects and arrays nested deeper than this are refused (far beyond any rla file's layout)."""


class DuplicateKeyError(ValueError):
    """An object names one key twice."""

    def __init__(self, key: str, line: int | None = None):
        self.key, self.line = key, line
        where = f" (line {line})" if line is not None else ""
        super().__init__(f"key {key!r} appears twice in one object{where}; JSON readers keep one of the two "
                         "silently, so rla refuses the file: remove one")


def short(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters (a 400-digit number in a message stays readable)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 12]}...({len(text)} chars)"


def _pairs(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKeyError(k)
        out[k] = v
    return out


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def _depth_ok(text: str) -> None:
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise ValueError(f"nested more than {MAX_DEPTH} levels deep; rla reads flatter JSON")
        elif ch in "]}":
            depth -= 1
    return None


def _line_of_second(text: str, key: str) -> int | None:
    hits = [m.start() for m in re.finditer(re.escape(json.dumps(key)) + r"\s*:", text)]
    return text.count("\n", 0, hits[1]) + 1 if len(hits) > 1 else None


def loads(text: str) -> Any:
    """``json.loads(text)`` with the refusals of the module docstring."""
    if text.count("[") + text.count("{") > MAX_DEPTH:  # only then can it be too deep
        _depth_ok(text)
    try:
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_reject_constant)
    except DuplicateKeyError as e:
        raise DuplicateKeyError(e.key, _line_of_second(text, e.key)) from None
    except RecursionError:  # below MAX_DEPTH but past this interpreter's stack: still an error, not a crash
        raise ValueError("nested too deeply to read") from None
