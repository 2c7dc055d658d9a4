"""The metadata service: the metadata logic of ``_metadata.py`` served over the wire.

Stateless beyond its engine (node registry included), so several copies may
serve one engine. One op, ``meta``, carries every ``Request`` of
``transport/_requests.py``; the engine's blocking calls run on a small thread pool, so
many clients' requests proceed at once (SQLite serialises the writers).

Several services may share one engine: each records itself there, and the
one holding the lease (``_leader.py``) runs the background duties each round:
repair (``_repair.py``), conversion (``_convert.py``) and the collection of
chunks no file uses (``_collect.py``); every write a round makes to the engine
is fenced, so a deposed leader's is refused.

Mutations carry the client's idempotency keys: a commit group records each
member's key with its reply in the group's one engine transaction, and a
repeat (through this service or another) gets the recorded reply
(``_idempotency.py``). Op ``ping`` is answered on the event loop, never behind the
engine, so a client kept waiting can tell a busy service from a hung one.

Every call must carry the cluster's client token, or a tenant's token, whose
requests are checked against its scope (``_scopes.py``); the capabilities
replies carry for the data nodes are ``_grants.py``'s.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Union

import msgspec

from .._batcher import Batcher
from .._config import TLS
from .._errors import GrabenError, InvalidArgument
from .._types import (
    Capability,
    ChunkRef,
    FileInfo,
    FileLayout,
    NodeState,
    Op,
    ServiceState,
)
from ..transport import (
    ChunkPage,
    Commit,
    CommitEach,
    Committed,
    Grant,
    Grants,
    ListDir,
    Placement,
    Prepare,
    RemoteChunks,
    Request,
    request_types,
)
from ..wire import (
    DEFAULT_IDLE_TIMEOUT,
    Answer,
    Call,
    Metrics,
    Server,
    auth,
    decode,
    dialled,
    encode,
    every,
    serve_if_asked,
    stop,
    to_wire,
)
from ..wire import (
    tls as wire_tls,
)
from ._collect import COLLECT_CHUNKS, COLLECT_GRACE_S, CollectMetrics, Collector
from ._commits import Reached
from ._convert import CONVERT_CHUNKS, Converter, for_readers
from ._grants import TENANT_TTL_S, Capabilities
from ._leader import BEAT_S, LEASE_S, Deposed, Leadership, SchemaChanged
from ._metadata import Metadata
from ._nodes import Vigil
from ._placement import place
from ._policy import INLINE_MAX
from ._rebalance import REBALANCE_RATE, Rebalancer
from ._repair import RepairMetrics, Repairs
from ._repo import Repository
from ._scopes import (
    Scope,
    TokenCache,
    authorize,
    check_unproven,
    listing_above,
    mine,
    narrow,
    needs_engine,
    unproven,
    verify,
)
from ._sweep import SWEEP_GRACE_S, Sweep
from .engines import SCHEMA_VERSION

log = logging.getLogger("graben.meta")
NODE_CALL_S = 15.0
"""A call of the leader's duties to a data node (a copy, a delete, a page of its files)
gives up after this long: a hung node (SIGSTOPped, its network gone) holds a round up
no longer than that, and is dead by the next (the heartbeat timeout, 10 s by default);
an 8 MiB chunk crosses in it at 0.6 MB/s."""
AnyRequest: Any = Union[request_types()]  # noqa: UP007  (built at run time)
NODES_TTL_S = 1.0
"""How long placement may use a cached list of live nodes."""
REQUEST_NAMES = frozenset(t.__name__ for t in request_types())


class _Tag(msgspec.Struct):
    """Just the request's type, of a ``meta`` call's body (the rest is skipped)."""

    type: str = ""


def request_label(call: Call) -> str:
    """``meta.Lookup`` and so on: a ``meta`` call's name in the metrics."""
    if call.op != "meta":
        return call.op
    try:
        tag = msgspec.msgpack.decode(call.body, type=_Tag).type
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return "meta"
    return f"meta.{tag}" if tag in REQUEST_NAMES else "meta"  # no label a peer makes up


