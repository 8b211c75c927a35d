"""Ctrl-C for a command stuck inside one long operation (an hour-long attention kernel): Python
raises KeyboardInterrupt only between operations, so a watcher thread hears the signal at once
(signal.set_wakeup_fd) and, when the main thread has not taken it within GRACE_S, runs the
command's last words (marking its run interrupted) and ends the process with exit code 130."""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

GRACE_S = 2.0  # how long the main thread has to take Ctrl-C itself
EXIT_INTERRUPTED = 130  # the shell's code for a process ended by SIGINT, as `zoo` returns


@contextmanager
def stop_when_stuck(
    last_words: Callable[[], str], grace_s: float = GRACE_S
) -> Iterator[Callable[[], None]]:
    """Within the block, Ctrl-C that the main thread does not take within `grace_s` prints
    last_words() (called in the watcher thread) on stderr and ends the process. Yields `taken`,
    to call where the block handles KeyboardInterrupt. Outside the main thread, or with another
    SIGINT handler than Python's, it does nothing."""
    taken, done = threading.Event(), threading.Event()
    in_main = threading.current_thread() is threading.main_thread()
    if not in_main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield taken.set
        return
    heard, wake = socket.socketpair()
    wake.setblocking(False)
    previous = signal.set_wakeup_fd(wake.fileno(), warn_on_full_buffer=False)

    def watch() -> None:
        while not done.is_set():
            if not select.select([heard], [], [], 0.2)[0]:
                continue
            if signal.SIGINT not in heard.recv(64):
                continue
            if taken.wait(grace_s) or done.is_set():
                return
            try:
                try:
                    words = last_words()
                except Exception as exc:  # a locked store, a full disk: the process ends anyway
                    words = f"interrupted (its run could not be marked interrupted: {exc})"
                print(words, file=sys.stderr, flush=True)
                sys.stdout.flush()
            finally:
                os._exit(EXIT_INTERRUPTED)

    watcher = threading.Thread(target=watch, name="zoo-ctrl-c", daemon=True)
    watcher.start()
    try:
        yield taken.set
    finally:
        done.set()
        taken.set()  # the main thread is here: the watcher has nothing left to do
        signal.set_wakeup_fd(previous)
        watcher.join()
        heard.close()
        wake.close()
