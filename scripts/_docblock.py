"""A generated block in a Markdown doc: find it, check it, or replace it atomically.

The block sits between a ``BEGIN`` and an ``END`` comment line; the scripts that
render docs' measured tables (``steering_tables.py``, ``scaling_tables.py``) use it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
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


Blocks = Callable[[Path], list[tuple[str, str, str]]]


def main(
    argv: list[str] | None, description: str, doc: Path, data: Path, blocks: Blocks, script: str
) -> int:
    """The scripts' command line: print the blocks, ``--check`` them, or ``--write`` them.

    ``blocks(data)`` gives ``(begin, end, fresh text)`` for every generated block of ``doc``.
    """
    parser = argparse.ArgumentParser(description=description)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="fail if the doc differs")
    group.add_argument("--write", action="store_true", help="update the doc in place")
    parser.add_argument("--doc", type=Path, default=doc)
    parser.add_argument("--data", type=Path, default=data)
    args = parser.parse_args(argv)
    rendered = blocks(args.data)
    if not (args.check or args.write):
        print("\n\n".join(fresh for _begin, _end, fresh in rendered))
        return 0
    return max(
        check_or_write(args.doc, begin, end, fresh, check=args.check, script=script)
        for begin, end, fresh in rendered
    )
