"""One way to read or change the residual stream: :func:`hook` on a named site.

Every read and every write of a model's internals in tokenfield goes through
here: the tracer's capture (:mod:`tokenfield.models.capture`), the attention
read-out (:mod:`tokenfield.models.attention`), steering
(:mod:`tokenfield.steering.hooks`) and the recording during generation
(:mod:`tokenfield.steering.generate`).

Sites (see :mod:`tokenfield.models.sites` for what each one is):

==============  ==================================================================
``embed``       the input of block 0 (a pre-hook on block 0): ``time`` 0
``block.{i}``   the output of block ``i`` (a forward hook on block ``i``): ``time`` i + 1
``final_norm``  the output of the final norm (models without one have no such site)
``attn.{i}``    the output of block ``i``'s self-attention module (under eager
                attention a tuple whose item 1 is the weights ``(batch, heads, seq, seq)``)
==============  ==================================================================

``pre=True`` reads a module's input instead of its output (``embed`` is
``block.0`` with ``pre=True``). For the residual sites the function receives the
hidden states ``(batch, seq, d)``, whatever the block returns (a tensor, or a
tuple whose first item it is); for ``attn.{i}`` the module's raw output.

**Order.** A function returns ``None`` (it only reads) or a replacement value
(it intervenes). At each site the registered functions run in ascending
:class:`Order`, then in the order they were registered: interventions
(:data:`Order.INTERVENE`: steering, patching) first, read-outs
(:data:`Order.READ`: capture, attention read-out, logit lens) last. So a
read-out always sees the intervened value, whoever registered first. The order
is kept by one dispatcher per module and direction: the first :func:`hook` on a
module registers one torch hook that calls every registered function in order;
the last one to leave removes it.

Example:
    >>> with hook(model, "block.3", lambda h: h + delta, order=Order.INTERVENE):
    ...     model.model(**inputs)
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import torch
from torch import nn

from tokenfield.models.sites import ModelSites, attention_modules

__all__ = [
    "Order",
    "Site",
    "add_to_residual",
    "hook",
    "hooks",
    "resolve_site",
    "shift",
    "site_for_time",
]

#: ``fn(value) -> None | replacement``
HookFn = Callable[[Any], Any]


class Order(IntEnum):
    """When a function runs at its site: lower first."""

    INTERVENE = 0  # steering, activation patching: change the value
    READ = 100  # capture, attention read-out, logit lens: see the final value


@dataclass(frozen=True)
class Site:
    """A resolved site: the module, whether its input (``pre``) or output is
    meant, and whether the function gets the hidden states (``residual``) or the
    module's raw value."""

    name: str
    module: nn.Module
    pre: bool
    residual: bool


def _sites_of(target: Any) -> ModelSites:
    return target if isinstance(target, ModelSites) else target.sites


def site_for_time(time: int) -> str:
    """The site read at run ``time``: ``embed`` for 0, ``block.{time-1}`` after."""
    if time < 0:
        raise ValueError(f"time must be >= 0, got {time}")
    return "embed" if time == 0 else f"block.{time - 1}"


def resolve_site(target: Any, site: str, *, pre: bool = False) -> Site:
    """Map a site name to its module (the one place that knows that ``embed`` is a
    pre-hook on block 0 and ``block.{i}`` a forward hook on block ``i``).

    Args:
        target: a :class:`~tokenfield.models.load.LoadedModel` or its
            :class:`~tokenfield.models.sites.ModelSites`.
        site: ``embed``, ``block.{i}``, ``final_norm`` or ``attn.{i}``.
        pre: the module's input instead of its output.

    Raises:
        ValueError: an unknown site, or a block index out of range.
    """
    sites = _sites_of(target)
    if site == "embed":
        if pre:
            raise ValueError("'embed' is already an input (of block 0); drop pre=True")
        return Site(site, sites.blocks[0], True, True)
    if site == "final_norm":
        if sites.final_norm is None:
            raise ValueError(f"a {sites.family.name} model has no final norm")
        return Site(site, sites.final_norm, pre, True)
    kind, _, index = site.partition(".")
    if kind in ("block", "attn") and index.isdigit():
        i = int(index)
        if not 0 <= i < sites.n_blocks:
            raise ValueError(f"site '{site}': the model has blocks 0..{sites.n_blocks - 1}")
        if kind == "block":
            return Site(site, sites.blocks[i], pre, True)
        return Site(site, attention_modules(sites)[i], pre, False)
    raise ValueError(f"unknown site '{site}' (embed, block.N, final_norm or attn.N)")


