"""
How readable the core scripts are, in numbers: per file its lines, the share of them that comment (a `#`
comment or a docstring of the module, a class or a function), conditional expressions (`a if c else b`) and
comprehensions, the functions longer than 60 lines or with 7 or more parameters, and the packed constructs
the style rules forbid (a string or list multiplied by a comparison or a bool, a conditional expression
inside another one or used as an `if` test). tests/test_style.py holds the core files to the rules; this
prints the counts.

    python dev/style_report.py                  # the core files
    python dev/style_report.py --at 127a803     # the same files at another commit (git show), for a before/after
    python dev/style_report.py path/to/file.py  # any files
"""
import argparse
import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE_FILES = ("model.py", "train.py", "fit_laws.py", "prepare_data.py", "flops.py", "muonh.py", "evaluate.py",
              "allocate.py", "export_hf.py", "nanoloop/laws.py", "nanoloop/eval_tasks.py", "nanoloop/runs.py",
              "nanoloop/dataloader.py", "nanoloop/common.py", "nanoloop/tracking.py", "nanoloop/plots.py",
              "nanoloop/sweep_state.py", "nanoloop/download.py", "nanoloop/fused_loss.py", "nanoloop/recipe.py",
              "nanoloop/truncate_law.py", "nanoloop/allocation.py", "nanoloop/engine.py", "nanoloop/averaging.py",
              "nanoloop/verdict.py", "nanoloop/loops.py")
MAX_FUNCTION_LINES = 60
MANY_PARAMETERS = 7  # nanoGPT's and nanochat's model and training code have no function with this many
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def is_bool_like(node):
    """A comparison, a bool() call, a `not`, or a conditional: what a string multiplied by it hides."""
    if isinstance(node, (ast.Compare, ast.BoolOp)):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return True
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "bool"


def is_sequence_literal(node):
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (str, bytes))
    return isinstance(node, (ast.List, ast.Tuple, ast.JoinedStr))


def packed_constructs(tree):
    """(line, what) for every construct the style rules forbid."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            pairs = ((node.left, node.right), (node.right, node.left))
            if any(is_sequence_literal(seq) and is_bool_like(flag) for seq, flag in pairs):
                found.append((node.lineno, "a string or list multiplied by a condition"))
        if isinstance(node, ast.IfExp):
            inner = [n for n in ast.walk(node) if isinstance(n, ast.IfExp) and n is not node]
            if inner:
                found.append((node.lineno, "a conditional expression inside another"))
        if isinstance(node, (ast.If, ast.While)) and isinstance(node.test, ast.IfExp):
            found.append((node.lineno, "a conditional expression as an if test"))
    return sorted(set(found))


def long_functions(tree):
    """(name, first line, length) of every function over MAX_FUNCTION_LINES lines, decorators excluded."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                out.append((node.name, node.lineno, length))
    return out


def comment_lines(source, tree):
    """The numbers of the lines that hold a # comment or belong to a module, class or function docstring."""
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            lines.add(token.start[0])
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node):
            first = node.body[0]
            lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def many_parameter_functions(tree):
    """(name, first line, parameters) of every function with MANY_PARAMETERS or more (self and cls aside)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
            names = [name for name in names if name not in ("self", "cls")]
            if len(names) >= MANY_PARAMETERS:
                out.append((node.name, node.lineno, len(names)))
    return out


def report(source):
    """The counts of one file's source text."""
    tree = ast.parse(source)
    nodes = list(ast.walk(tree))
    n_lines = len(source.splitlines())
    return {"lines": n_lines, "comment_share": len(comment_lines(source, tree)) / max(1, n_lines),
            "many_parameters": many_parameter_functions(tree),
            "conditional_expressions": sum(isinstance(n, ast.IfExp) for n in nodes),
            "comprehensions": sum(isinstance(n, COMPREHENSIONS) for n in nodes),
            "long_functions": long_functions(tree), "packed": packed_constructs(tree)}


def source_at(path, commit):
    """A file's text at a commit, or None if it did not exist there."""
    proc = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", help="files to measure (default: the core files)")
    p.add_argument("--at", default="", help="read the files at this git commit instead of the working tree")
    args = p.parse_args()
    files = args.files or CORE_FILES
    print(f"{'file':<18}{'lines':>7}{'comments':>10}{'cond. expr.':>13}{'comprehensions':>16}{'fns > 60':>10}"
          f"{'7+ params':>11}{'packed':>8}")
    for name in files:
        if args.at:
            source = source_at(name, args.at)
        else:
            path = ROOT / name
            source = path.read_text() if path.exists() else None
        if source is None:
            print(f"{name:<18}{'(absent)':>7}")
            continue
        r = report(source)
        print(f"{name:<18}{r['lines']:>7}{r['comment_share']:>9.0%} {r['conditional_expressions']:>12}"
              f"{r['comprehensions']:>16}{len(r['long_functions']):>10}{len(r['many_parameters']):>11}{len(r['packed']):>8}")
        for fn, line, length in r["long_functions"]:
            print(f"    {name}:{line} {fn}() is {length} lines")
        for fn, line, count in r["many_parameters"]:
            print(f"    {name}:{line} {fn}() takes {count} parameters")
        for line, what in r["packed"]:
            print(f"    {name}:{line} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
