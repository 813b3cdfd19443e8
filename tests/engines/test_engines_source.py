"""rla.engines.source: finding an engine's files without importing it, and AST extraction.

A small synthetic engine (a wheel in tmp_path, and the same files as an 'installed' package whose
``__init__`` raises) stands in for vLLM, so every path of the loader is exercised in milliseconds.
"""

from __future__ import annotations

import hashlib
import sys
import zipfile

import pytest
import torch

from rla.engines.source import (
    EngineCodeError,
    EngineNotFound,
    extract_class,
    extract_function,
    locate,
)

MODULE = '''
import torch
from fakeeng.registry import register_op, CustomOp


@register_op
def scaled(x: Tensor, s: float) -> Tensor:
    return (x.float() * s).to(x.dtype)


def uses_unknown(x):
    return helper_we_do_not_provide(x)


@CustomOp.register("base")
class Base:
    def step(self, x):
        return x + self.offset

    @staticmethod
    def twice(x):
        return 2 * x


class Child(Base):
    def step(self, x):
        return super().step(x) * 10
'''

NS = {"torch": torch}


def _write_wheel(path, version="1.2.3", module=MODULE):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"fakeeng-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: fakeeng\nVersion: {version}\n")
        zf.writestr("fakeeng/__init__.py", "raise RuntimeError('the engine package must not be imported')\n")
        zf.writestr("fakeeng/ops.py", module)
    return path


@pytest.fixture
def wheel(tmp_path):
    return _write_wheel(tmp_path / "fakeeng-1.2.3-py3-none-any.whl")


def test_wheel_version_and_function(wheel):
    pkg = locate("fakeeng", wheel)
    assert (pkg.version, pkg.origin) == ("1.2.3", "wheel")
    fn, prov = extract_function(pkg, "fakeeng/ops.py", "scaled", NS)
    x = torch.tensor([1.0, 3.0], dtype=torch.bfloat16)
    assert torch.equal(fn(x, 0.5), torch.tensor([0.5, 1.5], dtype=torch.bfloat16))
    # provenance: the file inside the wheel, and the sha256 of exactly the source that ran
    segment = MODULE[MODULE.index("@register_op"):MODULE.index("\n\n\ndef uses_unknown")] + "\n"
    assert prov.file.endswith("!fakeeng/ops.py") and prov.sha256 == hashlib.sha256(segment.encode()).hexdigest()
    assert "fakeeng" not in sys.modules  # nothing was imported


def test_class_methods_with_super_and_staticmethod(wheel):
    pkg = locate("fakeeng", wheel)
    base, provs = extract_class(pkg, "fakeeng/ops.py", "Base", ["step", "twice"], NS)
    child, _ = extract_class(pkg, "fakeeng/ops.py", "Child", ["step"], NS, base=base)
    obj = object.__new__(child)
    obj.offset = 1
    assert obj.step(2) == 30  # (2 + 1) * 10: super() resolved to the extracted base
    assert base.twice(4) == 8
    assert set(provs) == {"Base.step", "Base.twice"}


def test_missing_function_names_file_and_version(tmp_path):
    pkg = locate("fakeeng", _write_wheel(tmp_path / "w.whl", "9.9", MODULE.replace("def scaled", "def scaled_v2")))
    with pytest.raises(EngineCodeError, match=r"fakeeng 9\.9: scaled is not defined in .*w\.whl!fakeeng/ops\.py"):
        extract_function(pkg, "fakeeng/ops.py", "scaled", NS)
    with pytest.raises(EngineCodeError, match=r"Child\.forward is not defined"):
        extract_class(pkg, "fakeeng/ops.py", "Child", ["forward"], NS)
    with pytest.raises(EngineNotFound, match="fakeeng/gone.py is not in"):
        extract_function(pkg, "fakeeng/gone.py", "scaled", NS)


def test_unknown_global_name_is_an_error(wheel):
    pkg = locate("fakeeng", wheel)
    with pytest.raises(EngineCodeError, match="uses helper_we_do_not_provide"):
        extract_function(pkg, "fakeeng/ops.py", "uses_unknown", NS)


def test_installed_package_is_not_imported(tmp_path, monkeypatch):
    root = tmp_path / "site"
    (root / "fakeeng").mkdir(parents=True)
    (root / "fakeeng" / "__init__.py").write_text("raise RuntimeError('must not run')\n")
    (root / "fakeeng" / "ops.py").write_text(MODULE)
    (root / "fakeeng-4.5.6.dist-info").mkdir()
    (root / "fakeeng-4.5.6.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeeng\nVersion: 4.5.6\n")
    monkeypatch.syspath_prepend(str(root))
    pkg = locate("fakeeng")
    assert (pkg.origin, pkg.version) == ("installed", "4.5.6")
    fn, prov = extract_function(pkg, "fakeeng/ops.py", "scaled", NS)
    assert prov.file == str(root / "fakeeng" / "ops.py")
    assert fn(torch.ones(2), 3.0).tolist() == [3.0, 3.0]
    assert "fakeeng" not in sys.modules


def test_not_installed_and_bad_wheel(tmp_path):
    with pytest.raises(EngineNotFound, match="not installed .* no wheel was given"):
        locate("no_such_engine_rla_test")
    with pytest.raises(EngineNotFound, match="does not exist"):
        locate("fakeeng", tmp_path / "missing.whl")
    bad = tmp_path / "bad.whl"
    bad.write_text("not a zip")
    with pytest.raises(EngineNotFound, match="not a wheel"):
        locate("fakeeng", bad)
