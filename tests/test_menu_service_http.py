"""The menu service over HTTP (FastAPI on uvicorn), tested as a client sees it.

The server runs as its own process (``examples/menu_service serve``) and is
spoken to over raw sockets, so that malformed requests reach it exactly as sent:
every bad input must get a JSON 4xx, and the server must go on serving.
SIGTERM and SIGINT must let a request in flight finish and leave nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from cacheguard.testing import RedisEndpoint

pytest.importorskip("fastapi", reason="the service extra (pip install -e '.[service]')")

ROOT = Path(__file__).resolve().parent.parent
SERVE = [sys.executable, str(ROOT / "examples" / "menu_service"), "serve"]
BODY_TIMEOUT = 1.0  # the server's, for this module: lying clients are answered within it
HEAD_TIMEOUT = 1.0
CLIENT_TIMEOUT = 10.0  # ours: far above the server's, so a hang is a failure, not a wait


@dataclass
class Service:
    proc: subprocess.Popen[str]
    port: int
    redis_url: str
    lines: list[str]


def _start(
    args: list[str], env: dict[str, str], lines: list[str] | None = None
) -> tuple[subprocess.Popen[str], int, str, list[str]]:
    """Start ``serve`` and wait for its "serving on" line (or its early death)."""
    proc = subprocess.Popen(
        [*SERVE, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = [] if lines is None else lines
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("serving on"):
                ready.set()
        ready.set()  # the process ended: stop waiting

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(60) or proc.poll() is not None:
        proc.kill()
        raise AssertionError("serve did not start:\n" + "".join(seen))
    banner = next(line for line in seen if line.startswith("serving on"))
    port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", banner)[1])  # type: ignore[index]
    redis_url = re.search(r"(redis://\S+)", banner)[1]  # type: ignore[index]
    return proc, port, redis_url.rstrip(";"), seen


def _env(**changes: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)  # a throwaway SQLite file unless a test gives one
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture(scope="module")
def service(redis_endpoint: RedisEndpoint) -> Iterator[Service]:
    redis_url = redis_endpoint.url
    namespace = f"menu-http-{uuid.uuid4().hex[:8]}"
    args = ["--port", "0", "--menus", "6", "--namespace", namespace]
    args += ["--body-timeout", str(BODY_TIMEOUT), "--head-timeout", str(HEAD_TIMEOUT)]
    proc, port, url, lines = _start(args, _env(REDIS_URL=redis_url))
    yield Service(proc, port, url, lines)
    assert _stop(proc) == 0, "".join(lines)
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{namespace}:*", count=1000):
        client.delete(key)
    client.close()


# -- a raw HTTP client ------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    method: str,
    path: str,
    body: bytes | str | None = None,
    headers: tuple[str, ...] = (),
) -> bytes:
    """The bytes of a request (a ``str`` body is sent as UTF-8, lone surrogates too)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: test"]
    data = b""
    if body is not None:
        data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
        lines.append("Content-Type: application/json")
        if not any(h.lower().startswith("content-length") for h in headers):
            lines.append(f"Content-Length: {len(data)}")
    lines.extend(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data


def exchange(port: int, raw: bytes) -> Reply:
    """Send ``raw``, read one response (until its Content-Length, or the close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT) as sock:
        sock.sendall(raw)
        return _read_reply(sock)


def _read_reply(sock: socket.socket) -> Reply:
    data = b""
    while True:
        try:
            chunk = sock.recv(1)  # a byte at a time: a later reply stays unread
        except TimeoutError:
            raise AssertionError(f"no complete reply within {CLIENT_TIMEOUT} s") from None
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            break
        data += chunk
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            if length is None or len(rest) >= int(length[1]):
                break
    assert data, "the server closed the connection without a reply"
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Reply(int(status_line.split()[1]), headers, rest)


def call(port: int, method: str, path: str, body: Any = None) -> Reply:
    data = None if body is None else json.dumps(body)
    return exchange(port, request(method, path, data))


# -- the battery of bad requests --------------------------------------------------------------

BIG = "99999999999999999999999"
# (case, raw request, status): each answered with JSON {"detail": ...}.
BAD_REQUESTS = [
    ("id beyond 64 bits", request("GET", f"/menus/{BIG}"), 422),
    ("id beyond the column", request("GET", "/menus/2147483648"), 422),
    ("id not a number", request("GET", "/menus/abc"), 404),
    ("id with a sign", request("GET", "/menus/+1"), 404),
    ("id with an underscore", request("GET", "/menus/1_0"), 404),
    ("trailing slash", request("GET", "/menus/"), 404),
    ("line separator in a name", request("PUT", "/menus/1", '{"name": "a\\u2028b"}'), 422),
    ("non-character in a name", request("PUT", "/menus/1", '{"name": "a\\uffffb"}'), 422),
    ("id zero", request("GET", "/menus/0"), 422),
    ("negative id", request("GET", "/menus/-1"), 422),
    ("minus zero", request("GET", "/menus/-0"), 422),
    ("negative id beyond 64 bits", request("GET", f"/menus/-{BIG}"), 422),
    ("PUT negative id", request("PUT", "/menus/-1", '{"name": "x"}'), 422),
    ("a minus alone", request("GET", "/menus/-"), 404),
    ("unknown id", request("GET", "/menus/999"), 404),
    ("sort beyond 64 bits", request("PUT", "/menus/1", f'{{"sort": {BIG}}}'), 422),
    ("sort beyond the column", request("PUT", "/menus/1", '{"sort": 2147483648}'), 422),
    ("escaped lone surrogate", request("PUT", "/menus/1", '{"name": "\\ud800"}'), 422),
    ("raw lone surrogate", request("PUT", "/menus/1", '{"name": "\ud800"}'), 422),
    ("NUL in a name", request("PUT", "/menus/1", '{"name": "a\\u0000b"}'), 422),
    ("blank name", request("PUT", "/menus/1", '{"name": "  "}'), 422),
    ("name over 100", request("PUT", "/menus/1", json.dumps({"name": "x" * 101})), 422),
    ("url over 200", request("PUT", "/menus/1", json.dumps({"url": "/" * 201})), 422),
    ("null name", request("PUT", "/menus/1", '{"name": null}'), 422),
    ("sort as string", request("PUT", "/menus/1", '{"sort": "5"}'), 422),
    ("sort as bool", request("PUT", "/menus/1", '{"sort": true}'), 422),
    ("sort as float", request("PUT", "/menus/1", '{"sort": 1.5}'), 422),
    ("name as number", request("PUT", "/menus/1", '{"name": 5}'), 422),
    ("unknown field", request("PUT", "/menus/1", '{"colour": "red"}'), 422),
    ("empty object", request("PUT", "/menus/1", "{}"), 422),
    ("empty body", request("PUT", "/menus/1", ""), 422),
    ("no body", request("PUT", "/menus/1"), 422),
    ("not JSON", request("PUT", "/menus/1", "{not json"), 422),
    ("JSON array", request("PUT", "/menus/1", "[1]"), 422),
    ("missing parent", request("PUT", "/menus/1", '{"parent_id": 999}'), 422),
    ("own parent", request("PUT", "/menus/3", '{"parent_id": 3}'), 422),
    ("parent below", request("PUT", "/menus/2", '{"parent_id": 5}'), 422),  # 5 is below 2
    ("parent zero", request("PUT", "/menus/1", '{"parent_id": 0}'), 422),
    ("PUT unknown id", request("PUT", "/menus/999", '{"name": "x"}'), 404),
    ("unknown path", request("GET", "/nowhere"), 404),
    ("POST", request("POST", "/menus", '{"name": "x"}'), 405),
    ("DELETE", request("DELETE", "/menus/1"), 405),
    ("PATCH", request("PATCH", "/menus/1", '{"name": "x"}'), 405),
    ("Content-Length abc", request("PUT", "/menus/1", "{}", ("Content-Length: abc",)), 400),
    ("Content-Length -1", request("PUT", "/menus/1", "{}", ("Content-Length: -1",)), 400),
    ("not HTTP", b"\x16\x03\x01\x02\x00hello\r\n\r\n", 400),
    # Announced: refused from the header, the 200 MB are never sent.
    ("200 MB body", request("PUT", "/menus/1", b"", ("Content-Length: 200000000",)), 413),
    ("50 MB name", request("PUT", "/menus/1", b"", (f"Content-Length: {50 * 2**20 + 12}",)), 413),
    (
        "chunked body over 64 KiB",
        request("PUT", "/menus/1", headers=("Transfer-Encoding: chunked",))
        + (b"8000\r\n" + b"a" * 0x8000 + b"\r\n") * 3
        + b"0\r\n\r\n",
        413,
    ),
    # Lying or slow clients, answered after the server's timeouts.
    (
        "Content-Length above the body",
        request("PUT", "/menus/1", '{"name"', ("Content-Length: 100",)),
        408,
    ),
    ("request head never finished", b"GET /menus HTTP/1.1\r\nHost: test\r\n", 408),
]


@pytest.mark.parametrize(
    ("raw", "status"),
    [c[1:] for c in BAD_REQUESTS],
    ids=[c[0].replace(" ", "-") for c in BAD_REQUESTS],
)
@pytest.mark.slow
def test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on(
    service: Service, raw: bytes, status: int
) -> None:
    reply = exchange(service.port, raw)
    assert reply.status == status, reply.body
    assert reply.headers["content-type"] == "application/json"
    assert isinstance(reply.json()["detail"], (str, list))
    assert b"x" * 101 not in reply.body  # errors name the field, never echo the input
    assert service.proc.poll() is None
    assert call(service.port, "GET", "/menus/1").status == 200
    assert "Traceback" not in "".join(service.lines)


@pytest.mark.slow
def test_bad_requests_change_nothing(service: Service) -> None:
    before = call(service.port, "GET", "/menus").json()
    for _, raw, _status in BAD_REQUESTS[:30]:
        exchange(service.port, raw)
    assert call(service.port, "GET", "/menus").json() == before


def test_query_strings_are_ignored(service: Service) -> None:
    assert call(service.port, "GET", "/menus?x=1").status == 200


def test_an_upgrade_request_is_a_plain_request(service: Service) -> None:
    headers = ("Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13")
    reply = exchange(service.port, request("GET", "/menus/1", headers=headers))
    assert reply.status == 200
    assert reply.json()["id"] == 1


@pytest.mark.slow
def test_a_later_request_head_on_a_kept_alive_connection_has_a_deadline_too(
    redis_url: str,
) -> None:
    """The first request outlasts the head deadline armed at connect (its list takes
    1.5 s to build); the second request's head, never finished, still gets a 408."""
    namespace = f"menu-heads-{uuid.uuid4().hex[:8]}"
    args = ["--port", "0", "--menus", "3", "--namespace", namespace, "--build-ms", "1500"]
    args += ["--head-timeout", str(HEAD_TIMEOUT)]
    proc, port, _, lines = _start(args, _env(REDIS_URL=redis_url))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT) as sock:
            sock.sendall(request("GET", "/menus"))  # cold: loaded and built, 1.5 s
            assert _read_reply(sock).status == 200
            sock.sendall(b"GET /menus/1 HTTP/1.1\r\nHost: test\r\n")  # never finished
            second = _read_reply(sock)
        assert second.status == 408
        assert second.headers["content-type"] == "application/json"
    finally:
        assert _stop(proc) == 0, "".join(lines)
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{namespace}:*", count=1000):
            client.delete(key)
        client.close()


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
def test_a_body_sent_a_byte_at_a_time_is_cut_off_at_the_deadline(service: Service) -> None:
    """Each byte comes well within the deadline; the whole body does not."""
    body = b'{"name": "slow and steady"}'
    head = request("PUT", "/menus/1", b"", (f"Content-Length: {len(body)}",))
    with socket.create_connection(("127.0.0.1", service.port), timeout=CLIENT_TIMEOUT) as sock:
        sock.sendall(head)
        for byte in body:  # the client's pace, not synchronisation: ~4 s in all
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # answered and closed: stop sending
                break
            time.sleep(BODY_TIMEOUT / 6)
        reply = _read_reply(sock)
    assert reply.status == 408, reply.body
    assert call(service.port, "GET", "/menus/1").json()["name"] != "slow and steady"


