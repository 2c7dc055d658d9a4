"""The status page's figures (``graben meta serve --status``): what one viewer's token sees.

Every figure is asked of the service through ``MetaService.ask`` with the
viewer's scope, as the same request over the wire would be, so the page never
shows a token more than the API would:

- the cluster's token (the operator) sees what ``graben status`` shows
  (``GetHealth``: the services and the leader, each data node, chunks short of
  copies, damaged copies, collection), the conversion backlog and the storage
  classes set on paths (read from the engine, as the leader's conversions read
  them), every tenant (``ListTenants``) and every quota with its usage
  (``GetQuotas``), the memory agents and their checkpoint jobs, and the
  service's own request rate;
- a tenant's token sees its quotas (``GetQuotas``, narrowed as for its
  token) and the checkpoint jobs below its prefix: nothing of the cluster's
  (the nodes, the services, the other tenants are the operator's, as ``status``
  is).

Checkpoint jobs: the memory tier lives in the memory agents, which report to no
metadata service, and the store does not know which directories are
checkpoints. So the page asks the agents named by ``--status-agents`` what
they hold (``agent.held``, with the cluster's token), remembers the job roots it
has seen (``JOBS_KEPT``), and lists each root in the store for the checkpoint
manager's step directories (``step-NNNNNNNNNNNN``). A job no named agent ever
held is not listed here (``graben ckpt ls`` lists any root).

The operator's figures and the agents' answers are kept ``FRESH_S``: however
many browsers refresh, the engine and the agents are asked at most that often.
The request counters are sampled every ``SAMPLE_S`` into a ring of ``HISTORY``.
"""

from __future__ import annotations

import asyncio
import collections
import re
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec

from .._errors import GrabenError, NotFound
from .._types import Health, QuotaState
from ..transport import GetHealth, GetQuotas, Held, ListDir, ListTenants
from ..wire import Connection, auth, decode, encode, every, stop
from ._scopes import Scope

if TYPE_CHECKING:
    from ._service import MetaService

SAMPLE_S = 2.0
"""Seconds between samples of the service's request counters."""
HISTORY = 300
"""Samples kept: the chart's last ten minutes."""
FRESH_S = 2.0
"""How long the operator's figures and the agents' answers are shown again before they
are asked anew."""
AGENT_TIMEOUT_S = 2.0
"""Seconds an agent has to answer: a hung one never holds the page up for long."""
JOBS_KEPT = 100
"""Checkpoint jobs remembered (the most recently seen), and shown at most."""
CLASSES_SHOWN = 200
"""Paths with a class set, shown at most."""
CONVERT_COUNTED = 10_000
"""Chunks waiting for conversion, counted up to this many."""
STEP = re.compile(r"step-(\d{12})")
"""A checkpoint manager's step directory (the checkpoint door's layout, which the store
does not import)."""


class Sample(msgspec.Struct, frozen=True):
    """The service's requests over one sampling interval, per second."""

    at: float
    """Unix time the interval ended."""
    requests: float
    """Requests answered."""
    errors: float
    """Of them, those answered with an error."""
    received: float
    """Request bytes received."""
    sent: float
    """Reply bytes sent."""


class ClassRule(msgspec.Struct, frozen=True):
    """A storage class set on a path."""

    path: str
    name: str


class AgentState(msgspec.Struct, frozen=True):
    """A memory agent as it answered."""

    address: str
    held: int = 0
    """Bytes of segments it holds."""
    segments: int = 0
    """Segments it holds (complete or being written, its own and peers' copies)."""
    error: str = ""
    """Why it did not answer (``""``: it did)."""


class JobStep(msgspec.Struct, frozen=True):
    """One step of a checkpoint job, and where it is."""

    step: int
    tiers: str
    """``store``, ``memory`` (every rank's segment at the named agents), ``memory+store``,
    or ``store, memory 1/2 ranks`` (some ranks' only)."""


class Job(msgspec.Struct, frozen=True):
    """A checkpoint job: its root's URL (the agents' name for it) and its steps."""

    url: str
    steps: list[JobStep]
    error: str = ""
    """Why its root could not be listed in the store (``""``: it was, or is not there)."""


