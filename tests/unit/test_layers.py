"""The package's layers, enforced: the protocol core does no I/O and knows nothing above it,
policy/ does only the I/O listed here, runtime/ knows nothing of trio/, and no module imports
itself back through others (no import cycle, not even one closed through TYPE_CHECKING)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "reactor_fabric"


def import_statements(path: Path, root: Path = PACKAGE.parent) -> Iterator[tuple[str, list[str]]]:
    """Each import of a source file below ``root`` as (module, names), the module absolute
    (relative imports resolved): ``import a.b`` is ("a.b", []), ``from .x import y`` in package
    p is ("p.x", ["y"]). Every import statement counts, those under ``if TYPE_CHECKING:`` and
    inside functions too."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                assert node.module is not None
                module = node.module
            yield module, [alias.name for alias in node.names]


def imports_of(path: Path) -> set[str]:
    """Every module a source file imports, absolute (relative imports resolved)."""
    return {module for module, _names in import_statements(path)}


def imported_modules(path: Path, root: Path = PACKAGE.parent) -> set[str]:
    """What a source file may import: each module, and for ``from a import b`` also ``a.b``
    (a submodule when there is one, else a name of ``a``)."""
    found: set[str] = set()
    for module, names in import_statements(path, root):
        found.add(module)
        found.update(f"{module}.{name}" for name in names)
    return found


# What each pure layer may import besides the standard library (its own layer included).
ALLOWED = {
    "protocol": (
        "msgspec",
        # Sans-I/O HTTP/1.1 (bytes in, events out): the egress proxy's request head (h11), and
        # the server's requests (llhttp, through httptools: protocol/http1.py says why).
        "h11",
        "httptools",
        "reactor_fabric._errors",
        "reactor_fabric._reasons",
        "reactor_fabric.protocol",
        "reactor_fabric.discovery",
    ),
    # The ranking engine: pure computation over a catalog (its stemmer and tokenizer included).
    "discovery": ("snowballstemmer", "tiktoken", "reactor_fabric.discovery"),
}
IO_MODULES = ("trio", "socket", "threading", "asyncio", "subprocess", "docker", "selectors")
# One module of the discovery layer holds state across threads: the tokenizer loads its
# encoding only while counts need it and drops it after (a lock, as indexes are built in worker
# threads; the freed memory given back to the system by the allocator's module, no I/O).
DISCOVERY_EXCEPTIONS = {"tokens.py": ("threading", "reactor_fabric._allocator")}


@pytest.mark.parametrize("path", sorted((PACKAGE / "protocol").glob("*.py")), ids=lambda p: p.name)
def test_the_protocol_layer_imports_nothing_that_does_io(path: Path) -> None:
    for module in imports_of(path):
        top = module.split(".")[0]
        assert top not in IO_MODULES, f"{path.name} imports {module}"
        if top == "reactor_fabric" or top not in _stdlib():
            assert module.startswith(ALLOWED["protocol"]), f"{path.name} imports {module}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "discovery").glob("*.py")), ids=lambda p: p.name)
def test_the_discovery_layer_imports_nothing_that_does_io_nor_any_layer_above(path: Path) -> None:
    for module in imports_of(path):
        if module in DISCOVERY_EXCEPTIONS.get(path.name, ()):
            continue
        top = module.split(".")[0]
        assert top not in IO_MODULES, f"{path.name} imports {module}"
        if top == "reactor_fabric" or top not in _stdlib():
            assert module.startswith(ALLOWED["discovery"]), f"{path.name} imports {module}"


def _stdlib() -> frozenset[str]:
    return frozenset(sys.stdlib_module_names)


def test_the_import_reader_sees_a_trio_import_when_there_is_one(tmp_path: Path) -> None:
    # The check above must be able to fail.
    fake = PACKAGE / "protocol" / "__probe_for_layers_test__.py"
    fake.write_text("import trio\nfrom ..runtime import base\n")
    try:
        assert {"trio", "reactor_fabric.runtime"} <= imports_of(fake)
    finally:
        fake.unlink()


# --- policy/: rules, and exactly this much I/O ------------------------------------------------

