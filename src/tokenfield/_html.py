"""Small HTML tables for results objects shown in Jupyter (``_repr_html_``)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any


def html_table(
    caption: str, headers: Sequence[str], rows: Sequence[Sequence[Any]], *, note: str = ""
) -> str:
    """An escaped HTML table: ``caption`` above, one ``<tr>`` per row, ``note`` below.

    Args:
        caption: the title (plain text; escaped).
        headers: the column names.
        rows: the cells, converted with ``str`` (``None`` shows as an empty cell).
        note: a line under the table (plain text; escaped).

    Returns:
        The HTML fragment, with every cell escaped.

    Example:
        >>> html_table("t", ["a"], [["<b>"]])
        '<div style="overflow-x: auto"><table class="tokenfield"><caption>t</caption><thead><tr><th>a</th></tr></thead><tbody><tr><td>&lt;b&gt;</td></tr></tbody></table></div>'
    """

    def cell(value: Any) -> str:
        return "" if value is None else html.escape(str(value))

    head = "".join(f"<th>{cell(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    # a wide table scrolls inside its output area instead of being clipped by it
    table = (
        f'<div style="overflow-x: auto"><table class="tokenfield">'
        f"<caption>{cell(caption)}</caption>"
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )
    return table + (f"<p>{cell(note)}</p>" if note else "")
