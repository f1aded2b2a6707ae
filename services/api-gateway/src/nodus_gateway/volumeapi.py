"""Volume revisions, and the deletes of Volumes and Workspaces that are in use (ADR-0036).

=======================================================  ======  =======================================
route                                                    who     answer
=======================================================  ======  =======================================
POST   .../namespaces/{ns}/volumes/{name}/revisions       editor  201 the Volume, its new revision last
DELETE .../namespaces/{ns}/volumes/{name}                 editor  the deleted Volume; 409 while in use
DELETE .../namespaces/{ns}/workspaces/{name}              editor  the deleted Workspace, its files gone;
                                                                  409 while in use
=======================================================  ======  =======================================

The body of a POST is a VolumeRevisionRequest, ``{"digest": "sha256:<hex>"}``: an uploaded blob of the
project (blobbing.py). :func:`append_revision` appends it as revision n + 1 to the Volume's status by
compare-and-set (the status is the gateway's alone: admission resets it on create and keeps the stored one
on every update, so a user never writes it). A writable mount's commit
(noding.py) appends through the same function with its Attempt, and a retried commit gets the same
revision back.

The two DELETE routes are served here, before the generic ones (app.py orders the routers), because a
delete of these kinds first asks whether anything still uses the object, like Kubernetes' PVC protection
but answered at once: any unfinished Job of the project (phase not in TERMINAL_PHASES), Sweep not
finished, or unfinished Pipeline with a stage (run or still to run, issue #22) that mounts the Volume
(``spec.volumes``, ``inputs[].volume``) or reads the Workspace (``inputs[].fromWorkspace``) is a 409
naming up to five of them. Otherwise the delete is the generic one (deleting.py: preconditions, dry run),
and a deleted Workspace's files are removed from the store after it (best effort). A deleted Volume's
blobs are left to expire.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response

from nodus_gateway import bodies
from nodus_gateway.authorizing import authorize
from nodus_gateway.blobbing import blob_exists, touch_blob
from nodus_gateway.clusterrouting import check_name, check_namespace
from nodus_gateway.deleting import delete_object, delete_options
from nodus_gateway.querying import DryRunQ, PropagationQ, dry_run_of
from nodus_gateway.referencing import specs_at
from nodus_gateway.resources import Resource, Stores, resource
from nodus_gateway.responding import ApiError, invalid, store_errors
from nodus_gateway.routing import API_PREFIX, admitted_response
from nodus_gateway.storeaccess import StoreAccess
from nodus_gateway.workspacefiles import delete_home
from nodus_schema import TERMINAL_PHASES, CauseType, FieldError, Job, Sweep
from nodus_schema.jobs import JobSpec
from nodus_schema.meta import now_rfc3339
from nodus_schema.pipelines import Pipeline
from nodus_schema.volumes import BLOB_PATTERN, MAX_REVISIONS, Volume, VolumeRevision

REVISIONS_PATH: Final = f"{API_PREFIX}/namespaces/{{namespace}}/volumes/{{name}}/revisions"
MAX_NAMED_USERS: Final = 5


# -- revisions --------------------------------------------------------------------------------------------
def _same(rev: VolumeRevision, digest: str, attempt: str | None) -> bool:
    return rev.digest == digest and rev.attempt == attempt


def _existing(vol: Volume, digest: str, attempt: str | None) -> VolumeRevision | None:
    """The revision a retry of this append already made. A commit (with its Attempt) is found wherever it
    is; a push without one only as the latest (pushing the latest's bytes again changes nothing, while
    pushing an older revision's bytes again makes it the latest)."""
    revisions = vol.status.revisions
    if attempt is not None:
        return next((r for r in revisions if _same(r, digest, attempt)), None)
    if revisions and _same(revisions[-1], digest, None):
        return revisions[-1]
    return None


def _appended(vol: Volume, rev: VolumeRevision) -> Volume:
    revisions = [*vol.status.revisions, rev][-MAX_REVISIONS:]  # the oldest beyond the cap are dropped
    status = msgspec.structs.replace(vol.status, revisions=revisions, latest=rev.revision)
    return msgspec.structs.replace(vol, status=status)


async def _append(
    stores: Stores,
    namespace: str,
    volume: str,
    digest: str,
    size_bytes: int,
    creator: str,
    attempt: str | None,
) -> tuple[Volume, VolumeRevision]:
    res = resource("volumes")
    made: list[VolumeRevision] = []

    def change(vol: Volume) -> Volume | None:
        made.clear()  # run again after a lost compare-and-set: decided anew on the fresh read
        kept = _existing(vol, digest, attempt)
        if kept is not None:
            made.append(kept)
            return None
        number = (vol.status.latest or 0) + 1
        rev = VolumeRevision(
            revision=number,
            digest=digest,
            size_bytes=size_bytes,
            creator=creator,
            time=now_rfc3339(),
            attempt=attempt,
        )
        made.append(rev)
        return _appended(vol, rev)

    # Touched first, strictly: a blob expiring at this moment is refused here rather than listed as a
    # revision whose bytes are gone (blobreaping.py).
    await touch_blob(stores, namespace, digest, strict=True)
    with store_errors(res, namespace, volume):
        vol: Volume = await stores[res.plural].mutate(namespace, volume, change)
    return vol, made[0]


async def append_revision(
    stores: Stores,
    namespace: str,
    volume: str,
    digest: str,
    size_bytes: int,
    creator: str,
    attempt: str | None = None,
) -> VolumeRevision:
    """Append revision n + 1 (``digest``, an uploaded blob of the project) to the Volume's status and
    return it; the revision already made when this is a retry (see :func:`_existing`). NotFound (an
    ApiError) for a Volume that does not exist. Touches the blob record's lastUsedTime."""
    _, rev = await _append(stores, namespace, volume, digest, size_bytes, creator, attempt)
    return rev


def _bad_digest(name: str, value: Any, why: str, fix: str) -> ApiError:
    cause = FieldError("digest", CauseType.INVALID, f"Invalid value: {value!r}: {why}")
    err = invalid(resource("volumes"), name, [cause])
    return ApiError(msgspec.structs.replace(err.status, fix=fix))


def _digest_of(namespace: str, name: str, data: Any) -> str:
    if not isinstance(data, dict):
        raise ApiError.of(
            "BadRequest",
            "the body must be a JSON object: a VolumeRevisionRequest",
            fix='Send {"digest": "sha256:<hex>"}, the digest of a blob you uploaded to the project.',
        )
    digest = data.get("digest")
    if not isinstance(digest, str) or BLOB_PATTERN.fullmatch(digest) is None:
        raise _bad_digest(
            name,
            digest,
            "must be a blob digest, sha256:<64 lower-case hex digits>",
            'Send {"digest": "sha256:<hex>"}, the digest of the archive you uploaded.',
        )
    return digest


# -- in use -----------------------------------------------------------------------------------------------
def _volumes_of(spec: JobSpec) -> set[str]:
    mounted = {v.volume for v in spec.volumes if v.volume}
    return mounted | {i.volume.name for i in spec.inputs if i.volume is not None and i.volume.name}


def _workspaces_of(spec: JobSpec) -> set[str]:
    return {i.from_workspace.name for i in spec.inputs if i.from_workspace and i.from_workspace.name}


def _unfinished(phase: str | None) -> bool:
    return phase not in TERMINAL_PHASES


async def users_of(
    stores: Stores, namespace: str, name: str, uses: Callable[[JobSpec], set[str]]
) -> list[str]:
    """``job/<name>``, ``sweep/<name>`` and ``pipeline/<name>`` of every unfinished Job, Sweep and Pipeline
    of the project whose spec (a Sweep's template, a stage's) ``uses`` names ``name``."""
    users: list[str] = []
    jobs: Iterable[Job] = (await stores["jobs"].list(namespace)).items
    users += [f"job/{j.metadata.name}" for j in jobs if _unfinished(j.status.phase) and name in uses(j.spec)]
    sweeps: Iterable[Sweep] = (await stores["sweeps"].list(namespace)).items
    users += [
        f"sweep/{s.metadata.name}"
        for s in sweeps
        if _unfinished(s.status.phase) and name in uses(s.spec.template.spec)
    ]
    pipelines: Iterable[Pipeline] = (await stores["pipelines"].list(namespace)).items
    users += [
        f"pipeline/{p.metadata.name}"
        for p in pipelines
        if _unfinished(p.status.phase) and any(name in uses(spec) for spec, _ in specs_at(p))
    ]
    return users


def in_use(res: Resource, namespace: str, name: str, users: list[str]) -> ApiError:
    more = len(users) - MAX_NAMED_USERS
    shown = ", ".join(users[:MAX_NAMED_USERS]) + (f" and {more} more" if more > 0 else "")
    return ApiError.of(
        "Conflict",
        f'{res.group_resource} "{name}" is in use by {shown}: it cannot be deleted while they are unfinished',
        name=name,
        kind=res.plural,
        fix="Wait for them to finish, or cancel or delete them first "
        f"(`nodus delete job NAME -n {namespace}`, `nodus delete sweep NAME -n {namespace}`), then delete "
        f"the {res.kind} again.",
    )


USES: Final[dict[str, Callable[[JobSpec], set[str]]]] = {
    "volumes": _volumes_of,
    "workspaces": _workspaces_of,
}
"""What a Job spec uses of each guarded kind, by plural."""


# -- routes -----------------------------------------------------------------------------------------------
async def _optional_body(request: Request, limit: int) -> Any:
    body = await bodies.read_body(request, limit)
    return bodies.parse(body, bodies.media_type(request)) if body.strip() else None


def volume_router(stores: Stores, access: StoreAccess | None, *, max_body_bytes: int) -> APIRouter:
    """Revisions of Volumes, and the guarded deletes of Volumes and Workspaces."""
    router = APIRouter(tags=["volumes"])
    volumes = resource("volumes")

    @router.post(REVISIONS_PATH, name="create revision of volumes")
    async def create_revision(namespace: str, name: str, request: Request) -> Response:
        check_namespace(namespace)
        principal = await authorize(request, "update", volumes.plural, namespace)
        check_name(volumes, name, namespace)
        body = await bodies.read_body(request, max_body_bytes)
        digest = _digest_of(namespace, name, bodies.parse(body, bodies.media_type(request)))
        with store_errors(volumes, namespace, name):
            await stores[volumes.plural].get(namespace, name)  # a missing Volume before a missing blob
        blob = await blob_exists(stores, namespace, digest)
        if blob is None:
            raise _bad_digest(
                name,
                digest,
                "no blob of the project has this digest",
                f"Upload it first: PUT {API_PREFIX}/namespaces/{namespace}/blobs/{digest} with the archive "
                "as the body (`nodus volume push` does both).",
            )
        vol, _ = await _append(stores, namespace, name, digest, blob.spec.size_bytes, principal.name, None)
        return admitted_response(volumes, vol, status_code=201)

    def guarded_delete(plural: str) -> Callable[..., Any]:
        res = resource(plural)

        async def delete(
            namespace: str,
            name: str,
            request: Request,
            propagation_policy: PropagationQ = None,
            dry_run: DryRunQ = None,
        ) -> Response:
            check_namespace(namespace)
            await authorize(request, "delete", res.plural, namespace)
            check_name(res, name, namespace)
            options = delete_options(propagation_policy, await _optional_body(request, max_body_bytes))
            dry = dry_run_of(dry_run)
            with store_errors(res, namespace, name):
                await stores[res.plural].get(namespace, name)  # a missing one is a 404, used or not
            users = await users_of(stores, namespace, name, USES[plural])
            if users:
                raise in_use(res, namespace, name, users)
            with store_errors(res, namespace, name):
                deleted = await delete_object(res, stores, namespace, name, options, dry_run=dry)
            if plural == "workspaces" and not dry:
                await delete_home(access, namespace, name)
            return admitted_response(res, deleted)

        return delete

    for plural in USES:
        path = f"{API_PREFIX}/namespaces/{{namespace}}/{plural}/{{name}}"
        router.add_api_route(path, guarded_delete(plural), methods=["DELETE"], name=f"delete {plural}")
    return router