class _Dispatcher:
    """The one torch hook on one module and direction; calls the registered
    functions in (order, registration) order and threads replacements through."""

    _ATTR = "_tokenfield_dispatchers"

    def __init__(self, module: nn.Module, pre: bool):
        self.module, self.pre = module, pre
        # key -> (order, registration number, fn, whether fn gets the hidden states)
        self.entries: dict[int, tuple[int, int, HookFn, bool]] = {}
        self.handle = (
            module.register_forward_pre_hook(self._on_input, with_kwargs=True)
            if pre
            else module.register_forward_hook(self._on_output)
        )

    @classmethod
    def of(cls, module: nn.Module, pre: bool) -> _Dispatcher:
        table = module.__dict__.setdefault(cls._ATTR, {})
        if pre not in table:
            table[pre] = cls(module, pre)
        return table[pre]

    def remove(self, key: int) -> None:
        self.entries.pop(key, None)
        if not self.entries:
            self.handle.remove()
            table = self.module.__dict__.get(self._ATTR, {})
            table.pop(self.pre, None)
            if not table:
                self.module.__dict__.pop(self._ATTR, None)

    def _run(self, value: Any) -> tuple[Any, bool]:
        """Call every function in order; each sees the value the previous ones left."""
        changed = False
        ordered = sorted(self.entries.values(), key=lambda entry: (entry[0], entry[1]))
        for _order, _seq, fn, wants_hidden in ordered:
            arg = _hidden_of(value) if wants_hidden else value
            result = fn(arg)
            if result is not None:
                value = _with_hidden(value, result) if wants_hidden else result
                changed = True
        return value, changed

    def _on_output(self, _module: nn.Module, _args: Any, output: Any) -> Any:
        value, changed = self._run(output)
        return value if changed else None

    def _on_input(self, _module: nn.Module, args: tuple, kwargs: dict) -> Any:
        hidden = args[0] if args else kwargs["hidden_states"]
        value, changed = self._run(hidden)
        if not changed:
            return None
        if args:
            return (value, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": value}


def _hidden_of(value: Any) -> torch.Tensor:
    """Blocks return a tensor (transformers 5) or a tuple whose first item it is."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    raise TypeError(f"cannot read hidden states from a value of type {type(value)}")


def _with_hidden(value: Any, hidden: torch.Tensor) -> Any:
    if isinstance(value, torch.Tensor):
        return hidden
    return (hidden, *value[1:]) if isinstance(value, tuple) else [hidden, *value[1:]]


_KEYS = itertools.count()


@contextlib.contextmanager
def hook(
    target: Any, site: str, fn: HookFn, *, pre: bool = False, order: int = Order.READ
) -> Iterator[None]:
    """Call ``fn`` at ``site`` during every forward pass inside the block.

    The hook is removed on exit, even when the body raises.

    Args:
        target: a :class:`~tokenfield.models.load.LoadedModel` or its
            :class:`~tokenfield.models.sites.ModelSites`.
        site: ``embed``, ``block.{i}``, ``final_norm`` or ``attn.{i}``
            (see :func:`resolve_site`).
        fn: receives the hidden states ``(batch, seq, d)`` (residual sites) or
            the module's output (``attn.{i}``); returns ``None`` to leave them,
            or the value to use instead.
        pre: the module's input rather than its output.
        order: :data:`Order.INTERVENE` for functions that change the value,
            :data:`Order.READ` (the default) for read-outs; see the module docstring.
    """
    with hooks(target, [(site, fn)], pre=pre, order=order):
        yield


@contextlib.contextmanager
def hooks(
    target: Any,
    pairs: list[tuple[str, HookFn]],
    *,
    pre: bool = False,
    order: int = Order.READ,
) -> Iterator[None]:
    """:func:`hook` for several ``(site, fn)`` pairs at once (all removed on exit)."""
    registered: list[tuple[_Dispatcher, int]] = []
    try:
        for site, fn in pairs:
            where = resolve_site(target, site, pre=pre)
            dispatcher = _Dispatcher.of(where.module, where.pre)
            key = next(_KEYS)
            dispatcher.entries[key] = (int(order), key, fn, where.residual)
            registered.append((dispatcher, key))
        yield
    finally:
        for dispatcher, key in reversed(registered):
            dispatcher.remove(key)


def shift(hidden: torch.Tensor, delta: torch.Tensor, positions: str = "last") -> torch.Tensor:
    """``hidden`` ``(batch, seq, d)`` plus ``delta`` (``(d,)``, or ``(batch, d)``: one
    per row) at the last column (``"last"``) or at every position (``"all"``)."""
    delta = delta.to(device=hidden.device, dtype=hidden.dtype)
    if positions == "all":
        return hidden + (delta[:, None, :] if delta.dim() == 2 else delta)
    shifted = hidden.clone()
    shifted[:, -1, :] = shifted[:, -1, :] + delta
    return shifted


@contextlib.contextmanager
def add_to_residual(
    target: Any, deltas: Mapping[int, torch.Tensor], *, positions: str = "last"
) -> Iterator[None]:
    """Add ``deltas[time]`` to the residual stream at the site of run ``time``
    (:func:`site_for_time`) inside the block, as interventions (:func:`shift`).

    The mechanism of steering (:mod:`tokenfield.steering.hooks`); states at
    earlier times are untouched.

    Raises:
        ValueError: ``positions`` is not ``"last"`` or ``"all"``.
    """
    if positions not in ("last", "all"):
        raise ValueError(f"positions must be 'last' or 'all', not {positions!r}")

    def add(delta: torch.Tensor) -> HookFn:
        return lambda hidden: shift(hidden, delta, positions)

    pairs = [(site_for_time(int(time)), add(delta)) for time, delta in deltas.items()]
    with hooks(target, pairs, order=Order.INTERVENE):
        yield
