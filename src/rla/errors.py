"""Which errors are the user's: the rule the CLI applies before it prints a one-line message.

``rla`` refuses bad input by raising, from its own code, an exception whose message names what is
wrong and how to fix it: mostly ``ValueError`` (and its subclasses such as
``RolloutFormatError``), ``TypeError`` / ``KeyError`` for an argument of the wrong kind or an
unknown name, ``NotImplementedError`` for a model or setting not covered. The same types also
come out of bugs (a wrong call, a missing dict key, a dependency that changed), where a one-line
message would hide the traceback that locates the bug. So the type alone does not decide:

- :class:`UserError` and its subclasses are always the user's (the explicit mark, for a refusal
  that is not one of the types below);
- ``OSError`` is always the machine's or the user's (a missing file, a permission, no device);
- ``ValueError``, ``TypeError``, ``KeyError``, ``NotImplementedError`` are the user's only when
  raised by a ``raise`` statement in rla's own source (the innermost frame of the traceback is a
  ``raise`` in a file of the ``rla`` package): a refusal rla wrote, with its message;
- anything else -- those types raised by a builtin, by torch or transformers, by a call with the
  wrong arguments, and every other exception -- is internal, and shown with its traceback.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

__all__ = ["UserError", "REFUSALS", "is_user_error"]

#: Types rla raises to refuse input; the user's only when an rla ``raise`` statement raised them.
REFUSALS = (ValueError, TypeError, KeyError, NotImplementedError)

_PACKAGE = Path(__file__).resolve().parent


class UserError(Exception):
    """An error the user can fix from its message alone (bad input, an unsupported setting)."""


@functools.lru_cache(maxsize=256)
def _raise_lines(path: str) -> frozenset[int]:
    """The lines covered by ``raise`` statements in one source file."""
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    return frozenset(line for node in ast.walk(tree) if isinstance(node, ast.Raise)
                     for line in range(node.lineno, (node.end_lineno or node.lineno) + 1))


def _raised_by_rla(exc: BaseException) -> bool:
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = Path(tb.tb_frame.f_code.co_filename).resolve()
    if _PACKAGE not in path.parents:
        return False
    return tb.tb_lineno in _raise_lines(str(path))


def is_user_error(exc: BaseException) -> bool:
    """True when ``exc`` is the user's to fix from its message (the rule in the module docstring)."""
    if isinstance(exc, (UserError, OSError)):
        return True
    return isinstance(exc, REFUSALS) and _raised_by_rla(exc)
