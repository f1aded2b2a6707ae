"""The asynchronous client: ``await AsyncClient().sweeps.get("lr")`` returns a :class:`nodus_schema.Sweep`.

Every accessor builds its request with :mod:`nodus_sdk.resources` and :mod:`nodus_sdk.accessing`; this
module only carries them over ``httpx.AsyncClient``. Lists, watches and logs are async iterators.

Code and data (ADR-0036): :meth:`AsyncClient.upload_blob` and :meth:`AsyncClient.upload_dir` send an
archive only when the project does not have it yet; ``volumes.push`` makes a Volume revision of a
directory; ``workspaces.push/pull/ls`` move a Workspace's files. Files are read and written in 1 MiB
chunks in the calling thread, and packing a directory is CPU work there too: in a busy event loop, pack
in a worker thread (``to_thread(pack_dir, ...)``) and upload the result with ``upload_blob``.

:mod:`nodus_sdk.syncclient` is generated from this module (``libs/nodus_sdk/scripts/generate_sync.py``,
with unasync): edit this one, then regenerate. What the generator cannot translate lives in a module of
its own, one per client (the watch: :mod:`nodus_sdk.asyncwatch`, :mod:`nodus_sdk.syncwatch`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx

from nodus_schema import Job, Sweep
from nodus_schema.access import Project
from nodus_schema.attempts import Attempt
from nodus_schema.billing import Account, Budget, Invoice, UsageList
from nodus_schema.configs import Connection, Secret
from nodus_schema.nodes import Node
from nodus_schema.offerings import Offering
from nodus_schema.pipelines import Pipeline
from nodus_schema.results import SweepResults
from nodus_schema.volumes import Volume, Workspace, workspace_path
from nodus_sdk import accessing, uploading
from nodus_sdk.accessing import Accessor, name_selector
from nodus_sdk.asyncwatch import Watch as Watch  # re-exported: it was defined here before
from nodus_sdk.configuring import Config, with_overrides
from nodus_sdk.errors import AlreadyExists, NotFound
from nodus_sdk.packing import pack_dir
from nodus_sdk.requesting import (
    TIMEOUT_S,
    Call,
    Retry,
    answer,
    client_options,
    error_of,
    retry_after,
    retryable,
    unreachable,
)
from nodus_sdk.resources import (
    ATTEMPTS,
    BUDGETS,
    CONNECTIONS,
    JOBS,
    NODES,
    OFFERINGS,
    PAGE_SIZE,
    PIPELINES,
    PROJECTS,
    SECRETS,
    SWEEPS,
    VOLUMES,
    WORKSPACES,
    Estimated,
    Kind,
    Page,
    PatchType,
    kind_of,
    name_of,
    namespace_in,
)
from nodus_sdk.uploading import Transfer, Uploaded, WorkspaceFile
from nodus_sdk.waiting import Condition, WaitTimeout
from nodus_sdk.watching import WatchState, gone, meta_rv

T = TypeVar("T")


class AsyncClient:
    """A client of the Nodus API. Settings come from :meth:`Config.load` unless ``config`` is given; the
    keyword arguments override single settings (``Client(project="vision")``)."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        server: str | None = None,
        token: str | None = None,
        project: str | None = None,
        ca: str | None = None,
        timeout: float = TIMEOUT_S,
        retry: Retry | None = None,
        user_agent: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = with_overrides(config, server=server, token=token, project=project, ca=ca)
        self.retry = retry or Retry()
        self._http = httpx.AsyncClient(
            **client_options(self.config, timeout, user_agent), transport=transport
        )
        p = self.config.project
        self.sweeps: SweepResource = SweepResource(self, SWEEPS, p)
        self.jobs: JobResource = JobResource(self, JOBS, p)
        self.attempts: ReadResource[Attempt] = ReadResource(self, ATTEMPTS, p)
        self.secrets: Resource[Secret] = Resource(self, SECRETS, p)
        self.connections: Resource[Connection] = Resource(self, CONNECTIONS, p)
        self.budgets: Resource[Budget] = Resource(self, BUDGETS, p)
        self.nodes: ReadResource[Node] = ReadResource(self, NODES, p)
        self.offerings: ReadResource[Offering] = ReadResource(self, OFFERINGS, p)
        self.projects: Resource[Project] = Resource(self, PROJECTS, p)
        self.volumes: VolumeResource = VolumeResource(self, VOLUMES, p)
        self.workspaces: WorkspaceResource = WorkspaceResource(self, WORKSPACES, p)
        self.pipelines: Resource[Pipeline] = Resource(self, PIPELINES, p)

    @property
    def project(self) -> str:
        project: str = self.config.project
        return project

    @property
    def server(self) -> str:
        server: str = self.config.server
        return server

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    # -- sending -----------------------------------------------------------------------------------------
    async def send(self, call: Call[T]) -> T:
        """Send one call; GETs are retried on connection errors and 503 (:class:`Retry`), writes never."""
        delays = self.retry.delays() if call.idempotent else iter(())
        while True:
            try:
                resp = await self._http.request(call.method, call.path, **call.request_kwargs())
            except httpx.TransportError as e:
                delay = next(delays, None)
                if delay is None:
                    raise unreachable(self.server, e) from None
                await asyncio.sleep(delay)
                continue
            if retryable(resp):
                delay = next(delays, None)
                if delay is not None:
                    await asyncio.sleep(retry_after(resp, delay))
                    continue
            return answer(call, resp)

    async def send_file(self, call: Call[T], path: Path) -> T:
        """Send ``call`` with the file at ``path`` as its body, streamed in chunks (never retried: it
        writes)."""
        kwargs = call.request_kwargs()
        try:
            resp = await self._http.request(call.method, call.path, content=_chunks(path), **kwargs)
        except httpx.TransportError as e:
            raise unreachable(self.server, e) from None
        return answer(call, resp)

    @asynccontextmanager
    async def stream(self, call: Call[Any], *, read_timeout: float | None) -> AsyncIterator[httpx.Response]:
        """The response of ``call`` as it arrives (a log, a watch): raises its error when it is not a 2xx.
        ``read_timeout`` None waits for data as long as it takes."""
        timeout = httpx.Timeout(self._http.timeout.connect, read=read_timeout)
        try:
            async with self._http.stream(
                call.method, call.path, timeout=timeout, **call.request_kwargs()
            ) as resp:
                if not resp.is_success:
                    await resp.aread()
                    raise error_of(resp)
                yield resp
        except httpx.TransportError as e:
            raise unreachable(self.server, e) from None

    # -- project-level endpoints -------------------------------------------------------------------------
    async def account(self, *, project: str | None = None) -> Account:
        return await self.send(accessing.account(project or self.project))

    async def grant(
        self,
        amount_usd: str,
        *,
        project: str | None = None,
        id: str | None = None,
        revoke: bool = False,
        note: str = "",
    ) -> Account:
        """Grant (or with ``revoke`` take back) credits, cluster admin only; the same ``id`` counts once."""
        return await self.send(
            accessing.grant(project or self.project, amount_usd, id=id, revoke=revoke, note=note)
        )

    async def usage(self, month: str | None = None, *, project: str | None = None) -> UsageList:
        return await self.send(accessing.usage(project or self.project, month))

    async def usage_csv(self, month: str | None = None, *, project: str | None = None) -> str:
        return await self.send(accessing.usage_csv(project or self.project, month))

    async def invoice(self, month: str, *, project: str | None = None) -> Invoice:
        return await self.send(accessing.invoice(project or self.project, month))

    async def invoice_csv(self, month: str, *, project: str | None = None) -> str:
        return await self.send(accessing.invoice_csv(project or self.project, month))

    async def results(self, sweep: Sweep | str, *, project: str | None = None) -> SweepResults:
        """A Sweep's results: every cell with its cost per million units, the best cells marked."""
        return await self.sweeps.results(sweep, namespace=project)

    # -- code and data: blobs (ADR-0036) ----------------------------------------------------------------
    async def upload_blob(
        self, path: Path, *, project: str | None = None, digest: str | None = None
    ) -> Uploaded:
        """Make sure the project has the tar.zst at ``path`` as a blob: ask first (``HEAD``), send its bytes
        only when it is missing. ``digest`` (``sha256:<hex>`` of the file) saves reading it twice."""
        ns = project or self.project
        if digest is None:
            digest, size = uploading.file_digest(Path(path))
        else:
            size = uploading.file_size(Path(path))
        try:
            known = await self.send(uploading.head_blob(ns, digest))
            return Uploaded(digest, known if known >= 0 else size, uploaded=False)
        except NotFound:
            pass
        stored = await self.send_file(uploading.put_blob(ns, digest, size), Path(path))
        return Uploaded(digest, stored if stored >= 0 else size, uploaded=True)

    async def upload_dir(self, root: Path, *, project: str | None = None) -> Uploaded:
        """Pack the directory ``root`` (:func:`nodus_sdk.packing.pack_dir`: deterministic, its ignore files
        honoured) and upload it unless the project has it; ``digest`` is what ``spec.source.blob`` takes."""
        with pack_dir(Path(root)) as packed:
            done = await self.upload_blob(packed.path, project=project, digest=packed.digest)
        return Uploaded(done.digest, done.size_bytes, done.uploaded, packed.files, packed.skipped)

    async def wait_for(self, obj: Any, condition: Condition, *, timeout: float | None = None) -> Any:
        """Wait until ``condition(obj)`` holds for the object as the server has it (a Sweep, a Job, ...),
        and return that state; :class:`WaitTimeout` after ``timeout`` seconds."""
        kind = kind_of(obj)
        return await ReadResource(self, kind, self.project).wait_for(
            name_of(obj), condition, namespace=namespace_in(obj), timeout=timeout
        )


