"""A priced estimate's plan, passed on to billing (ADR-0031): the gateway asks once, billing answers it.

The gateway's request carries ``priced``; the scheduler makes its plan and, rather than answer, publishes
the :class:`~nodus_schema.estimating.QuoteRequest` on ``nodus.rpc.billing.quote`` with the gateway's reply
subject (:class:`nodus_kit.messaging.Forward`). Three messages instead of four, and the gateway encodes
one request and decodes one reply.

One thing is lost by passing a request on: "no responders". nats-server tells it only to the client that
published, on that client's own subscription to the reply subject, so a request passed on to a subject
nobody serves is dropped and its asker waits out its timeout. Hence :class:`QuoteForwarder`: at most once
every :data:`CHECK_S` a priced estimate asks billing itself and relays the answer; when nobody serves the
quote, priced estimates are answered Unavailable ("nobody serves nodus.rpc.billing.quote", as the gateway
heard it when it asked billing itself) until a later check finds billing again. The requests passed on in
the second before billing was found gone time out at the gateway (2 s), which then stops asking for a
second (``nodus_gateway.estimating``).
"""

from __future__ import annotations

import time
from typing import Final

from nats.aio.client import Client as NATS

from nodus_kit import errors, messaging
from nodus_schema.estimating import QUOTE_SUBJECT, EstimateReply, QuoteRequest

CHECK_S: Final = 1.0
"""At most this often a priced estimate asks billing itself (its answer relayed) instead of passing on."""
CHECK_TIMEOUT_S: Final = 1.0
"""The check's own wait, under the gateway's 2 s: estimates wait behind it (one at a time)."""


class QuoteForwarder:
    """Passes priced plans on to billing, checking at most once every :data:`CHECK_S` that it serves."""

    def __init__(self, nc: NATS, *, subject: str = QUOTE_SUBJECT, check_s: float | None = None) -> None:
        self.nc, self.subject = nc, subject
        self.check_s = CHECK_S if check_s is None else check_s
        self._checked = -float("inf")
        self._absent: str | None = None
        """Why the last check found nobody serving the quote (None: billing answered it)."""

    async def price(self, quote: QuoteRequest) -> EstimateReply | messaging.Forward:
        now = time.monotonic()
        if now - self._checked < self.check_s:
            if self._absent is not None:
                raise errors.Unavailable(self._absent)
            return messaging.Forward(self.subject, quote)
        self._checked = now
        try:
            reply = await messaging.request(
                self.nc, self.subject, quote, EstimateReply, timeout=CHECK_TIMEOUT_S
            )
        except errors.Unavailable as e:  # no responders: nobody serves the quote
            self._absent = str(e)
            raise
        self._absent = None  # billing answered (its errors are answers too: they are raised to the asker)
        return reply
