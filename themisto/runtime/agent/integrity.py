"""A branch child's guard against its own candidate: closed descriptors, sealed hashing, and alarms on tampering.

In-process forgery cannot be ruled out, so this makes it hard and visible: the child keeps no descriptor it does not
need (the kernel's zmq sockets included), hashes the state with private copies of the hashing code (patching a
module's globals or builtins changes nothing), and an audit hook reports every touch of the machinery (gc object
walks, ctypes or frame access from the cell's own code, /proc, signals, killing processes) at once to the monitor,
which the candidate cannot reach. What the candidate patched is listed after it ran. Runs inside the kernel:
standard library only.
"""

from __future__ import annotations

import builtins
import json
import os
import signal
import sys
import types
from typing import Any, Callable

# Events that are suspicious wherever they come from: nothing a notebook cell needs walks every object or frame.
_ALWAYS = frozenset({"gc.get_objects", "sys._current_frames", "sys.settrace", "sys.setprofile", "os.kill",
                     "os.killpg", "signal.pthread_kill"})
# Suspicious when the cell's own code does it (pandas asks gc for an object's referents, legitimately).
_FROM_CELL = frozenset({"gc.get_referrers", "gc.get_referents"})
# Frame objects reached from the cell's own code (libraries format tracebacks through them, legitimately).
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "f_back", "gi_frame", "cr_frame", "ag_frame", "f_globals", "f_locals"})
# /proc files that hold the process's memory, mappings or descriptors.
_PROC_SECRETS = ("/mem", "/maps", "/smaps", "/pagemap", "/fd", "/fdinfo", "/map_files", "/environ", "/syscall")
CONTINUATION_PREFIX = "continuation: "
# Most distinct alarms one branch sends: enough to audit, never enough to fill the pipe.
_MAX_ALARMS = 32
ALARM_BYTES = 200


def close_inherited(keep: set[int]) -> None:
    """Close every descriptor but `keep`: the kernel's sockets and pipes must be out of the candidate's reach."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = soft if soft != resource.RLIM_INFINITY else 1 << 20
    start = 0
    for fd in sorted(keep) + [top]:
        if fd > start:
            os.closerange(start, min(fd, top))
        start = fd + 1


def _cell_file(filename: str) -> bool:
    """Whether code of this file name is a cell (IPython compiles cells to `<ipython-input-…>` or a temp file)."""
    return filename.startswith("<") or "/ipykernel_" in filename


def _caller_is_cell(depth: int = 2) -> bool:
    """Whether the nearest Python frame outside ctypes (which the event came from) runs a cell's own code."""
    frame = sys._getframe(depth)
    for _ in range(8):
        if frame is None:
            return False
        name = frame.f_code.co_filename
        if "/ctypes/" not in name:
            return _cell_file(name)
        frame = frame.f_back
    return False


def classify(event: str, args: tuple) -> str | None:
    """What the event says about the candidate, or None when it is ordinary."""
    if event in _ALWAYS:
        return event
    if (event in _FROM_CELL or event.startswith("ctypes.")) and _caller_is_cell(3):
        return event
    if event == "object.__getattr__" and len(args) > 1 and args[1] in _FRAME_ATTRIBUTES and _caller_is_cell(3):
        return f"frame access ({args[1]})"
    if event in ("open", "os.listdir", "os.scandir") and args:
        path = args[0]
        if isinstance(path, bytes):
            path = path.decode("utf-8", "replace")
        if isinstance(path, str) and path.startswith("/proc"):
            if any(part in path for part in _PROC_SECRETS) or _caller_is_cell(3):
                return f"{event} {path}"
    return None


