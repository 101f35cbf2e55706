"""Fixtures: the real countersign-server binary on a free loopback port with a temp database."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from countersign import Approval, Client, Decider, Scope, State, Verdict

REPO = Path(__file__).resolve().parents[3]
STARTUP_TIMEOUT = 30.0
ALICE = Decider("cli", "alice", "Alice")
_names = itertools.count()


@pytest.fixture(scope="session")
def server_binary() -> Path:
    """$COUNTERSIGN_SERVER_BIN (scripts/test names a copy of the tests' build), else
    target/debug/countersign-server, built by cargo when it is missing."""
    named = os.environ.get("COUNTERSIGN_SERVER_BIN")
    if named:
        return Path(named)
    target = REPO / os.environ.get("CARGO_TARGET_DIR", "target")
    binary = target / "debug" / "countersign-server"
    if not binary.exists():
        cargo = shutil.which("cargo")
        if cargo is None:
            pytest.fail(f"{binary} is missing and cargo is not on PATH to build it")
        subprocess.run([cargo, "build", "-p", "countersign-server"], cwd=REPO, check=True)
    return binary


@pytest.fixture(scope="session")
def postgres_url(server_binary: Path) -> str:
    """A database of a private PostgreSQL cluster (the Rust tests' countersign-test-postgres,
    beside the server binary or in target/debug), stopped once this test process ends."""
    named = os.environ.get("COUNTERSIGN_TEST_POSTGRES_BIN")
    candidates = [Path(named)] if named else []
    target = REPO / os.environ.get("CARGO_TARGET_DIR", "target")
    candidates += [
        server_binary.parent / "countersign-test-postgres",
        target / "debug" / "countersign-test-postgres",
    ]
    binary = next((c for c in candidates if c.exists()), None)
    if binary is None:
        pytest.fail(f"no countersign-test-postgres among {[str(c) for c in candidates]}: build the workspace")
    started = subprocess.run(
        [str(binary), "--until", str(os.getpid())], capture_output=True, text=True, check=False, timeout=120
    )
    if started.returncode != 0:
        pytest.fail(f"countersign-test-postgres failed: {started.stderr}")
    return f"postgres://postgres@127.0.0.1:{started.stdout.strip()}/postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One countersign-server process; ``restart`` keeps its port and database."""

    def __init__(
        self, binary: Path, workdir: Path, config: str, env: dict[str, str], database: str | None = None
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # A SQLite file in the work directory, or the PostgreSQL URL given.
        self.database = database or workdir / "countersign.db"
        self.config = workdir / "countersign.toml"
        self.config.write_text(config)
        self.env = {**os.environ, "RUST_LOG": "warn,countersign_server=info", **env}
        self.log = workdir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        """Starts the binary and returns once it serves: it binds its port before it opens the
        database, so an open port is not enough; it logs "listening" right before serving."""
        logged_before = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.binary),
                    "--config",
                    str(self.config),
                    "--listen",
                    self.address,
                    "--database",
                    str(self.database),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"countersign-server exited at start:\n{self.log.read_text()}")
            with self.log.open("rb") as log:
                log.seek(logged_before)
                if b"countersign-server listening" in log.read():
                    return
            time.sleep(0.05)
        raise RuntimeError(f"countersign-server did not serve within {STARTUP_TIMEOUT} s")

    def kill(self) -> None:
        """SIGKILL: the server gets no chance to say goodbye."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def client(self, **options: object) -> Client:
        return Client(self.address, **options)


BASE_SETTINGS: dict[str, dict[str, object]] = {
    "approvals": {"sweep_interval_ms": 100},
    "watch": {"heartbeat_interval_ms": 500},
}


def render(sections: dict[str, dict[str, object]]) -> str:
    """TOML tables of scalar settings."""
    lines = []
    for table, settings in sections.items():
        lines.append(f"[{table}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def start_server(
    server_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Server]]:
    """Starts a server with BASE_SETTINGS merged with ``sections`` (table -> settings), then
    ``extra`` TOML (arrays of tables); all are stopped at the end."""
    servers: list[Server] = []

    def start(
        extra: str = "",
        env: dict[str, str] | None = None,
        database: str | None = None,
        **sections: dict[str, object],
    ) -> Server:
        workdir = tmp_path_factory.mktemp("server")
        merged = {t: {**BASE_SETTINGS.get(t, {}), **sections.get(t, {})} for t in {*BASE_SETTINGS, *sections}}
        server = Server(server_binary, workdir, render(merged) + extra, env or {}, database)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()


@pytest.fixture(scope="session")
def server(start_server: Callable[..., Server]) -> Server:
    """A server shared by the tests that need no special configuration."""
    return start_server()


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with server.client() as client:
        yield client


@pytest.fixture
def agent_id() -> str:
    """An agent id of this test only, so tests sharing a server never see each other's
    approvals."""
    return f"agent-{next(_names)}-{os.getpid()}"


def first_pending(client: Client, agent_id: str, timeout: float = 20.0) -> Approval:
    """Waits, as an approver watching the queue would, for a pending approval of agent_id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page = client.list(states=[State.PENDING], agent_id=agent_id)
        if page.approvals:
            return page.approvals[-1]
        time.sleep(0.05)
    raise AssertionError(f"no pending approval of {agent_id} within {timeout} s")


class Approver:
    """A person deciding through the server in another thread, once they see the request."""

    def __init__(
        self,
        address: str,
        agent_id: str,
        verdicts: list[tuple[Verdict, Scope, str]] | list[tuple[Verdict, Scope, str, dict | None]],
    ) -> None:
        self.address = address
        self.agent_id = agent_id
        self.verdicts = verdicts
        self.decided: list[Approval] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with Client(self.address) as client:
                for verdict, scope, reason, *edit in self.verdicts:
                    pending = first_pending(client, self.agent_id)
                    # A fourth item: the arguments approved instead (edit-on-approve).
                    edited = edit[0] if edit else None
                    result = client.decide(
                        pending.id,
                        verdict,
                        decider=ALICE,
                        scope=scope,
                        reason=reason,
                        edited_arguments=edited,
                    )
                    self.decided.append(result.approval)
        except BaseException as error:  # noqa: BLE001 - reported by join()
            self.error = error

    def join(self) -> list[Approval]:
        self.thread.join(30)
        assert not self.thread.is_alive(), "the approver is still waiting"
        if self.error is not None:
            raise self.error
        return self.decided
