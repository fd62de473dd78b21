"""Run test code in real child processes (spawned, so no inherited threads or locks)."""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import Any

CTX = mp.get_context("spawn")


def _trampoline(results: Any, index: int, target: Callable[..., Any], args: Sequence[Any]) -> None:
    try:
        results.put((index, True, target(*args)))
    except BaseException:
        results.put((index, False, traceback.format_exc()))


def run_processes(
    target: Callable[..., Any], arg_lists: Sequence[Sequence[Any]], *, timeout: float = 90
) -> list[Any]:
    """Run ``target(*args)`` in one child process per entry; return results in order.

    A child's exception is re-raised here with its traceback; a child that does
    not report within ``timeout`` fails the test (and is killed).
    """
    return results_of(start_processes(target, arg_lists), timeout=timeout)


def start_process(target: Callable[..., Any], *args: Any) -> BaseProcess:
    """Start ``target(*args)`` in a child process and return it (to kill or join)."""
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def start_process_reporting(target: Callable[..., Any], *args: Any) -> tuple[BaseProcess, Any]:
    """Start ``target(*args)`` in a child process; returns it and a queue on which the
    child puts ``(0, True, result)`` or ``(0, False, traceback)`` when it is done."""
    results = CTX.Queue()
    proc = CTX.Process(target=_trampoline, args=(results, 0, target, args), daemon=True)
    proc.start()
    return proc, results


def result_within(results: Any, timeout: float, what: str) -> Any:
    """The result a :func:`start_process_reporting` child put on ``results`` within
    ``timeout`` s; fails the test if none came or the child raised."""
    try:
        _, ok, value = results.get(timeout=timeout)
    except queue_module.Empty:
        raise AssertionError(f"{what}: no result within {timeout} s") from None
    if not ok:
        raise AssertionError(f"{what}: the child process failed:\n{value}")
    return value


def start_processes(
    target: Callable[..., Any], arg_lists: Sequence[Sequence[Any]]
) -> tuple[list[BaseProcess], Any]:
    """Start ``target(*args)`` in one child process per entry, without waiting; pass
    what this returns to :func:`results_of` for their results."""
    results = CTX.Queue()
    procs = [
        CTX.Process(target=_trampoline, args=(results, i, target, args), daemon=True)
        for i, args in enumerate(arg_lists)
    ]
    for p in procs:
        p.start()
    return procs, results


def results_of(started: tuple[list[BaseProcess], Any], *, timeout: float = 90) -> list[Any]:
    """The results of :func:`start_processes`' children, in order (as :func:`run_processes`)."""
    procs, results = started
    out: dict[int, Any] = {}
    try:
        for _ in procs:
            try:
                index, ok, value = results.get(timeout=timeout)
            except queue_module.Empty:
                raise AssertionError(f"a child process did not finish within {timeout}s") from None
            if not ok:
                raise AssertionError(f"child process {index} failed:\n{value}")
            out[index] = value
    finally:
        stop_processes(procs)
    return [out[i] for i in range(len(procs))]


def stop_processes(procs: Sequence[BaseProcess]) -> None:
    """Join ``procs``, killing those that do not end within a few seconds."""
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()
