"""Which files a session's inputs read and write, found statically: each string literal that names a data file,
classified by the call it is passed to, with the folder the session stood in when it ran.

A literal passed to a reader (`pd.read_csv(p)`, `open(p)` or `open(p, 'rb')`, `np.load(p)`, `Image.open(p)`,
`h5py.File(p, 'r')`, `json.load(open(p))`) is a read; to a writer (`df.to_csv(p)`, `open(p, 'w')`, `np.save(p, a)`,
`savefig(p)`, `pickle.dump(x, open(p, 'wb'))`) a write; anywhere else (an assignment, an f-string, a shell command,
a function of the developer's own) its use is unknown. A name bound to a literal (`path = 'data/x.csv'`) and then
passed to a reader or writer is that literal. An input that may make files no literal names (a shell command, `%run`,
an archive extracted, a write to a computed path) is a `MAKES` use: after it, a file the repository never held may be
one the session made. A path's own methods (`Path(p).read_text()`) and `%%writefile p` count as calls on `p`; a read
inside a function (it runs when called), a `try` or an `if os.path.exists(...)` is of unknown use. `%cd` and
`os.chdir` to a literal folder move the folder later paths resolve against; to anything else, that folder is unknown
from there on (`cwd` None). Nothing here runs or opens anything.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Sequence

from themisto.ingest.compiles import parse_cell

READ, WRITE, UNKNOWN, MAKES, IMPORT = "read", "write", "unknown", "makes", "import"

# Suffixes of the data files sessions read; a string literal ending so is a file the session may open.
DATA_SUFFIXES = frozenset({".csv", ".tsv", ".txt", ".json", ".xlsx", ".xls", ".parquet", ".pkl", ".pickle", ".npy",
                           ".npz", ".h5", ".hdf5", ".hdf", ".dat", ".xml", ".sqlite", ".db", ".feather", ".mat",
                           ".zip", ".gz", ".tif", ".tiff", ".png", ".jpg", ".jpeg", ".nc", ".shp", ".geojson",
                           ".yaml", ".yml", ".jsonl", ".log", ".fits", ".sav", ".dta", ".ods", ".arff"})
# Calls that read a file named by any of their arguments (a name, or a name's prefix).
_READERS = frozenset({"load", "loadtxt", "genfromtxt", "fromfile", "loadmat", "imread", "ExcelFile", "read", "parse",
                      "textFile"})
_READER_PREFIXES = ("read_", "load_", "open_")
# Calls that write a file named by any of their arguments; those of `_WRITES_FILE` write one even when its name is
# computed (`df.to_csv(out)`), which makes any later read of a file the repository never held possibly the session's.
_WRITES_FILE = frozenset({"to_csv", "to_excel", "to_pickle", "to_parquet", "to_hdf", "to_feather", "to_file",
                          "to_netcdf", "to_stata", "savefig", "save", "savez", "savez_compressed", "savetxt", "imsave",
                          "imwrite", "tofile", "urlretrieve", "download", "retrieve", "ExcelWriter", "write_csv",
                          "write_parquet", "save_model", "save_weights"})
_WRITERS = _WRITES_FILE | {"dump", "to_json", "to_html", "to_latex", "to_xml", "write_image", "write_html"}
# Calls whose mode argument decides (its position after the path, and the mode when none is given).
_OPENERS = {"open": "r", "File": "r", "ZipFile": "r", "HDFStore": "a", "Dataset": "r"}
# A path object's own methods (`Path('x.csv').read_text()`): the path is the receiver, not an argument.
_PATH_METHODS = {"read_text": READ, "read_bytes": READ, "write_text": WRITE, "write_bytes": WRITE, "touch": WRITE}
_UNPACKS = frozenset({"extractall", "unpack_archive"})  # files whose names no literal gives
_COPIES = frozenset({"copy", "copyfile", "copy2", "move", "rename"})  # the first argument read, the second written
_PATH_WRAPPERS = frozenset({"Path", "PurePath", "PosixPath", "PurePosixPath", "join", "abspath", "normpath", "str"})
_RUNS = frozenset({"exec", "execfile", "call", "check_call", "check_output", "Popen"})
_RUN_MAGICS = frozenset({"run", "bash", "sh", "script", "system", "sx"})
_EXISTS = frozenset({"exists", "isfile", "is_file", "glob", "listdir"})
# Shell commands that make no file (a redirect aside): `!ls`, `!pip install x` leave the folder as it was.
_QUIET_SHELL = frozenset({"ls", "ll", "pwd", "cat", "head", "tail", "wc", "pip", "pip3", "conda", "echo", "which",
                          "du", "df", "nvidia-smi", "free", "nproc", "date", "whoami", "tree", "file", "grep", "env",
                          "hostname", "uname", "python", "jupyter", "top", "ps", "less", "more", "history"})
_BARE_CD = re.compile(r"^\s*%?cd(?:\s+(\S.*?))?\s*$", re.MULTILINE)


@dataclass(frozen=True)
class FileUse:
    """One use of a file by input `index`: READ, WRITE, UNKNOWN (a data-file literal in no known call), MAKES (files
    no literal names may appear; `path` empty) or IMPORT (`path`: a top-level module name, which may be the
    repository's own file), with the folder the session stood in, relative to where it started (None: unknown)."""

    index: int
    kind: str
    path: str
    cwd: str | None = ""


def looks_like_data_file(text: str) -> bool:
    text = text.strip()
    return (0 < len(text) < 300 and "\n" not in text and "://" not in text
            and PurePosixPath(text.replace("\\", "/")).suffix.lower() in DATA_SUFFIXES)


def file_uses(codes: Sequence[str]) -> list[list[FileUse]]:
    """Per input of `codes` (in order), its file uses in the order they appear."""
    tracker = _Tracker()
    return [tracker.uses(index, code) for index, code in enumerate(codes)]


def imported(tree: ast.AST) -> list[str]:
    """Top-level module names the tree imports (relative imports left out: they name the repository's own files)."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module.split(".")[0])
    return names


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _mode(call: ast.Call, default: str, position: int = 1) -> str | None:
    """A call's literal mode argument (positional at `position`, or `mode=`), its default where none, None if
    computed."""
    node = call.args[position] if len(call.args) > position else \
        next((k.value for k in call.keywords if k.arg == "mode"), None)
    if node is None:
        return default
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _by_mode(mode: str) -> str:
    return WRITE if mode[:1] in ("w", "a", "x") else READ  # "r", "rb", "r+", "readonly", "update": read


def _kind(call: ast.Call) -> str | None:
    """READ or WRITE for a call that reads or writes the files its arguments name; None for any other call."""
    name = _name(call.func)
    if name in _OPENERS:
        mode = _mode(call, _OPENERS[name])
        if mode is None:
            return None
        return _by_mode(mode)
    if name in _WRITERS:
        return WRITE
    if name in _READERS or name.startswith(_READER_PREFIXES):
        return READ
    return None


class _Tracker:
    """What a session's inputs have done so far that the next one's paths depend on: the folder it stands in, and the
    names bound to a data-file literal."""

    def __init__(self) -> None:
        self.cwd: str | None = ""
        self.names: dict[str, str] = {}

    def uses(self, index: int, code: str) -> list[FileUse]:
        tree = parse_cell(code)
        if tree is None:  # `cd data` typed bare (automagic) is not Python; nothing else of it can be read
            for match in _BARE_CD.finditer(code):
                self._chdir(match.group(1))
            return []
        out: list[FileUse] = []
        for statement in tree.body:
            try:
                out += self._statement(index, statement)
            except RecursionError:  # a stranger's expression nested past what this reader follows: left unread
                continue
        return out

    def _statement(self, index: int, statement: ast.stmt) -> list[FileUse]:
        nodes = list(ast.walk(statement))
        found: list[tuple[tuple[int, int], FileUse]] = []
        consumed: set[int] = set()
        guarded = _guarded(nodes)
        makes = False
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [((node.lineno, node.col_offset), FileUse(index, IMPORT, name, self.cwd))
                          for name in imported(node)]
            if not isinstance(node, ast.Call):
                continue
            name = _name(node.func)
            if name == "run_line_magic" and _literal_args(node, 2) and node.args[0].value == "cd":
                self._chdir(node.args[1].value)
            elif name == "chdir":
                self._chdir(self._literal(node.args[0]) if node.args else None)
            makes = makes or self._makes(node, name)
            for use, path, at in self._named(node, name):
                consumed |= {id(n) for n in ast.walk(at)}
                use = UNKNOWN if use == READ and id(node) in guarded else use
                found.append(((at.lineno, at.col_offset), FileUse(index, use, path, self.cwd)))
            kind = _kind(node)
            for position, argument in enumerate(list(node.args) + [k.value for k in node.keywords]):
                use = (READ if position == 0 else WRITE) if name in _COPIES and position < 2 else kind
                path = self._literal(argument) if use is not None else None
                if path is None or not looks_like_data_file(path):
                    continue
                consumed |= {id(n) for n in ast.walk(argument)}
                use = UNKNOWN if use == READ and id(node) in guarded else use
                found.append(((argument.lineno, argument.col_offset), FileUse(index, use, path, self.cwd)))
        for node in nodes:
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in consumed \
                    and looks_like_data_file(node.value):
                found.append(((node.lineno, node.col_offset),
                              FileUse(index, UNKNOWN, node.value.strip().replace("\\", "/"), self.cwd)))
        self._bind(statement, nodes)
        out = [use for _, use in sorted(found, key=lambda pair: pair[0])]
        return out + [FileUse(index, MAKES, "", self.cwd)] if makes else out

    def _literal(self, node: ast.expr) -> str | None:
        """The path an argument names when it is a literal, a name bound to one, or literals joined
        (`os.path.join('data', 'x.csv')`, `Path('data') / 'x.csv'`); else None."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value.strip().replace("\\", "/")
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, ast.Call) and _name(node.func) in _PATH_WRAPPERS and node.args and not node.keywords:
            parts = [self._literal(a) for a in node.args]
            return None if None in parts else "/".join(p for p in parts if p)  # type: ignore[misc]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left, right = self._literal(node.left), self._literal(node.right)
            return f"{left}/{right}" if left is not None and right is not None else None
        return None

    def _named(self, call: ast.Call, name: str) -> list[tuple[str, str, ast.expr]]:
        """(kind, path, node) of a file a call names outside its arguments: the receiver of a path's own method
        (`Path('x.csv').read_text()`, `.open('w')`), or the file `%%writefile x.csv` writes."""
        if isinstance(call.func, ast.Attribute) and (name in _PATH_METHODS or name == "open"):
            path = self._literal(call.func.value)
            if path is not None and looks_like_data_file(path):
                if name != "open":
                    return [(_PATH_METHODS[name], path, call.func.value)]
                mode = _mode(call, "r", position=0)
                return [] if mode is None else [(_by_mode(mode), path, call.func.value)]
        if name == "run_cell_magic" and _literal_args(call, 2) and call.args[0].value == "writefile" \
                and call.args[1].value.split():
            return [(WRITE, call.args[1].value.split()[-1], call.args[1])]
        return []

    def _makes(self, call: ast.Call, name: str) -> bool:
        """Whether `call` may make files that no literal names: a shell command (but a quiet one), a script run, an
        archive extracted, or a write to a computed path."""
        if name in ("system", "getoutput"):
            if not (call.args and isinstance(call.args[0], ast.Constant)):
                return True  # a command computed at run time
            command = str(call.args[0].value)
            return not command.split() or command.split()[0] not in _QUIET_SHELL or ">" in command
        if name in _RUNS or name in _UNPACKS or (name in ("run_line_magic", "run_cell_magic") and call.args
                             and isinstance(call.args[0], ast.Constant) and call.args[0].value in _RUN_MAGICS):
            return True
        if name in _OPENERS:
            paths = call.args[:1] + [k.value for k in call.keywords if k.arg in ("file", "name", "filename")]
            return _kind(call) != READ and not any(self._literal(a) is not None for a in paths)
        if name in _WRITES_FILE:
            paths = list(call.args) + [k.value for k in call.keywords]
            return bool(paths) and not any(looks_like_data_file(self._literal(a) or "") for a in paths)
        return False

    def _chdir(self, target: str | None) -> None:
        """Move the session's folder to `target` (relative to where it stands); unknown for anything but a plain
        relative path."""
        target = (target or "").strip().strip("'\"")
        if self.cwd is None or not target or target[0] in "/~-$" or re.match(r"^[A-Za-z]:", target) or "{" in target:
            self.cwd = None
            return
        self.cwd = PurePosixPath(self.cwd, target.replace("\\", "/")).as_posix() if self.cwd else target

    def _bind(self, statement: ast.stmt, nodes: list[ast.AST]) -> None:
        """Names the statement (whose nodes are `nodes`) binds: to a data-file literal (remembered), or to anything
        else (forgotten)."""
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name):
            path = self._literal(statement.value)
            if path is not None and looks_like_data_file(path):
                self.names[statement.targets[0].id] = path
                return
        for node in nodes:
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                self.names.pop(node.id, None)


def _guarded(nodes: list[ast.AST]) -> set[int]:
    """Ids of the nodes (of `nodes`, a statement's) whose read may never happen or whose failure the developer caught:
    inside a function or a lambda (run only when called), a `try` body, or an `if` that asks whether a file exists."""
    out: set[int] = set()
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            out |= {id(n) for n in ast.walk(node)}
        elif isinstance(node, ast.Try):
            out |= {id(n) for part in node.body for n in ast.walk(part)}
        elif isinstance(node, ast.If) and any(isinstance(n, ast.Call) and _name(n.func) in _EXISTS
                                              for n in ast.walk(node.test)):
            out |= {id(n) for n in ast.walk(node)}
    return out


def _literal_args(call: ast.Call, n: int) -> bool:
    return len(call.args) >= n and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args[:n])
