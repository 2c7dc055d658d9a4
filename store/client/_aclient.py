"""``AsyncClient``: the store's API, written once over the transport seam.

Over 500 lines: it is the whole API (the sync ``Client`` is derived from it),
one documented method per operation; the work is in the modules beside it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Literal

from .. import _paths
from .._buffers import BufferPool
from .._config import Options, cluster_url, resolve
from .._errors import (
    AlreadyExists,
    GrabenError,
    InvalidArgument,
    IsADirectory,
    NotFound,
    ProtocolError,
)
from .._types import (
    Buffer,
    Change,
    ChangeFeed,
    ClassState,
    FileCommit,
    FileInfo,
    FileLayout,
    FsckReport,
    Health,
    NodeState,
    QuotaState,
    TokenInfo,
    WriteMode,
)
from ..embedded import open_store
from ..transport import (
    AddTenant,
    Changes,
    ChunkTransport,
    Commit,
    DrainNode,
    GetClass,
    GetHealth,
    GetQuotas,
    GetSettings,
    IssueToken,
    Link,
    ListTenants,
    ListTokens,
    MakeDir,
    MetaTransport,
    Remove,
    RemoveEach,
    RemoveNode,
    Rename,
    ReportBad,
    RevokeTokens,
    SetAttributes,
    SetAttributesEach,
    SetClass,
    SetQuota,
    Settings,
    Stat,
    Usage,
    WhoAmI,
    open_cluster,
)
from ..wire import WireError, auth, from_wire, tls
from . import _pages
from ._afiles import AsyncFileOpener
from ._fsck import Fsck
from ._parts import finished, inline_batches, stage_parts
from ._reader import Reader, Report
from ._slow import SlowNodes
from ._unmade import made, unmade
from ._upload import DEFAULT_WRITE, Upload, WriteOptions

Progress = Callable[[int], None]


class AsyncClient:
    """Async access to one store (embedded directory or cluster).

    ``AsyncClient(url, **options)`` opens the store ``url`` names (see
    ``graben.store.connect``); ``options`` are the fields of ``Options``.
    Use it as an async context manager, or ``await client.close()``.
    """

    def __init__(self, url: str | os.PathLike[str] | None = None, **options: object) -> None:
        opts = Options(**options)  # type: ignore[arg-type]
        target = resolve(url)
        if target.addresses:
            remote, nodes = open_cluster(
                target.addresses,
                opts.hash_threads,
                token=_token(opts),
                read_ahead=opts.remote_read_ahead,
                timeout=opts.timeout,
                wait=opts.wait,
                check=opts.read_check,
                tls=None if opts.tls is None else tls.client_context(opts.tls),
            )
            self._setup(remote, nodes, opts, cluster_url(target.addresses), report=True)
            return
        assert target.embedded is not None
        if made(target.embedded):
            meta, chunks = open_store(target.embedded, opts.io_threads)
            self._setup(meta, chunks, opts, str(target.embedded))
        else:  # a misspelt path must not read as an empty store, nor leave one behind
            self._setup(*unmade(target.embedded, opts.io_threads), opts, str(target.embedded))

    @classmethod
    def over(
        cls, meta: MetaTransport, chunks: ChunkTransport, options: Options, name: str = "custom"
    ) -> AsyncClient:
        """A client over given transports (the seam tests and the cluster use)."""
        client = cls.__new__(cls)
        client._setup(meta, chunks, options, name)
        return client

    def _setup(
        self,
        meta: MetaTransport,
        chunks: ChunkTransport,
        options: Options,
        name: str,
        *,
        report: bool = False,
    ) -> None:
        # Only a cluster can repair a damaged copy from another; an embedded
        # store has one copy, and forgetting it would hide the real error.
        self._report: Report | None = self._report_bad if report else None
        self.options = options
        self.name = name
        self.meta, self.chunks = meta, chunks
        self.pool = BufferPool(options.chunk_size, keep=options.max_inflight + 4)
        self._hasher = ThreadPoolExecutor(options.hash_threads, thread_name_prefix="graben-hash")
        self.replication = options.replication or 0  # 0: the store's default
        self._settings: asyncio.Future[Settings] | None = None
        self._slow = SlowNodes(options.replica_deadline)
        self._closed = False

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Release threads, buffers and connections (again: nothing happens)."""
        if self._closed:
            return
        self._closed = True
        self._hasher.shutdown(wait=True)
        await self.meta.close()
        await self.chunks.close()
        self.pool.close()

    def __repr__(self) -> str:
        return f"<AsyncClient {self.name}>"

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._closed

    @property
    def local(self) -> bool:
        """Whether the store runs in this process (embedded): its reads cost no hand-off."""
        return self.meta.local_read is not None

    @property
    def chunk_size(self) -> int:
        """Bytes per chunk for new files."""
        return self.options.chunk_size

    # -- namespace ------------------------------------------------------------

    async def stat(self, path: str) -> FileInfo:
        """Attributes of a file or directory; ``NotFound`` if absent."""
        return await self.meta.request(Stat(_paths.normalize(path)))

    async def exists(self, path: str) -> bool:
        """Whether ``path`` names a file or directory."""
        try:
            await self.stat(path)
        except NotFound:
            return False
        return True

    async def ls(self, path: str = "/") -> list[FileInfo]:
        """Entries of a directory sorted by name (a file lists as itself)."""
        return await _pages.listing(self.meta, _paths.normalize(path))

    async def mkdir(
        self,
        path: str,
        *,
        parents: bool = False,
        exist_ok: bool = False,
        mode: int | None = None,
        uid: int = -1,
        gid: int = -1,
    ) -> FileInfo:
        """Create a directory (``pathlib`` semantics), with ``mode`` (else 0o755) and an
        owner (-1: none recorded)."""
        clean = _paths.normalize(path)
        return await self.meta.request(MakeDir(clean, parents, exist_ok, "", mode, uid, gid))

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file or empty directory; everything below it with ``recursive``."""
        await self.meta.request(Remove(_paths.normalize(path), recursive))

    async def remove_each(
        self, paths: Sequence[str], *, directories: bool | Sequence[bool] = True
    ) -> list[GrabenError | None]:
        """Remove each path in turn, in one transaction: for each, ``None`` if it went,
        else why it did not (gone already, a directory not empty, or a directory at all
        where ``directories`` says no: one flag for all or one a path); the others go
        regardless."""
        clean = tuple(_paths.normalize(p) for p in paths)
        flags = (directories,) * len(clean) if isinstance(directories, bool) else directories
        done = await self.meta.request(RemoveEach(clean, tuple(flags)))
        return [None if r.error is None else from_wire(r.error) for r in done]

    async def rename(
        self, src: str, dst: str, *, replace: bool = True, replace_tree: bool = False
    ) -> FileInfo:
        """Move atomically (``os.replace`` semantics; ``replace=False`` refuses to clobber).

        Missing parents of ``dst`` are created. ``replace_tree`` also replaces a
        non-empty directory, its old tree deleted in the same transaction (how a
        checkpoint is overwritten without ever being half there).
        """
        return await self.meta.request(
            Rename(_paths.normalize(src), _paths.normalize(dst), replace, replace_tree)
        )

    async def publish(
        self,
        uploads: Sequence[Upload],
        src: str,
        dst: str,
        *,
        replace: bool = True,
        replace_tree: bool = False,
        files: Sequence[FileCommit] = (),
    ) -> FileInfo:
        """Commit ``uploads`` and ``rename(src, dst)`` in one transaction: readers see
        neither or both (how a checkpoint's last files and its name arrive at once).

        ``files``: more files to commit, finished elsewhere (``finish_uploads`` in other
        processes: every rank's files of a checkpoint). They should lie inside ``src``:
        past ``COMMIT_INLINE_MAX`` bytes kept inline, the first of them are committed in
        transactions of their own before the last one.
        """
        mine = await finished(uploads)
        *before, last = inline_batches([*files, *mine])
        for batch in before:
            await self.meta.request(Commit(tuple(batch)))
        move = Rename(
            _paths.normalize(src), _paths.normalize(dst), replace, replace_tree, files=tuple(last)
        )
        return await self.meta.request(move)

    async def finish_uploads(self, uploads: Sequence[Upload]) -> list[FileCommit]:
        """Wait for each upload's chunks and commit none: what another process's
        ``publish(files=...)`` makes visible (a checkpoint's ranks
        hand theirs to the coordinator). Chunks no commit names are collected later."""
        return await finished(uploads)

    async def _report_bad(self, chunk: str, node: str, reason: str) -> None:
        await self.meta.request(ReportBad(chunk, node, reason))

    async def health(self) -> Health:
        """Data nodes, and chunks short of copies (what ``graben status`` shows)."""
        return await self.meta.request(GetHealth())

    async def drain_node(self, node: str, *, undo: bool = False) -> NodeState:
        """Move every copy and piece off data node ``node`` in the background (the
        operator's; ``undo``: put it back in service); the node as it stands. Nothing new
        is placed on it; ``health()`` shows the copies it still holds, and ``"drained"``
        once none is left."""
        return await self.meta.request(DrainNode(node, undo))

    async def remove_node(self, node: str) -> None:
        """Unregister a stopped data node and forget its copies (the operator's); refused
        while it runs or holds the only copy of anything (drain it first)."""
        await self.meta.request(RemoveNode(node))

    async def changes(
        self, after: int = -1, missing: tuple[int, ...] = (), limit: int = 0
    ) -> ChangeFeed:
        """The store's change feed: each path a write changed, numbered past ``after``
        (-1: none, only where the feed is now), with the numbers in ``missing`` that have
        come since (a writer that took its number first may commit last). What a mount
        follows to keep its caches true; ``PathChange.inode`` is 0 where no name is left."""
        return await self.meta.request(Changes(after, missing, limit))

    async def du(self, path: str = "/") -> tuple[int, int]:
        """(files, bytes) at or below ``path``."""
        return await self.meta.request(Usage(_paths.normalize(path)))

    async def set_class(self, path: str, name: str) -> str:
        """Set the storage class of a directory or file (``""``: clear it); its canonical
        name. ``ec:K+M`` keeps the chunks of the files there as K data and M parity pieces
        once they are unchanged for the class's age (``ec:6+3@1h``); ``replicated`` keeps
        them as written (a subtree excepted from its directory's class)."""
        return await self.meta.request(SetClass(_paths.normalize(path), name))

    async def storage_class(self, path: str) -> ClassState:
        """The class in force at ``path``, where it was set, and how many of a file's chunks
        have taken it."""
        return await self.meta.request(GetClass(_paths.normalize(path)))

    # -- tenants and quotas ---------------------------------------------------

    async def quotas(self, path: str = "") -> list[QuotaState]:
        """The quotas above, at and below ``path`` (every one: ``""``), each with the usage
        of its tree; a tenant's token sees those it reaches and its tenant's own."""
        return await self.meta.request(GetQuotas(_paths.normalize(path) if path else ""))

    async def set_quota(
        self, path: str, *, max_bytes: int = 0, max_physical: int = 0, max_files: int = 0
    ) -> QuotaState:
        """Limit what the tree at directory ``path`` holds: logical bytes, bytes on disk
        (every copy) and files (0: no limit of that kind; all 0: clear the quota). A write
        past it fails with ``QuotaExceeded`` before its bytes are sent."""
        limits = SetQuota(_paths.normalize(path), max_bytes, max_physical, max_files)
        return await self.meta.request(limits)

    async def add_tenant(
        self,
        name: str,
        root: str,
        *,
        max_bytes: int = 0,
        max_physical: int = 0,
        max_files: int = 0,
    ) -> QuotaState:
        """Add a tenant (the operator's): its root directory is made, and the root's quota
        is the tenant's (0: no limit of that kind, usage counted all the same)."""
        request = AddTenant(name, _paths.normalize(root), max_bytes, max_physical, max_files)
        return await self.meta.request(request)

    async def tenants(self) -> dict[str, str]:
        """Every tenant's root, by name (the operator's)."""
        return await self.meta.request(ListTenants())

    async def issue_token(
        self, tenant: str, *, prefix: str = "", rights: str = "rw", ttl_s: float = 7 * 86400.0
    ) -> str:
        """A new token of ``tenant`` (the operator's): it reaches ``prefix`` (within the
        tenant's root; ``""``: the root) with ``rights`` (``r``, ``w``, ``a``) for ``ttl_s``
        seconds. Its text is returned here only: keep it in a 0600 file."""
        issued = await self.meta.request(IssueToken(tenant, prefix, rights, ttl_s))
        return issued.token

    async def tokens(self, tenant: str = "") -> list[TokenInfo]:
        """Every token (of ``tenant``), revoked and expired ones too, never its text."""
        return await self.meta.request(ListTokens(tenant))

    async def whoami(self) -> TokenInfo | None:
        """The token this client signs with: a tenant's, with the prefix it reaches and its
        rights; ``None`` for the cluster's own token and an embedded store (everything)."""
        return await self.meta.request(WhoAmI())

    async def revoke_tokens(self, *ids: str, tenant: str = "") -> int:
        """Revoke tokens by id, or every token of ``tenant``; refused on every metadata
        service within half a second. How many were live."""
        return await self.meta.request(RevokeTokens(ids, tenant))

    # -- data ---------------------------------------------------------------

    async def put(
        self,
        path: str,
        data: Buffer,
        *,
        exclusive: bool = False,
        replication: int | None = None,
        min_replicas: int | None = None,
        permissions: int | None = None,
        attributes: Change | None = None,
    ) -> FileInfo:
        """Store ``data`` at ``path`` in one commit, without copying it.

        Missing parent directories are created. With ``exclusive``, fail with
        ``AlreadyExists`` if the path exists at commit time. ``permissions``
        sets the mode bits; ``None`` keeps those of the file replaced (0o644 if
        new). ``attributes`` sets an owner or a modification time as well.
        """
        write = WriteOptions(
            exclusive=exclusive,
            replication=replication,
            min_replicas=min_replicas,
            permissions=permissions,
            attributes=attributes,
        )
        info, _ = await self.put_parts_checked(path, [data], write=write)
        return info

    async def put_parts(
        self,
        path: str,
        parts: Sequence[Buffer],
        *,
        exclusive: bool = False,
        replication: int | None = None,
        min_replicas: int | None = None,
        permissions: int | None = None,
        attributes: Change | None = None,
    ) -> FileInfo:
        """Store the concatenation of ``parts`` at ``path`` in one commit (the keywords
        are ``put``'s).

        Parts of ``DIRECT_PART`` bytes or more are uploaded from the caller's
        memory, without a copy, as chunks of their own (cut at the chunk
        size): a part that comes again in a later file, such as an unchanged
        tensor in the next checkpoint, is found in the store and not sent
        again. Smaller parts are packed together (a lone part never is: it
        goes uncopied whatever its size). Keep ``parts`` unchanged until this
        returns.
        """
        write = WriteOptions(
            exclusive=exclusive,
            replication=replication,
            min_replicas=min_replicas,
            permissions=permissions,
            attributes=attributes,
        )
        info, _ = await self.put_parts_checked(path, parts, write=write)
        return info

    async def put_parts_checked(
        self, path: str, parts: Sequence[Buffer], *, write: WriteOptions = DEFAULT_WRITE
    ) -> tuple[FileInfo, list[int]]:
        """``put_parts``, and the crc32c of each part; ``write`` holds ``put``'s keywords.

        A large part's comes from its chunks' own (which the store computes
        anyway), without another pass over its bytes.
        """
        upload, sums = await self.stage_parts(path, parts, write=write)
        return await upload.commit(), sums

    async def stage_parts(
        self, path: str, parts: Sequence[Buffer], *, write: WriteOptions = DEFAULT_WRITE
    ) -> tuple[Upload, list[int]]:
        """``put_parts_checked`` up to its commit: the finished ``Upload`` (commit it, with
        others in one transaction through ``commit_uploads``) and each part's crc32c."""
        # No early check: the bytes are already here and the commit checks
        # atomically; a stat first would cost a round trip per small file.
        upload = await self._open_upload(path, write, check=False)
        return upload, await stage_parts(upload, parts, self.pool, self.options.chunk_size)

    async def get(self, path: str) -> bytes:
        """A file's whole content."""
        return await self.get_range(path, 0, None)

    async def get_range(self, path: str, start: int, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of a file (``end=None``: to the end), cut at the end."""
        if start < 0 or (end is not None and end < start):
            raise InvalidArgument(f"bad range [{start}, {end})", path)
        reader = await self._open_reader(path)
        try:
            return await reader.read(start, (end if end is not None else reader.size) - start)
        finally:
            await reader.close()

    async def layout(self, path: str) -> FileLayout:
        """Where a file's bytes are: its extents in order and the nodes holding each chunk
        (what ``graben du --physical`` counts)."""
        return await _pages.layout(self.meta, _paths.normalize(path))

    async def _open_reader(self, path: str) -> Reader:
        """A ``Reader`` of the file's current version (``NotFound``, ``IsADirectory``)."""
        clean = _paths.normalize(path)
        layout = await _pages.layout(self.meta, clean)

        async def relocate(offset: int) -> FileLayout:
            return await _pages.page_at(self.meta, clean, layout.info.inode, offset)

        return Reader(
            self.chunks,
            self.pool,
            layout,
            self.options.read_ahead,
            self._report,
            self._slow,
            relocate,
        )

    async def _open_upload(
        self, path: str, write: WriteOptions = DEFAULT_WRITE, *, check: bool = True
    ) -> Upload:
        """An ``Upload`` to ``path``, written as ``write`` says.

        With ``check``, fail before any byte moves if the path cannot be
        written (what a file opened for a long stream wants); the commit
        checks the same again, atomically, either way. Unset, ``replication``
        and ``min_replicas`` are the client's options', then the store's defaults.
        """
        if write.min_replicas is not None and write.min_replicas < 1:
            raise InvalidArgument(
                f"min_replicas must be at least 1, not {write.min_replicas}", path
            )
        clean = _paths.normalize(path)
        if check:
            await self._check_writable(clean, write.mode)
        return Upload(
            self.meta,
            self.chunks,
            self._hasher,
            clean,
            mode=write.mode,
            replication=write.replication or self.replication,
            min_replicas=write.min_replicas or self.options.min_replicas or 0,
            max_inflight=self.options.max_inflight,
            permissions=write.permissions,
            attributes=write.attributes,
            inline_max=await self._inline_max(),
            slow=self._slow,
        )

    async def _inline_max(self) -> int:
        """The largest file written inline: the store's limit, cut to the client's own."""
        asked = self.options.inline_max
        if asked == 0:
            return 0
        if self._settings is None:  # asked once per client; a failure is asked again
            self._settings = asyncio.ensure_future(self.meta.request(GetSettings()))
        if self._settings.done() and self._settings.exception() is None:
            settings = self._settings.result()  # every upload after the first: no await
        else:
            try:
                settings = await asyncio.shield(self._settings)
            except BaseException:
                self._settings = None
                raise
        return settings.inline_max if asked is None else min(asked, settings.inline_max)

    async def set_attributes(
        self,
        path: str,
        *,
        mode: int | None = None,
        mtime_ns: int | None = None,
        atime_ns: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
    ) -> FileInfo:
        """Change mode bits, times or owner in place (``chmod``, ``touch``, ``chown``)."""
        change = Change(mode, mtime_ns, atime_ns, uid, gid)
        return await self.meta.request(SetAttributes(_paths.normalize(path), change))

    async def set_attributes_each(
        self, changes: Sequence[tuple[str, Change]]
    ) -> list[FileInfo | GrabenError]:
        """``set_attributes`` for several paths in one transaction, in order: for each,
        its attributes now, or why it did not change (gone); the others change
        regardless."""
        paths = tuple(_paths.normalize(path) for path, _ in changes)
        done = await self.meta.request(SetAttributesEach(paths, tuple(c for _, c in changes)))
        return [r.info if r.error is None and r.info else _refusal(r.error) for r in done]

    async def link(self, src: str, dst: str) -> FileInfo:
        """Give the file at ``src`` another name (a hard link): both names show one file,
        and a version written through either. ``dst``'s directory must exist."""
        return await self.meta.request(Link(_paths.normalize(src), _paths.normalize(dst)))

    async def mknod(
        self, path: str, mode: int, *, rdev: int = 0, uid: int | None = None, gid: int | None = None
    ) -> FileInfo:
        """Make a fifo, socket or device node (``mode`` with its type bits): a name with
        attributes and no bytes. ``AlreadyExists`` if the path exists."""
        commit = FileCommit(
            _paths.normalize(path), (), mode="create", permissions=mode, uid=uid, gid=gid, rdev=rdev
        )
        [info] = await self.meta.request(Commit((commit,)))
        return info

    async def copy(self, src: str, dst: str, *, exclusive: bool = False) -> FileInfo:
        """A new file at ``dst`` with ``src``'s content, without moving a byte.

        The copy shares ``src``'s chunks (one metadata commit, whatever the
        size); later writes to either path leave the other alone. Missing
        parents of ``dst`` are created; ``exclusive`` refuses an existing one.
        """
        layout = await _pages.layout(self.meta, _paths.normalize(src))
        mode: WriteMode = "create" if exclusive else "overwrite"
        commit = FileCommit(
            _paths.normalize(dst), layout.extents, (), mode, layout.info.replication
        )
        [info] = await self.meta.request(Commit((commit,)))
        return info

    async def commit_uploads(self, uploads: Sequence[Upload]) -> list[FileInfo]:
        """Make several uploads visible in one transaction: all of them or none.

        Each upload's chunks are waited for first; if any fails, nothing is
        committed and the error is raised.
        """
        commits = await finished(uploads)
        if not commits:
            return []
        return await self.meta.request(Commit(tuple(commits)))

    async def _check_writable(self, path: str, mode: WriteMode) -> None:
        try:
            info = await self.stat(path)
        except NotFound:
            return
        if info.is_dir:
            raise IsADirectory("a directory has this name", path)
        if mode == "create":
            raise AlreadyExists("file exists", path)

    def open(
        self, path: str, mode: Literal["rb", "wb", "xb"] = "rb", *, autocommit: bool = True
    ) -> AsyncFileOpener:
        """``async with client.open(path, mode) as f`` (or ``f = await client.open(...)``).

        ``rb``: the version committed at open time, seekable. ``wb``: a new
        version, visible atomically at ``close`` (with ``autocommit=False``, at
        ``commit``, or with others through ``commit_uploads``). ``xb``: like
        ``wb`` but fails with ``AlreadyExists`` if the path exists (at open and
        at commit).
        """
        return AsyncFileOpener(self, path, mode, autocommit)

    # -- integrity ------------------------------------------------------------

    async def fsck(
        self,
        *,
        collect: bool = False,
        grace: float | None = None,
        force: bool = False,
        progress: Progress | None = None,
    ) -> FsckReport:
        """Re-read every chunk copy (crc32c and blake3), cross-check the metadata, and
        find orphan chunk files and writers' leftover temporaries.

        With ``collect``, delete orphan copies, chunks no file has used and
        temporaries, all older than ``grace`` seconds (default
        ``Options.gc_grace_s``). Collection refuses, deleting nothing, when the
        metadata is inconsistent or names far fewer chunks than the nodes hold
        (a wrong or emptied metadata database); ``force`` overrides that.
        """
        run = Fsck(
            self.meta,
            self.chunks,
            self.pool,
            self._hasher,
            io_threads=self.options.io_threads,
            report=self._report,
            progress=progress,
        )
        grace = self.options.gc_grace_s if grace is None else grace
        return await run.run(collect=collect, grace=grace, force=force)


def _token(options: Options) -> str:
    """The token a cluster client presents: ``token_file``'s, else as ``auth.cluster_token``
    finds it (``token``, then the environment)."""
    if options.token_file is not None:
        return auth.read_token_file(os.fspath(options.token_file))
    return auth.cluster_token(options.token)


def _refusal(error: WireError | None) -> GrabenError:
    """A path's error in a reply of several; none at all is the server's fault."""
    if error is None:
        return ProtocolError("a reply with neither attributes nor an error")
    return from_wire(error)
