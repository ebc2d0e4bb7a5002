"""The one trust boundary: whether a path others could reach may be read, run or written.

Every folder the toolkit reads code from, runs from or writes into (a cache, a work folder, a --dest,
a node's state or install prefix) is judged here, on both sides (the node installer is built from
this package). `folder_problem` takes the path as given, never resolved first, and walks every
component and every hop of every link, as the kernel will when the path is used: each link and each
folder on the way must belong to this user or root and be writable by no one else. A sticky folder
(/tmp) may be passed through, since the next entry's owner is checked; a setgid folder of a group
this user is in (2775) is the documented way to share (docs/trust.md): its members are trusted.
`tree_problem` judges what runs or is compiled (an environment, a compiler cache, a root): every
entry inside, with links only to inside. Both return the reason in words (None: none), printed
escaped; callers raise it as their error with their fix.
"""

import hashlib
import os
import stat

from builder.node.files import shown

SYSTEM_FOLDERS = ("/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/media", "/mnt", "/opt",
                  "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/local", "/var",
                  "/var/tmp", "/var/lib", "/dev/shm")  # fmt: skip
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys",
                "/usr/bin", "/usr/include", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/sbin",
                "/usr/share")  # fmt: skip
SCRATCH_TREES = ("/dev/shm",)  # inside a system tree, but a tmpfs every user may make folders in, as /tmp
MAX_HOPS = 40  # the kernel's own limit of links on one path (ELOOP)
STAMP = ".ds-builder-trusted"  # tree_problem's record of the tree it last found sound
# What of a root its compilers run and read: its programs, libraries and headers, and /etc's links that
# choose among them (alternatives) and the loader's configuration. The rest holds state or data, owned by
# its services (Debian makes /var/local 2775 root:staff, a host's /etc/munge is munge's), or is the host's,
# bound in (/dev, /proc, /usr/local).
ROOT_CODE = ("usr/bin", "usr/sbin", "usr/lib", "usr/lib32", "usr/lib64", "usr/libexec", "usr/include", "bin", "sbin",
             "lib", "lib32", "lib64", "etc/alternatives", "etc/ld.so.conf.d",
             "usr/aarch64-linux-gnu")  # the cross compiler's headers and libraries (a wheel for aarch64)  # fmt: skip


def is_system_folder(resolved: str, home: str = "") -> bool:
    """Whether a resolved path is a system folder, inside a system tree, or the user's home itself."""
    home = home or os.path.realpath(os.path.expanduser("~"))
    if any(resolved.startswith(t + "/") for t in SCRATCH_TREES):
        return False
    inside = any(resolved == t or resolved.startswith(t + "/") for t in SYSTEM_TREES)
    return resolved in SYSTEM_FOLDERS or resolved == home or inside


def _groups() -> "set[int]":
    return {os.getegid(), *os.getgroups()}


def is_group_shared(st: "os.stat_result") -> bool:
    """A setgid folder of a group this user is in: the documented way two builders share a cache."""
    return stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISGID) and st.st_gid in _groups()


def _owner_problem(path: str, st: "os.stat_result", shared: bool, what: str) -> "str | None":
    """Who may own an entry: this user or root, or in a group-shared place, a member of its group."""
    if st.st_uid in (0, os.geteuid()) or (shared and st.st_gid in _groups()):
        return None
    return f"{shown(path)} {what} another user (uid {st.st_uid}), who decides what is there"


def _mode_problem(path: str, st: "os.stat_result", shared: bool) -> "str | None":
    """Who may write an entry: no one else; a sticky folder, and a group-shared folder's group,
    excepted."""
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX:
        return None  # as /tmp: no one may rename or remove another's entry there, and each entry's owner is checked
    if mode & 0o002:
        return f"{shown(path)} is writable by every user (mode {mode:o}): anyone could replace what is in it"
    if mode & 0o020 and not (shared or is_group_shared(st)):
        return (f"{shown(path)} is writable by its group (gid {st.st_gid}, mode {mode:o}), which is not "
                "a shared setgid folder of a group this user is in")  # fmt: skip
    return None


def _split(path: str) -> "list[str]":
    return [p for p in path.split("/") if p]


