"""``nodus patch KIND NAME -p PATCH [--type merge|json|strategic]``: change an object in place.

The gateway applies the patch to the stored object and admits the result like an update (its
patching.py): ``merge`` is a JSON merge patch (RFC 7386: a partial object, null removes a key), ``json``
a JSON patch (RFC 6902: a list of operations), ``strategic`` is read as a merge patch (Nodus kinds have
no patch-merge keys). The patch may be written as JSON or YAML; it is sent as JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml

from nodus_cli import exiting
from nodus_cli.client import ApiError
from nodus_cli.config import Config
from nodus_cli.kinds import Kind
from nodus_cli.reporting import status_text
from nodus_cli.requesting import Requests


class BadPatch(ValueError):
    pass


def parse(text: str, patch_type: str) -> Any:
    """The patch as data; a JSON patch must be a list of operations, the others an object."""
    try:
        patch = yaml.safe_load(text)  # JSON is YAML: one parser reads both
    except yaml.YAMLError as e:
        raise BadPatch(f"the patch is neither JSON nor YAML: {e}") from None
    if patch_type == "json" and not isinstance(patch, list):
        raise BadPatch('a JSON patch (--type json) is a list of operations: [{"op": "replace", ...}]')
    if patch_type != "json" and not isinstance(patch, dict):
        raise BadPatch(f'a {patch_type} patch is an object with the fields to change: {{"spec": {{...}}}}')
    return patch


def patch(
    api: Requests, config: Config, kind: Kind, name: str, text: str, *, patch_type: str, output: str
) -> int:
    if not kind.writable:
        print(
            f"error: {kind.plural} are written by Nodus' services, not through the API\n"
            f"fix: read them with `nodus get {kind.plural}`",
            file=sys.stderr,
        )
        return exiting.FAILED
    try:
        body = parse(text, patch_type)
    except BadPatch as e:
        print(
            f'error: {e}\nfix: pass the patch with -p, e.g. -p \'{{"spec": {{"maxParallel": 2}}}}\'',
            file=sys.stderr,
        )
        return exiting.USAGE
    try:
        before = api.get(kind, config.namespace, name)
        after = api.patch(kind, config.namespace, name, body, patch_type)
    except ApiError as e:
        print(status_text(e.status), file=sys.stderr)
        return exiting.FAILED
    if output == "json":
        print(json.dumps(after, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(after, sort_keys=False, allow_unicode=True).rstrip())
    else:
        same = _comparable(before) == _comparable(after)
        print(f"{kind.ref(name)} {'patched (no change)' if same else 'patched'}")
    return exiting.OK


_SERVER_FIELDS = ("resourceVersion", "managedFields", "generation")


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """What a patch can change: the object without status and the fields the server sets on every write
    (the gateway stores a patch that changes nothing as a new version all the same)."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _SERVER_FIELDS}
    return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": meta}