def test_a_body_nobody_reads_ends_the_connection(service: Service) -> None:
    """A GET with a body the endpoint never reads: answered, then the connection is
    closed, rather than the rest of the body read without limit or deadline (a
    client trickling it would keep the connection for ever)."""
    raw = request("GET", "/menus/2", b"x" * 10, ("Content-Length: 1000",))
    with socket.create_connection(("127.0.0.1", service.port), timeout=CLIENT_TIMEOUT) as sock:
        sock.sendall(raw)
        assert _read_reply(sock).status == 200
        sock.settimeout(0.5)
        for _ in range(16):  # ~8 s of trickling, a byte every half second
            try:
                if sock.recv(1024) == b"":
                    return  # closed by the server
            except ConnectionResetError:
                return
            except TimeoutError:
                pass
            try:
                sock.sendall(b"x")
            except OSError:
                return
    raise AssertionError("the connection stayed open, reading the unread body a byte at a time")


# -- what the service does -----------------------------------------------------------------------


def test_reads_through_the_cache_and_writes_through_the_hooks(service: Service) -> None:
    port = service.port
    call(port, "GET", "/menus")
    queries = call(port, "GET", "/stats").json()["db_queries"]
    for _ in range(3):
        assert call(port, "GET", "/menus").status == 200
    assert call(port, "GET", "/stats").json()["db_queries"] == queries  # hits only
    reply = call(port, "PUT", "/menus/4", {"name": "Soups", "sort": 99, "parent_id": 1})
    assert reply.status == 200, reply.body
    assert reply.json() == {"id": 4, "name": "Soups", "parent_id": 1, "sort": 99, "url": "/menu/4"}
    # The sync write path invalidated what the asyncio reads cached.
    assert call(port, "GET", "/menus/4").json()["name"] == "Soups"
    menus = call(port, "GET", "/menus").json()
    assert menus[-1]["id"] == 4  # sorted by the new sort value
    stats = call(port, "GET", "/stats").json()
    assert stats["reads"]["loads"] >= 3
    assert stats["db_queries"] > queries


