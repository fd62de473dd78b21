"""The notifiers' pub/sub wire (cacheguard/redis/pubsub.py), scripted: no server."""

from __future__ import annotations

from cacheguard.redis.pubsub import (
    Confirmations,
    Push,
    parse_push,
    subscribe_commands,
    unsubscribe_commands,
)


def test_broadcast_channels_share_a_command_and_sharded_ones_go_alone() -> None:
    # A cluster refuses one SSUBSCRIBE for channels of several slots.
    channels = [("ns:l1", False), ("ns:{a}:rel", True), ("ns:other", False), ("ns:{b}:rel", True)]
    assert subscribe_commands(iter(channels)) == [
        ("SUBSCRIBE", "ns:l1", "ns:other"),
        ("SSUBSCRIBE", "ns:{a}:rel"),
        ("SSUBSCRIBE", "ns:{b}:rel"),
    ]
    assert unsubscribe_commands([("ns:{a}:rel", True)]) == [("SUNSUBSCRIBE", "ns:{a}:rel")]
    assert subscribe_commands([]) == []


def test_pushes_are_parsed_by_kind() -> None:
    assert parse_push([b"smessage", b"ns:{a}:rel", b"free"]) == Push(
        "message", "ns:{a}:rel", "smessage", b"free"
    )
    assert parse_push([b"message", b"ns:l1", "name"]) == Push(
        "message", "ns:l1", "message", b"name"
    )
    assert parse_push([b"ssubscribe", b"c", 1]) == Push("subscribed", "c", "ssubscribe", b"")
    assert parse_push([b"sunsubscribe", b"c", 0]) == Push("unsubscribed", "c", "sunsubscribe", b"")
    for other in (b"PONG", [b"pmessage", b"p", b"c", b"x"][:2], [b"pong", b""], None):
        assert parse_push(other) is None


def test_confirmations_settle_in_order_and_an_unasked_sunsubscribe_is_a_revocation() -> None:
    owed: Confirmations[str] = Confirmations()
    owed.sent(("SUBSCRIBE", "l1"), {"l1": "L1"})
    owed.sent(("SSUBSCRIBE", "rel"), {"rel": "REL"})
    assert len(owed) == 2
    assert owed.settle(Push("subscribed", "l1", "subscribe", b"")) == ("settled", "L1")
    # The slot of "other" left the node: the server unsubscribes it unasked.
    assert owed.settle(Push("unsubscribed", "other", "sunsubscribe", b"")) == ("revoked", None)
    assert owed.settle(Push("subscribed", "rel", "ssubscribe", b"")) == ("settled", "REL")
    owed.sent(("SUNSUBSCRIBE", "rel"))
    assert owed.settle(Push("unsubscribed", "rel", "sunsubscribe", b"")) == ("settled", None)
    assert owed.settle(Push("subscribed", "late", "ssubscribe", b"")) == ("unexpected", None)
    owed.sent(("SUBSCRIBE", "x"))
    owed.clear()
    assert len(owed) == 0
