"""`mofa.atomic.write_file_set`: a folder's set of files is replaced as a whole. A child
process rewrites large sets in a loop and is killed with SIGKILL at random moments; the
folder must then hold exactly one complete set, old or new, never a mix and never a file
of an older set that the newer one does not have."""

import os
import inspect
import random
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from mofa import atomic
from mofa.atomic import FolderNotOurs, check_target, recover, write_file_set

FILES = 6
SIZE = 200_000  # bytes per file: a set is 1.2 MB, written and fsynced file by file


def file_set(generation: int) -> dict[str, str]:
    """Generation g's set: even and odd sets differ in a file (export_errors.txt), so a stale
    file of the previous set would show. Each file names its generation and ends in 'end'."""
    names = [f"part{i}.txt" for i in range(FILES)] + (["export_errors.txt"] if generation % 2 else [])
    return {name: f"generation {generation} {name}\n" + "x" * SIZE + "\nend\n" for name in names}


CHILD = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from mofa import atomic
FILES, SIZE = {FILES}, {SIZE}
{inspect.getsource(file_set)}
if sys.argv[2] == "fallback":
    atomic._renameat2 = None  # no RENAME_EXCHANGE: rename aside, rename in
generation = int(sys.argv[3])
while True:
    atomic.write_file_set(sys.argv[1], file_set(generation), owned=lambda name: True)
    generation += 1
"""


def complete_set(directory) -> int:
    """The generation of the one complete set the folder holds (asserts there is one)."""
    names = sorted(os.listdir(directory))
    assert names, "the folder is empty"
    generations = set()
    for name in names:
        text = open(os.path.join(directory, name)).read()
        head, _, rest = text.partition("\n")
        assert text.endswith("\nend\n") and len(rest) == SIZE + 5, f"{name} is truncated"
        generations.add(int(head.split()[1]))
    assert len(generations) == 1, f"files of generations {sorted(generations)} mixed"
    (generation,) = generations
    assert names == sorted(file_set(generation)), f"generation {generation} set is {names}"
    return generation


@pytest.mark.parametrize("mode,kills", [("exchange", 30), ("fallback", 15)])
def test_sigkill_at_random_moments_leaves_one_complete_set(tmp_path, mode, kills):
    if mode == "exchange" and atomic._renameat2 is None:
        pytest.skip("no renameat2 on this system")
    directory = str(tmp_path / "out")
    rng = random.Random(12)
    generation, seen, midway = 0, set(), 0
    started = time.monotonic()
    for _ in range(kills):
        child = subprocess.Popen([sys.executable, "-c", CHILD, directory, mode, str(generation)], cwd=str(ROOT))
        deadline = time.monotonic() + 10  # once the child writes (its start-up time varies) ...
        while not any(f"mofa-new-{child.pid}-" in name for name in os.listdir(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.25))  # ... kill it at a random moment of its rewrites
        child.send_signal(signal.SIGKILL)
        child.wait()
        midway += any(name != "out" for name in os.listdir(tmp_path))
        if mode == "fallback":
            recover(directory)  # a kill between the two renames leaves the old set aside
        if os.path.exists(directory):
            found = complete_set(directory)
            assert found >= generation - 1  # nothing older than the set in place before
            seen.add(found)
            generation = found + 1
    assert time.monotonic() - started < 60
    assert len(seen) > kills // 3, "the children did not get far enough to mean anything"
    assert midway > kills // 3, f"only {midway} of {kills} kills landed in the middle of a rewrite"
    # the next write cleans what the killed writers left beside the folder
    write_file_set(directory, file_set(generation), owned=lambda name: True)
    assert complete_set(directory) == generation
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_replaces_the_whole_set(tmp_path):
    directory = tmp_path / "out"
    write_file_set(str(directory), {"a.txt": "1", "stale.txt": "old"})
    write_file_set(str(directory), {"a.txt": "2", "b.bin": b"\x00\x01"}, owned=("a.txt", "b.bin", "stale.txt"))
    assert sorted(os.listdir(directory)) == ["a.txt", "b.bin"]
    assert (directory / "a.txt").read_text() == "2" and (directory / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert oct(directory.stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_folder_of_other_files_is_refused_and_left_alone(tmp_path):
    directory = tmp_path / "out"
    directory.mkdir()
    (directory / "notes.md").write_text("mine")
    with pytest.raises(FolderNotOurs, match="notes.md"):
        write_file_set(str(directory), {"result.json": "{}"})
    assert os.listdir(directory) == ["notes.md"]
    (directory / "notes.md").unlink()
    (directory / "sub").mkdir()
    with pytest.raises(FolderNotOurs, match="sub"):
        check_target(str(directory), ("result.json",))
    with pytest.raises(FolderNotOurs, match="not a folder"):
        write_file_set(str(tmp_path / "file"), {}) if (tmp_path / "file").write_text("x") else None
    with pytest.raises(ValueError):
        write_file_set(str(tmp_path / "x"), {"../escape": "no"})


def test_a_symlink_is_followed(tmp_path):
    real = tmp_path / "real"
    write_file_set(str(real), {"a": "1"})
    (tmp_path / "link").symlink_to(real)
    write_file_set(str(tmp_path / "link"), {"a": "2"})
    assert (tmp_path / "link").is_symlink() and (real / "a").read_text() == "2"


def test_recover_puts_the_old_set_back(tmp_path):
    """The fallback's state after a kill between its two renames: folder missing, the old set
    aside under a dead process's name."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    aside = tmp_path / f".out.mofa-old-{dead}-abc"
    newer = tmp_path / f".out.mofa-new-{dead}-def"
    aside.mkdir(), newer.mkdir()
    (aside / "a").write_text("old")
    (newer / "a").write_text("new")
    recover(str(tmp_path / "out"))
    assert (tmp_path / "out" / "a").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["out"]
