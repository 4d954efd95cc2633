"""User-facing errors.

Anything the user can fix (a bad flag, a missing file, an unknown model) raises
:class:`UserError`. The CLI prints it as one line and exits with status 2, with
no traceback. Library callers get an ordinary exception they can catch.

A bad value of one named parameter raises :class:`ParameterError`: the library
names the parameter (``beta must be finite``), and the CLI, which knows which
flag set it, names the flag instead (``--beta must be finite; pass a finite
--beta``). Each input is validated once, in the library.
"""

from __future__ import annotations

__all__ = ["ParameterError", "UserError"]


class UserError(ValueError):
    """A problem with the user's input, with a hint on how to fix it.

    Args:
        problem: what is wrong, e.g. ``"prompt file 'x.txt' is empty"``.
        fix: what to do about it, e.g. ``"put one prompt per line"``.
        cli_fix: the fix as a command-line user should read it, when it differs
            (a library fix may name a Python argument such as ``allow_partial``).

    Example:
        >>> err = tf.UserError("prompt file 'x.txt' is empty", "put one prompt per line")
        >>> err.problem, err.fix
        ("prompt file 'x.txt' is empty", 'put one prompt per line')
    """

    def __init__(self, problem: str, fix: str | None = None, *, cli_fix: str | None = None):
        self.problem = problem
        self.fix = fix
        self.cli_fix = cli_fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        text = self.problem.rstrip(".")
        if self.fix:
            text += f"; {self.fix.rstrip('.')}"
        return " ".join(text.split()) + "."


class ParameterError(UserError):
    """A bad value of the parameter ``param``.

    ``problem`` and ``fix`` may contain ``{name}``; it is replaced by the
    parameter's name here, and by whatever :meth:`named` is given (the CLI's
    flag) there.

    Example:
        >>> raise ParameterError("beta", "{name} must be finite, not nan", "pass a finite {name}")
        ParameterError: beta must be finite, not nan; pass a finite beta.
    """

    def __init__(self, param: str, problem: str, fix: str | None = None):
        self.param = param
        self.templates = (problem, fix)
        super().__init__(_fill(problem, param), _fill(fix, param) if fix else None)

    def named(self, name: str) -> UserError:
        """The same error with ``name`` (e.g. ``--beta``) for the parameter."""
        problem, fix = self.templates
        return UserError(_fill(problem, name), _fill(fix, name) if fix else None)


def _fill(text: str, name: str) -> str:
    return text.replace("{name}", name)
