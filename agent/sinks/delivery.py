"""Delivery as the daemon wires it: the durable outbox (in the state directory) and the configured
destinations, drained by a :class:`~agent.sinks.notify.Notifier`.

:func:`agent.app.build_agent` opens one :class:`Delivery` and hands it to the detection pipeline
as where alert events go (:meth:`~agent.sinks.notify.Notifier.enqueue`, durable before the alert
state is saved) and to the weekly report (:meth:`~agent.sinks.notify.Notifier.enqueue_message`);
the supervisor runs :meth:`~agent.sinks.notify.Notifier.run` as a loop and closes it at shutdown.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from agent.clock import Clock
from agent.config import AlertsConfig
from agent.sinks.notify import Notifier, Sink
from agent.sinks.outbox import Outbox
from agent.sinks.registry import sinks_from_config


class Delivery(Notifier):
    """A notifier that owns its outbox: built from the config, closing both at shutdown."""

    @classmethod
    def open(
        cls,
        alerts: AlertsConfig,
        outbox_path: Path,
        clock: Clock,
        sinks: Sequence[Sink] | None = None,
        rng: random.Random | None = None,
    ) -> Delivery:
        """The outbox at ``outbox_path`` (SQLite, created when missing) and ``sinks`` (default: the
        destinations configured under ``alerts``)."""
        outbox = Outbox(outbox_path)
        try:
            return cls(outbox, sinks_from_config(alerts, clock) if sinks is None else sinks, clock, rng)
        except BaseException:
            outbox.close()
            raise

    async def close(self) -> None:
        """Close the HTTP session, then the outbox."""
        try:
            await super().close()
        finally:
            self.outbox.close()
