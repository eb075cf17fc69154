"""The stub watchdog (serving/launcher/watchdog.py) outlives a check that fails: it logs the failure and polls on,
since a watchdog thread that died would leave every later stub death unmended."""

from __future__ import annotations

import os
import threading

from serving.launcher.watchdog import StubWatchdog


class FailingOnce(StubWatchdog):
    checks = 0
    checked_again: threading.Event

    def check(self) -> None:
        self.checks += 1
        if self.checks == 1:
            raise RuntimeError("an unreadable /proc entry")
        self.checked_again.set()


def test_a_failed_check_is_logged_and_the_watchdog_polls_on():
    lines: list[str] = []
    watchdog = FailingOnce(os.getpid(), "127.0.0.1:1", "key", interval_s=0.01, log=lines.append)
    watchdog.checked_again = threading.Event()
    watchdog.start()
    try:
        assert watchdog.checked_again.wait(5), "the watchdog stopped polling after a failed check"
    finally:
        watchdog.stop()
    assert lines[0] == "watchdog: a check failed (RuntimeError('an unreadable /proc entry')); polling on"
