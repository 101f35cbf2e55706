"""``@requires_approval``: a function (or coroutine) that runs only when a person approves."""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from countersign._common import log
from countersign.aio import AsyncClient
from countersign.client import Client
from countersign.errors import ApprovalNotGranted, ApprovalRejected
from countersign.model import Approval, ApprovalRequest, Risk, State

F = TypeVar("F", bound=Callable[..., Any])

_default_client: Client | None = None
_default_lock = threading.Lock()


def _shared_client() -> Client:
    """One Client.from_env() for every decorated sync function without a client."""
    global _default_client
    with _default_lock:
        if _default_client is None:
            _default_client = Client.from_env()
        return _default_client


def requires_approval(
    *,
    action: str | Callable[..., str],
    risk: Risk | str = Risk.MEDIUM,
    ttl: float | timedelta | None = None,
    client: Client | AsyncClient | Callable[[], Client | AsyncClient] | None = None,
    agent_id: str | None = None,
    tool_name: str | None = None,
    session_id: str = "",
    reason: str = "",
    deadline: float | None = None,
) -> Callable[[F], F]:
    """Gates a function or coroutine function on a countersign approval.

    Each call asks for an approval whose arguments are the call's arguments (by parameter
    name, defaults included), then waits for the decision (``deadline`` seconds; None: the
    approval's own expiry). The call runs only when approved, and is then recorded as consumed
    (succeeded, or failed with the exception's type). A rejection raises ApprovalRejected
    carrying the approver's reason; an expiry, a cancellation or no decision by the deadline
    raises ApprovalNotGranted; an unreachable server raises its error. None of them runs the
    function.

    ``action`` is shown to the approver: a template formatted with the arguments
    (``"delete {path}"``) or a callable taking the same arguments. ``client``: a Client (for
    functions) or AsyncClient (for coroutine functions), or a callable returning one, called on
    each call; None uses ``from_env()``. An AsyncClient obtained from a callable or from the
    environment is closed after the call (it belongs to the event loop it was made in); a
    Client from a callable is left open (return a shared one). ``agent_id`` defaults to
    $COUNTERSIGN_AGENT_ID, then "python"; ``tool_name`` to the function's module and qualified
    name.
    """

    def decorate(func: F) -> F:
        signature = inspect.signature(func)
        # The server allows letters, digits and . _ : / - in a tool name.
        name = tool_name or f"{func.__module__}.{func.__qualname__.replace('<locals>.', '')}"

        def request(args: tuple[Any, ...], kwargs: dict[str, Any]) -> ApprovalRequest:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            shown = action(*args, **kwargs) if callable(action) else action.format_map(arguments)
            return ApprovalRequest(
                agent_id=agent_id or os.environ.get("COUNTERSIGN_AGENT_ID", "python"),
                tool_name=name,
                arguments=arguments,
                action=shown,
                reason=reason,
                risk=risk,
                session_id=session_id,
                ttl=ttl,
            )

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def gated_coroutine(*args: Any, **kwargs: Any) -> Any:
                api = _resolve(client, AsyncClient)
                try:
                    approval = await api.request_and_wait(request(args, kwargs), deadline=deadline)
                    _check(approval)
                    run_args, run_kwargs = _approved_call(signature, approval, args, kwargs)
                    try:
                        result = await func(*run_args, **run_kwargs)
                    except BaseException as error:
                        await _report(api, approval, error)
                        raise
                    await _report(api, approval, None)
                    return result
                finally:
                    if not isinstance(client, AsyncClient):
                        # Made for this call (from the environment or the factory): an
                        # AsyncClient belongs to the event loop it was made in.
                        await api.close()

            return gated_coroutine  # type: ignore[return-value]

        @functools.wraps(func)
        def gated(*args: Any, **kwargs: Any) -> Any:
            api = _resolve(client, Client)
            approval = api.request_and_wait(request(args, kwargs), deadline=deadline)
            _check(approval)
            run_args, run_kwargs = _approved_call(signature, approval, args, kwargs)
            try:
                result = func(*run_args, **run_kwargs)
            except BaseException as error:
                _report_sync(api, approval, error)
                raise
            _report_sync(api, approval, None)
            return result

        return gated  # type: ignore[return-value]

    return decorate


def _resolve(client: Any, kind: type) -> Any:
    if client is None:
        if kind is AsyncClient:
            # An AsyncClient belongs to one event loop: a fresh one per call.
            return AsyncClient.from_env()
        return _shared_client()
    api = client() if callable(client) and not isinstance(client, (Client, AsyncClient)) else client
    if not isinstance(api, kind):
        raise TypeError(f"this function needs a countersign {kind.__name__}, not {type(api).__name__}")
    return api


def _check(approval: Approval) -> None:
    """Fail closed: anything but APPROVED stops the call."""
    if approval.approved:
        return
    if approval.state is State.REJECTED:
        raise ApprovalRejected(approval)
    raise ApprovalNotGranted(approval)


def _approved_call(
    signature: inspect.Signature, approval: Approval, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments to call with: as called, or as an approver edited them (edit-on-approve).
    Edited arguments that are not available (redacted) or do not fit the function's
    parameters stop the call: running anything else would run what nobody approved."""
    if not approval.edited:
        return args, kwargs
    edited = approval.edited_arguments
    if edited is None:
        raise ApprovalNotGranted(approval)
    try:
        bound = signature.bind(**edited)
    except TypeError:
        raise ApprovalNotGranted(approval) from None
    return bound.args, bound.kwargs


def _consumption(approval: Approval, error: BaseException | None) -> dict[str, Any]:
    """How the call went, naming the version that ran: the decorator runs exactly
    ``arguments_to_run``."""
    ran = approval.current_args_digest
    if error is None:
        return {"succeeded": True, "detail": "ok", "args_digest": ran}
    return {"succeeded": False, "detail": type(error).__name__, "args_digest": ran}


async def _report(api: AsyncClient, approval: Approval, error: BaseException | None) -> None:
    """Records that the call ran (and how); failing to record it must not hide its result."""
    try:
        await api.consume(approval.id, **_consumption(approval, error))
    except Exception as failure:  # noqa: BLE001
        log.warning("recording approval %s as consumed failed: %s", approval.id, failure)


def _report_sync(api: Client, approval: Approval, error: BaseException | None) -> None:
    try:
        api.consume(approval.id, **_consumption(approval, error))
    except Exception as failure:  # noqa: BLE001
        log.warning("recording approval %s as consumed failed: %s", approval.id, failure)
