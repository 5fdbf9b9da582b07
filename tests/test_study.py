"""
The CPU study's published numbers are the committed results': README.md's phi table is what
dev/study_tables.py computes from dev/results/cpu-micro*/ (rows and fits), line for line.
(That each fit refits from its rows is tests/test_fit_laws.py; that the grid is sweep.sh's plan and
brackets its minima is tests/test_sweep.py.)
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_phi_table_is_the_committed_fits():
    out = subprocess.run([sys.executable, str(ROOT / "dev" / "study_tables.py")], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    table = out.split("\n\n")[0].splitlines()[1:]
    assert len(table) == 6 and "not fitted yet" not in table[2]  # the base grid is fitted
    readme = (ROOT / "README.md").read_text().splitlines()
    assert all(line in readme for line in table), table
