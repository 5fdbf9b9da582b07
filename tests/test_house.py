"""
The layout a reader walks: scripts sit over a small library and never import each other (nanochat's scripts/
over nanochat/), no file reaches into another's underscore names, and every dev/ script still runs, so that a
refactor cannot break one unseen.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The entry points: each is run, none is imported by another file of the project (tests and dev/ aside).
SCRIPTS = ("train.py", "evaluate.py", "fit_laws.py", "prepare_data.py", "allocate.py", "export_hf.py")
MODULES = sorted(path.stem for path in ROOT.glob("*.py"))
DEV_SCRIPTS = sorted((ROOT / "dev").glob("*.py"))


def imported_names(path):
    """[(module, name)] of every `import m` (name None) and `from m import name` in a file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.module.split(".")[0], alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize("name", MODULES)
def test_no_project_file_imports_a_script(name):
    """A helper two scripts need lives in the library file that owns its concern, not in one of the scripts."""
    imported = {module for module, _ in imported_names(ROOT / f"{name}.py")}
    assert not imported & {Path(script).stem for script in SCRIPTS}, name


@pytest.mark.parametrize("name", MODULES)
def test_no_file_imports_another_files_private_names(name):
    private = [f"{module}.{item}" for module, item in imported_names(ROOT / f"{name}.py")
               if module in MODULES and item and item.startswith("_")]
    assert not private, name


def test_the_model_layer_does_not_import_the_data_or_fitting_layers():
    """flops.py is pure Python (the fits and the sweep count with it; its --plan hands the process over to
    sweep_state.py, which reads the data); model.py needs torch, flops.py, muonh.py's group names, its loss and
    its CPU attention kernel."""
    assert {module for module, _ in imported_names(ROOT / "flops.py")} <= {"argparse", "json", "os", "sys", "pathlib",
                                                                              "dataclasses", "common"}
    model_imports = {module for module, _ in imported_names(ROOT / "model.py")}
    assert model_imports & set(MODULES) <= {"flops", "muonh", "fused_loss", "cpu_attention"}


@pytest.mark.slow
@pytest.mark.parametrize("script", DEV_SCRIPTS, ids=[path.name for path in DEV_SCRIPTS])
def test_every_dev_script_runs(script, tmp_path):
    """Its --help (it parses its flags, and everything it imports still exists), then its --tiny mode if it has
    one, writing into a temporary --out where it takes one (never into the committed results)."""
    proc = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-1000:]
    if "--tiny" in proc.stdout:
        out = ["--out", str(tmp_path)] if "--out" in proc.stdout else []
        tiny = subprocess.run([sys.executable, str(script), "--tiny", *out], cwd=ROOT, capture_output=True,
                              text=True, timeout=600)
        assert tiny.returncode == 0, tiny.stderr[-2000:]


@pytest.mark.parametrize("script", sorted((ROOT / "dev").glob("*.sh")), ids=lambda path: path.name)
def test_every_dev_shell_script_parses(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