class View(msgspec.Struct, frozen=True):
    """Everything the page shows one viewer (``/status.json``)."""

    viewer: str
    """``operator`` (the cluster's token), or the tenant whose token it is."""
    token: str
    """The tenant's token's id (``""``: the operator)."""
    at: float
    """Unix time the figures were gathered."""
    quotas: list[QuotaState]
    jobs: list[Job]
    health: Health | None = None
    """What ``graben status`` shows (the operator's only)."""
    tenants: dict[str, str] = {}
    """Each tenant's root."""
    classes: list[ClassRule] = []
    converting: int = 0
    """Chunks whose class wants them converted and that are not yet (up to
    ``CONVERT_COUNTED``)."""
    agents: list[AgentState] = []
    throughput: list[Sample] = []
    sample_s: float = SAMPLE_S


Segments = dict[str, dict[tuple[int, int], set[int]]]
"""Job -> (step, world) -> the ranks whose complete segment some agent holds."""


class Status:
    """The figures of one service's page. Call order: ``start`` on the service's event
    loop, then ``view`` for each page asked, last ``close``."""

    def __init__(
        self, service: MetaService, *, secret: bytes, agents: tuple[str, ...] = ()
    ) -> None:
        self._service, self._agents = service, agents
        self._token = auth.client_token(secret)
        self._samples: collections.deque[Sample] = collections.deque(maxlen=HISTORY)
        self._last: tuple[float, tuple[float, ...]] | None = None
        self._sampling: asyncio.Task[None] | None = None
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._fresh: dict[str, tuple[float, Any]] = {}

    def start(self) -> None:
        """Sample the service's counters in the background (on the running loop)."""
        self._sampling = every(SAMPLE_S, self._sample, "status page sample", at_once=True)

    async def close(self) -> None:
        await stop(self._sampling)

    async def view(self, token: str) -> View:
        """What ``token`` may see; ``PermissionDenied`` as the API refuses it."""
        scope = await self._service.tokens.scope(token)
        if scope is None:
            view: View = await self._kept("operator", self._operator)
            return view
        quotas = await self._allowed(GetQuotas(""), scope)
        jobs = await self._jobs(scope)
        return View(scope.tenant, scope.token, time.time(), quotas or [], jobs)

    async def _kept(self, what: str, make: Any) -> Any:
        """``make()``'s result, made again once ``FRESH_S`` old."""
        at, kept = self._fresh.get(what, (0.0, None))
        if time.monotonic() - at > FRESH_S:
            kept = await make()
            self._fresh[what] = (time.monotonic(), kept)
        return kept

    async def _operator(self) -> View:
        ask = self._service.ask
        health, tenants, quotas = await asyncio.gather(
            ask(None, GetHealth()), ask(None, ListTenants()), ask(None, GetQuotas(""))
        )
        classes, converting = await asyncio.to_thread(self._classes)
        return View(
            "operator",
            "",
            time.time(),
            quotas,
            await self._jobs(None),
            health=health,
            tenants=tenants,
            classes=classes,
            converting=converting,
            agents=[state for state, _ in (await self._held()).values()],
            throughput=list(self._samples),
        )

    async def _allowed(self, request: Any, scope: Scope | None) -> Any:
        """``request``'s reply for ``scope``; ``None`` if its token may not ask it."""
        try:
            return await self._service.ask(scope, request)
        except PermissionError:
            return None

    # -- storage classes ------------------------------------------------------------

    def _classes(self) -> tuple[list[ClassRule], int]:
        """On a thread: the classes set on paths; chunks waiting for conversion."""
        classes = self._service.metadata.classes
        with classes.repo.read() as tx:
            rules = [
                ClassRule(tx.tree.path_of(inode) or f"(inode {inode})", name)
                for inode, name in tx.stripes.classed()[:CLASSES_SHOWN]
            ]
        kinds = frozenset(classes.kinds - {"replicated"})
        return rules, len(classes.to_convert(CONVERT_COUNTED, None, kinds))

    # -- the request counters -------------------------------------------------------

    async def _sample(self) -> None:
        metrics = self._service.metrics
        if metrics is None:
            return
        now, totals = time.time(), _totals(metrics.registry)
        if self._last is not None:
            then, before = self._last
            rates = [(a - b) / max(now - then, 1e-3) for a, b in zip(totals, before, strict=True)]
            self._samples.append(Sample(now, *rates))
        self._last = (now, totals)

    # -- checkpoint jobs ----------------------------------------------------------------

    async def _held(self) -> dict[str, tuple[AgentState, list[Held]]]:
        """Each named agent's state and segments (kept ``FRESH_S``)."""

        async def ask_all() -> dict[str, tuple[AgentState, list[Held]]]:
            answers = await asyncio.gather(*(self._ask_agent(a) for a in self._agents))
            return dict(zip(self._agents, answers, strict=True))

        held: dict[str, tuple[AgentState, list[Held]]] = await self._kept("agents", ask_all)
        return held

    async def _ask_agent(self, address: str) -> tuple[AgentState, list[Held]]:
        host, _, port = address.rpartition(":")
        try:
            async with asyncio.timeout(AGENT_TIMEOUT_S):
                conn = await Connection.open(host, int(port), timeout=AGENT_TIMEOUT_S)
                try:
                    reply, _ = await conn.call("agent.held", encode(None), token=self._token)
                finally:
                    await conn.close()
        except (GrabenError, OSError, TimeoutError, ValueError) as exc:  # ValueError: no port
            return AgentState(address, error=str(exc) or type(exc).__name__), []
        held = decode(reply, list[Held])
        return AgentState(address, sum(h.size for h in held), len(held)), held

    async def _jobs(self, scope: Scope | None) -> list[Job]:
        """The jobs ``scope`` reaches, those the agents hold now and those seen before."""
        segments: Segments = {}
        for _, held in (await self._held()).values():
            for h in held:
                if h.complete:
                    ranks = segments.setdefault(h.key.job, {}).setdefault(
                        (h.key.step, h.key.world), set()
                    )
                    ranks.add(h.key.rank)
        for job in sorted(segments):
            self._seen[job] = None
            self._seen.move_to_end(job)
        while len(self._seen) > JOBS_KEPT:
            self._seen.popitem(last=False)
        shown = [job for job in self._seen if scope is None or _reaches(scope, job)]
        return list(await asyncio.gather(*(self._job(scope, j, segments) for j in shown)))

    async def _job(self, scope: Scope | None, job: str, segments: Segments) -> Job:
        memory = _memory_tiers(segments.get(job, {}))
        stored, error = set[int](), ""
        path = _path_of(job)
        if path is not None:
            try:
                listing = await self._service.ask(scope, ListDir(path))
                stored = {int(m.group(1)) for e in listing.entries if (m := STEP.fullmatch(e.name))}
            except NotFound:
                pass
            except GrabenError as exc:
                error = exc.message
        steps = [
            JobStep(step, _tiers(step in stored, memory.get(step)))
            for step in sorted(stored | memory.keys())
        ]
        return Job(job, steps, error)


