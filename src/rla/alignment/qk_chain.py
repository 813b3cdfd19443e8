"""q/k norm -> RoPE as one op: the attention forward rebuilt from HF's own source, at run time.

Under ``qk_norm_out='fp32'`` (vLLM's default compiled mode) Qwen3's per-head q/k RMSNorm output
reaches RoPE unrounded. Done as two ops, the norms write an fp32 q/k that RoPE reads: 8 extra bytes
per element of q and k, written and read in every layer. ``rla.ops.qk_norm_rope`` does both in one
kernel, but HF's attention calls them apart::

    query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
    key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
    ...
    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

so the norm has to move into the RoPE call. This module takes the attention class's ``forward``
source from the installed transformers (``inspect.getsource``, never a copy in this repository),
parses it and rewrites exactly three nodes:

    self.q_norm(X)  ->  X          self.k_norm(X)  ->  X
    apply_rotary_pos_emb(q, k, ...)  ->  apply_rotary_pos_emb(q, k, ..., qk_norm=(self.q_norm, self.k_norm))

then compiles it under HF's file name and line numbers (tracebacks and Dynamo point at HF's
lines) and gives the code to ``patch.with_globals``, which binds ``apply_rotary_pos_emb`` to rla's
function in a copy of the module globals and rebuilds the decorators around it. rla's
``apply_rotary_pos_emb`` (``rope.make_apply_qk_norm_rope``) runs ``rla.ops.qk_norm_rope`` with the norm
modules' own weights and eps when ``qk_norm`` is given.

Why this is exact: an RMSNorm over the last dim commutes with ``transpose(1, 2)`` of a 4-D tensor,
and the fused op normalises the [B, H, S, D] view's rows as the [B, S, H, D] view HF's norm reads
(``rla.ops.reference.compose_qk_norm_rope``), so the numbers are those of the two-op chain bit for
bit (tests/alignment/test_align_qk_chain.py: logits and every gradient).

Why a source rewrite and not something else: the alternatives were (a) a q/k norm that returns a
lazy "to be normalised" tensor subclass that RoPE recognises (a tensor subclass in every layer,
which torch.compile and FSDP handle poorly), (b) per-instance state that the norm leaves for RoPE
(a side channel that Dynamo would guard per layer), (c) a copy of HF's attention forward (ruled
out: no HF code in the repository). The rewrite keeps HF's code as the single source, one
function per class (no per-layer globals, so compiled models do not recompile per layer), and
refuses anything it does not recognise.

The checks before rewriting (else ``rla.align`` keeps the two-op chain and says why in the
report's notes, never silently): exactly one call each of ``self.q_norm(X)`` and
``self.k_norm(X)``, each the whole right-hand side of an assignment to a name, optionally followed
by ``.transpose(1, 2)``; exactly one ``apply_rotary_pos_emb`` call whose first two arguments are
those names; nothing reads or rebinds them in between; the source is available and compiles to
code with the original's free variables.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types

from rla.alignment.patch import defined_in, with_globals

__all__ = ["fuse_qk_norm_into_rope", "QK_NORMS", "Refused", "rewritten_code"]

#: The attention attributes whose calls move into RoPE, in (q, k) order.
QK_NORMS = ("q_norm", "k_norm")
_ROPE = "apply_rotary_pos_emb"


class Refused(Exception):
    """The source does not have the shape the rewrite needs; the message says what differs."""


def fuse_qk_norm_into_rope(
    forward: types.FunctionType, module_globals: dict, replacements: dict
) -> tuple[types.FunctionType | None, str]:
    """``(rebuilt forward, "")``, or ``(None, why)`` when the source does not have the expected shape.

    ``forward`` is the attention class's ``forward`` (decorated or not); ``module_globals`` its
    modeling module's globals; ``replacements`` what the rebuilt forward sees instead
    (``apply_rotary_pos_emb``)."""
    inner = defined_in(forward, module_globals)
    try:
        if inner is None:
            raise Refused("no function in its __wrapped__ chain is defined in its modeling module")
        code = rewritten_code(inner, _rewrite)
    except Refused as e:
        return None, str(e)
    return with_globals(forward, module_globals, replacements, code=code), ""


def rewritten_code(inner: types.FunctionType, rewrite) -> types.CodeType:
    """The code of ``inner`` (a function defined in a modeling module) from its own source, parsed,
    changed in place by ``rewrite(func: ast.FunctionDef)`` (which raises :class:`Refused` where the
    source has another shape), compiled under HF's file name and line numbers; its decorators are
    dropped (``with_globals`` rebuilds them). ``rla.alignment.attn_gate`` rewrites with it too."""
    try:
        source = inspect.getsource(inner)
        filename = inspect.getsourcefile(inner) or inner.__code__.co_filename
    except (OSError, TypeError) as e:
        raise Refused(f"its source is not available ({e})") from None
    tree = ast.parse(textwrap.dedent(source))
    func = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(func, ast.FunctionDef) or func.name != inner.__name__:
        raise Refused("its source is not one function definition")
    func.decorator_list = []  # the decorators' wrappers are rebuilt around it by with_globals
    rewrite(func)
    ast.increment_lineno(tree, inner.__code__.co_firstlineno - 1)
    module_code = compile(tree, filename, "exec", dont_inherit=True)
    codes = [c for c in module_code.co_consts if isinstance(c, types.CodeType) and c.co_name == func.name]
    if len(codes) != 1 or codes[0].co_freevars != inner.__code__.co_freevars:
        raise Refused("the rewritten source does not compile to a function with the original's free variables")
    return codes[0]


def _is_call_of(node, owner: str, attr: str) -> bool:
    """``owner.attr(...)``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr
            and isinstance(node.func.value, ast.Name) and node.func.value.id == owner)