class ReadResource(Generic[T]):
    """get, list and watch of one kind."""

    def __init__(self, client: AsyncClient, kind: Kind[T], project: str) -> None:
        self._client = client
        self._a = Accessor(kind, project)

    @property
    def kind(self) -> Kind[T]:
        return self._a.kind

    async def get(self, name: str, *, namespace: str | None = None) -> T:
        return await self._client.send(self._a.calls.get(self._a.ns(namespace), name))

    async def list_page(
        self,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_: str | None = None,
    ) -> Page[T]:
        """One page of the list (``limit`` objects at most); its ``continue_`` asks for the next."""
        call = self._a.calls.list_page(
            self._a.ns(namespace),
            label_selector=label_selector,
            field_selector=field_selector,
            limit=limit,
            continue_=continue_,
        )
        return await self._client.send(call)

    async def list(
        self,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = PAGE_SIZE,
    ) -> AsyncIterator[T]:
        """Every object, page after page as the iteration goes on."""
        token: str | None = None
        while True:
            page = await self.list_page(
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                limit=page_size,
                continue_=token,
            )
            for item in page.items:
                yield item
            token = page.continue_
            if not token:
                return

    def watch(
        self,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
        timeout: float | None = None,
    ) -> Watch[T]:
        """The changes, as :class:`~nodus_sdk.watching.Event` objects, from ``resource_version`` (default:
        the current objects as ADDED first), resumed and relisted as :mod:`nodus_sdk.watching` says;
        with ``timeout`` it ends after that many seconds."""
        state = WatchState(
            self._a.calls,
            self._a.ns(namespace),
            label_selector=label_selector,
            field_selector=field_selector,
            resource_version=resource_version,
            timeout=timeout,
        )
        return Watch(self._client, state)

    async def wait_for(
        self, name: str, condition: Condition, *, namespace: str | None = None, timeout: float | None = None
    ) -> T:
        """Wait until ``condition`` holds for the object ``name``; return it. :class:`WaitTimeout` after
        ``timeout`` seconds, :class:`~nodus_sdk.errors.NotFound` if it is (or gets) deleted."""
        last = await self.get(name, namespace=namespace)  # NotFound at once when there is no such object
        if condition(last):
            return last
        rv = meta_rv(last)
        selector = name_selector(name)
        watch = self.watch(namespace=namespace, field_selector=selector, resource_version=rv, timeout=timeout)
        async with watch as w:
            async for event in w:
                if event.type == "DELETED":
                    raise gone(self.kind, name)
                last = event.object
                if condition(last):
                    return last
        raise WaitTimeout(f"{self.kind.kind} {name}", timeout or 0, last)