class Alarm:
    """Sends one line per distinct alarm to the monitor on `fd`, at once; a tampered or closed channel kills the
    child, so silencing the alarm costs the candidate its result."""

    def __init__(self, fd: int):
        st = os.fstat(fd)
        self._fd, self._identity = fd, (st.st_dev, st.st_ino)
        # Bound now: a candidate that patches os or signal later changes nothing here.
        self._write, self._fstat, self._kill, self._pid = os.write, os.fstat, os.kill, os.getpid()
        self._sent: set[str] = set()
        # CONTINUATION_PREFIX while the developer's next cells run after the candidate: the host then counts only
        # the alarms the reference's own continuation did not raise (themisto.scoring.continuation).
        self.prefix = ""
        self.armed = False
        self._busy = False

    def __call__(self, what: str) -> None:
        what = self.prefix + what
        if what in self._sent or len(self._sent) >= _MAX_ALARMS:
            return
        self._sent.add(what)
        # A leading newline too: whatever the candidate wrote on this pipe stays a line of its own.
        line = ("\n" + what.replace("\n", " ")[:ALARM_BYTES] + "\n").encode("utf-8", "replace")
        try:
            st = self._fstat(self._fd)
            if (st.st_dev, st.st_ino) != self._identity:
                raise OSError("the alarm channel was replaced")
            self._write(self._fd, line)
        except OSError:
            self._kill(self._pid, signal.SIGKILL)

    def hook(self, event: str, args: tuple) -> None:
        """The audit hook (added once, it cannot be removed): classify while armed, never re-entered."""
        if not self.armed or self._busy:
            return
        self._busy = True
        try:
            what = classify(event, args)
            if what is not None:
                self(what)
        finally:
            self._busy = False


