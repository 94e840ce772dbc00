"""The work-folder guard: files a branch changed in the kernel's work folder are put back.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field


# The words of what a guard found a branch did to the files, declared once: the keys of its report, which the host
# reads (themisto.runtime.branch), and the key of the paths it could not put back.
WORKDIR_CHANGES: tuple[str, ...] = ("added", "deleted", "modified")
UNRESTORED = "unrestored"

# ----- the workdir guard ----------------------------------------------------------------------------------------


@dataclass
class WorkdirGuard:
    """Records a folder's files and keeps copies, so that what a branch deleted, changed or added can be undone.

    A forked child shares the filesystem with the kernel; this is how its file changes stay out of the parent's world.
    """

    root: str
    backup_limit_bytes: int = 2**30
    max_entries: int = 20_000
    listing: dict[str, tuple] = field(default_factory=dict)
    backup_dir: str | None = None
    unbacked: set[str] = field(default_factory=set)

    def _scan(self) -> dict[str, tuple]:
        found: dict[str, tuple] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames + filenames:
                full = os.path.join(dirpath, name)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                rel = os.path.relpath(full, self.root)
                if stat.S_ISDIR(st.st_mode):
                    found[rel] = ("d", stat.S_IMODE(st.st_mode))
                elif stat.S_ISLNK(st.st_mode):
                    found[rel] = ("l", os.readlink(full))
                else:  # ctime cannot be set by the user: any write or rename changes it
                    found[rel] = ("f", st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, stat.S_IMODE(st.st_mode),
                                  st.st_uid, st.st_gid)
                if len(found) > self.max_entries:
                    raise RuntimeError(f"{self.root} holds more than {self.max_entries} entries; not guarded")
        return found

    def refresh(self) -> None:
        """Take the folder's current state as the state to restore; back up files that are new or changed."""
        if self.backup_dir is None:
            self.backup_dir = tempfile.mkdtemp(prefix="themisto-workdir-backup-")
        current = self._scan()
        used = sum(entry[1] for rel, entry in self.listing.items() if entry[0] == "f" and rel not in self.unbacked)
        for rel, entry in current.items():
            if entry[0] != "f" or self.listing.get(rel) == entry and rel not in self.unbacked:
                continue
            self.unbacked.discard(rel)
            if used + entry[1] > self.backup_limit_bytes:
                self.unbacked.add(rel)
                continue
            target = os.path.join(self.backup_dir, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(os.path.join(self.root, rel), target)
            used += entry[1]
        self.unbacked &= set(current)
        self.listing = current

    def check_and_restore(self) -> dict:
        """Compare with the recorded state, undo the differences, and say what they were and whether all were undone."""
        current = self._scan()
        added = sorted(set(current) - set(self.listing))
        deleted = sorted(set(self.listing) - set(current))
        modified = sorted(rel for rel in set(current) & set(self.listing) if current[rel] != self.listing[rel]
                          and not (current[rel][0] == "d" == self.listing[rel][0]))
        unrestored: list[str] = []
        for rel in sorted(added, key=lambda r: -r.count(os.sep)):  # deepest first, so folders are empty when removed
            full = os.path.join(self.root, rel)
            try:
                if current[rel][0] == "d":
                    shutil.rmtree(full, ignore_errors=True)
                else:
                    os.unlink(full)
            except FileNotFoundError:
                pass
            except OSError:
                unrestored.append(rel)
        for rel in sorted(deleted + modified, key=lambda r: r.count(os.sep)):  # parents first
            entry = self.listing[rel]
            full = os.path.join(self.root, rel)
            try:
                if os.path.lexists(full) and not os.path.isdir(full) or os.path.islink(full):
                    os.unlink(full)
                elif os.path.isdir(full) and entry[0] != "d":
                    shutil.rmtree(full)
                if entry[0] == "d":
                    os.makedirs(full, exist_ok=True)
                    os.chmod(full, entry[1])
                elif entry[0] == "l":
                    os.symlink(entry[1], full)
                elif rel in self.unbacked or self.backup_dir is None:
                    unrestored.append(rel)
                else:
                    partial = full + ".themisto-restore"
                    shutil.copy2(os.path.join(self.backup_dir, rel), partial)
                    if (os.geteuid() == 0) and (entry[6], entry[7]) != (os.getuid(), os.getgid()):
                        os.chown(partial, entry[6], entry[7])  # the host restores files the kernel's uid owns
                    os.replace(partial, full)
            except OSError:
                unrestored.append(rel)
        if added or deleted or modified:
            restored_now = self._scan()
            for rel in deleted + modified:  # restored files have a new inode and ctime; remember those
                if rel in restored_now and rel not in unrestored:
                    self.listing[rel] = restored_now[rel]
        return {**dict(zip(WORKDIR_CHANGES, (added, deleted, modified))), UNRESTORED: sorted(set(unrestored))}

    def close(self) -> None:
        """Remove the backup copies."""
        if self.backup_dir is not None:
            shutil.rmtree(self.backup_dir, ignore_errors=True)
            self.backup_dir = None


# ----- the guards of a kernel: its work folder and its home, each kept from one branch call to the next ------------

_GUARDS: dict[str, WorkdirGuard] = {}


def _home() -> str | None:
    """The kernel's home when it has one of its own (not when it runs unsandboxed as a real user: not ours)."""
    home = os.path.realpath(os.path.expanduser("~"))
    return home if os.path.isdir(home) and home not in ("/", os.path.realpath("/root")) else None


def guard_workdir(workdir: str) -> WorkdirGuard:
    """The guard of the work folder (and of the kernel's home), their files as they are now kept."""
    guard = _GUARDS.get(workdir) or WorkdirGuard(workdir)
    _GUARDS[workdir] = guard
    guard.refresh()
    home = _home()
    if home is not None:
        _GUARDS.setdefault(home, WorkdirGuard(home)).refresh()
    return guard


def restore_home(changes: dict) -> None:
    """Undo what a candidate wrote in the kernel's home (a startup file planted for the next prediction, say) and
    add it to the workdir `changes` as `~/…` paths."""
    home = _home()
    guard = None if home is None else _GUARDS.get(home)
    if guard is None:
        return
    found = guard.check_and_restore()
    for key in (*WORKDIR_CHANGES, UNRESTORED):
        if found.get(key):
            changes[key] = list(changes.get(key) or []) + [os.path.join("~", path) for path in found[key]]