class Resource(ReadResource[T]):
    """Every verb of one kind."""

    async def get_status(self, name: str, *, namespace: str | None = None) -> T:
        return await self._client.send(self._a.calls.get_status(self._a.ns(namespace), name))

    async def create(
        self,
        obj: T | dict[str, Any],
        *,
        namespace: str | None = None,
        dry_run: bool = False,
        if_match: str | None = None,
        field_validation: str | None = None,
    ) -> T:
        """Create ``obj`` (a typed object or its dict); ``if_match`` binds it to a dry run's ETag."""
        call = self._a.calls.create(
            self._a.ns(namespace, obj),
            obj,
            dry_run=dry_run,
            if_match=if_match,
            field_validation=field_validation,
        )
        return await self._client.send(call)

    async def estimate(self, obj: T | dict[str, Any], *, namespace: str | None = None) -> Estimated[T]:
        """The dry run (``?dryRun=All``): the object with ``status.estimate``, and its ETag."""
        return await self._client.send(self._a.calls.estimate(self._a.ns(namespace, obj), obj))

    async def update(
        self,
        obj: T | dict[str, Any],
        *,
        namespace: str | None = None,
        dry_run: bool = False,
        field_validation: str | None = None,
    ) -> T:
        """Replace the object (PUT); its metadata.resourceVersion makes it a compare-and-set (Conflict)."""
        call = self._a.calls.update(
            self._a.ns(namespace, obj), obj, dry_run=dry_run, field_validation=field_validation
        )
        return await self._client.send(call)

    async def patch(
        self,
        name: str,
        patch: Any,
        *,
        type: PatchType = "merge",
        namespace: str | None = None,
        field_manager: str | None = None,
        force: bool | None = None,
        dry_run: bool = False,
    ) -> T:
        """Patch it: ``merge`` (RFC 7386), ``json`` (RFC 6902 operations), ``strategic`` (served as a merge
        patch), or ``apply`` (server-side apply, with ``field_manager``)."""
        call = self._a.calls.patch(
            self._a.ns(namespace),
            name,
            patch,
            type=type,
            field_manager=field_manager,
            force=force,
            dry_run=dry_run,
        )
        return await self._client.send(call)

    async def delete(
        self,
        name: str,
        *,
        namespace: str | None = None,
        propagation_policy: str | None = None,
        dry_run: bool = False,
        resource_version: str | None = None,
    ) -> T:
        """Delete it (its owned objects too, unless ``propagation_policy="Orphan"``); returns it."""
        call = self._a.calls.delete(
            self._a.ns(namespace),
            name,
            propagation_policy=propagation_policy,
            dry_run=dry_run,
            resource_version=resource_version,
        )
        return await self._client.send(call)

    async def delete_collection(
        self,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        propagation_policy: str | None = None,
        dry_run: bool = False,
    ) -> list[T]:
        """Delete every object the selectors match; returns what was deleted."""
        call = self._a.calls.delete_collection(
            self._a.ns(namespace),
            label_selector=label_selector,
            field_selector=field_selector,
            propagation_policy=propagation_policy,
            dry_run=dry_run,
        )
        deleted = await self._client.send(call)
        return deleted.items


