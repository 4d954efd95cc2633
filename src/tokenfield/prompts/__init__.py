"""Prompt sets: the seed experiment's two sets, their replication sets, and loaders for user files.

A prompt is text plus an optional category and label (the seed numbers its
spectrum prompts 1..21; the label carries that number).

Accepted sources for :func:`load_prompts`:

- a bundled set name: ``seed-categories`` (25 prompts in 5 categories) or
  ``seed-spectrum`` (21 numbered prompts in 7 groups), exactly as written in the
  seed post; or ``replication-categories`` (160 prompts, 32 in each of the same
  5 categories) or ``replication-spectrum`` (221 prompts, 31 or 32 in each of the
  same 7 groups): fresh prompts that share none with the seed sets, for testing
  the seed's claims on prompts nobody chose a layer on (labels ``R1``, ``R2``...);
- ``.txt``: one prompt a line (blank lines and lines starting with ``#`` skipped; lines
  end at ``\n`` or ``\r\n`` only, so a U+2028 or a form feed stays inside its prompt);
- ``.jsonl``: one object a line with ``text`` and optional ``category``, ``label``;
- ``.csv``: a header row with a ``text`` column and optional ``category``, ``label``
  (a quoted field may hold newlines; a row with more fields than the header is an error);
- ``.yaml`` / ``.yml``: a list of strings or of mappings with ``text`` (and
  optional ``category``, ``label``), or a mapping ``{category: [text, ...]}``.

Any other field or column (a misspelled ``catgory``) is an error naming the
known ones: silently ignoring it would leave the categories empty.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tokenfield.errors import UserError

BUNDLED_SETS = (
    "seed-categories",
    "seed-spectrum",
    "replication-categories",
    "replication-spectrum",
)
#: The fields (keys, columns) a prompt may have; any other is a typo and an error.
FIELDS = ("text", "category", "label")

__all__ = ["BUNDLED_SETS", "Prompt", "load_prompts", "as_prompts"]


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text, category ("" when none) and label ("" when none).

    Args:
        text: the prompt's text.
        category: its category (prompts are grouped and coloured by it).
        label: its label within the category.

    Example:
        >>> p = tf.Prompt("The capital of France is", category="geography")
        >>> p.text, p.category, p.label
        ('The capital of France is', 'geography', '')
    """

    text: str
    category: str = ""
    label: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    to_json = to_dict  # the old name of the one serialisation verb


def as_prompts(prompts: Iterable[Prompt | str | dict[str, Any]]) -> list[Prompt]:
    """Coerce strings / mappings / prompts to a list of :class:`Prompt`.

    Args:
        prompts: strings (text only), mappings with ``text`` and optionally
            ``category`` and ``label``, or :class:`Prompt` objects.

    Returns:
        The prompts, in order.

    Example:
        >>> from tokenfield.prompts import as_prompts
        >>> as_prompts(["2 + 2 =", {"text": "def f(x):", "category": "Code"}])
        [Prompt(text='2 + 2 =', category='', label=''), Prompt(text='def f(x):', category='Code', label='')]
    """
    out: list[Prompt] = []
    for item in prompts:
        if isinstance(item, Prompt):
            out.append(item)
        elif isinstance(item, str):
            out.append(Prompt(item))
        elif isinstance(item, dict):
            out.append(_from_mapping(item, "<list>", len(out) + 1))
        else:
            raise UserError(
                f"prompt #{len(out) + 1} is a {type(item).__name__}",
                "give prompts as strings, mappings with 'text', or Prompt objects",
            )
    return _validated(out, "<list>")


def load_prompts(source: str | Path | Sequence[Prompt | str]) -> list[Prompt]:
    """Load prompts from a bundled set name, a file, or a list.

    Args:
        source: a bundled set name (``"seed-categories"``, ``"seed-spectrum"``),
            a prompt file, or a list of strings / :class:`Prompt`.

    Returns:
        The prompts, in order.

    Raises:
        UserError: unknown set, missing/unreadable/empty file, bad format.

    Example:
        >>> prompts = tf.load_prompts("seed-categories")
        >>> len(prompts), prompts[0].category
        (25, 'Math')
    """
    if not isinstance(source, (str, Path)):
        return as_prompts(source)
    name = str(source)
    if name in BUNDLED_SETS:
        text = resources.files("tokenfield.prompts").joinpath("data", f"{name}.jsonl").read_text()
        return _validated(_parse_jsonl(text, name), name)
    path = Path(name).expanduser()
    if not path.exists():
        raise UserError(
            f"prompt file '{name}' does not exist",
            f"pass a file path or one of the bundled sets: {', '.join(BUNDLED_SETS)}",
        )
    if path.is_dir():
        raise UserError(
            f"'{name}' is a directory", "pass a prompt file (.txt, .jsonl, .csv, .yaml)"
        )
    try:
        # newline="": lines end where _lines says, and a CSV's quoted "\r\n" stays
        with path.open(encoding="utf-8", newline="") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise UserError(
            f"cannot read prompt file '{name}' ({reason})",
            "check its permissions and that it is UTF-8 text",
        ) from None
    suffix = path.suffix.lower()
    if suffix in (".txt", ""):
        prompts = [Prompt(line.strip()) for line in _lines(text) if _is_prompt_line(line)]
    elif suffix == ".jsonl":
        prompts = _parse_jsonl(text, name)
    elif suffix == ".csv":
        prompts = _parse_csv(text, name)
    elif suffix in (".yaml", ".yml"):
        prompts = _parse_yaml(text, name)
    else:
        raise UserError(
            f"prompt file '{name}' has an unknown extension '{suffix}'",
            "use .txt (one prompt a line), .jsonl, .csv or .yaml",
        )
    return _validated(prompts, name)