def _memory_tiers(held: dict[tuple[int, int], set[int]]) -> dict[int, str]:
    """Each step's memory tier: ``memory`` if every rank of a world size it was saved at
    is held, else how many are."""
    tiers: dict[int, str] = {}
    for (step, world), ranks in sorted(held.items()):
        if len(ranks) == world:
            tiers[step] = "memory"
        elif tiers.get(step) != "memory":
            tiers[step] = f"memory {len(ranks)}/{world} ranks"
    return tiers


def _tiers(stored: bool, memory: str | None) -> str:
    if memory is None:
        return "store"
    if not stored:
        return memory
    return "memory+store" if memory == "memory" else f"store, {memory}"


def _path_of(job: str) -> str | None:
    """The store path of a job's root (its name is the root's ``graben://`` URL)."""
    parts = urlsplit(job)
    return (parts.path or "/") if parts.scheme == "graben" else None


def _reaches(scope: Scope, job: str) -> bool:
    path = _path_of(job)
    try:
        return path is not None and scope.reaches(path)
    except GrabenError:  # not a path at all
        return False


def _totals(registry: Any) -> tuple[float, float, float, float]:
    """Requests, errors, bytes received and sent, as the registry counts them so far."""
    requests = errors = received = sent = 0.0
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "graben_requests_total":
                requests += sample.value
                errors += sample.value if sample.labels.get("outcome") != "ok" else 0.0
            elif sample.name == "graben_request_bytes_total":
                received += sample.value
            elif sample.name == "graben_response_bytes_total":
                sent += sample.value
    return requests, errors, received, sent