class MetaService:
    """Serves ``Metadata`` on one engine to remote clients and data nodes."""

    ANSWERED_HERE = frozenset({Grant, CommitEach})
    """Requests the service answers itself (capabilities it signs, commits it groups);
    every other one is a ``Metadata`` handler's."""

    def __init__(
        self,
        repo: Repository,
        *,
        secret: bytes,
        replication: int = 3,
        min_replicas: int = 0,
        inline_max: int = INLINE_MAX,
        heartbeat_timeout: float = 10.0,
        repair_interval: float = 5.0,
        rebalance_rate: float = REBALANCE_RATE,
        threads: int = 8,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        metrics: tuple[str, int] | None = None,
        counted: bool = False,
        tls: TLS | None = None,
        lease_s: float = LEASE_S,
        tier: str | None = None,
        collect_grace: float = COLLECT_GRACE_S,
        collect_per_round: int = COLLECT_CHUNKS,
        orphan_grace: float = SWEEP_GRACE_S,
    ) -> None:
        """``tls``: serve over TLS only, and dial the data nodes (repair) over TLS.
        ``tier``: the cluster's S3 tier (``s3://BUCKET/PREFIX``), where chunks of class
        ``s3`` go. ``collect_grace``: seconds a chunk stays unused before the leader
        collects it (``inf``: never; ``fsck --collect`` does); ``collect_per_round``:
        chunks a round collects at most (``_collect.py``); ``orphan_grace``: how old a
        chunk file no metadata names must be before the leader's sweep deletes it
        (``inf``: never; ``_sweep.py``)."""
        self._tls = None if tls is None else wire_tls.server_context(tls)
        self.metadata = Metadata(
            repo,
            self._place,
            default_replication=replication,
            min_replicas=min_replicas,
            heartbeat_timeout=heartbeat_timeout,
            inline_max=inline_max,
        )
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="graben-meta")
        self._nodes: tuple[float, list[NodeState]] = (0.0, [])
        self._vigil = Vigil()
        """The leader's: logs each node going dead and coming back."""
        self.server: Server | None = None
        self.repair_interval = repair_interval
        self.idle_timeout = idle_timeout
        checker = ThreadPoolExecutor(2, thread_name_prefix="graben-repair")
        self._secret = secret
        # One group at a time: two side by side on PostgreSQL measured slower on 2 cores
        # (docs/benchmarks.md, "Small files").
        self._group: Batcher[Commit, list[FileInfo]] = Batcher(
            self._commit_group, size=lambda c: len(c.files)
        )
        self.chunks = RemoteChunks(
            self._list_nodes,
            checker,
            Grants(self._mint),
            token=auth.client_token(secret),
            owns_checker=True,
            timeout=NODE_CALL_S,
            tls=None if tls is None else wire_tls.client_context(tls),
        )
        self.grants = Capabilities(secret, self.metadata.policy, self.metadata.records)
        """The capabilities this service hands out."""
        tokens = self.metadata.tenants.token_rows
        self.tokens = TokenCache(secret, lambda ids: self._run(tokens, ids))
        """The tenants' tokens, as this service last read them."""
        self.converter = Converter(
            self.metadata.classes, self.metadata.records, self.chunks, self._run, self._fence, tier
        )
        """The leader's conversions (to stripes, to the S3 tier), and stripes' repairs."""
        self._repairing: asyncio.Task[None] | None = None
        self._metrics_at = metrics
        self.metrics = Metrics() if metrics is not None or counted else None
        """Served at ``metrics`` (``HOST:PORT``) from ``start`` to ``close``, if given; kept
        unserved if ``counted`` (the status page charts its counters)."""
        self.repairs = Repairs(
            self.metadata.records,
            self.chunks,
            self.converter,
            self._run,
            self._fence,
            self._list_nodes,
            None if self.metrics is None else RepairMetrics(self.metrics),
            self.metadata.drains,
            Rebalancer(repo, self.chunks, self.converter, self._fence, rebalance_rate),
        )
        """The leader's repair rounds."""
        self.collector = Collector(
            self.metadata.records,
            self.chunks,
            self._run,
            self._fence,
            grace_s=collect_grace,
            per_round=collect_per_round,
            metrics=None if self.metrics is None else CollectMetrics(self.metrics),
            list_nodes=self._list_nodes,
        )
        """The leader's collection rounds."""
        self.sweep = Sweep(
            self.metadata.records,
            self.chunks,
            self._run,
            self._fence,
            lambda: self.metadata.policy.store_id,
            self.metadata.nodes.restore_point,
            grace_s=orphan_grace,
            metrics=self.metrics,
        )
        """The leader's sweep of the nodes' orphan chunk files."""
        if not math.isinf(collect_grace):
            self.metadata.policy.collect_grace_s = collect_grace
        self.id = uuid.uuid4().hex[:12]
        """This service's id in the engine's registry of services (new at each start)."""
        self._lease_s = lease_s
        self.leadership: Leadership | None = None
        """The lease, from ``start``: only its holder repairs."""
        self._beating: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int, *, advertise: str | None = None) -> Server:
        """Listen for clients (and serve metrics, if asked), record the service in the
        engine and try for the lease; heartbeat, and repair while leading, in the
        background.

        ``advertise`` (``HOST:PORT``, or ``HOST`` with the bound port) is the address
        the registry of services shows (default: the bound one)."""
        serve_if_asked(self.metrics, self._metrics_at)
        try:
            self.server = await Server.start(
                {"meta": self._meta, "ping": self._ping},
                host,
                port,
                admit=self._admit,
                idle_timeout=self.idle_timeout,
                metrics=self.metrics,
                label=request_label,
                tls=self._tls,
            )
        except BaseException:
            if self.metrics is not None:
                self.metrics.close()
            raise
        told = advertise or host
        address = told if ":" in told else f"{told}:{self.server.port}"
        try:
            metrics = serve_if_asked(self.metrics, self._metrics_at, self.server.port)
        except BaseException:
            await self.server.close()
            raise
        me = ServiceState(
            self.id,
            address,
            self.metadata.repo.location.partition(":")[0],
            0.0,
            0.0,
            SCHEMA_VERSION,
            metrics=dialled(metrics, address) if metrics else "",
        )
        self.leadership = Leadership(
            self.metadata.repo, me, lease_s=self._lease_s, metrics=self.metrics
        )
        await self.leadership.beat()  # a lone service leads before it answers anyone
        self._beating = every(BEAT_S, self.leadership.beat, "heartbeat")
        self._repairing = every(self.repair_interval, self._duties, "repair")
        return self.server

    async def until_outdated(self) -> SchemaChanged:
        """Wait until the engine's schema changes under this service (a newer graben
        migrated it); why it must stop. Call after ``start``; ``close`` it then."""
        if self.leadership is None:
            raise InvalidArgument("until_outdated is for a service that has started")
        return await self.leadership.until_outdated()

    async def close(self) -> None:
        """Stop serving and repairing; give the lease up; release the engine."""
        await stop(self._repairing, self._beating)
        if self.leadership is not None:
            await self.leadership.close()
        if self.server is not None:
            await self.server.close()
        if self.metrics is not None:
            self.metrics.close()
        await self.chunks.close()
        self._threads.shutdown(wait=True)
        self.metadata.repo.close()

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    async def _commit_group(self, commits: list[Commit]) -> list[list[FileInfo] | GrabenError]:
        """A group of commits in one engine transaction, each batch's key recorded in it."""
        run = self.metadata.commits.commit_group
        done: list[list[FileInfo] | GrabenError] = await self._run(
            run, [c.files for c in commits], [c.key for c in commits]
        )
        return done

    async def _list_nodes(self) -> list[NodeState]:
        nodes: list[NodeState] = await self._run(self.metadata.nodes.listed)
        return nodes

    # -- repair ----------------------------------------------------------------

    def _fence(self) -> int:
        """The fence this service leads under (``Deposed`` if it does not lead)."""
        if self.leadership is None:
            raise Deposed(f"metadata service {self.id} has not started")
        return self.leadership.check()

    async def _duties(self) -> None:
        """The leader's round of duties; the others' turn to wait."""
        if self.leadership is None or not self.leadership.leading:
            return
        try:
            self._vigil.look(await self._list_nodes(), self.metadata.policy.heartbeat_timeout)
            await self.repair_once()
            # Conversions go on while each batch is full, for up to a round's length:
            # a large dataset converts at the nodes' pace, not a batch per round.
            until = time.monotonic() + self.repair_interval
            while await self.convert_once() == CONVERT_CHUNKS and time.monotonic() < until:
                pass
            await self.collect_once()
            if not math.isinf(self.sweep.grace_s):
                await self.sweep.once()
        except Deposed as exc:
            log.warning("repair stopped: %s", exc.message)
            self.leadership.lose(exc.message)

    async def convert_once(self) -> int:
        """Convert chunks whose class wants them erasure-coded (a round's share); how many.

        Only while leading, as ``repair_once``."""
        self._fence()
        nodes = await self._list_nodes()
        await self.chunks.nodes()  # fresh addresses
        made = await self.converter.convert_once(nodes)
        self.repairs.converted(made)
        return made

    async def repair_once(self) -> int:
        """One round of repair (``Repairs.once``); only while leading."""
        return await self.repairs.once()

    async def collect_once(self) -> int:
        """One round of collection (``Collector.once``); only while leading."""
        return await self.collector.once()

    def _admit(self, call: Call, length: int) -> None:
        """Only a client holding a token may make the service hold a large request."""
        self.tokens.admit(call.token)

    async def _meta(self, call: Call, payload: memoryview | None) -> Answer:
        scope = await self.tokens.scope(call.token)
        return Answer(encode(await self.ask(scope, decode(call.body, AnyRequest))))

    async def ask(self, scope: Scope | None, request: Request[Any]) -> Any:
        """``request``'s reply as a caller of ``scope`` (``None``: the cluster's token) gets
        it over the wire, a tenant's checked and narrowed (``_scopes.py``); the status page's."""
        if scope is not None:
            authorize(scope, request)
            if needs_engine(request):
                await self._run(verify, self.metadata.repo, scope, request)
            if isinstance(request, ListDir) and not scope.reaches(request.path):
                return await self._run(listing_above, self.metadata.repo, scope, request.path)
            if (tenants := await self._serve_tenant(scope, request)) is not None:
                return tenants
        ttl = auth.GRANT_TTL_S if scope is None else TENANT_TTL_S
        result = await self._serve(request, ttl)
        return result if scope is None else narrow(scope, request, result)

    async def _serve_tenant(self, scope: Scope, request: Request[Any]) -> Any:
        """What a tenant's token gets in place of ``_serve``'s reply, if anything: its
        writes see and name only the chunks its scope reaches or it proves it holds,
        so nothing it is told depends on another tenant's bytes (``_scopes.py``)."""
        if isinstance(request, Commit | CommitEach):
            needed = unproven(self._secret, self.metadata.store_id, scope, request)
            if needed:
                await self._run(check_unproven, self.metadata.repo, scope, needed)
            return None
        if isinstance(request, Prepare):
            placed = await self._run(self._prepare, request, mine(scope))
            return self.grants.attach(request, placed, TENANT_TTL_S)
        if isinstance(request, Grant) and request.op == "write":
            # A write is checked against the chunk's id by the node: another tenant's
            # file using the chunk is no reason to refuse it, and telling would say so.
            return self.grants.caps(request.chunks, "write", TENANT_TTL_S)
        return None

    def _prepare(self, request: Prepare, within: Reached) -> list[Placement]:
        r = request
        return self.metadata.commits.prepare(
            r.chunks, r.replication, r.avoid, r.min_replicas, r.paths, r.sent, mine=within
        )

    async def _serve(self, request: Request[Any], ttl: float = auth.GRANT_TTL_S) -> Any:
        """Run a request; the capabilities its reply carries last ``ttl`` seconds."""
        if isinstance(request, Grant):
            return await self._run(self.grants.grant, request, ttl)
        if isinstance(request, Commit):
            return await self._group.submit(request)
        if isinstance(request, CommitEach):
            keys = request.keys or ("",) * len(request.batches)
            if len(keys) != len(request.batches):
                raise InvalidArgument(
                    f"{len(request.batches)} batches to commit with {len(keys)} keys"
                )
            outcomes = await asyncio.gather(
                *(
                    self._group.submit(Commit(files, key))
                    for files, key in zip(request.batches, keys, strict=True)
                ),
                return_exceptions=True,
            )
            return [_committed(o) for o in outcomes]
        result = await self._run(self._execute, request)
        return self.grants.attach(request, result, ttl)

    def _execute(self, request: Request[Any]) -> Any:
        """A request on an engine thread; layouts and chunk pages as readers take them."""
        result = self.metadata.execute(request)
        if isinstance(result, (FileLayout, ChunkPage)):
            return for_readers(result, self._fresh_nodes())
        return result

    async def _ping(self, call: Call, payload: memoryview | None) -> Answer:
        """Answered on the event loop, never queued behind the engine: a client waiting
        long for a reply asks this to tell a busy service from one that stopped."""
        await self.tokens.scope(call.token)
        return Answer()

    # -- capabilities ------------------------------------------------------------

    async def _mint(self, chunks: tuple[str, ...], op: Op) -> list[Capability]:
        """Capabilities for the service's own repair reads, writes and deletes."""
        return self.grants.caps(chunks, op)

    def _place(
        self, chunk: ChunkRef, replication: int, minimum: int, avoid: tuple[str, ...]
    ) -> tuple[str, ...]:
        nodes = self._fresh_nodes()
        return place(nodes, replication, chunk.id, chunk.length, exclude=avoid, minimum=minimum)

    def _fresh_nodes(self) -> list[NodeState]:
        """The data nodes, alive or not (on an engine thread; a second old is good enough)."""
        stamp, nodes = self._nodes
        if time.monotonic() - stamp > NODES_TTL_S:
            nodes = self.metadata.nodes.listed()
            self._nodes = (time.monotonic(), nodes)
        return nodes


def _committed(outcome: list[FileInfo] | BaseException) -> Committed:
    if isinstance(outcome, GrabenError):
        return Committed(error=to_wire(outcome))
    if isinstance(outcome, BaseException):
        raise outcome  # not the batch's fault: the whole call fails
    return Committed(outcome)
