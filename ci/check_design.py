#!/usr/bin/env python3
"""Checks that docs/DESIGN.md's "Checked by:" lines name things that exist.

Every invariant (D1..) in docs/DESIGN.md ends with a "Checked by:" paragraph
naming tests (`snake_case` function names), simulator oracles (`D1 ...`, as
verify/src/lib.rs spells them) and planted bugs (`CamelCase`, the variants of
engine/core/src/planted.rs). A renamed or deleted test would leave the design
pointing at nothing; this fails then, naming the invariant and the name.
Every repository path the design names (`engine/.../x.rs`, `ci/x.sh`, ...)
must exist too: a moved file fails it the same way.

    python3 ci/check_design.py        exit 0, or 1 with one line per missing name
"""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
design = (root / "docs" / "DESIGN.md").read_text()
sources = "\n".join(
    p.read_text()
    for d in ("engine", "sim", "verify")
    for p in (root / d).rglob("*.rs")
    if "target" not in p.parts
)
planted = (root / "engine" / "core" / "src" / "planted.rs").read_text()

missing = []
blocks = re.findall(r"- \*\*(D\d+) [^\n]*\n((?:  [^\n]*\n)*)", design)
if not blocks:
    sys.exit("check_design: no invariants found in docs/DESIGN.md")
for inv, body in blocks:
    if "Checked by:" not in body:
        missing.append(f"{inv}: no 'Checked by:' line")
        continue
    text = body.split("Checked by:", 1)[1]
    for name in re.findall(r"`([^`]+)`", text):
        if re.fullmatch(r"D\d+ [a-z -]+", name):
            ok = f'"{name}"' in sources
        elif re.fullmatch(r"[A-Z][A-Za-z]+", name):
            ok = re.search(rf"\b{name}\s*=", planted) is not None
        elif re.fullmatch(r"[a-z_][a-z0-9_]+", name):
            ok = re.search(rf"\bfn {name}\b", sources) is not None
        else:
            continue  # a path or a command, not a name to look up
        if not ok:
            missing.append(f"{inv}: `{name}` not found")
for path in sorted(set(re.findall(
    r"\b(?:engine|verify|sim|benches|ci|ops|docs|examples)/[A-Za-z0-9_./-]+"
    r"\.(?:rs|py|sh|md|yml|yaml|json|toml)\b",
    design,
))):
    if not (root / path).exists():
        missing.append(f"no file {path} (named in docs/DESIGN.md)")
for m in missing:
    print("check_design: " + m, file=sys.stderr)
if missing:
    sys.exit(1)
print(f"check_design: {len(blocks)} invariants, every name in 'Checked by' exists")
