"""A real-time task's report channel for a task run in the test's own process (`LiveCopy.run`), with no driver."""

from __future__ import annotations

from spark_app.realtime.task import DONE, LANDED, ON, STARTED


class AvailableNowDriver:
    """The driver of an available-now run that never says stop (an exactly-once slot that asks, once started, is told
    its run is on): what it keeps is the landing rows the task sent."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.started = False

    def send(self, message: list) -> None:
        self.started = self.started or message[0] == STARTED
        self.rows += message[1] if message[0] in (LANDED, DONE) else []

    def poll(self) -> bool:
        return False

    def recv(self) -> object:
        assert self.started, "an available-now task hears nothing from its driver but that its run is on"
        self.started = False
        return ON
