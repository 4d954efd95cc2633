"""A generated block in a Markdown doc: find it, check it, or replace it atomically.

The block sits between a ``BEGIN`` and an ``END`` comment line; the scripts that
render docs' measured tables (``steering_tables.py``, ``scaling_tables.py``) use it.
"""

from __future__ import annotations

import sys
from pathlib import Path


def block_of(text: str, begin: str, end: str, doc: str = "the doc") -> str:
    if begin not in text or end not in text:
        raise SystemExit(f"{doc} has no '{begin}' ... '{end}' block")
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def check_or_write(doc: Path, begin: str, end: str, fresh: str, *, check: bool, script: str) -> int:
    """``check``: 0 when the doc's block equals ``fresh``, else 1 and the first
    differing line on stderr. Otherwise replace the block (atomically) and return 0."""
    text = doc.read_text()
    current = block_of(text, begin, end, str(doc))
    if check:
        if current == fresh:
            return 0
        old, new = current.splitlines(), fresh.splitlines()
        for i in range(max(len(old), len(new))):
            a = old[i] if i < len(old) else "(missing)"
            b = new[i] if i < len(new) else "(missing)"
            if a != b:
                print(f"{doc}: the generated block differs at its line {i + 1}:\n"
                      f"  doc:       {a}\n  generated: {b}\n"
                      f"run: python scripts/{script} --write", file=sys.stderr)  # fmt: skip
                return 1
        return 1
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    tmp = doc.with_name(f".{doc.name}.tmp")
    tmp.write_text(f"{head}{begin}\n{fresh}\n{end}{tail}")
    tmp.replace(doc)
    return 0
