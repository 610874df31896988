"""Linux mount system calls the warm pool's staging area needs, by descriptor where it matters.

Python's standard library has no mount calls; these are thin ``ctypes`` wrappers of the kernel's
(glibc's ``mount``/``umount2``, and ``syscall`` for the descriptor-based mount API of Linux 5.2+
— ``open_tree``, ``move_mount`` — and 5.12+ — ``mount_setattr``). They are the only code here
that changes the host's mount table; :mod:`.staging` decides what to mount where.

Why the descriptor API: a session's directory is pinned as an ``O_PATH`` descriptor
(:mod:`reactor_fabric.policy.pinning`). :func:`clone_tree` copies the mount of exactly that
object, :func:`set_attributes` makes the copy read-only (and ``nosuid``, ``nodev``) *before* it
is attached anywhere, and :func:`move_tree` attaches it onto another descriptor: no path is
resolved between validation and mount, and no container can ever see the copy writable for an
instant (a bind followed by a read-only remount would be propagated writable, and the remount
is not propagated at all).

Every function blocks only for the system call (microseconds); all raise :class:`OSError` with
the kernel's errno. They need ``CAP_SYS_ADMIN`` in the host's mount namespace (root).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# The system calls of the new mount API have one number on every architecture (asm-generic).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442

_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_AT_EMPTY_PATH = 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x04
_MOVE_MOUNT_T_EMPTY_PATH = 0x40
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4

_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_MS_SHARED = 1 << 20
_MNT_DETACH = 0x2


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = (
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_void_p,
)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


def _check(result: int, what: str) -> int:
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")
    return result


def clone_tree(source_fd: int) -> int:
    """A detached copy of the mount of the object ``source_fd`` holds (not recursive, like a
    plain bind); the caller closes the returned descriptor (which unmounts it if unattached)."""
    return _check(
        _libc.syscall(
            _SYS_OPEN_TREE,
            ctypes.c_int(source_fd),
            b"",
            ctypes.c_uint(_OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_EMPTY_PATH),
        ),
        "open_tree",
    )


def set_attributes(tree_fd: int, *, read_only: bool, private: bool = False) -> None:
    """Make the (detached) mount ``tree_fd`` nosuid, nodev, and read-only if asked; its other
    flags (noexec, atime) stay as the source's. ``private``: take it out of the peer group
    the copy shares with its source (a clone of a shared mount, such as a systemd host's
    ``/``, is that mount's peer): a mount then put onto the copy does not propagate back to
    the host's own tree."""
    wanted = _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | (_MOUNT_ATTR_RDONLY if read_only else 0)
    attributes = _MountAttr(wanted, 0, _MS_PRIVATE if private else 0, 0)
    _check(
        _libc.syscall(
            _SYS_MOUNT_SETATTR,
            ctypes.c_int(tree_fd),
            b"",
            ctypes.c_uint(_AT_EMPTY_PATH),
            ctypes.byref(attributes),
            ctypes.c_size_t(ctypes.sizeof(attributes)),
        ),
        "mount_setattr",
    )


def move_tree(tree_fd: int, target_fd: int) -> None:
    """Attach the detached mount ``tree_fd`` onto the object ``target_fd`` holds."""
    _check(
        _libc.syscall(
            _SYS_MOVE_MOUNT,
            ctypes.c_int(tree_fd),
            b"",
            ctypes.c_int(target_fd),
            b"",
            ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH),
        ),
        "move_mount",
    )


def make_shared_mount(path: str) -> None:
    """Make ``path`` a mount point of its own, in a peer group of its own, shared: mounts made
    below it then propagate to binds of it made with slave propagation (the containers'), and
    to nothing else (it is made private first, so it joins no existing peer group)."""
    encoded = path.encode()
    _check(_libc.mount(encoded, encoded, None, _MS_BIND | _MS_REC, None), f"bind {path}")
    _check(_libc.mount(None, encoded, None, _MS_PRIVATE, None), f"make {path} private")
    _check(_libc.mount(None, encoded, None, _MS_SHARED, None), f"make {path} shared")


def detach(path: str) -> None:
    """Unmount ``path`` lazily (it is gone from the tree at once, released when unused);
    propagated copies (the containers') go with it."""
    _check(_libc.umount2(path.encode(), _MNT_DETACH), f"umount {path}")


def mount_points_below(root: str, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Mount points at or below ``root`` in this process's mount table, deepest first."""
    found: list[str] = []
    prefix = root.rstrip("/") + "/"
    with open(mountinfo, encoding="utf-8") as table:
        for line in table:
            fields = line.split(" ")
            if len(fields) < 5:
                continue
            point = _unescape(fields[4])
            if point == root or point.startswith(prefix):
                found.append(point)
    # Deepest first: a mount point inside another is released before the one it is in
    # (mounts stacked on one point are each a line: detaching the point once per line works).
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (octal).
    if "\\" not in field:
        return field
    out: list[str] = []
    index = 0
    while index < len(field):
        if (
            field[index] == "\\"
            and index + 3 < len(field)
            and field[index + 1 : index + 4].isdigit()
        ):
            out.append(chr(int(field[index + 1 : index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)
