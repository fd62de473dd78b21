"""The circuit breaker (cacheguard/cache/outage/breaker.py), on an injected clock."""

from __future__ import annotations

from cacheguard.cache.outage.breaker import Breakers, CircuitBreaker


def test_a_probe_whose_outcome_never_comes_back_expires() -> None:
    # A probe's call may fail in a layer that does not report to the breaker (a lock
    # script during a failover): the circuit must not stay open for good.
    now = [0.0]
    breaker = CircuitBreaker(failures=1, cooldown=1.0, timer=lambda: now[0])
    breaker.failure()
    assert not breaker.allow()
    now[0] = 1.0
    assert breaker.allow()  # the probe
    assert not breaker.allow()  # one at a time
    now[0] = 1.5
    assert not breaker.allow()
    now[0] = 2.0  # the probe never reported: another call probes
    assert breaker.allow()
    breaker.success()
    assert breaker.state == "closed"
    assert breaker.allow()


def test_a_failed_probe_opens_the_circuit_for_another_cooldown() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failures=2, cooldown=1.0, timer=lambda: now[0])
    breaker.failure()
    assert breaker.allow()  # one failure is not enough
    breaker.failure()
    assert breaker.state == "open"
    now[0] = 1.0
    assert breaker.allow()
    breaker.failure()
    now[0] = 1.9
    assert not breaker.allow()
    now[0] = 2.0
    assert breaker.allow()


def test_one_breaker_per_node_and_a_shared_one_for_keys_of_no_known_node() -> None:
    def node_of(key: str) -> str:
        if key == "lost":
            raise LookupError("no node serves the slot")
        return key[0]

    breakers = Breakers(failures=1, cooldown=1.0, node_of=node_of)
    assert breakers.of("a1") is breakers.of("a2")
    assert breakers.of("a1") is not breakers.of("b1")
    assert breakers.of("lost") is breakers.shared
    breakers.of("a1").failure()
    assert not breakers.of("a2").allow()
    assert breakers.of("b1").allow()
    assert breakers.opened == 1
    single = Breakers(failures=1, cooldown=1.0)
    assert single.single
    assert single.of("anything") is single.shared


def test_a_circuit_closing_after_it_was_open_calls_on_close_whoever_probed() -> None:
    """The guard marks its outbox replay pending there: any call's success (a write's,
    a lock's, not only a read's) may be the probe that finds the node back."""
    now = [0.0]
    closed: list[int] = []
    breaker = CircuitBreaker(
        failures=1, cooldown=1.0, timer=lambda: now[0], on_close=lambda: closed.append(1)
    )
    assert breaker.success() is False  # closed all along: nothing to tell
    breaker.failure()
    now[0] += 1.0
    assert breaker.allow()  # the probe
    assert breaker.success() is True
    assert closed == [1]
    assert breaker.success() is False
    assert closed == [1]
