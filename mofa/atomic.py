"""Writing outputs so that a reader (or a later run) never sees them half-written.

`write_atomically(path, text)` replaces one file; `write_file_set(directory, {name: text})`
replaces a folder's whole set of files: a process killed at any moment (SIGKILL included)
leaves either the complete old set or the complete new set in the folder, never a mix of
the two and never a file of an older run that the new run did not write.

How: every file is written and fsynced into a temporary sibling folder, which is then
exchanged with the target in one atomic step (Linux renameat2 RENAME_EXCHANGE); the old set,
now in the temporary folder, is deleted. A folder that did not exist is created by a single
rename. Where the exchange is not available (another OS, a file system without it) the
target is renamed aside and the new folder renamed in: a kill between those two renames
leaves the old set aside, and the next write_file_set puts it back before doing anything.
Temporary folders of killed runs are removed by the next run on the same folder.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping

_TAG = ".mofa-"  # temporary siblings: .{folder}.mofa-new-{pid}-{random} / .mofa-old-...


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(path: str, text: str) -> None:
    """Write via a temporary file in the same directory and rename: readers never see a
    partial file, and an existing file is only replaced once the new one is complete."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # as open() would create it, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class FolderNotOurs(OSError):
    """The target folder holds files this kind of output set does not own: replacing the
    folder would delete them."""


# --------------------------------------------------------------------------------------
# the atomic exchange of two paths
# --------------------------------------------------------------------------------------
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _load_renameat2():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_renameat2 = _load_renameat2()


def exchange(a: str, b: str) -> bool:
    """Swap two existing paths atomically. False where the system cannot (the caller falls
    back to two renames); other failures raise OSError."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), a, None, b)


# --------------------------------------------------------------------------------------
def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory; the rename order still holds
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _leftovers(parent: str, base: str) -> list[tuple[str, str, int]]:
    """(path, 'new' | 'old', pid) of the temporary siblings of `base` that earlier runs left."""
    pattern = re.compile(re.escape(f".{base}{_TAG}") + r"(new|old)-(\d+)-")
    out = []
    try:
        names = os.listdir(parent)
    except OSError:
        return out
    for name in names:
        m = pattern.match(name)
        if m:
            out.append((os.path.join(parent, name), m.group(1), int(m.group(2))))
    return out


def _recover(target: str, parent: str, base: str) -> None:
    """Undo what killed runs left: put an old set back where the folder is missing (killed
    between the two renames of the fallback), and delete their temporary folders."""
    dead = [(path, kind) for path, kind, pid in _leftovers(parent, base) if not _alive(pid)]
    if not os.path.lexists(target):
        for path, kind in dead:
            if kind == "old":
                os.rename(path, target)
                break
    for path, _ in dead:
        if os.path.lexists(path):
            shutil.rmtree(path, ignore_errors=True)


def _check_names(files: Mapping[str, object]) -> None:
    for name in files:
        if not name or name in (".", "..") or "/" in name or "\0" in name or (os.sep != "/" and os.sep in name):
            raise ValueError(f"not a plain file name: {name!r}")


def _owned_test(owned, files) -> Callable[[str], bool]:
    if owned is None:
        names = set(files)
        return names.__contains__
    if callable(owned):
        return owned
    names = set(owned) | set(files)
    return names.__contains__


def recover(directory: str) -> None:
    """Finish what killed writers of `directory` left: put the old set back if one was
    killed between the fallback's two renames, and delete their temporary folders.
    write_file_set does this first; a reader that must not miss the folder may call it."""
    target = os.path.realpath(directory)
    parent, base = os.path.split(target)
    if base:
        _recover(target, parent, base)


def check_target(directory: str, owned: Iterable[str] | Callable[[str], bool] | None = None, files: Iterable[str] = ()) -> bool:
    """Raise FolderNotOurs unless write_file_set may replace `directory` (see there);
    True when it exists. Lets a command refuse a bad output folder before working."""
    is_owned = _owned_test(owned, files)
    if not os.path.lexists(directory):
        return False
    target = os.path.realpath(directory)
    if not os.path.split(target)[1]:
        raise FolderNotOurs(errno.EINVAL, "cannot replace the root folder", directory)
    if not os.path.isdir(target):
        raise FolderNotOurs(errno.ENOTDIR, "exists and is not a folder", directory)
    foreign = sorted(n for n in os.listdir(target) if not is_owned(n) or not os.path.isfile(os.path.join(target, n)))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise FolderNotOurs(errno.ENOTEMPTY, f"holds files mofa did not write ({shown}); give a new or empty folder", directory)
    return True


def write_file_set(directory: str, files: Mapping[str, str | bytes], owned: Iterable[str] | Callable[[str], bool] | None = None) -> None:
    """Make `directory` hold exactly `files` ({name: text or bytes}), atomically.

    `owned` says which names in an existing folder belong to this kind of output set (a name
    list or a predicate; default: the names in `files`): the folder is only replaced when it
    holds nothing else, so pointing the output at a folder of other files is an error
    (FolderNotOurs) instead of deleting them. A symbolic link is followed: the folder it
    points to is replaced."""
    _check_names(files)
    target = os.path.realpath(directory)
    parent, base = os.path.split(target)
    if not base:
        raise FolderNotOurs(errno.EINVAL, "cannot replace the root folder", directory)
    os.makedirs(parent, exist_ok=True)
    _recover(target, parent, base)
    exists = check_target(target, owned, files)
    tmp = tempfile.mkdtemp(prefix=f".{base}{_TAG}new-{os.getpid()}-", dir=parent)
    try:
        os.chmod(tmp, os.stat(target).st_mode & 0o7777 if exists else 0o777 & ~_umask())
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else bytes(content)
            with open(os.path.join(tmp, name), "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if not exists:
            os.rename(tmp, target)  # a folder that did not exist appears complete
        elif exchange(tmp, target):
            pass  # the new set is in place; tmp now holds the old one
        else:
            aside = tempfile.mkdtemp(prefix=f".{base}{_TAG}old-{os.getpid()}-", dir=parent)
            try:
                os.rename(target, aside)  # onto the empty placeholder folder
            except BaseException:
                os.rmdir(aside)
                raise
            try:
                os.rename(tmp, target)
            except BaseException:
                os.rename(aside, target)  # the old set back in place
                raise
            tmp = aside
        _fsync_dir(parent)
    finally:
        if os.path.lexists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
