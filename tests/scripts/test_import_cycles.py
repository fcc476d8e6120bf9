"""scripts/check_import_cycles.py: finds a planted circle, and gives the
package the same verdict with or without its built extension modules (a
clean clone has none; CI failed on that once)."""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "check_import_cycles.py")


def run(cwd, *args):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=cwd, capture_output=True, text=True)


def test_package_without_built_extensions(tmp_path):
    shutil.copytree(os.path.join(ROOT, "python"), tmp_path / "python",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    shutil.copy(os.path.join(ROOT, "CMakeLists.txt"), tmp_path / "CMakeLists.txt")
    r = run(tmp_path)
    assert r.returncode == 0, r.stdout
    assert "no import cycles" in r.stdout


def test_planted_cycle_found(tmp_path):
    pkg = tmp_path / "python" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("import pkg.a\n")
    (pkg / "c.py").write_text("from pkg import _ext\n")  # extension from CMake: a leaf
    (tmp_path / "CMakeLists.txt").write_text("install(TARGETS _ext DESTINATION pkg)\n")
    (pkg / "__init__.py").write_text("from . import c\n")  # pkg -> c -> pkg without the CMake list
    r = run(tmp_path, "python/pkg")
    assert r.returncode == 1
    assert "import cycle: pkg.a, pkg.b" in r.stdout
    assert "pkg.c" not in r.stdout