def _lines(text: str) -> list[str]:
    """The lines of a prompt file: split at ``\n`` and ``\r\n`` only.

    ``str.splitlines`` also splits at U+2028, U+2029, U+0085, form feeds and other
    separators, which can sit inside a prompt's text."""
    lines = re.split(r"\r?\n", text)
    return lines[:-1] if lines and lines[-1] == "" else lines


def _is_prompt_line(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _from_mapping(item: dict[str, Any], source: str, number: int) -> Prompt:
    text = item.get("text")
    if not isinstance(text, str):
        raise UserError(
            f"prompt #{number} in '{source}' has no 'text' string",
            "give every entry a 'text' field",
        )
    unknown = [str(key) for key in item if key not in FIELDS and key is not None]
    if unknown:
        raise UserError(
            f"prompt #{number} in '{source}' has an unknown field '{unknown[0]}'",
            f"the known fields are {', '.join(FIELDS)} (check the spelling)",
        )
    return Prompt(text, _field(item.get("category")), _field(item.get("label")))


def _field(value: Any) -> str:
    """A category or label as text: absent or null is "", anything else its ``str``
    (a category ``0`` is "0", not "")."""
    return "" if value is None else str(value)


def _parse_jsonl(text: str, source: str) -> list[Prompt]:
    prompts = []
    for line_no, line in enumerate(_lines(text), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(
                f"line {line_no} of '{source}' is not valid JSON ({exc.msg})",
                "write one JSON object per line",
            ) from None
        if not isinstance(item, dict):
            raise UserError(
                f"line {line_no} of '{source}' is not a JSON object",
                'write objects like {"text": "...", "category": "..."}',
            )
        prompts.append(_from_mapping(item, source, line_no))
    return prompts


def _parse_csv(text: str, source: str) -> list[Prompt]:
    # newline="" as the csv module asks, so that a quoted field keeps its newlines
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if reader.fieldnames is None or "text" not in reader.fieldnames:
        raise UserError(
            f"CSV prompt file '{source}' has no 'text' column",
            "add a header row with a 'text' column (and optional 'category', 'label')",
        )
    unknown = [name for name in reader.fieldnames if name not in FIELDS]
    if unknown:
        raise UserError(
            f"CSV prompt file '{source}' has an unknown column '{unknown[0]}'",
            f"the known columns are {', '.join(FIELDS)} (check the spelling)",
        )
    prompts = []
    for number, row in enumerate(reader, start=1):
        if row.get(None):  # DictReader files the fields beyond the header under None
            raise UserError(
                f"row {number} of CSV prompt file '{source}' has more fields than the header "
                f"({len(reader.fieldnames) + len(row[None])} for {len(reader.fieldnames)})",
                "quote a field that contains a comma, or add the column to the header",
            )
        prompts.append(_from_mapping(row, source, number))
    return prompts


def _parse_yaml(text: str, source: str) -> list[Prompt]:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"'{source}' is not valid YAML ({exc})", "fix the YAML syntax") from None
    if data is None:
        return []
    if isinstance(data, dict):
        prompts = []
        for category, texts in data.items():
            if not isinstance(texts, list):
                raise UserError(
                    f"category '{category}' in '{source}' is not a list",
                    "write 'category: [prompt, ...]'",
                )
            for t in texts:
                prompts.append(Prompt(_yaml_text(t, source, len(prompts) + 1), str(category)))
        return prompts
    if isinstance(data, list):
        return [
            _from_mapping(item, source, i)
            if isinstance(item, dict)
            else Prompt(_yaml_text(item, source, i))
            for i, item in enumerate(data, start=1)
        ]
    raise UserError(f"'{source}' holds no list of prompts", "write a YAML list of prompts")


def _yaml_text(item: Any, source: str, number: int) -> str:
    """A YAML list entry that must be a prompt's text (``42``, ``null`` or a bare
    ``-`` are refused rather than turned into the prompts "42" or "None")."""
    if isinstance(item, str):
        return item
    what = "empty (null or a bare '-')" if item is None else f"{item!r}, not text"
    raise UserError(
        f"prompt #{number} in '{source}' is {what}",
        "quote it (e.g. '42') or remove it",
    )


def _check_encodable(value: str, source: str, number: int) -> None:
    """A lone surrogate (``"\\ud800"`` in JSON) is no character: no tokenizer or
    UTF-8 file can hold it, so it is refused here rather than deep in a trace."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(value[exc.start])
        raise UserError(
            f"prompt #{number} in '{source}' contains a lone surrogate (U+{code:04X}), "
            "which is no character",
            "write the character in full (a surrogate pair in JSON) or remove it",
        ) from None


def _validated(prompts: list[Prompt], source: str) -> list[Prompt]:
    if not prompts:
        raise UserError(f"no prompts in '{source}'", "put at least one prompt in it")
    for number, prompt in enumerate(prompts, start=1):
        if not prompt.text.strip():
            raise UserError(f"prompt #{number} in '{source}' is empty", "remove it or give it text")
        for value in (prompt.text, prompt.category, prompt.label):
            _check_encodable(value, source, number)
    return prompts