def folder_problem(path: str, system_ok: bool = False, written_into_files: bool = False) -> "str | None":
    """What makes `path` unsafe as a folder the toolkit reads code from or writes into (None: nothing).

    The path is taken as given and walked as the kernel walks it: every folder on the way and every
    link, at every hop, belongs to this user or root (a link's target walked in turn), and none can be
    written by others. The folder itself (or the deepest part that exists: the rest is made by the
    toolkit, in a folder just checked) must be a folder, and not a system folder unless `system_ok`.
    A path `written_into_files` (a modulefile, a .pth) may hold no control character: a newline there
    is a line of the file's own."""
    if not path:
        return "an empty path"
    if written_into_files and any(ord(c) < 32 or ord(c) == 127 for c in path):
        return f"{shown(path)} holds a control character"
    pending = _split(os.path.abspath(path))
    current, hops = "/", 0
    st = os.lstat("/")
    why = _owner_problem("/", st, False, "belongs to")
    if why:
        return why
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        parent_st = st
        following = os.path.join(current, part)
        try:
            st = os.lstat(following)
        except FileNotFoundError:  # made by the toolkit from here on, in a folder just checked
            current = os.path.normpath(os.path.join(following, *pending))
            break
        except OSError as exc:
            return f"{shown(following)} cannot be read ({exc.strerror})"
        shared_parent = is_group_shared(parent_st)
        if stat.S_ISLNK(st.st_mode):
            why = _owner_problem(following, st, shared_parent, "is a link made by")
            if why:
                return why
            hops += 1
            if hops > MAX_HOPS:
                return f"{shown(path)} passes through more than {MAX_HOPS} links"
            target = os.readlink(following)
            if target.startswith("/"):
                current = "/"
            pending = _split(target) + pending
            continue
        if not stat.S_ISDIR(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a file"
            return f"{shown(following)} is {kind}, not a folder"
        why = _owner_problem(following, st, shared_parent or is_group_shared(st), "belongs to")
        why = why or _mode_problem(following, st, False)
        if why:
            return why
        current = following
    real = os.path.normpath(current)
    if not system_ok and is_system_folder(real):
        if real == os.path.normpath(os.path.abspath(path)):
            return f"{shown(path)} is the system folder {shown(real)} (or inside one)"
        return f"{shown(path)} leads to the system folder {shown(real)} (or inside one)"
    return None


def _inside(top: str, link: str, absolute_inside: bool) -> bool:
    """Whether the link `link` inside `top` leads inside it, resolved hop by hop within it (an
    absolute target read under `top` where `absolute_inside`: a root's /usr/lib is its own)."""
    base = _split(top)
    current = _split(os.path.dirname(link))
    target = os.readlink(link)
    pending = _split(target)
    if target.startswith("/"):
        if not absolute_inside:
            return False
        current = list(base)
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            if len(current) <= len(base):
                if not absolute_inside:
                    return False  # above the top
                continue  # a root's "/.." is its "/"
            current.pop()
            continue
        following = "/" + "/".join([*current, part])
        try:
            st = os.lstat(following)
        except OSError:
            current.append(part)  # dangling: leads nowhere, so nowhere outside
            continue
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > MAX_HOPS:
                return False
            target = os.readlink(following)
            if target.startswith("/"):
                if not absolute_inside:
                    return False
                current = list(base)
            pending = _split(target) + pending
            continue
        current.append(part)
    return current[: len(base)] == base


def _leads_into(link: str, folders: "tuple[str, ...]") -> bool:
    real = os.path.realpath(link)
    return any(real == f or real.startswith(f.rstrip("/") + "/") for f in folders)


def _fingerprint(
    top: str, parts: "tuple[str, ...]" = ()
) -> "tuple[str, list[tuple[str, os.stat_result]], list[tuple[str, os.DirEntry[str]]]]":
    """The folders of a tree (path, inode, owner, group, mode, change time): what any change of an
    entry's name, or of a folder's owner or mode, changes; and every entry that is not a folder."""
    digest = hashlib.sha256()
    entries = []  # type: list[tuple[str, os.DirEntry[str]]]
    folders = []  # type: list[tuple[str, os.stat_result]]
    stack = [top]
    if parts:  # only these subtrees (each a folder, not a link: merged-usr's bin -> usr/bin is walked as usr/bin)
        stack = [p for p in (os.path.join(top, part) for part in parts) if os.path.isdir(p) and not os.path.islink(p)]
    while stack:
        folder = stack.pop()
        st = os.lstat(folder)
        folders.append((folder, st))
        digest.update(
            f"{folder}\0{st.st_ino}\0{st.st_uid}\0{st.st_gid}\0{st.st_mode}\0{st.st_ctime_ns}\n".encode(
                "utf-8", "surrogateescape"
            )
        )
        with os.scandir(folder) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    entries.append((entry.path, entry))
    return digest.hexdigest(), folders, entries


def tree_problem(
    top: str, absolute_inside: bool = False, stamp: bool = False, links_out_to: "tuple[str, ...]" = ()
) -> "str | None":
    """What makes the tree at `top` unsafe to run or compile from (None: nothing): an entry inside
    (folder, file, link) of a user other than this one or root (in a group-shared tree, a member),
    one others can write, or a link leading out of the tree (`absolute_inside`: a root, whose
    absolute links are read inside it, and of which what its compilers run and read, ROOT_CODE, is walked). With
    `stamp`, a sound tree is recorded in `top/STAMP` by its folders' fingerprint, and a tree whose
    folders are unchanged since (no entry added, removed or renamed, no folder's owner or mode
    changed) is not walked file by file again. `links_out_to`:
    folders (already judged by folder_problem) that links may lead into, as an environment's
    bin/python leads to its interpreter."""
    try:
        top_st = os.lstat(top)
    except OSError as exc:
        return f"{shown(top)} cannot be read ({exc.strerror})"
    if not stat.S_ISDIR(top_st.st_mode):
        return f"{shown(top)} is not a folder"
    shared = is_group_shared(top_st)
    stamp_path = os.path.join(top, STAMP)
    if stamp:
        _make_stamp(stamp_path)  # before the fingerprint: making it changes the top folder's ctime
    try:
        fingerprint, folders, entries = _fingerprint(top, ROOT_CODE if absolute_inside else ())
    except OSError as exc:
        return f"a folder in {shown(top)} cannot be read ({exc.strerror})"
    if stamp and _stamped(stamp_path, fingerprint):
        return None
    # uv makes an environment's lock file 0666 whatever the umask, each time it is missing; nothing reads it
    # as code, and its owner is checked like any entry's.
    uv_lock = os.path.join(top, ".lock")
    for folder, st in folders:
        why = _owner_problem(folder, st, shared, "belongs to")
        why = why or _mode_problem(folder, st, shared)
        if why:
            return why
    for path, entry in entries:
        if path == stamp_path:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as exc:
            return f"{shown(path)} cannot be read ({exc.strerror})"
        if stat.S_ISLNK(st.st_mode):
            why = _owner_problem(path, st, shared, "is a link made by")
            if why:
                return why
            if not _inside(top, path, absolute_inside) and not _leads_into(path, links_out_to):
                return f"{shown(path)} is a link leading out of {shown(top)} (to {shown(os.readlink(path))})"
            continue
        why = _owner_problem(path, st, shared, "belongs to")
        if not why and not (path == uv_lock and stat.S_ISREG(st.st_mode)):
            why = _mode_problem(path, st, shared)
        if why:
            return why
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(st.st_mode)
                else "a device"
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket"
            )
            if not absolute_inside:
                return f"{shown(path)} is {kind}, not a file"
        if st.st_mode & (stat.S_ISUID | stat.S_ISGID) and not absolute_inside:
            return f"{shown(path)} is setuid or setgid"
    if stamp:
        _write_stamp(stamp_path, fingerprint)
    return None


def _stamped(stamp_path: str, fingerprint: str) -> bool:
    try:
        st = os.lstat(stamp_path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            return False
        with open(stamp_path, encoding="ascii") as f:
            return f.read(100) == fingerprint
    except (OSError, ValueError):
        return False


def _make_stamp(stamp_path: str) -> None:
    try:
        os.close(os.open(stamp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
        os.chmod(stamp_path, 0o644)
    except OSError:
        pass  # there already, or a tree this user cannot write: walked again next time


def _write_stamp(stamp_path: str, fingerprint: str) -> None:
    """The fingerprint, written into the stamp made before it was taken (rewriting a file's content
    changes no folder's ctime, so the fingerprint stays the tree's)."""
    try:
        fd = os.open(stamp_path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.write(fd, fingerprint.encode("ascii"))
    finally:
        os.close(fd)
