"""Every cacheguard error survives a pickle round trip with its message and context.

Process pools, task queues and multiprocessing tests hand errors over as pickles;
most of these errors take keyword-only context that ``Exception``'s own pickling
cannot call back with, so without the root's ``__reduce__`` they fail to unpickle
(``TypeError: __init__() missing ... keyword-only argument``).
"""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from cacheguard import exceptions as errors

EXAMPLES: list[errors.CacheGuardError] = [
    errors.CacheGuardError("root"),
    errors.LockError("failed", name="menu:list", owner="o1", mode="read"),
    errors.LockTimeout(name="menu:list", mode="write", waited=1.5, owner="o2"),
    errors.LockUpgradeError(name="menu:list", owner="o3"),
    errors.LockLostError("lost", name="menu:list", owner="o4", mode="write"),
    errors.LockNotHeldError("not held", name="menu:list", mode="read"),
    errors.BackendUnavailable("Redis is down"),
    errors.WriteNotConfirmed("1 of 2 replicas"),
    errors.SerializationError("cannot encode", key="menu:list"),
    errors.KeyTemplateError("no parameter 'id'"),
    errors.FillFailed(key="menu:list", attempts=3),
    errors.IncompleteLoad(("menu:1", "menu:2")),
    errors.RecursiveLoadError(key="menu:list"),
    errors.WrongEventLoop("another loop"),
    errors.GuardClosed("closed"),
    errors.NoDefaultGuard("none installed"),
]


def _context(error: BaseException) -> dict[str, object]:
    return dict(vars(error))


def test_every_exported_error_has_an_example() -> None:
    exported = {getattr(errors, name) for name in errors.__all__}
    assert exported == {type(example) for example in EXAMPLES}


@pytest.mark.parametrize("error", EXAMPLES, ids=lambda e: type(e).__name__)
def test_an_error_unpickles_with_its_message_and_context(error: errors.CacheGuardError) -> None:
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error)
    assert again.args == error.args
    assert _context(again) == _context(error)


def _raise_timeout() -> None:
    raise errors.LockTimeout(name="menu:list", mode="write", waited=0.25, owner="worker")


def test_an_error_raised_in_a_worker_process_reaches_the_caller() -> None:
    with ProcessPoolExecutor(max_workers=1) as pool:
        future = pool.submit(_raise_timeout)
        with pytest.raises(errors.LockTimeout) as caught:
            future.result(timeout=60)
    assert caught.value.name == "menu:list"
    assert caught.value.waited == 0.25
    assert "timed out after 0.250s" in str(caught.value)


def test_the_dogpile_backends_argument_error_unpickles() -> None:
    from cacheguard.integrations.dogpile import BackendArgumentError

    error = BackendArgumentError("url and client are exclusive")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is BackendArgumentError
    assert str(again) == str(error)
