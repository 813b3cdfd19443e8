"""Find an engine's own source files and take single functions out of them, without importing it.

Why not ``import vllm``: an engine package pins its own torch (vLLM 0.33 wants torch==2.14) and
pulls in heavy dependencies, and importing it runs its ``__init__``. The numerics we calibrate
against live in a few plain Python functions (vLLM's native IR ops, ``forward_native`` /
``forward_static`` methods, the rotary cache builder). So we read the file that holds a function,
parse it with ``ast``, compile *only that function* (or a few methods of one class) and execute
the definition in a namespace that holds ``torch``, ``torch.nn.functional as F``, ``math`` and
small stand-ins for the engine-internal names the function body uses. Nothing of the engine is
copied into ``rla``: the code comes from the engine's package at run time.

The engine is found in one of two places:

- installed: ``importlib.util.find_spec(name).submodule_search_locations`` locates the package
  directory *without* executing its ``__init__``; the version comes from its metadata;
- a wheel file the user names: files are read with ``zipfile``; the version comes from the
  ``*.dist-info/METADATA`` inside it.

Every extracted function is recorded with its file and the sha256 of its source segment, so a
result can say exactly which code ran.
"""

from __future__ import annotations

import __future__
import ast
import builtins
import hashlib
import importlib.metadata
import importlib.util
import os
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rla.errors import UserError

__all__ = [
    "EngineNotFound",
    "EngineCodeError",
    "EngineUnavailable",
    "EnginePackage",
    "Provenance",
    "locate",
    "extract_function",
    "extract_class",
    "function_source",
    "file_provenance",
    "cache_dir",
    "cache_lock",
    "cached_wheel",
    "download_wheel",
]


class EngineNotFound(FileNotFoundError, UserError):
    """The engine package (or the wheel, or a file inside it) is not where we looked."""


class EngineCodeError(ValueError):
    """A function is no longer where this engine version was expected to keep it, or uses names
    we do not provide: the engine changed, and the adapter must be updated for that version."""


class EngineUnavailable(OSError, UserError):
    """The engine's compiled code cannot run here (no CUDA, no library file)."""


def cache_dir() -> Path:
    """Where engine wheels and extracted libraries are kept: ``$RLA_ENGINE_CACHE`` or
    ``~/.cache/rla/engines``."""
    env = os.environ.get("RLA_ENGINE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "rla" / "engines"


@contextmanager
def cache_lock(entry: str):
    """Hold ``cache_dir()/.<entry>.lock`` exclusively (``fcntl.flock``: the kernel drops it when its
    process dies, so a killed download never leaves the cache locked) while ``entry`` is downloaded
    or unpacked into the engine cache: two processes filling it at once (two pytest-xdist workers,
    two ``rla calibrate``) take turns, and the second finds the first's finished entry."""
    import fcntl

    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f".{entry}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _wheel_name_version(path: Path, name: str):
    """The version in a wheel's file name (``vllm-0.33.0-cp38-...whl`` -> 0.33.0), None when the
    file is not ``name``'s wheel."""
    from packaging.version import InvalidVersion, Version

    parts = path.name.split("-")
    if len(parts) < 3 or parts[0].replace("_", "-").lower() != name.replace("_", "-").lower():
        return None
    try:
        return Version(parts[1])
    except InvalidVersion:
        return None


def cached_wheel(name: str, version: str | None = None) -> Path | None:
    """``name``'s wheel in the engine cache (:func:`cache_dir`): of ``version`` when given, else
    the newest there; None when there is none."""
    from packaging.version import Version

    folder = cache_dir()
    if not folder.is_dir():
        return None
    want = None if version is None else Version(version)
    found = [(v, w) for w in folder.glob("*.whl") if (v := _wheel_name_version(w, name)) is not None
             and (want is None or v == want)]
    return max(found)[1] if found else None


def download_wheel(name: str, version: str | None = None) -> Path:
    """Download ``name`` (``==version`` when given, else the newest release) into the engine cache
    with ``pip download --no-deps`` (pip prints its progress) and return the wheel's path.

    Parallel-safe: under :func:`cache_lock` for the spec, a wheel of ``version`` another process
    finished meanwhile is returned as it is, and pip downloads into a private folder whose wheels are
    then renamed into the cache, so no process sees a half-written wheel there."""
    import shutil
    import subprocess
    import sys

    spec = name if version is None else f"{name}=={version}"
    with cache_lock(f"{name}-{version or 'newest'}.whl") as folder:
        if version is not None and (done := cached_wheel(name, version)) is not None:
            return done
        staging = folder / f".{name}-{version or 'newest'}.part{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", spec,
                                   "-d", str(staging)])
            if done.returncode != 0:
                raise EngineNotFound(f"pip download --no-deps {spec} -d {folder} failed (exit {done.returncode}); "
                                     "download the wheel yourself and pass it with --wheel")
            new = [folder / w.name for w in staging.glob("*.whl") if _wheel_name_version(w, name) is not None]
            for w in staging.glob("*.whl"):
                os.replace(w, folder / w.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    wheel = max(new, key=lambda w: _wheel_name_version(w, name)) if new else cached_wheel(name, version)
    if wheel is None:
        raise EngineNotFound(f"pip download {spec} left no {name} wheel in {folder}")
    return wheel


@dataclass(frozen=True)
class Provenance:
    """Which code ran: a qualified name, the file it was read from and the sha256 of its source."""

    qualname: str
    file: str
    sha256: str
    lineno: int

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256, "line": self.lineno}


