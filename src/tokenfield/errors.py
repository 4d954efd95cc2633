"""User-facing errors.

Anything the user can fix (a bad flag, a missing file, an unknown model) raises
:class:`UserError`. The CLI prints it as one line and exits with status 2, with
no traceback. Library callers get an ordinary exception they can catch.
"""

from __future__ import annotations


class UserError(ValueError):
    """A problem with the user's input, with a hint on how to fix it.

    Args:
        problem: what is wrong, e.g. ``"prompt file 'x.txt' is empty"``.
        fix: what to do about it, e.g. ``"put one prompt per line"``.
    """

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        text = self.problem.rstrip(".")
        if self.fix:
            text += f"; {self.fix.rstrip('.')}"
        return " ".join(text.split()) + "."