def test_stats_count_the_writes(service: Service) -> None:
    """Each PUT that reaches the write path is counted by its outcome (the sync
    guard's own counters are read-path ones: a PUT never moved them)."""
    port = service.port
    before = call(port, "GET", "/stats").json()["writes"]
    assert call(port, "PUT", "/menus/6", {"url": "/menu/six"}).status == 200
    assert call(port, "PUT", "/menus/999", {"name": "x"}).status == 404
    assert call(port, "PUT", "/menus/6", {"parent_id": 999}).status == 422
    assert call(port, "PUT", "/menus/6", {"sort": "5"}).status == 422  # refused before
    after = call(port, "GET", "/stats").json()["writes"]
    assert after == {
        **before,
        "updates": before["updates"] + 1,
        "not_found": before["not_found"] + 1,
        "invalid_parent": before["invalid_parent"] + 1,
    }
    assert after["failed"] == after["backend_errors"] == 0


def test_metrics_are_scraped_in_prometheus_format(service: Service) -> None:
    port = service.port
    for _ in range(3):
        call(port, "GET", "/menus/2")
    reply = exchange(port, request("GET", "/metrics"))
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(reply.body.decode())}
    hits = [
        s
        for name, family in families.items()
        if name.startswith("cacheguard") and "hit" in name
        for s in family.samples
        if s.name.endswith("_total")
    ]
    templates = {s.labels.get("template") for s in hits}
    assert "menu:{menu_id}" in templates
    assert not any(t and re.fullmatch(r"menu:\d+", t) for t in templates)  # never raw keys
    assert sum(s.value for s in hits if s.labels.get("template") == "menu:{menu_id}") >= 2