class EnginePackage:
    """One engine's files, from its installed package directory or from a wheel file.

    Paths are given relative to the top of the package tree, e.g. ``"vllm/ir/ops/layernorm.py"``.
    """

    def __init__(self, name: str, version: str, origin: str, location: str):
        self.name = name
        self.version = version
        self.origin = origin  # "installed" or "wheel"
        self.location = location  # the site-packages directory, or the wheel file
        self._texts: dict[str, str] = {}  # a wheel's directory is large: read each file once

    def __repr__(self) -> str:
        return f"EnginePackage({self.name} {self.version}, {self.origin}: {self.location})"

    def label(self, relpath: str) -> str:
        """How a file is named in provenance: an absolute path, or ``wheel!inner/path``."""
        if self.origin == "wheel":
            return f"{self.location}!{relpath}"
        return str(Path(self.location) / relpath)

    def read_text(self, relpath: str) -> str:
        if relpath not in self._texts:
            self._texts[relpath] = self._read_text(relpath)
        return self._texts[relpath]

    def _read_text(self, relpath: str) -> str:
        if self.origin == "wheel":
            with zipfile.ZipFile(self.location) as zf:
                try:
                    return zf.read(relpath).decode("utf-8")
                except KeyError:
                    raise EngineNotFound(
                        f"{relpath} is not in {self.location} ({self.name} {self.version}); "
                        "this adapter expects it there"
                    ) from None
        path = Path(self.location) / relpath
        if not path.is_file():
            raise EngineNotFound(
                f"{path} does not exist in the installed {self.name} {self.version}; "
                "this adapter expects it there"
            )
        return path.read_text(encoding="utf-8")

    def file_path(self, relpath: str, extract_to: Path | None = None) -> Path:
        """A real file on disk for ``relpath`` (a shared library must be a file to be loaded):
        the installed file itself, or the wheel's member extracted once under ``extract_to``
        (default: ``cache_dir()/<name>-<version>/``)."""
        if self.origin == "installed":
            path = Path(self.location) / relpath
            if not path.is_file():
                raise EngineNotFound(f"{path} does not exist in the installed {self.name} {self.version}")
            return path
        dest_root = extract_to or cache_dir() / f"{self.name}-{self.version}"
        dest = dest_root / relpath
        if dest.is_file():
            return dest
        with zipfile.ZipFile(self.location) as zf:
            try:
                info = zf.getinfo(relpath)
            except KeyError:
                raise EngineNotFound(f"{relpath} is not in {self.location}") from None
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + f".part{os.getpid()}")
            with zf.open(info) as src, open(tmp, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            os.replace(tmp, dest)
        return dest


def _wheel_version(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        metas = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")
                 and n.split("/")[0].split("-")[0].replace("_", "-").lower() == name.lower()]
        if not metas:
            raise EngineNotFound(f"{wheel} has no {name}-*.dist-info/METADATA: is it a {name} wheel?")
        for line in zf.read(metas[0]).decode("utf-8", "replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    raise EngineNotFound(f"{wheel}: {metas[0]} has no Version line")


def locate(name: str, wheel: str | os.PathLike | None = None) -> EnginePackage:
    """The engine ``name``'s files: from ``wheel`` if given, else from the installed package.

    Neither path executes the package's ``__init__``. Raises :class:`EngineNotFound` naming what
    was looked for when the engine is neither installed nor given as a wheel.
    """
    if wheel is not None:
        path = Path(wheel).expanduser()
        if not path.is_file():
            raise EngineNotFound(f"wheel file {path} does not exist")
        if not zipfile.is_zipfile(path):
            raise EngineNotFound(f"{path} is not a wheel (not a zip file)")
        return EnginePackage(name, _wheel_version(path, name), "wheel", str(path.resolve()))
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise EngineNotFound(
            f"{name} is not installed in this Python ({os.sys.executable}) and no wheel was given; "
            f"install {name}, or pass the path of a {name} wheel (e.g. `pip download --no-deps "
            f"{name}==VERSION -d DIR`, then --wheel DIR/{name}-VERSION-....whl)"
        )
    pkg_dir = Path(list(spec.submodule_search_locations)[0])
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return EnginePackage(name, version, "installed", str(pkg_dir.parent))


# ------------------------------------------------------------------------------------------
# AST extraction
# ------------------------------------------------------------------------------------------

#: Decorators kept on an extracted definition; every other one (``@register_op``,
#: ``@CustomOp.register(...)``, ``@torch.compile``...) registers the function with engine
#: machinery we do not load, and is dropped.
_KEPT_DECORATORS = {"staticmethod", "classmethod"}

_FLAGS = __future__.annotations.compiler_flag  # annotations name engine types: never evaluate them


def _segment(text: str, node: ast.AST) -> str:
    lines = text.splitlines(keepends=True)
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "".join(lines[start - 1 : node.end_lineno])


def _find(tree: ast.Module, qualname: str) -> ast.AST | None:
    scope: list[ast.stmt] = tree.body
    node = None
    for part in qualname.split("."):
        node = next(
            (n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part),
            None,
        )
        if node is None:
            return None
        scope = node.body
    return node


def _free_names(fn: ast.FunctionDef) -> set[str]:
    """Global names a function body reads (a conservative over-approximation is fine: every
    name assigned anywhere in the function counts as local)."""
    local = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    loads = set()
    # Decorators are dropped and annotations never evaluated: only the body and defaults run.
    roots = list(fn.body) + list(fn.args.defaults) + [d for d in fn.args.kw_defaults if d is not None]
    for node in (n for root in roots for n in ast.walk(root)):
        if isinstance(node, (ast.FunctionDef, ast.Lambda)):
            local |= {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else local).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            local |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.comprehension):
            local |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    return loads - local - set(dir(builtins))


def _strip_decorators(fn: ast.FunctionDef) -> ast.FunctionDef:
    fn.decorator_list = [
        d for d in fn.decorator_list if isinstance(d, ast.Name) and d.id in _KEPT_DECORATORS
    ]
    return fn


def _parse(pkg: EnginePackage, relpath: str) -> tuple[str, ast.Module]:
    text = pkg.read_text(relpath)
    return text, ast.parse(text, filename=pkg.label(relpath))


def _check_names(pkg, relpath, qualname, fn, namespace, extra=()):
    missing = _free_names(fn) - set(namespace) - set(extra)
    if missing:
        raise EngineCodeError(
            f"{pkg.name} {pkg.version}: {qualname} in {pkg.label(relpath)} uses "
            f"{', '.join(sorted(missing))}, which rla's adapter does not provide; the function "
            "changed in this version and the adapter must be updated for it"
        )


def _missing(pkg, relpath, qualname) -> EngineCodeError:
    return EngineCodeError(
        f"{pkg.name} {pkg.version}: {qualname} is not defined in {pkg.label(relpath)}; "
        "this version moved or renamed it, and rla's adapter must be updated for it"
    )


def function_source(pkg: EnginePackage, relpath: str, qualname: str) -> tuple[str, Provenance]:
    """The source text of ``qualname`` (``"f"`` or ``"Class.method"``) in ``relpath``, read and never
    run, with its provenance: for checking what an engine's function calls."""
    text, tree = _parse(pkg, relpath)
    node = _find(tree, qualname)
    if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        raise _missing(pkg, relpath, qualname)
    source = _segment(text, node)
    return source, Provenance(qualname, pkg.label(relpath), hashlib.sha256(source.encode()).hexdigest(), node.lineno)


def file_provenance(pkg: EnginePackage, relpath: str) -> Provenance:
    """A whole file's provenance (a kernel source that is compiled as a unit)."""
    text = pkg.read_text(relpath)
    return Provenance(relpath, pkg.label(relpath), hashlib.sha256(text.encode()).hexdigest(), 1)


def extract_function(
    pkg: EnginePackage, relpath: str, qualname: str, namespace: dict[str, Any]
) -> tuple[Any, Provenance]:
    """Compile the module-level function ``qualname`` of ``relpath`` alone, in ``namespace``.

    Decorators other than ``staticmethod``/``classmethod`` are dropped (they register the
    function with the engine's machinery). Returns the function and its provenance.
    """
    text, tree = _parse(pkg, relpath)
    node = _find(tree, qualname)
    if not isinstance(node, ast.FunctionDef):
        raise _missing(pkg, relpath, qualname)
    source = _segment(text, node)
    _check_names(pkg, relpath, qualname, node, namespace)
    module = ast.Module(body=[_strip_decorators(node)], type_ignores=[])
    ns = dict(namespace)
    exec(compile(module, pkg.label(relpath), "exec", flags=_FLAGS, dont_inherit=True), ns)
    prov = Provenance(qualname, pkg.label(relpath), hashlib.sha256(source.encode()).hexdigest(), node.lineno)
    return ns[node.name], prov


def extract_class(
    pkg: EnginePackage,
    relpath: str,
    class_name: str,
    methods: list[str],
    namespace: dict[str, Any],
    base: type | None = None,
) -> tuple[type, dict[str, Provenance]]:
    """A minimal class holding only ``methods`` of the engine's class ``class_name``.

    The methods are compiled inside a ``class`` statement, so a zero-argument ``super()`` in them
    works: ``base`` (e.g. a class made by an earlier ``extract_class`` of the engine's base class)
    supplies what ``super()`` resolves to. Attributes the methods read from ``self`` are set by
    the caller on an instance made with ``object.__new__``; ``__init__`` is never run (it builds
    the engine's module machinery).
    """
    text, tree = _parse(pkg, relpath)
    cls = _find(tree, class_name)
    if not isinstance(cls, ast.ClassDef):
        raise _missing(pkg, relpath, class_name)
    body, provs = [], {}
    for m in methods:
        node = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == m), None)
        qual = f"{class_name}.{m}"
        if node is None:
            raise _missing(pkg, relpath, qual)
        _check_names(pkg, relpath, qual, node, namespace, extra=("super", class_name))
        source = _segment(text, node)
        provs[qual] = Provenance(qual, pkg.label(relpath), hashlib.sha256(source.encode()).hexdigest(), node.lineno)
        body.append(_strip_decorators(node))
    base_name = "__rla_engine_base__"
    fields = dict(name=class_name, bases=[ast.Name(id=base_name, ctx=ast.Load())], keywords=[],
                  body=body, decorator_list=[])
    if "type_params" in ast.ClassDef._fields:  # Python >= 3.12
        fields["type_params"] = []
    class_def = ast.ClassDef(**fields)
    module = ast.fix_missing_locations(ast.Module(body=[class_def], type_ignores=[]))
    ns = dict(namespace)
    ns[base_name] = base if base is not None else object
    exec(compile(module, pkg.label(relpath), "exec", flags=_FLAGS, dont_inherit=True), ns)
    return ns[class_name], provs
