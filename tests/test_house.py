"""
The layout a reader walks: the root holds the scripts the user named and three more, over one package
(nanoloop/, as nanochat's scripts/ sit over nanochat/); no script imports another, no file reaches into
another's underscore names, and every dev/ script still runs, so that a refactor cannot break one unseen.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "nanoloop"  # the library: every support module, imported by the scripts
# The entry points: each is run, none is imported by another file of the project (tests and dev/ aside).
SCRIPTS = ("train.py", "evaluate.py", "fit_laws.py", "prepare_data.py", "allocate.py", "export_hf.py")
# The root as its user asked for it: the named files, the entry scripts a user types, and the rest of the house.
NAMED = {"train.py", "model.py", "muonh.py", "flops.py", "fit_laws.py", "prepare_data.py", "sweep.sh", "README.md",
         "tests"}
ENTRY_SCRIPTS = {"evaluate.py", "allocate.py", "export_hf.py"}
HOUSE = {PACKAGE, "data", "dev", ".ci", "pytest.ini", "requirements.txt", "requirements-dev.txt",
         "requirements-gpu.txt", ".gitignore", ".git"}
# Every project module by its import name: the root's files ("model") and the package's ("nanoloop.runs").
FILES = {path.stem: path for path in ROOT.glob("*.py")}
FILES |= {f"{PACKAGE}.{path.stem}": path for path in (ROOT / PACKAGE).glob("*.py") if path.stem != "__init__"}
MODULES = sorted(FILES)
DEV_SCRIPTS = sorted((ROOT / "dev").glob("*.py"))


def imported_names(path):
    """[(module, name)] of every `import m` (name None) and `from m import name` in a file, at any depth;
    `from nanoloop import runs` is the module nanoloop.runs."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            found += [(f"{PACKAGE}.{alias.name}", None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.module, alias.name) for alias in node.names]
    return found


def project_imports(path):
    return {module for module, _ in imported_names(path) if module in FILES}


def ignored_at_the_root():
    """The folder names .gitignore keeps out of the repository (out/, runs/, caches): what a run leaves there."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return {line.strip("/") for line in lines if line.endswith("/") and "*" not in line and line.count("/") <= 2}


def test_the_root_holds_the_named_files_and_three_entry_scripts():
    """The user's top level (train.py, model.py, muonh.py, flops.py, fit_laws.py, prepare_data.py, sweep.sh,
    README.md, tests/), the scripts a user types besides (evaluate.py, allocate.py, export_hf.py), and one
    package for the library: a reader sees at `ls` what to run and what to read first."""
    root = {path.name for path in ROOT.iterdir()} - ignored_at_the_root()
    assert root - NAMED - ENTRY_SCRIPTS - HOUSE == set()
    assert NAMED | ENTRY_SCRIPTS <= root
    assert sorted(path.name for path in ROOT.glob("*.py")) == sorted(name for name in NAMED | ENTRY_SCRIPTS
                                                                     if name.endswith(".py"))


def test_the_package_hands_no_names_on():
    """nanoloop/__init__.py defines and imports nothing: a name is imported from the module that defines it."""
    tree = ast.parse((ROOT / PACKAGE / "__init__.py").read_text())
    assert all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in tree.body)


@pytest.mark.parametrize("name", MODULES)
def test_no_project_file_imports_a_script(name):
    """A helper two scripts need lives in the library file that owns its concern, not in one of the scripts.
    The package imports only the root's library files (model.py, flops.py, muonh.py: the paper's model, its
    FLOPs and its optimizer, kept at the root as the user named them) and itself."""
    assert not project_imports(FILES[name]) & {Path(script).stem for script in SCRIPTS}, name
    if name.startswith(PACKAGE):
        package = {module for module in MODULES if module.startswith(PACKAGE)}
        assert project_imports(FILES[name]) - {"model", "flops", "muonh"} <= package


@pytest.mark.parametrize("name", MODULES)
def test_no_file_imports_another_files_private_names(name):
    private = [f"{module}.{item}" for module, item in imported_names(FILES[name])
               if module in FILES and item and item.startswith("_")]
    assert not private, name


def test_the_model_layer_does_not_import_the_data_or_fitting_layers():
    """flops.py is pure Python (the fits and the sweep count with it; its --plan hands the process over to
    nanoloop/sweep_state.py, which reads the data); model.py needs torch, flops.py, muonh.py's group names, its
    loss and its CPU attention kernel."""
    assert {module for module, _ in imported_names(ROOT / "flops.py")} <= {"argparse", "json", "os", "sys", "pathlib",
                                                                              "dataclasses", "nanoloop.common"}
    assert project_imports(ROOT / "model.py") <= {"flops", "muonh", "nanoloop.fused_loss", "nanoloop.cpu_attention"}


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
