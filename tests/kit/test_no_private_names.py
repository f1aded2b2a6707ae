"""No production code reaches into a third-party library's private names (issue #19).

A private name (``_pending_queue``, ``Msg._client``) is no part of a library's contract: a patch release
may rename it, and the code that used it breaks, or worse, silently stops doing what it did. The pins in
the lock make that a surprise at upgrade time rather than never.

Found statically, in every ``.py`` under ``libs/*/src`` and ``services/*/src`` (what ``ast`` can see; the
practical version, not a type checker):

* ``import x._y`` / ``from x._y import z`` / ``from x import _y`` of a third-party module;
* ``X._y`` (also in ``getattr(X, "_y")`` and its kin) where ``X`` is a name bound by a third-party import;
* a deny-list of private attributes known to be used on objects that nats-py, FastAPI and Starlette hand
  out (``_pending_queue``, ``_client``, ...), on any object: those objects are not names of an import,
  so only their attributes' names give them away. ``self.<name>`` is a class's own attribute, unless the
  class derives from a third-party one;
* assigning Starlette's ``middleware_stack`` (a public name, but the app builds it itself on first call).

Third-party: neither first-party (``nodus_*``, relative imports) nor the standard library (whose few
``_``-names in use, such as ``os._exit``, are documented API).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY_PREFIX = "nodus_"
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}
DENIED_ATTRIBUTES = frozenset({"_pending_queue", "_client", "_route_selected", "_native_telemetry"})
DENIED_ASSIGNMENTS = frozenset({"middleware_stack"})
ATTRIBUTE_BUILTINS = frozenset({"getattr", "hasattr", "setattr", "delattr"})
OWN = frozenset({"self", "cls"})


def production_files() -> list[Path]:
    return sorted([*ROOT.glob("libs/*/src/**/*.py"), *ROOT.glob("services/*/src/**/*.py")])


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_third_party(module: str) -> bool:
    top = module.split(".")[0]
    return not top.startswith(FIRST_PARTY_PREFIX) and top not in STDLIB


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _third_party_names(tree: ast.Module) -> set[str]:
    """Names bound by third-party imports anywhere in the module."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names if is_third_party(a.name)}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and is_third_party(node.module or ""):
            names |= {a.asname or a.name for a in node.names}
    return names


class PrivateNames(ast.NodeVisitor):
    """Collects ``(line, what)`` for each use of a third-party private name in one module."""

    def __init__(self, tree: ast.Module) -> None:
        self.imported = _third_party_names(tree)
        self.found: list[tuple[int, str]] = []
        self._subclassing: list[bool] = []  # per enclosing class: does it derive from a third-party one?

    def _flag(self, node: ast.AST, what: str) -> None:
        self.found.append((getattr(node, "lineno", 0), what))

    def _is_imported(self, node: ast.expr) -> bool:
        root = _root(node)
        return isinstance(root, ast.Name) and root.id in self.imported

    def _is_own(self, obj: ast.expr) -> bool:
        """``self.x`` of a class that is not a third-party one's subclass: the class's own attribute."""
        in_subclass = bool(self._subclassing) and self._subclassing[-1]
        return isinstance(obj, ast.Name) and obj.id in OWN and not in_subclass

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if is_third_party(alias.name) and any(map(is_private, alias.name.split("."))):
                self._flag(node, f"import {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or not is_third_party(module):
            return
        if any(map(is_private, module.split("."))):
            self._flag(node, f"from {module} import ...")
        for alias in node.names:
            if is_private(alias.name):
                self._flag(node, f"from {module} import {alias.name}")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._subclassing.append(any(self._is_imported(base) for base in node.bases))
        self.generic_visit(node)
        self._subclassing.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._check_attribute(node, node.value, node.attr)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func, args = node.func, node.args
        if isinstance(func, ast.Name) and func.id in ATTRIBUTE_BUILTINS and len(args) >= 2:
            name = args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                self._check_attribute(node, args[0], name.value)
        self.generic_visit(node)

    def _check_attribute(self, node: ast.AST, obj: ast.expr, attr: str) -> None:
        of_an_import = is_private(attr) and self._is_imported(obj)
        denied = attr in DENIED_ATTRIBUTES and not self._is_own(obj)
        if of_an_import or denied:
            self._flag(node, f"{ast.unparse(obj)}.{attr}")

    def visit_Assign(self, node: ast.Assign) -> None:
        self._check_targets(node.targets)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_targets([node.target])
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_targets([node.target])
        self.generic_visit(node)

    def _check_targets(self, targets: list[ast.expr]) -> None:
        for target in targets:
            if not isinstance(target, ast.Attribute) or target.attr not in DENIED_ASSIGNMENTS:
                continue
            if not self._is_own(target.value):
                self._flag(target, f"{ast.unparse(target)} = ...")


def private_names(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    finder = PrivateNames(tree)
    finder.visit(tree)
    return sorted(finder.found)


def findings() -> Iterator[str]:
    for path in production_files():
        for line, what in private_names(path.read_text()):
            yield f"{path.relative_to(ROOT)}:{line}: {what}"


def test_production_code_uses_no_private_name_of_a_third_party_library() -> None:
    assert production_files(), "found no production code: the globs are wrong"
    found = list(findings())
    assert not found, "private names of third-party libraries (use their public API):\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("from nats.aio.client import _private", "from nats.aio.client import _private"),
        ("from starlette._utils import is_async_callable", "from starlette._utils import ..."),
        ("import nats._internal", "import nats._internal"),
        ("from nats.aio.client import Client as NATS\nNATS._process_msg", "NATS._process_msg"),
        ("import nats\nnats.aio.client._CRLF_", "nats.aio.client._CRLF_"),
        ("import nats\nhasattr(nats, '_hidden')", "nats._hidden"),
        ("sub._pending_queue = mux", "sub._pending_queue"),
        ("def f(msg):\n    return msg._client.publish", "msg._client"),
        ("getattr(route, '_route_selected', None)", "route._route_selected"),
        ("app.middleware_stack = None", "app.middleware_stack = ..."),
        (
            "from starlette.applications import Starlette\n"
            "class App(Starlette):\n    def build(self):\n        self.middleware_stack = None",
            "self.middleware_stack = ...",
        ),
        (
            "import nats.aio.subscription as s\n"
            "class Sub(s.Subscription):\n    def f(self):\n        return self._pending_queue",
            "self._pending_queue",
        ),
    ],
)
def test_the_check_finds_each_kind_of_use(source: str, what: str) -> None:
    assert [w for _, w in private_names(source)] == [what]


@pytest.mark.parametrize(
    "source",
    [
        "from nodus_kit import tracing\ntracing._request_id.reset(token)",  # first-party
        "from . import _sibling",  # relative: first-party
        "import os\nos._exit(1)",  # the standard library's documented API
        "import nats\nnats.__version__",  # a dunder is public
        "class Client:\n    def __init__(self, c):\n        self._client = c",  # a class's own attribute
        "from nats.aio.client import Client as NATS\nNATS.request",
        "state = {}\nstate['_client'] = 1",  # a key, not an attribute
    ],
)
def test_the_check_leaves_public_and_first_party_names_alone(source: str) -> None:
    assert private_names(source) == []
