#!/usr/bin/env python3
"""Fails naming every Python function over 100 lines of code (blank and comment lines not
counted, as clippy's too_many_lines counts Rust) in tools/, python/ and e2e/: the same limit
clippy.toml sets for the Rust code. tools/test.sh runs it.

usage: tools/pyfunc-length.py [LIMIT] (default 100)
"""
import ast
import pathlib
import sys

ROOTS = ("tools", "python", "e2e")


def code_lines(src_lines, node):
    """Lines of code of `node`: its span without blank lines and comment-only lines."""
    span = src_lines[node.lineno - 1 : node.end_lineno]
    return sum(1 for l in span if l.strip() and not l.strip().startswith("#"))


def long_functions(path, limit):
    """(name, line, lines) of each function in `path` over `limit` lines of code."""
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = code_lines(lines, node)
            if n > limit:
                out.append((node.name, node.lineno, n))
    return out


def main():
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    root = pathlib.Path(__file__).resolve().parent.parent
    bad = []
    files = 0
    for top in ROOTS:
        for path in sorted((root / top).rglob("*.py")):
            if any(p.startswith(".") or p in ("target", "__pycache__") for p in path.parts):
                continue
            files += 1
            for name, line, n in long_functions(path, limit):
                bad.append(f"{path.relative_to(root)}:{line}: {name} has {n} lines of code")
    for b in bad:
        print(b, file=sys.stderr)
    if bad:
        print(f"pyfunc-length: {len(bad)} functions over {limit} lines", file=sys.stderr)
        sys.exit(1)
    print(f"pyfunc-length: {files} files, no function over {limit} lines")


if __name__ == "__main__":
    main()
