"""
The CPU study's published numbers are the committed results': README.md's phi table is what
dev/study_tables.py computes from dev/results/cpu-micro*/ (rows and fits), line for line.
(That each fit refits from its rows is tests/test_fit_laws.py; that the grid is sweep.sh's plan and
brackets its minima is tests/test_sweep.py.)
"""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the case studies fitted against the layout-matched r = 1 (dev/study_tables.py --layout-anchored)
LAYOUT_COMPARES = sorted((ROOT / "dev" / "results").glob("cpu-micro-*/fit/compare_layout.json"))


def test_readme_phi_table_is_the_committed_fits():
    out = subprocess.run([sys.executable, str(ROOT / "dev" / "study_tables.py")], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    table = out.split("\n\n")[0].splitlines()[1:]
    # header, the five grids (base, layout, lr, trunc, hyper), the layout-anchored case studies
    assert len(table) == 2 + 5 + len(LAYOUT_COMPARES) and "not fitted yet" not in "".join(table)
    readme = (ROOT / "README.md").read_text().splitlines()
    assert all(line in readme for line in table), table


def test_layout_anchored_fits_read_the_committed_rows():
    """A case study against the layout-matched r = 1 is fitted from <grid>/fit/layout_anchored.jsonl: that
    file is the grid's own looped rows plus cpu-micro-layout's r = 1 rows (what study_tables.py builds),
    so no row in it is typed in or stale."""
    assert [p.parent.parent.name for p in LAYOUT_COMPARES] == ["cpu-micro-hyper", "cpu-micro-trunc"]
    for path in LAYOUT_COMPARES:
        grid = path.parent.parent.name
        rows = subprocess.run([sys.executable, str(ROOT / "dev" / "study_tables.py"), "--layout-anchored", grid],
                              capture_output=True, text=True, check=True, timeout=60).stdout
        assert [json.loads(x) for x in rows.splitlines()] == \
            [json.loads(x) for x in (path.parent / "layout_anchored.jsonl").read_text().splitlines()]
        cmp = json.loads(path.read_text())
        assert cmp["compare"]["n_runs"] == len(rows.splitlines())
        assert cmp["compare"]["file"].endswith(f"{grid}/fit/layout_anchored.jsonl")