@pytest.mark.slow
def test_writes_check_parents_under_the_list_lock(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """Two writes that would each close half of a cycle (3 under 4, 4 under 3), from two
    guards as from two processes: the second checks only after the first committed,
    because both take ``menu:list``'s write lock before they read."""
    sys.path.insert(0, str(ROOT / "examples"))
    from menu_service.infra import make_engine, seed
    from menu_service.models import Menu
    from menu_service.repository import LIST_KEY, InvalidParent, MenuRepository
    from sqlalchemy import event
    from sqlalchemy.orm import sessionmaker

    from cacheguard.integrations.sqlalchemy import track_models
    from tests.helpers import client_for, make_guard

    database = os.environ.get("DATABASE_URL") or ""
    if not database.startswith("postgresql"):
        database = f"sqlite:///{tmp_path / 'menu.sqlite3'}"
    engine = make_engine(database)
    seed(engine, 6)
    writers = []
    for _ in range(2):
        guard = make_guard(client_for(redis_url), namespace)
        sessions = sessionmaker(engine, expire_on_commit=False)
        writers.append((guard, sessions, track_models(guard, sessions, [Menu])))
    (first_guard, first_sessions, _), (second_guard, second_sessions, _) = writers
    lock_key = first_guard.rwlock(LIST_KEY).remote.keys.lock
    watcher = client_for(redis_url)
    first_checked, first_may_go = threading.Event(), threading.Event()

    @event.listens_for(first_sessions, "before_flush")
    def hold_the_first(session: Any, context: Any, instances: Any) -> None:
        first_checked.set()  # its parent check is done; its lock is held
        assert first_may_go.wait(30)

    outcome: list[BaseException | dict[str, Any]] = []

    def second() -> None:
        try:
            outcome.append(
                MenuRepository(second_guard, second_sessions).update_menu_by_id(
                    {"id": 4, "parent_id": 3}
                )
            )
        except BaseException as exc:
            outcome.append(exc)

    def let_the_first_go_once_the_second_waits() -> None:
        assert first_checked.wait(30)
        runner.start()
        deadline = time.monotonic() + 30
        while not any(k.startswith(b"q:") for k in watcher.hkeys(lock_key)):
            assert time.monotonic() < deadline, "the second write never queued"
            time.sleep(0.01)
        first_may_go.set()

    runner = threading.Thread(target=second)
    releaser = threading.Thread(target=let_the_first_go_once_the_second_waits)
    releaser.start()
    try:
        first = MenuRepository(first_guard, first_sessions).update_menu_by_id(
            {"id": 3, "parent_id": 4}
        )
        assert first["parent_id"] == 4
        releaser.join(30)
        runner.join(30)
        assert len(outcome) == 1
        assert isinstance(outcome[0], InvalidParent), outcome[0]
        with first_sessions() as session:
            assert session.get(Menu, 4).parent_id is None  # type: ignore[union-attr]
    finally:
        first_may_go.set()
        event.remove(first_sessions, "before_flush", hold_the_first)
        for guard, _, tracker in writers:
            tracker.remove()
            guard.close()
        watcher.close()
        engine.dispose()


# -- shutting down -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_finishes_requests_in_flight_and_leaves_nothing_behind(
    sig: int, tmp_path: Path
) -> None:
    # No REDIS_URL: serve starts its own throwaway Redis, in TMPDIR like its SQLite file.
    env = _env(REDIS_URL=None, TMPDIR=str(tmp_path))
    proc, port, redis_url, lines = _start(
        ["--port", "0", "--menus", "5", "--build-ms", "1500"], env
    )
    try:
        assert any(tmp_path.iterdir()), "serve made no temporary files where we look"
        in_flight: dict[str, Reply] = {}
        reader = threading.Thread(
            target=lambda: in_flight.setdefault("reply", call(port, "GET", "/menus"))
        )
        reader.start()
        deadline = time.monotonic() + 30
        while call(port, "GET", "/stats").json()["reads"]["misses"] < 1:  # the fill began
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.02)
        code = _stop(proc, sig)
        reader.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    try:
        assert code == 0, "".join(lines)
        assert in_flight["reply"].status == 200
        assert [m["id"] for m in in_flight["reply"].json()] == [1, 2, 3, 4, 5]
        assert "stopped" in "".join(lines)
        assert list(tmp_path.iterdir()) == []  # SQLite file, Redis's directory: all removed
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(redis_url, socket_connect_timeout=2).ping()
    finally:
        _shut_down_if_left(redis_url)