def _rebind(function: types.FunctionType, space: dict) -> types.FunctionType:
    copy = types.FunctionType(function.__code__, space, function.__name__, function.__defaults__,
                              function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    return copy


def seal(modules: list[types.ModuleType]) -> dict[str, dict]:
    """Private copies of the modules' namespaces (and of builtins) whose functions look every name up in the copies:
    what the candidate assigns to those modules' globals or to builtins afterwards is not seen by them."""
    private_builtins = dict(builtins.__dict__)
    spaces = {module.__name__: dict(vars(module)) for module in modules}
    for space in spaces.values():
        space["__builtins__"] = private_builtins
    for space in spaces.values():
        for key, value in list(space.items()):
            if isinstance(value, types.FunctionType) and value.__module__ in spaces:
                space[key] = _rebind(value, spaces[value.__module__])
    return spaces


def sealed_method(bound: types.MethodType, space: dict) -> types.MethodType:
    """`bound` with its function looking names up in a sealed module `space` (see `seal`)."""
    return types.MethodType(_rebind(bound.__func__, space), bound.__self__)


def json_encoder() -> Callable[[Any], str]:
    """A JSON encoder built from the C accelerator now, so a patched `json.dumps` or `JSONEncoder` cannot forge the
    report (what is not plain JSON is written as its str)."""
    from _json import encode_basestring_ascii, make_encoder

    text, join = str, "".join
    encoder = make_encoder(None, lambda value: text(value), encode_basestring_ascii, None, ":", ",", True, False,
                           False)
    return lambda value: join(encoder(value, 0))


# Modules whose namespaces a candidate has no reason to change; a changed entry is reported by name.
_WATCHED = ("builtins", "json", "json.encoder", "json.decoder", "hashlib", "struct", "mmap", "pickle", "gc", "os",
            "signal", "sys")


# Set by the interpreter or IPython on their own (the last error), not by a candidate's patching.
# The standard streams too: libraries wrap them (colorama), and what a cell prints is its own business.
_VOLATILE = frozenset({"last_type", "last_value", "last_traceback", "last_exc", "displayhook", "stdout", "stderr",
                       "stdin"})


def _watched_spaces() -> dict[str, dict]:
    spaces = {name: dict(vars(sys.modules[name])) for name in _WATCHED if name in sys.modules}
    for name, module in list(sys.modules.items()):
        if name.startswith("themisto") and module is not None:
            spaces[name] = dict(vars(module))
    return spaces


class Integrity:
    """What the candidate could tamper with, taken before it runs; `changes()` names what differs after."""

    def __init__(self, fds: list[int], handlers: list[int]):
        self.modules = dict(sys.modules)
        self.spaces = _watched_spaces()
        self.fds = {fd: self._identity(fd) for fd in fds}
        self.handlers = {number: signal.getsignal(number) for number in handlers}
        self._encoder_methods = dict(vars(json.JSONEncoder))

    @staticmethod
    def _identity(fd: int) -> tuple | None:
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def changes(self) -> list[str]:
        """What the candidate changed in the machinery, e.g. `patched json.dumps`, `sys.modules edited: numpy`."""
        found = []
        edited = sorted(name for name, module in self.modules.items() if sys.modules.get(name) is not module)
        if edited:
            found.append("sys.modules edited: " + ", ".join(edited[:5]))
        for name, before in self.spaces.items():
            module = self.modules.get(name)
            after = vars(module) if module is not None else {}
            patched = sorted(key for key, value in before.items()
                             if after.get(key, before) is not value and key not in _VOLATILE)
            if name not in ("sys", "builtins"):  # extension modules add their own entries (pybind11 does)
                patched += sorted(key for key in after if key not in before)
            if patched:
                found.append(f"patched {name}." + f", {name}.".join(patched[:5]))
        if dict(vars(json.JSONEncoder)) != self._encoder_methods:
            found.append("patched json.JSONEncoder")
        for fd, identity in self.fds.items():
            if self._identity(fd) != identity:
                found.append(f"descriptor {fd} replaced or closed")
        for number, handler in self.handlers.items():
            if signal.getsignal(number) is not handler:
                found.append(f"signal handler {signal.Signals(number).name} replaced")
        return found


# Calls that reach past the cell into the process: reported when the armed candidate makes them.
_WRAPPED = {"os": ("_exit", "dup2", "closerange"),
            "signal": ("signal", "setitimer", "alarm", "pthread_sigmask", "siginterrupt", "set_wakeup_fd")}


def _wrap(module: types.ModuleType, name: str, alarm: Alarm) -> None:
    original = getattr(module, name, None)
    if original is None:
        return
    what = f"{module.__name__}.{name}"

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if alarm.armed:
            alarm(what)
        return original(*args, **kwargs)

    setattr(module, name, wrapped)


class Guard:
    """The candidate's watcher in a branch child: alarms on `alarm_fd`, armed only while candidate code runs."""

    def __init__(self, alarm_fd: int):
        self.fd = alarm_fd
        self.alarm = Alarm(alarm_fd)
        sys.addaudithook(self.alarm.hook)
        for module_name, names in _WRAPPED.items():
            for name in names:
                _wrap(sys.modules[module_name], name, self.alarm)
        self.integrity: Integrity | None = None

    def arm(self) -> None:
        """Take the machinery's picture and start reporting. Before every cell: the child re-installs its capture
        between cells, and what a cell changed is reported when it is disarmed."""
        self.integrity = Integrity([0, 1, 2, self.fd], [signal.SIGINT, signal.SIGTERM])
        self.alarm.armed = True

    def disarm(self) -> None:
        """Stop reporting events, and report what the cell changed in the machinery since `arm()`."""
        self.alarm.armed = False
        self.check()

    def check(self) -> None:
        """Report what the candidate changed in the machinery since `arm()`."""
        if self.integrity is not None:
            for change in self.integrity.changes():
                self.alarm(change)


def read_alarms(data: bytes) -> list[str]:
    """The distinct alarms of a branch, in order, from what its alarm channel carried (anything on it counts)."""
    found: list[str] = []
    for line in data.decode("utf-8", "replace").split("\n"):
        line = line.strip()[:ALARM_BYTES]
        if line and line not in found:
            found.append(line if line.isprintable() else repr(line)[:ALARM_BYTES])
        if len(found) >= _MAX_ALARMS:
            break
    return found