def _norm_then_transposes(value, call) -> bool:
    """``value`` is ``call`` followed by zero or more ``.transpose(1, 2)`` (which commute with a
    norm over the last dim of a 4-D tensor)."""
    while value is not call:
        if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                and value.func.attr == "transpose" and not value.keywords
                and sorted(getattr(a, "value", None) for a in value.args) == [1, 2]
                and all(isinstance(a, ast.Constant) for a in value.args)):
            return False
        value = value.func.value
    return True


def _names(stmt, ctx) -> set[str]:
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def _rewrite(func: ast.FunctionDef) -> None:
    if not func.args.args:
        raise Refused("forward takes no self")
    me = func.args.args[0].arg
    body = func.body
    found = {}
    for attr in QK_NORMS:
        calls = [(i, n) for i, stmt in enumerate(body) for n in ast.walk(stmt) if _is_call_of(n, me, attr)]
        if len(calls) != 1:
            raise Refused(f"{me}.{attr}(...) is called {len(calls)} times, not once")
        i, call = calls[0]
        stmt = body[i]
        if len(call.args) != 1 or call.keywords or isinstance(call.args[0], ast.Starred):
            raise Refused(f"{me}.{attr}(...) does not take exactly one positional argument")
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and _norm_then_transposes(stmt.value, call)):
            raise Refused(f"{me}.{attr}(...) is not assigned to a name as is or transposed (1, 2)")
        found[attr] = (i, stmt.targets[0].id, call)
    ropes = [(j, n) for j, stmt in enumerate(body) for n in ast.walk(stmt)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == _ROPE]
    if len(ropes) != 1:
        raise Refused(f"{_ROPE}(...) is called {len(ropes)} times, not once")
    j, rope = ropes[0]
    if not (isinstance(body[j], ast.Assign) and body[j].value is rope):
        raise Refused(f"{_ROPE}(...) is not the whole right-hand side of an assignment")
    names = [found[a][1] for a in QK_NORMS]
    if (len(rope.args) < 2 or not all(isinstance(a, ast.Name) for a in rope.args[:2])
            or [a.id for a in rope.args[:2]] != names or any(kw.arg == "qk_norm" for kw in rope.keywords)):
        raise Refused(f"{_ROPE}(...) does not take the normalised {names[0]}, {names[1]} as its first two arguments")
    for attr, name in zip(QK_NORMS, names):
        i = found[attr][0]
        if not i < j:
            raise Refused(f"{_ROPE}(...) comes before {me}.{attr}(...)")
        between = body[i + 1:j]
        if any(name in _names(s, ast.Load) or name in _names(s, ast.Store) or name in _names(s, ast.Del)
               for s in between):
            raise Refused(f"{name} is read or rebound between {me}.{attr}(...) and {_ROPE}(...)")
        others = rope.args[2:] + [kw.value for kw in rope.keywords]
        if any(name in _names(a, ast.Load) for a in others):
            raise Refused(f"{_ROPE}(...) reads {name} in another argument")

    calls = {id(found[a][2]): found[a][2].args[0] for a in QK_NORMS}

    class Unwrap(ast.NodeTransformer):
        def visit_Call(self, node):
            self.generic_visit(node)
            return calls.get(id(node), node)

    for attr in QK_NORMS:  # only the two statements holding the norm calls change
        i = found[attr][0]
        body[i] = Unwrap().visit(body[i])
    norms = ast.Tuple(elts=[ast.Attribute(value=ast.Name(id=me, ctx=ast.Load()), attr=a, ctx=ast.Load())
                            for a in QK_NORMS], ctx=ast.Load())
    rope.keywords.append(ast.keyword(arg="qk_norm", value=norms))
    ast.copy_location(norms, rope)
    ast.fix_missing_locations(func)