@pytest.mark.slow
def test_a_stop_signal_while_starting_leaves_nothing_behind(tmp_path: Path) -> None:
    """SIGTERM after the throwaway Redis started, before serving (seeding many rows)."""
    env = _env(REDIS_URL=None, TMPDIR=str(tmp_path))
    proc = subprocess.Popen(
        [*SERVE, "--port", "0", "--menus", "100000"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(p.name.startswith("cacheguard-redis-") for p in tmp_path.iterdir()):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "serve never started its Redis"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "serving on" not in output, "the signal came too late to test the start-up"
    assert proc.returncode == 0, output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_restart_does_not_serve_what_an_earlier_run_cached(redis_url: str) -> None:
    """With a REDIS_URL that outlives the service, a restart (which seeds the table
    anew) must not serve the entries the earlier run cached."""
    namespace = f"menu-restart-{uuid.uuid4().hex[:8]}"
    args = ["--port", "0", "--menus", "5", "--namespace", namespace]
    proc, port, _, lines = _start(args, _env(REDIS_URL=redis_url))
    try:
        assert call(port, "PUT", "/menus/4", {"name": "Soups"}).status == 200
        assert call(port, "GET", "/menus/4").json()["name"] == "Soups"  # cached
    finally:
        assert _stop(proc) == 0, "".join(lines)
    proc, port, _, lines = _start(args, _env(REDIS_URL=redis_url))
    try:
        assert call(port, "GET", "/menus/4").json()["name"] == "Menu 4 #0"  # seeded anew
    finally:
        assert _stop(proc) == 0, "".join(lines)
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{namespace}:*", count=1000):
            client.delete(key)
        client.close()


def _shut_down_if_left(redis_url: str) -> None:
    """A serve that failed to clean up (a failing test, a mutant) leaves its Redis:
    stop it, so no test leaves a process behind."""
    with contextlib.suppress(redis.RedisError):
        redis.Redis.from_url(redis_url, socket_connect_timeout=1).shutdown(nosave=True)


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
def test_serve_on_postgresql(redis_url: str) -> None:
    database = os.environ.get("DATABASE_URL", "")
    if not database.startswith("postgresql"):
        pytest.skip("DATABASE_URL names no PostgreSQL database (CI gives one)")
    namespace = f"menu-pg-{uuid.uuid4().hex[:8]}"
    env = _env(REDIS_URL=redis_url, DATABASE_URL=database)
    proc, port, _, lines = _start(
        ["--port", "0", "--menus", "5", "--reset", "--namespace", namespace], env
    )
    try:
        assert len(call(port, "GET", "/menus").json()) == 5
        assert call(port, "PUT", "/menus/2", {"name": "Desserts"}).status == 200
        assert call(port, "GET", "/menus/2").json()["name"] == "Desserts"
        assert call(port, "PUT", "/menus/1", {"sort": 2**31}).status == 422
    finally:
        assert _stop(proc) == 0, "".join(lines)
