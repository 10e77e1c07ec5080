"""The ground the flow ledger's model tests share: a Hypothesis state machine around a real `FlowLedger` of one
topic, whose state is saved in a folder of its own as the mirror saves it beside its checkpoint."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis.stateful import RuleBasedStateMachine

from spark_app.config import FlowConfig
from spark_app.ledger import LedgerState
from spark_app.storage import checkpoint_files


class LedgerMachine(RuleBasedStateMachine):
    """A flow of `topic` whose checkpoint is a folder of this machine's own, removed when it ends."""

    def __init__(self, topic: str) -> None:
        super().__init__()
        self.folder = tempfile.mkdtemp(prefix=f"mirrorkit-{type(self).__name__}-")
        self.flow = FlowConfig.model_validate(
            {"source": "a", "target": "b", "topics": {"include": [topic]}, "checkpoint_location": self.folder}
        )

    def saved(self) -> LedgerState:
        """The ledger's state as a restart reads it: from the folder alone."""
        return LedgerState.load(checkpoint_files(self.folder))

    def teardown(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