# What policy/ may import of the package: nothing that runs containers, serves clients or keeps
# the orchestrator's state (runtime/, trio/, observe/), so that its rules hold whoever calls them.
ALLOWED["policy"] = (
    "reactor_fabric._errors",
    "reactor_fabric._reasons",
    "reactor_fabric.config",
    "reactor_fabric.policy",
    "reactor_fabric.protocol",
    # PyJWT's signature checks (computation only: its PyJWKClient, which fetches, is not
    # used here; see the test below).
    "jwt",
)
# The standard library's ways out of the process (files and descriptors, users, the network,
# threads, other processes), whose uses in policy/ are checked name by name below.
SYSTEM_MODULES = (
    *IO_MODULES,
    "os",
    "posixpath",
    "pathlib",
    "io",
    "pwd",
    "grp",
    "shutil",
    "tempfile",
    "fcntl",
    "select",
    "signal",
    "mmap",
    "ctypes",
    "multiprocessing",
    "urllib.request",
    "http.client",
    "ssl",
)
# Names in those modules that reach nothing: constants (in capitals, e.g. os.O_PATH), path
# arithmetic on strings, an errno's text, a stat result's type.
HARMLESS = frozenset({"join", "normpath", "basename", "dirname", "split", "isabs", "sep"})
HARMLESS |= {"strerror", "stat_result"}

# The I/O each module of policy/ does, exactly: the test fails on a use not listed here, and on
# a listed one no longer used (so this stays the truth). A module not named does none.
POLICY_IO: dict[str, frozenset[str]] = {
    # Pinning a mount source: the validated path walked one component at a time by descriptor
    # (O_PATH, never following a link), what it holds stat'ed, read access checked through
    # /proc/self/fd, named to the engine as /proc/PID/fd/N, the descriptors closed once under
    # a lock (a cancelled start releases its pins from a worker thread); the engines' sockets
    # are recognised by stat.
    "pinning.py": frozenset(
        {"os.open", "os.fstat", "os.access", "os.getpid", "os.close", "os.stat", "threading.Lock"}
    ),
    # Validation resolves a source (symlinks followed) and checks it exists, through
    # injectables (the tests use real symlinks); where the engines' sockets may be comes from
    # the environment and this process's uid.
    "mounts.py": frozenset({"os.path.realpath", "os.path.exists", "os.environ", "os.getuid"}),
    # Who a server runs as: a uid's user name (NSS) and this process's own ids.
    # and, for secret-bearing servers, an id no account, group or subordinate range holds.
    "accounts.py": frozenset({"pwd.getpwuid", "grp.getgrgid", "os.getuid", "os.getgid", "open"}),
    # Whether a container's owner still lives: this host's name, a process's start time from
    # /proc/PID/stat (a Path), an area's owner.json (open).
    "owner.py": frozenset({"socket.gethostname", "pathlib.Path", "open"}),
    # Who owns the listener the stdio bridge reached: this network namespace's TCP tables
    # (/proc/net/tcp, tcp6).
    "listener_owner.py": frozenset({"open"}),
}


def system_uses(path: Path) -> set[str]:
    """The names a source file uses from SYSTEM_MODULES (``os.open``, ``pathlib.Path``), and
    ``open`` for the builtin, referenced anywhere (called or passed on), HARMLESS ones left out."""
    tree = ast.parse(path.read_text())
    bound: dict[str, str] = {}  # local name → what it is, e.g. "Path" → "pathlib.Path"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname is not None:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module is not None:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    found: set[str] = set()

    def dotted(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Attribute | ast.Name):
            name = dotted(node)
            if name is not None:
                found.add(name)
                return  # the longest name wins: os.path.realpath, not os
            if isinstance(node, ast.Name) and node.id == "open":
                found.add("open")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)

    def is_system(name: str) -> bool:
        if name == "open":
            return True
        return any(name == m or name.startswith(m + ".") for m in SYSTEM_MODULES)

    def harmless(name: str) -> bool:
        last = name.rsplit(".", 1)[-1]
        return last.isupper() or last in HARMLESS

    return {name for name in found if is_system(name) and not harmless(name)}


# Its subpackage of container spec parts (policy/container_parts/) included.
POLICY_MODULES = sorted((PACKAGE / "policy").rglob("*.py"))