class SweepResource(Resource[Sweep]):
    async def results(self, sweep: Sweep | str, *, namespace: str | None = None) -> SweepResults:
        name = sweep if isinstance(sweep, str) else name_of(sweep)
        ns = self._a.ns(namespace, None if isinstance(sweep, str) else sweep) or self._client.project
        return await self._client.send(accessing.results(ns, name))

    async def results_csv(self, name: str, *, namespace: str | None = None) -> str:
        return await self._client.send(
            accessing.results_csv(self._a.ns(namespace) or self._client.project, name)
        )


class JobResource(Resource[Job]):
    async def log(
        self,
        name: str,
        *,
        namespace: str | None = None,
        follow: bool = False,
        index: int | None = None,
        attempt: int | None = None,
        tail_lines: int | None = None,
        since_seconds: int | None = None,
        timestamps: bool = False,
    ) -> AsyncIterator[str]:
        """The Job's log, line by line; with ``follow`` new lines as they come, until the Job finishes."""
        call = accessing.log(
            self._a.ns(namespace) or self._client.project,
            name,
            follow=follow,
            index=index,
            attempt=attempt,
            tail_lines=tail_lines,
            since_seconds=since_seconds,
            timestamps=timestamps,
        )
        read = None if follow else self._client._http.timeout.read
        async with self._client.stream(call, read_timeout=read) as resp:
            try:
                async for line in resp.aiter_lines():
                    yield line
            except httpx.TransportError as e:
                raise unreachable(self._client.server, e) from None


class VolumeResource(Resource[Volume]):
    """Volumes, and their revisions."""

    async def add_revision(self, name: str, digest: str, *, namespace: str | None = None) -> Volume:
        """Make the uploaded blob ``digest`` the Volume's next revision; returns the Volume."""
        ns = self._a.ns(namespace) or self._client.project
        return await self._client.send(uploading.add_revision(ns, name, digest))

    async def ensure(
        self, name: str, *, namespace: str | None = None, description: str | None = None
    ) -> None:
        """Create the Volume unless it exists."""
        await _ensure(self, "Volume", name, namespace, description)

    async def push(
        self, name: str, root: Path, *, namespace: str | None = None, create: bool = True
    ) -> tuple[Volume, Uploaded]:
        """The directory ``root`` as the Volume's next revision: packed, uploaded unless the project has
        it, then added (``create``: the Volume is made first when missing). Returns the Volume (its
        ``status.latest`` is the new revision) and what was uploaded."""
        if create:
            await self.ensure(name, namespace=namespace)
        done = await self._client.upload_dir(Path(root), project=self._a.ns(namespace))
        return await self.add_revision(name, done.digest, namespace=namespace), done


