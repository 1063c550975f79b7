#!/usr/bin/env python3
"""Checks the library's layering: every `crate::` path in src/ (code, not comments or test
modules) names a module of a lower layer than its own, so no module imports one above it and
there is no import circle. Prints the module graph; exits 1 naming each violation.

usage: tools/layers.py [--graph] [--self-test]
The layers, bottom first (docs/design.md, "Layers"):"""
import os
import re
import sys

LAYERS = [
    ["sys", "buf"],       # system-call loops, file kinds; aligned and device buffers
    ["error"],            # the crate's errors
    ["key"],              # block hashes and worker ids
    ["format", "index"],  # the block file format; the in-memory index and its policies
    ["layout", "engine"], # the tree's names; the I/O engines
    ["ns"],               # every file operation
    ["stats"],            # counters below both the store and the offloader
    ["store"],            # the store
    ["offload", "queue"], # write-behind, and the completion queue, over the store
    ["transfer"],         # the engine-facing API: batches between KV memory and the store
    ["inspect", "testing"], # public views for the tools and the tests, over everything
]
LEVEL = {m: i for i, ms in enumerate(LAYERS) for m in ms}
__doc__ += "\n" + "\n".join("  %d: %s" % (i, ", ".join(ms)) for i, ms in enumerate(LAYERS))


def strip(text):
    """The text with comments (line, block, nested block), string literals (with escapes and
    `\\` line continuations; raw, byte and C strings) and char literals blanked, lifetimes
    kept: one pass over the characters, as rustc's lexer reads them."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        else:
            raw = re.match(r'(?:b|c)?r(#*)"', text[i:i + 260]) if c in "bcr" else None
            if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                end = text.find('"' + raw.group(1), i + raw.end())
                i = n if end < 0 else end + 1 + len(raw.group(1))
                out.append('""')
            elif c == '"' or (c in "bc" and text.startswith('"', i + 1)
                              and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_"))):
                i = text.index('"', i) + 1
                while i < n and text[i] != '"':
                    i += 2 if text[i] == "\\" else 1
                i += 1
                out.append('""')
            elif c == "'" and re.match(r"'(?:\\.[^']*|[^\\'])'", text[i:i + 12]):
                i += re.match(r"'(?:\\.[^']*|[^\\'])'", text[i:i + 12]).end()
                out.append("' '")
            else:
                out.append(c)
                i += 1
    return "".join(out)


def code_of(text):
    """The text without comments, string literals and `#[cfg(test)]` modules."""
    text = strip(text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\(crate\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while depth and j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def self_test():
    """The cases the checker must read right: an import after a string that ends in a line
    continuation (the one it missed, hiding engine/nixl.rs -> ns), after escaped quotes, raw
    strings, lifetimes and char literals; none inside comments or strings."""
    found = lambda src: re.findall(r"\bcrate::([a-z_]+)", code_of(src))
    bs = chr(92)  # a backslash
    cases = [
        ('let a = format!("x{}; y ' + bs + '\n z", 1);\nlet b = "w";\nuse crate::ns;\nlet c = "q";', ["ns"]),
        ('let s = "say \\"hi\\" // no";\nuse crate::ns;', ["ns"]),
        ('let s = r#"crate::x " still"#;\nuse crate::ns;', ["ns"]),
        ("fn f<'a>(c: char) -> bool { c == '\"' || c == '\\\\' }\nuse crate::ns;", ["ns"]),
        ("/* outer /* crate::x */ crate::y */ // crate::z\nuse crate::ns;", ["ns"]),
        ('let b = b"crate::x"; let c = \'"\';\nuse crate::ns;', ["ns"]),
        ("#[cfg(test)]\nmod tests { use crate::store; }\nuse crate::ns;", ["ns"]),
    ]
    for src, want in cases:
        got = found(src)
        if got != want:
            print("layers: self-test failed on %r: found %r, want %r" % (src, got, want), file=sys.stderr)
            sys.exit(1)
    print("layers: self-test: %d cases read right" % len(cases))


def module_of(path):
    parts = os.path.relpath(path, "src")[:-3].split(os.sep)
    return parts[0]


def main():
    if "--self-test" in sys.argv:
        self_test()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    deps, where = {}, {}
    for d, _, files in os.walk("src"):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            p = os.path.join(d, f)
            m = module_of(p)
            if m == "lib":
                continue
            for u in re.findall(r"\bcrate::([a-z_]+)", code_of(open(p).read())):
                if u != m:
                    deps.setdefault(m, set()).add(u)
                    where.setdefault((m, u), p)
    bad = []
    for m in sorted(set(deps) | {u for us in deps.values() for u in us}):
        if m not in LEVEL:
            bad.append("module %s is in no layer: add it to tools/layers.py" % m)
    for m, us in sorted(deps.items()):
        for u in sorted(us):
            if m in LEVEL and u in LEVEL and LEVEL[u] >= LEVEL[m]:
                bad.append("%s (layer %d) imports %s (layer %d), in %s"
                           % (m, LEVEL[m], u, LEVEL[u], where[(m, u)]))
    if "--graph" in sys.argv or bad:
        for m in sorted(deps, key=lambda m: (LEVEL.get(m, 99), m)):
            print("%-8s -> %s" % (m, ", ".join(sorted(deps[m]))))
    for b in bad:
        print("layers: " + b, file=sys.stderr)
    if bad:
        sys.exit(1)
    print("layers: %d modules in %d layers, every import points down" % (len(LEVEL), len(LAYERS)))


if __name__ == "__main__":
    main()
