"""Latency and accounting for one request, turned into :class:`RequestMetrics` at the end."""

from __future__ import annotations

import itertools
from array import array
from typing import TYPE_CHECKING

import attrs

from .._percentile import percentile
from ..types import (
    AttemptOutcome,
    AttemptRecord,
    ConversationResponse,
    LedgerEntry,
    RateLimitSnapshot,
    RequestMetrics,
    SamplingErrorInfo,
    Usage,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..models import ModelCatalog
    from ..wire import StreamTransform

__all__ = ["AttemptMetrics", "MetricsRecorder", "percentile", "priced_response", "sum_usage"]


_CANCELLED = AttemptOutcome.CANCELLED


def priced_response(
    response: ConversationResponse | None, catalog: ModelCatalog | None, model: str | None
) -> ConversationResponse | None:
    """``response`` with its cost from ``catalog`` when the server reported none (priced
    at the model that served it, else ``model``, the one asked for). Every outcome is
    priced by this one rule: a completed response, a failed or cancelled attempt's
    partial, a lost hedge."""
    if response is None or catalog is None:
        return response
    if response.cost_usd_ticks is not None or response.usage is None:
        return response
    served = response.model or model
    cost = catalog.cost_ticks(served, response.usage) if served else None
    return response if cost is None else attrs.evolve(response, cost_usd_ticks=cost)


def sum_usage(usages: list[Usage]) -> Usage | None:
    """Field by field sum; ``None`` for an empty list (one usage: that one)."""
    if not usages:
        return None
    if len(usages) == 1:
        return usages[0]
    return Usage(
        input_tokens=sum(u.input_tokens for u in usages),
        output_tokens=sum(u.output_tokens for u in usages),
        cache_read_tokens=sum(u.cache_read_tokens for u in usages),
        cache_write_tokens=sum(u.cache_write_tokens for u in usages),
        reasoning_tokens=sum(u.reasoning_tokens for u in usages),
    )


def _less(usage: Usage, parts: list[Usage]) -> Usage:
    """``usage`` without ``parts``, field by field, never below zero."""
    taken = sum_usage(parts)
    assert taken is not None
    return Usage(
        input_tokens=max(usage.input_tokens - taken.input_tokens, 0),
        output_tokens=max(usage.output_tokens - taken.output_tokens, 0),
        cache_read_tokens=max(usage.cache_read_tokens - taken.cache_read_tokens, 0),
        cache_write_tokens=max(usage.cache_write_tokens - taken.cache_write_tokens, 0),
        reasoning_tokens=max(usage.reasoning_tokens - taken.reasoning_tokens, 0),
    )


def bill(
    attempt: AttemptMetrics,
    outcome: AttemptOutcome,
    usage: Usage | None,
    cost: int | None,
    catalog: ModelCatalog | None,
) -> tuple[LedgerEntry, ...]:
    """The ledger lines of one ended attempt: one, or, after server-side fallback hops
    whose usage the server reported, the first model's share and each hop's, each priced
    at its own model (when the catalog knows every one of them)."""
    number, asked, rid = attempt.number, attempt.model, attempt.provider_request_id
    if usage is None and cost is None and attempt.token_count and attempt.prompt_estimate:
        # Content came, so the server processed the request, but it reported no usage
        # before the end: the best estimate, marked as one.
        estimate = Usage(input_tokens=attempt.prompt_estimate, output_tokens=attempt.token_count)
        price = catalog.cost_ticks(asked, estimate) if catalog is not None and asked else None
        return (
            LedgerEntry(
                number, outcome, asked, estimate, price, estimated=True, provider_request_id=rid
            ),
        )
    hops = [] if attempt.transform is None else attempt.transform.served_hops
    shares = [(hop.to_model, hop.usage) for hop in hops if hop.usage is not None]
    if usage is None or not shares or catalog is None:
        return (LedgerEntry(number, outcome, asked, usage, cost, provider_request_id=rid),)
    first = hops[0].from_model or asked
    lines = [(first, _less(usage, [share for _, share in shares]), False)]
    lines += [(model, share, True) for model, share in shares]
    costs = [catalog.cost_ticks(model, share) if model else None for model, share, _ in lines]
    if any(line_cost is None for line_cost in costs):  # a model without a price: as one
        return (LedgerEntry(number, outcome, asked, usage, cost, provider_request_id=rid),)
    return tuple(
        LedgerEntry(number, outcome, model, share, line_cost, hop=hop, provider_request_id=rid)
        for (model, share, hop), line_cost in zip(lines, costs, strict=True)
    )


class AttemptMetrics:
    """The timings of one attempt (``trio.current_time()`` values). Hedged attempts run
    side by side, so each attempt has its own."""

    __slots__ = (
        "first_token_at",
        "headers_at",
        "last_byte_at",
        "model",
        "number",
        "paced_s",
        "prompt_estimate",
        "provider_request_id",
        "rate_limit",
        "request_sent_at",
        "route",
        "sent",
        "started_at",
        "token_count",
        "token_times",
        "transform",
    )

    def __init__(self, number: int, started_at: float, route: str | None, model: str | None):
        self.number = number
        self.started_at = started_at
        self.route = route
        self.model = model
        #: When its request's last byte was written (``None``: the transport did not say).
        self.request_sent_at: float | None = None
        self.headers_at: float | None = None
        self.first_token_at: float | None = None
        self.last_byte_at: float | None = None
        #: When each read that carried content arrived: raw doubles, not a float object
        #: a read kept for the request's life (``benchmarks/bench_per_token.py``).
        self.token_times = array("d")
        self.token_count = 0
        #: What the attempt's response said of the rate limits.
        self.rate_limit: RateLimitSnapshot | None = None
        #: Seconds the rate-limit pacer held the attempt.
        self.paced_s = 0.0
        #: Its request went to the client (past the pacer and the admission).
        self.sent = False
        #: Its prompt's size in tokens as the pacer estimates it (body bytes / 4; 0:
        #: not sent): the ledger's estimate when the server reports no usage.
        self.prompt_estimate = 0
        #: What its body has been turned into so far (``None``: not sent yet): what a
        #: cancel that ends it now finds billed.
        self.transform: StreamTransform | None = None
        #: The provider's id of its request, from the response head or an error.
        self.provider_request_id: str | None = None

    @property
    def usage(self) -> Usage | None:
        """The usage the server has reported to the attempt so far (``None``: none)."""
        return None if self.transform is None else self.transform.usage

    def partial(self, catalog: ModelCatalog | None) -> ConversationResponse | None:
        """What the attempt has received so far, priced."""
        if self.transform is None:
            return None
        return priced_response(self.transform.partial(), catalog, self.model)

    def tokens(self, now: float, count: int) -> None:
        """``count`` content events arrived in one network read at ``now``."""
        if self.first_token_at is None:
            self.first_token_at = now
        self.token_times.append(now)
        self.token_count += count


class MetricsRecorder:
    """Times are ``trio.current_time()`` values; reported in ms from submit.

    Every attempt is recorded (:class:`AttemptRecord`: route, outcome, timings, usage,
    cost); the request's latency values (headers, first token, token gaps) describe the
    attempt that produced the terminal, since earlier attempts' output was discarded.
    """

    def __init__(self, submitted_at: float, catalog: ModelCatalog | None = None) -> None:
        self.submitted_at = submitted_at
        #: Prices what the server reported no cost for (``None``: nothing is priced).
        self.catalog = catalog
        #: The ended attempts, and every ended attempt's bill line by line (what the
        #: totals are the sum of). Tuples: empty and shared while the first attempt
        #: streams, rather than two lists a request that live as long as it (the
        #: collector's share, ``benchmarks/objects_per_stream.py``).
        self.attempts: tuple[AttemptRecord, ...] = ()
        self.ledger: tuple[LedgerEntry, ...] = ()
        #: Attempts started and not yet ended.
        self.open: list[AttemptMetrics] = []
        #: The attempt whose timings the request reports.
        self.current: AttemptMetrics | None = None
        self.started = 0
        #: The routes passed over, and why (a tuple: most requests pass over none, and
        #: an empty one is shared rather than a list per request).
        self.skipped: tuple[tuple[str, str], ...] = ()
        self.route: str | None = None

    def start_attempt(
        self, now: float, route: str | None = None, model: str | None = None
    ) -> AttemptMetrics:
        self.started += 1
        attempt = AttemptMetrics(self.started, now, route, model)
        self.open.append(attempt)
        self.current = attempt
        return attempt

    def end_attempt(
        self,
        attempt: AttemptMetrics,
        now: float,
        error: SamplingErrorInfo | None,
        *,
        outcome: AttemptOutcome | None = None,
        usage: Usage | None = None,
        cost_usd_ticks: int | None = None,
    ) -> int | None:
        """Record the ended attempt and its bill (exactly once: an attempt already ended
        is not billed again); its cost, as its ledger lines sum it."""
        if attempt not in self.open:
            return cost_usd_ticks
        self.open.remove(attempt)
        if outcome is None:
            outcome = AttemptOutcome.COMPLETED if error is None else AttemptOutcome.FAILED
        lines = bill(attempt, outcome, usage, cost_usd_ticks, self.catalog)
        cost = _sum_costs(lines)
        self.ledger += tuple(lines)
        billed = _sum_usages(lines)
        self.attempts += (self._record(attempt, now, error, outcome, billed, cost),)
        return cost

    def drop_attempt(self, attempt: AttemptMetrics) -> None:
        """Forget an attempt that never sent its request (a hedge cancelled while the
        pacer or the admission still held it): it is not an attempt of the request."""
        if attempt in self.open:
            self.open.remove(attempt)
        if self.current is attempt:
            self.current = self.open[-1] if self.open else None

    def _record(
        self,
        attempt: AttemptMetrics,
        now: float,
        error: SamplingErrorInfo | None,
        outcome: AttemptOutcome,
        usage: Usage | None,
        cost: int | None,
    ) -> AttemptRecord:
        return AttemptRecord(
            attempt=attempt.number,
            kind=None if error is None else error.kind,
            status_code=None if error is None else error.status_code,
            duration_ms=(now - attempt.started_at) * 1000.0,
            outcome=outcome,
            route=attempt.route,
            model=attempt.model,
            started_ms=(attempt.started_at - self.submitted_at) * 1000.0,
            time_to_request_sent_ms=self._ms(attempt.request_sent_at),
            time_to_headers_ms=self._ms(attempt.headers_at),
            time_to_first_token_ms=self._ms(attempt.first_token_at),
            usage=usage,
            cost_usd_ticks=cost,
            rate_limit=attempt.rate_limit,
            rate_limit_wait_ms=attempt.paced_s * 1000.0,
        )

    def _cut(self, attempt: AttemptMetrics) -> tuple[AttemptRecord, tuple[LedgerEntry, ...]]:
        """An open attempt as a cancel ending it now records and bills it."""
        partial = attempt.partial(self.catalog)
        usage = None if partial is None else partial.usage
        lines = bill(
            attempt,
            _CANCELLED,
            usage,
            None if partial is None else partial.cost_usd_ticks,
            self.catalog,
        )
        end = attempt.last_byte_at or attempt.started_at
        record = self._record(attempt, end, None, _CANCELLED, _sum_usages(lines), _sum_costs(lines))
        return record, lines

    def price(self, response: ConversationResponse | None) -> ConversationResponse | None:
        """``response`` priced at the model it names, else the current attempt's."""
        current = self.current
        return priced_response(response, self.catalog, None if current is None else current.model)

    def skip(self, route: str, reason: str) -> None:
        """The chain passed over ``route`` without an attempt."""
        self.skipped += ((route, reason),)

    def _ms(self, at: float | None) -> float | None:
        return None if at is None else (at - self.submitted_at) * 1000.0

    def build(self, response: ConversationResponse | None) -> RequestMetrics:
        """The metrics so far. Attempts still open (a cancel arriving now) are listed as
        cancelled, their duration up to their last byte, billed what they had reached."""
        attempts: Sequence[AttemptRecord] = self.attempts
        ledger: Sequence[LedgerEntry] = self.ledger
        if self.open:
            cut = [self._cut(a) for a in self.open]
            attempts = [*attempts, *(record for record, _ in cut)]
            ledger = [*ledger, *(line for _, lines in cut for line in lines)]
        if len(attempts) > 1:
            attempts = sorted(attempts, key=_attempt_number)
            ledger = sorted(ledger, key=_attempt_number)
        current = self.current
        times = current.token_times if current is not None else ()
        gaps = (
            sorted((later - earlier) * 1000.0 for earlier, later in itertools.pairwise(times))
            if len(times) > 1
            else None
        )
        reported: RateLimitSnapshot | None = None
        waited = 0.0
        for record in attempts:
            if record.rate_limit is not None:
                reported = record.rate_limit
            waited += record.rate_limit_wait_ms
        return RequestMetrics(
            time_to_request_sent_ms=None if current is None else self._ms(current.request_sent_at),
            time_to_headers_ms=None if current is None else self._ms(current.headers_at),
            time_to_first_token_ms=None if current is None else self._ms(current.first_token_at),
            time_to_last_byte_ms=None if current is None else self._ms(current.last_byte_at),
            itl_p50_ms=percentile(gaps, 0.5) if gaps else None,
            itl_p99_ms=percentile(gaps, 0.99) if gaps else None,
            itl_max_ms=gaps[-1] if gaps else None,
            chunk_count=0 if current is None else current.token_count,
            attempts=tuple(attempts),
            ledger=tuple(ledger),
            usage=None if response is None else response.usage,
            cost_usd_ticks=None if response is None else response.cost_usd_ticks,
            total_usage=_sum_usages(ledger),
            total_cost_usd_ticks=_sum_costs(ledger),
            route=self.route,
            skipped_routes=self.skipped,
            rate_limit=reported,
            rate_limit_wait_ms=waited,
        )


def _sum_usages(lines: Sequence[LedgerEntry]) -> Usage | None:
    """The sum of the lines' usage (``None``: no line has one)."""
    return sum_usage([line.usage for line in lines if line.usage is not None])


def _sum_costs(lines: Sequence[LedgerEntry]) -> int | None:
    """The sum of the lines' costs (``None``: no line has one)."""
    costs = [line.cost_usd_ticks for line in lines if line.cost_usd_ticks is not None]
    return sum(costs) if costs else None


def _attempt_number(record: AttemptRecord | LedgerEntry) -> int:
    return record.attempt