def policy_name(path: Path) -> str:
    """A policy module as POLICY_IO names it: its path below policy/ (``mounts.py``,
    ``container_parts/mounts.py``)."""
    return str(path.relative_to(PACKAGE / "policy"))


@pytest.mark.parametrize("path", POLICY_MODULES, ids=policy_name)
def test_the_policy_layer_imports_nothing_above_it(path: Path) -> None:
    # trio, docker and the like are not in the standard library: refused here. What it uses of
    # the standard library's I/O is checked name by name (below).
    for module in imports_of(path):
        top = module.split(".")[0]
        if top == "reactor_fabric" or top not in _stdlib():
            assert module.startswith(ALLOWED["policy"]), f"{path.name} imports {module}"


def test_the_policy_layer_uses_no_part_of_pyjwt_that_fetches() -> None:
    for path in POLICY_MODULES:
        assert "PyJWKClient" not in path.read_text(), path.name


@pytest.mark.parametrize("path", POLICY_MODULES, ids=policy_name)
def test_the_policy_layer_does_exactly_the_io_listed_for_it(path: Path) -> None:
    assert system_uses(path) == POLICY_IO.get(policy_name(path), frozenset())


def test_every_module_with_listed_io_exists() -> None:
    assert set(POLICY_IO) <= {policy_name(path) for path in POLICY_MODULES}


def test_the_io_reader_sees_what_a_module_does_with_the_system(tmp_path: Path) -> None:
    # The check above must be able to fail, however a module reaches the system.
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import os\n"
        "import os.path as osp\n"
        "from pathlib import Path\n"
        "from socket import socket as make_socket\n"
        "\n"
        "def f(p: str, flags: int = os.O_RDONLY) -> object:\n"
        "    os.unlink(os.path.join(p, 'x'))\n"
        "    make_socket()\n"
        "    return Path(p).read_text(), open(p), osp.exists, os.strerror(1)\n"
    )
    assert system_uses(planted) == {
        "os.unlink",
        "socket.socket",
        "pathlib.Path",
        "open",
        "os.path.exists",
    }


# --- runtime/ below trio/ ---------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted((PACKAGE / "runtime").rglob("*.py")), ids=lambda p: p.name)
def test_the_runtime_layer_imports_nothing_from_the_trio_layer(path: Path) -> None:
    # trio the library is fine; the package's trio/ layer uses runtime/, never the reverse.
    for module in imported_modules(path):
        assert not module.startswith("reactor_fabric.trio"), f"{path.name} imports {module}"


# --- workspace/: blocking file and git I/O, below everything that schedules it ---------------

# What workspace/ may import of the package: the errors it raises and nothing that runs
# containers, serves clients or schedules work (it runs in worker threads; trio/ calls it).
WORKSPACE_MAY_IMPORT = (
    "reactor_fabric._errors",
    "reactor_fabric._reasons",
    "reactor_fabric.workspace",
)


@pytest.mark.parametrize("path", sorted((PACKAGE / "workspace").glob("*.py")), ids=lambda p: p.name)
def test_the_workspace_layer_imports_no_trio_and_nothing_of_the_layers_that_call_it(
    path: Path,
) -> None:
    for module in imports_of(path):
        top = module.split(".")[0]
        assert top not in ("trio", "docker", "asyncio"), f"{path.name} imports {module}"
        if top == "reactor_fabric" or top not in _stdlib():
            assert module.startswith(WORKSPACE_MAY_IMPORT), f"{path.name} imports {module}"


# The runtime modules that only translate (a container spec into an engine's payload, an
# engine's failures into the product's errors, bytes into frames): tested without an engine, so
# they do no I/O and reach no trio, not even through the package's modules they import. Of the
# engines' client libraries they use the payload and exception types only.
RUNTIME_TRANSLATIONS = (
    "docker_errors.py",
    "docker_framing.py",
    "docker_payload.py",
    "kubernetes_errors.py",
    "kubernetes_manifests.py",
)
TRANSLATIONS_MAY_IMPORT = ("docker.types", "docker.errors", "requests.exceptions")