class WorkspaceResource(Resource[Workspace]):
    """Workspaces, and the files of their homes."""

    def _ns(self, namespace: str | None) -> str:
        return self._a.ns(namespace) or self._client.project

    async def ensure(
        self, name: str, *, namespace: str | None = None, description: str | None = None
    ) -> None:
        """Create the Workspace unless it exists."""
        await _ensure(self, "Workspace", name, namespace, description)

    async def upload_file(self, name: str, path: str, local: Path, *, namespace: str | None = None) -> int:
        """Write the local file ``local`` at ``path`` in the home; returns its size."""
        size = uploading.file_size(Path(local))
        await self._client.send_file(uploading.put_file(self._ns(namespace), name, path, size), Path(local))
        return size

    async def delete_file(self, name: str, path: str, *, namespace: str | None = None) -> None:
        await self._client.send(uploading.delete_file(self._ns(namespace), name, path))

    async def download_file(self, name: str, path: str, target: Path, *, namespace: str | None = None) -> int:
        """Write the file ``path`` of the home to ``target`` (through a temporary file beside it, renamed
        when complete); returns its size."""
        call = uploading.get_file(self._ns(namespace), name, path)
        with uploading.Partial(Path(target)) as out:
            async with self._client.stream(call, read_timeout=self._client._http.timeout.read) as resp:
                async for chunk in resp.aiter_bytes(uploading.CHUNK_SIZE):
                    out.write(chunk)
            out.commit()
        return out.size

    async def ls(
        self, name: str, prefix: str = "", *, namespace: str | None = None
    ) -> AsyncIterator[WorkspaceFile]:
        """The files under ``prefix`` (a folder of the home, or all of it), page after page."""
        ns = self._ns(namespace)
        token: str | None = None
        while True:
            page = await self._client.send(uploading.list_files(ns, name, prefix, token))
            for item in page.items:
                yield item
            token = page.continue_
            if not token:
                return

    async def push(
        self, name: str, source: Path, *, to: str = "", namespace: str | None = None, create: bool = True
    ) -> Transfer:
        """Send a local file to ``<to>/<its name>``, or a directory's files under ``<to>/`` (its ignore
        files honoured, as a pack honours them); ``create``: the Workspace is made first when missing."""
        if create:
            await self.ensure(name, namespace=namespace)
        done = Transfer(skipped=uploading.skipped_locals(Path(source)))
        for path, local, _ in uploading.local_files(Path(source), to):
            done.bytes += await self.upload_file(name, path, local, namespace=namespace)
            done.paths.append(path)
        return done

    async def pull(self, name: str, path: str, dest: Path, *, namespace: str | None = None) -> Transfer:
        """Copy the file ``path`` of the home into the folder ``dest``, or the folder ``path`` (the whole
        home for "") with what is under it; a listed path that would land outside ``dest`` is refused."""
        done = Transfer()
        async for item in self.ls(name, path, namespace=namespace):
            rel = uploading.pulled_rel(item.path, path)
            if rel is None:
                continue
            target = uploading.local_target(Path(dest), rel)
            done.bytes += await self.download_file(name, item.path, target, namespace=namespace)
            done.paths.append(item.path)
        single = workspace_path(path)
        if not done.paths and single:
            # Not a folder: the file itself (NotFound when it is neither).
            target = uploading.local_target(Path(dest), uploading.posix_name(single))
            done.bytes += await self.download_file(name, single, target, namespace=namespace)
            done.paths.append(single)
        return done


async def _ensure(
    resource: Resource[Any], kind: str, name: str, namespace: str | None, description: str | None
) -> None:
    try:
        await resource.get(name, namespace=namespace)
        return
    except NotFound:
        pass
    try:
        await resource.create(uploading.new_object(kind, name, description), namespace=namespace)
    except AlreadyExists:
        pass  # made meanwhile by someone else: what we wanted


async def _chunks(path: Path) -> AsyncIterator[bytes]:
    """A file's bytes in chunks: the streamed body of an upload."""
    for chunk in uploading.file_chunks(path):
        yield chunk
