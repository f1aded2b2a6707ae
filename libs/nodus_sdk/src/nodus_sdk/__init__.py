"""The Nodus Python SDK: typed clients of the nodus.dev/v1 API (docs/sdk.md).

::

    from nodus_sdk import Client, finished, load_objects

    # Settings: NODUS_URL, NODUS_TOKEN, NODUS_PROJECT; ~/.config/nodus/config.yaml; .nodus/local.env.
    with Client() as nodus:
        sweep = nodus.sweeps.create(load_objects(open("sweep.yaml").read())[0])
        done = nodus.wait_for(sweep, finished, timeout=600)
        print(nodus.results(done).best)

Code and data (ADR-0036): ``nodus.upload_dir(path)`` packs a directory (:func:`pack_dir`, deterministic,
``.gitignore``/``.nodusignore`` honoured) and uploads it once; ``nodus.volumes.push(name, path)`` makes it a
Volume revision; ``nodus.workspaces.push/pull/ls`` move a Workspace's files.

Objects are ``nodus_schema`` Structs (``Sweep``, ``Job``, ...); errors are :class:`NodusError` subclasses
carrying the server's Status.
"""

from nodus_sdk.asyncclient import AsyncClient
from nodus_sdk.configuring import Config, ConfigError, Context, read_config_file, write_context
from nodus_sdk.errors import (
    AlreadyExists,
    BadCA,
    BadRequest,
    BudgetExceeded,
    Conflict,
    Forbidden,
    FundingError,
    Gone,
    InsufficientCredits,
    Invalid,
    MaxCostReached,
    MethodNotAllowed,
    NodusError,
    NotFound,
    ServerError,
    TooManyRequests,
    Unauthorized,
    Unreachable,
)
from nodus_sdk.manifests import load_objects
from nodus_sdk.packing import Packed, PackError, pack_dir
from nodus_sdk.requesting import Retry
from nodus_sdk.resources import Estimated, Kind, Page
from nodus_sdk.syncclient import Client
from nodus_sdk.uploading import Transfer, Uploaded, WorkspaceFile
from nodus_sdk.waiting import WaitTimeout, finished, phase_in, settled, succeeded
from nodus_sdk.watching import Event

__all__ = [
    "AlreadyExists",
    "AsyncClient",
    "BadCA",
    "BadRequest",
    "BudgetExceeded",
    "Client",
    "Config",
    "ConfigError",
    "Conflict",
    "Context",
    "Estimated",
    "Event",
    "Forbidden",
    "FundingError",
    "Gone",
    "InsufficientCredits",
    "Invalid",
    "Kind",
    "MaxCostReached",
    "MethodNotAllowed",
    "NodusError",
    "NotFound",
    "PackError",
    "Packed",
    "Page",
    "Retry",
    "ServerError",
    "TooManyRequests",
    "Transfer",
    "Unauthorized",
    "Unreachable",
    "Uploaded",
    "WaitTimeout",
    "WorkspaceFile",
    "finished",
    "load_objects",
    "pack_dir",
    "phase_in",
    "read_config_file",
    "settled",
    "succeeded",
    "write_context",
]