@pytest.mark.parametrize("name", RUNTIME_TRANSLATIONS)
def test_the_runtimes_translations_import_nothing_that_does_io(name: str) -> None:
    path = PACKAGE / "runtime" / name
    for module in imports_of(path):
        if module in TRANSLATIONS_MAY_IMPORT:
            continue
        assert module.split(".")[0] not in IO_MODULES, f"{name} imports {module}"
    graph = import_graph(PACKAGE)
    reached, todo = set(), [module_name(path, PACKAGE.parent)]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += graph[module]
    for module in sorted(reached):
        source = PACKAGE.parent.joinpath(*module.split("."))
        source = source / "__init__.py" if source.is_dir() else source.with_suffix(".py")
        assert "trio" not in {m.split(".")[0] for m in imports_of(source)}, (
            f"{name} reaches trio through {module}"
        )


# --- no import cycle ----------------------------------------------------------------------------


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path) -> dict[str, set[str]]:
    """Each module of ``package`` → the modules of it that it imports (TYPE_CHECKING imports
    and imports inside functions included: a cycle closed through them is still a cycle of the
    design, one moved import away from an ImportError)."""
    root = package.parent
    modules = {module_name(path, root): path for path in package.rglob("*.py")}
    return {
        name: {m for m in imported_modules(path, root) if m in modules and m != name}
        for name, path in modules.items()
    }


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's cycles, as its strongly connected components of more than one module
    (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = lowest[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                lowest[module] = min(lowest[module], lowest[imported])
            elif imported in on_stack:
                lowest[module] = min(lowest[module], index[imported])
        if lowest[module] == index[module]:
            component: list[str] = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                components.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(components)


def test_the_package_has_no_import_cycle() -> None:
    assert import_cycles(import_graph(PACKAGE)) == []


def test_the_cycle_finder_sees_a_cycle_closed_through_type_checking(tmp_path: Path) -> None:
    # The check above must be able to fail: a → c only for the type checker, c → b, b → a,
    # each written another way; d imports into the cycle without being part of it.
    package = tmp_path / "planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .c import C\n"
    )
    (package / "b.py").write_text("from . import a\n")
    (package / "c.py").write_text("import planted.b\n")
    (package / "d.py").write_text("from .a import A\nfrom planted import c\n")
    graph = import_graph(package)
    assert graph["planted.d"] == {"planted", "planted.a", "planted.c"}  # the package's too
    assert import_cycles(graph) == [["planted.a", "planted.b", "planted.c"]]


# Issue 49's bounds on size: a protocol module (a pure machine's part) at most 600 lines, any
# other module 700, no class over 25 methods (each grew past them once, then was split).
MAX_PROTOCOL_LINES, MAX_MODULE_LINES, MAX_METHODS = 600, 700, 25


def oversized(package: Path) -> list[str]:
    """The modules over their line bound and the classes over the method bound."""
    found = []
    for path in sorted(package.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        bound = MAX_PROTOCOL_LINES if path.parent.name == "protocol" else MAX_MODULE_LINES
        if lines > bound:
            found.append(f"{path.relative_to(package.parent)}: {lines} lines")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = [
                    b for b in node.body if isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
                if len(methods) > MAX_METHODS:
                    found.append(f"{node.name}: {len(methods)} methods")
    return found


def test_no_module_and_no_class_outgrows_its_bound() -> None:
    assert oversized(PACKAGE) == []


def test_the_size_check_sees_a_module_and_a_class_too_large(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "protocol").mkdir(parents=True)
    (tmp_path / "pkg" / "protocol" / "long.py").write_text("x = 1\n" * 601)
    methods = "".join(f"    def m{index}(self) -> None: ...\n" for index in range(26))
    (tmp_path / "pkg" / "big.py").write_text(f"class Big:\n{methods}")
    assert oversized(tmp_path / "pkg") == ["Big: 26 methods", "pkg/protocol/long.py: 601 lines"]


def test_a_serving_orchestrator_without_sign_in_imports_neither_pyjwt_nor_httpx() -> None:
    """PyJWT with cryptography, and httpx, are 20 MB of an orchestrator's memory: only
    auth.mode: oidc imports them (trio/serve.py, trio/authentication.py)."""
    program = (
        "import sys, reactor_fabric._cli, reactor_fabric._serve_cli, reactor_fabric.trio.serve, "
        "reactor_fabric.trio.app, reactor_fabric.policy.sign_in\n"
        "print(sorted({'jwt', 'cryptography', 'httpx'} & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
