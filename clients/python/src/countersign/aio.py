"""The asyncio client (grpc.aio): the same calls and semantics as ``countersign.Client``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import grpc
import grpc.aio

from countersign import _common, receipts
from countersign._common import Backoff, ClientBase, WatchCursor, log
from countersign.errors import CountersignError, RateLimited, from_rpc_error
from countersign.model import (
    Approval,
    ApprovalPage,
    ApprovalRequest,
    Decider,
    DecideResult,
    Event,
    RequestResult,
    Scope,
    Snapshot,
    State,
    Verdict,
    approval_of,
)
from countersign.v1 import approval_pb2 as pb
from countersign.v1 import approval_pb2_grpc as pb_grpc


class AsyncClient(ClientBase):
    """An asyncio connection to a countersign server; parameters as for ``Client``. Create it
    inside the event loop that uses it."""

    _grpc = grpc.aio

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        try:
            return await getattr(self._stub, method)(
                request,
                timeout=timeout or self._connection.timeout,
                metadata=self._connection.metadata,
            )
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    async def request_approval(
        self, request: ApprovalRequest | None = None, /, **fields: Any
    ) -> RequestResult:
        """As ``Client.request_approval``."""
        message = _common.as_request(request, fields).to_proto()
        response = await self._call("RequestApproval", message)
        return RequestResult(approval_of(response.approval), response.created)

    async def get(self, approval_id: str) -> Approval:
        return approval_of(await self._call("GetApproval", pb.GetApprovalRequest(approval_id=approval_id)))

    async def wait_for_decision(self, approval_id: str, timeout: float = 60.0) -> Approval:
        """As ``Client.wait_for_decision``: one long-poll."""
        request, call_timeout = _common.wait_request(approval_id, timeout)
        return approval_of(await self._call("WaitForDecision", request, call_timeout))

    async def request_and_wait(
        self,
        request: ApprovalRequest | None = None,
        /,
        *,
        deadline: float | None = None,
        **fields: Any,
    ) -> Approval:
        """As ``Client.request_and_wait``: survives restarts, reuses one idempotency key, never
        turns an error into an approval."""
        message = _common.as_request(request, fields).to_proto()
        started = time.monotonic()
        backoff = Backoff(_common.RETRY_MAX_BACKOFF)
        while True:
            try:
                approval = approval_of((await self._call("RequestApproval", message)).approval)
                break
            except CountersignError as error:
                limit = started + (deadline if deadline is not None else message.ttl_seconds or 3600)
                if isinstance(error, RateLimited) and time.monotonic() + error.retry_after < limit:
                    # The server said when the call fits: wait for it rather than fail.
                    log.warning("rate limited (%s); retrying in %.1f s", error.message, error.retry_after)
                    await asyncio.sleep(error.retry_after)
                    continue
                if not error.transient or time.monotonic() >= limit:
                    raise
                backoff.log_retry("requesting approval failed (%s); retrying", error)
                await asyncio.sleep(backoff.pause_until(limit))
        log.debug("approval %s requested: %s", approval.id, approval.state.value)
        if approval.pending:
            if deadline is not None:
                deadline -= time.monotonic() - started
            approval = await self._wait_resolved(
                approval.id, _common.wait_deadline(deadline, approval.expires_at)
            )
        if approval.approved:
            await self.verify_receipt(approval, message.arguments_json)
        return approval

    async def signing_keys(self) -> tuple[str, str]:
        """The server's receipt keys: (JWKS document, fingerprint)."""
        keys = await self._call("GetSigningKeys", pb.GetSigningKeysRequest())
        return keys.jwks_json, keys.fingerprint

    async def verify_receipt(self, approval: Approval, arguments_json: str) -> dict[str, Any]:
        """As Client.verify_receipt."""
        if self._keys is None or self._unknown_key(approval):
            self._keys = receipts.KeySet.from_jwks((await self.signing_keys())[0], self._receipt_pin)
        return self._check_receipt(approval, arguments_json)

    async def wait_until_resolved(self, approval_id: str, *, deadline: float | None = None) -> Approval:
        """As ``Client.wait_until_resolved``."""
        expires_at = (await self.get(approval_id)).expires_at if deadline is None else None
        return await self._wait_resolved(approval_id, _common.wait_deadline(deadline, expires_at))

    async def _wait_resolved(self, approval_id: str, deadline_at: float) -> Approval:
        backoff = Backoff(_common.RETRY_MAX_BACKOFF)
        while True:
            started = time.monotonic()
            remaining = max(0.0, deadline_at - started)
            try:
                approval = await self.wait_for_decision(approval_id, remaining)
            except CountersignError as error:
                if not error.transient or time.monotonic() >= deadline_at:
                    raise
                backoff.log_retry("waiting for approval %s failed (%s); re-attaching", approval_id, error)
                await asyncio.sleep(backoff.pause_until(deadline_at))
                continue
            if not approval.pending or time.monotonic() >= deadline_at:
                return approval
            if time.monotonic() - started < min(remaining, _common.EARLY_RETURN):
                await asyncio.sleep(backoff.pause_until(deadline_at))
            else:
                backoff.reset()

    async def list(
        self,
        *,
        states: Iterable[State | str] = (),
        agent_id: str = "",
        channel: str = "",
        session_id: str = "",
        tool_name: str = "",
        page_size: int = 0,
        page_token: str = "",
    ) -> ApprovalPage:
        request = _common.list_request(
            states, agent_id, channel, session_id, tool_name, page_size, page_token
        )
        response = await self._call("ListApprovals", request)
        return ApprovalPage([approval_of(a) for a in response.approvals], response.next_page_token)

    async def cancel(self, approval_id: str, reason: str = "") -> Approval:
        request = pb.CancelApprovalRequest(approval_id=approval_id, reason=reason)
        return approval_of(await self._call("CancelApproval", request))

    async def consume(
        self, approval_id: str, *, succeeded: bool = True, detail: str = "", args_digest: str = ""
    ) -> Approval:
        request = _common.consume_request(approval_id, succeeded, detail, args_digest)
        return approval_of(await self._call("Consume", request))

    async def decide(
        self,
        approval_id: str,
        verdict: Verdict | str,
        *,
        decider: Decider,
        scope: Scope | str = Scope.ONCE,
        reason: str = "",
        idempotency_key: str = "",
        edited_arguments: Mapping[str, Any] | None = None,
        expected_args_digest: str = "",
    ) -> DecideResult:
        """As ``Client.decide``."""
        request = _common.decide_request(
            approval_id,
            verdict,
            decider,
            scope,
            reason,
            idempotency_key,
            edited_arguments,
            expected_args_digest,
        )
        return _common.decide_result(await self._call("Decide", request))

    async def watch(
        self,
        *,
        after_seq: int = 0,
        history_id: str = "",
        include_snapshot: bool = True,
        channel: str = "",
        heartbeat_timeout: float = 30.0,
        max_backoff: float = 10.0,
    ) -> AsyncIterator[Snapshot | Event]:
        """As ``Client.watch``, as an async iterator (``async for item in client.watch()``)."""
        state = WatchCursor(channel, after_seq, history_id, include_snapshot, max_backoff)
        delay = 0.0
        while True:
            await asyncio.sleep(delay)
            # A fresh channel each time: the old connection may be dead without knowing it.
            channel_ = self._open_channel()
            try:
                call = pb_grpc.ApprovalServiceStub(channel_).WatchApprovals(
                    state.request(), metadata=self._connection.metadata
                )
                while True:
                    try:
                        message = await asyncio.wait_for(call.read(), heartbeat_timeout)
                    except asyncio.TimeoutError:
                        log.warning("watch silent for %.1f s; reconnecting", heartbeat_timeout)
                        delay = state.backoff.next_delay()
                        break
                    if message is grpc.aio.EOF:
                        delay = state.ended()
                        break
                    item = state.accept(message)
                    if item is not None:
                        yield item
            except grpc.RpcError as error:
                delay = state.failed(from_rpc_error(error))
            finally:
                await channel_.close()
