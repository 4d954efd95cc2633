"""The one way tokenfield reaches Dask: a scheduler's address checked, its handshake
bounded, a local cluster that listens on loopback only, and :func:`run_tasks`, the
one cluster lifecycle (start or reuse a client, submit, collect as completed, close)
that the sharded trace and the mean-field sweeps share.

``distributed`` bounds the TCP connect but not the handshake that follows it: an
address that accepts a connection and never answers (a wrong port, a proxy, a
stopped process) makes ``Client(address, timeout=...)`` wait for ever. So the
handshake is tried first, in a thread, under a deadline; only an address that
answered gets a :class:`~distributed.Client`. Everything that can go wrong with an
address (a malformed one, an unknown or a TLS scheme, no answer) is a
:class:`~tokenfield.errors.UserError` naming ``--scheduler``.

``distributed`` is imported inside the functions (it is an optional, heavy import).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from tokenfield.errors import UserError

__all__ = [
    "HANDSHAKE_TIMEOUT",
    "LOOPBACK",
    "check_scheduler",
    "connect",
    "local_cluster",
    "reach_scheduler",
    "run_tasks",
]

#: Seconds to connect to a scheduler and hear its handshake.
HANDSHAKE_TIMEOUT = 10.0
#: Where a local cluster's scheduler, workers and dashboard listen.
LOOPBACK = "127.0.0.1"
#: Schemes tokenfield connects with (TLS ones need certificates it is not given).
SCHEMES = ("tcp", "ws")
FIX = "pass --scheduler tcp://HOST:PORT (e.g. tcp://host:8786), or leave it out for a local cluster"


def check_scheduler(address: str) -> tuple[str, str]:
    """``(scheme, host:port)`` of a scheduler address, checked without any network.

    Raises:
        UserError: malformed, no port, or a scheme tokenfield cannot connect with.
    """
    from distributed.comm import parse_address
    from distributed.comm.addressing import parse_host_port

    text = str(address).strip()
    try:
        scheme, location = parse_address(text, strict=False)
    except (ValueError, TypeError) as exc:
        raise UserError(f"--scheduler '{address}' is not a Dask address ({exc})", FIX) from None
    if scheme in ("tls", "wss"):
        raise UserError(
            f"--scheduler '{address}' asks for TLS, and tokenfield has no certificates to give",
            "use a tcp:// address (through an SSH tunnel across an untrusted network)",
        )
    if scheme not in SCHEMES:
        raise UserError(f"--scheduler '{address}' has the unsupported scheme '{scheme}'", FIX)
    try:
        host, port = parse_host_port(location)
    except (ValueError, TypeError) as exc:
        raise UserError(f"--scheduler '{address}' is not HOST:PORT ({exc})", FIX) from None
    if not host or not 0 < int(port) < 65536:
        raise UserError(f"--scheduler '{address}' has no host or a bad port", FIX)
    return scheme, location


def _handshake(address: str, timeout: float) -> None:
    """Connect and hear the scheduler's handshake within ``timeout`` seconds, in a
    thread of its own (so that it also works under a running event loop)."""
    from distributed.comm import connect as comm_connect

    async def probe() -> None:
        comm = await asyncio.wait_for(comm_connect(address, timeout=timeout), timeout)
        await comm.close()

    outcome: dict[str, BaseException] = {}

    def target() -> None:
        try:
            asyncio.run(probe())
        except BaseException as exc:  # noqa: BLE001  reported below, in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="tokenfield-handshake", daemon=True)
    thread.start()
    thread.join(timeout + 5.0)  # wait_for ends the probe; the extra seconds are a margin
    error = outcome.get("error")
    if thread.is_alive() or isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        raise UserError(
            f"the Dask scheduler at '{address}' accepted no handshake within {timeout:g} s",
            "check that --scheduler names a running 'dask scheduler' (host and port)",
        )
    if error is not None:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise UserError(f"cannot reach the Dask scheduler at '{address}' ({reason})", FIX)


def reach_scheduler(address: str, *, timeout: float | None = None) -> None:
    """Check ``address`` and hear its handshake (bounded), then hang up: what a
    command does before it draws a progress bar or creates anything."""
    timeout = HANDSHAKE_TIMEOUT if timeout is None else float(timeout)
    scheme, location = check_scheduler(address)
    _handshake(f"{scheme}://{location}", timeout)


def connect(address: str, *, timeout: float | None = None) -> Any:
    """A :class:`distributed.Client` of the scheduler at ``address``, or a one-line
    :class:`UserError`; never an unbounded wait for the handshake."""
    from dask.distributed import Client

    timeout = HANDSHAKE_TIMEOUT if timeout is None else float(timeout)
    scheme, location = check_scheduler(address)
    full = f"{scheme}://{location}"
    _handshake(full, timeout)
    try:
        return Client(full, timeout=f"{timeout}s")
    except Exception as exc:  # it answered the handshake a moment ago
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise UserError(f"cannot reach the Dask scheduler at '{address}' ({reason})", FIX) from None


def local_cluster(
    n_workers: int, *, processes: bool, dashboard: bool = False, **kwargs: Any
) -> Any:
    """A :class:`distributed.LocalCluster` whose scheduler, workers and (with
    ``dashboard``) dashboard listen on the loopback interface only: nothing on the
    network can submit work to it or read its dashboard."""
    from dask.distributed import LocalCluster

    if processes:  # in-process clusters talk over inproc://, no socket at all
        kwargs.setdefault("host", LOOPBACK)
    return LocalCluster(
        n_workers=int(n_workers),
        processes=processes,
        dashboard_address=f"{LOOPBACK}:0" if dashboard else None,
        **kwargs,
    )


def run_tasks(
    tasks: Sequence[tuple[str | None, Callable[..., Any], tuple[Any, ...]]],
    on_result: Callable[[Any], Any],
    *,
    client: Any = None,
    n_workers: int = 1,
    processes: bool = False,
    **cluster: Any,
) -> tuple[str, list[str]]:
    """Run ``tasks`` on Dask and hand each result to ``on_result`` as it completes.

    Args:
        tasks: ``(name, function, args)``; ``name`` (or ``None``) starts the task's
            key, made unique, so the dashboard says what runs.
        on_result: called in this process with each task's return value; a task's
            error is raised here, and the tasks not yet run are cancelled.
        client: a connected client (:func:`connect`); ``None`` starts a
            :func:`local_cluster` of ``n_workers`` workers of one thread each
            (``processes``, and ``cluster``: its other options), closed at the end.
            The client is closed at the end either way.

    Returns:
        The scheduler's address and its workers' addresses (sorted).
    """
    from dask.distributed import Client, as_completed

    local = None
    try:
        if client is None:
            local = local_cluster(
                max(1, int(n_workers)), processes=processes, threads_per_worker=1, **cluster
            )
            client = Client(local)
        with client:
            futures = [
                client.submit(
                    function,
                    *args,
                    pure=False,
                    **({"key": f"{name}-{os.urandom(4).hex()}"} if name else {}),
                )
                for name, function, args in tasks
            ]
            try:
                for future in as_completed(futures):
                    on_result(future.result())  # a task's error surfaces here
            finally:
                for future in futures:
                    future.cancel()
            return client.scheduler.address, sorted(client.scheduler_info()["workers"])
    finally:
        if local is not None:
            local.close()
