#!/usr/bin/env python3
"""Checks the library's layering: every `crate::` path in src/ (code, not comments or test
modules) names a module of a lower layer than its own, so no module imports one above it and
there is no import circle. Prints the module graph; exits 1 naming each violation.

usage: tools/layers.py [--graph]
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
]
LEVEL = {m: i for i, ms in enumerate(LAYERS) for m in ms}
__doc__ += "\n" + "\n".join("  %d: %s" % (i, ", ".join(ms)) for i, ms in enumerate(LAYERS))


def code_of(text):
    """The text without comments, string literals and `#[cfg(test)]` modules."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
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


def module_of(path):
    parts = os.path.relpath(path, "src")[:-3].split(os.sep)
    return parts[0]


def main():
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
