"""Read an exported launch script back the way bash would: the ARGS=( ... ) array (shlex, so
quoting is honoured) and the world (NNODES x GPUS_PER_NODE). The tests hand the framework
these words, not the exporter's Python lists, so what is checked is the file a user runs."""

from __future__ import annotations

import re
import shlex


def script_args(text: str) -> list[str]:
    """The words of the script's ARGS array, without the shell's own variables ($CHECKPOINT_DIR)."""
    start = text.index("ARGS=(\n") + len("ARGS=(\n")
    end = text.index("\n)\n", start)
    words = shlex.split(text[start:end])
    out = []
    for w in words:
        if "$" in w:  # --save "$CHECKPOINT_DIR": a run-time path, not a setting
            out.pop() if out and out[-1].startswith("--") else None
            continue
        out.append(w)
    return out


def script_modules(text: str) -> dict[str, str]:
    """{module name: source} of the Python modules the script writes before it launches
    (`cat > "$DIR/NAME.py" <<'PY' ... PY`: torchtitan's layout config module)."""
    return {m.group(1): m.group(2) + "\n" for m in re.finditer(r"cat > \"\$\w+/(\w+)\.py\" <<'PY'\n(.*?)\nPY\n", text, re.S)}


def script_world(text: str) -> int:
    nodes = int(re.search(r"^NNODES=(\d+)$", text, re.M).group(1))
    per_node = int(re.search(r"^GPUS_PER_NODE=(\d+)$", text, re.M).group(1))
    return nodes * per_node


def with_flag(args: list[str], flag: str, value: str) -> list[str]:
    """A copy of args with flag's value replaced (to break a file on purpose)."""
    i = args.index(flag)
    return [*args[: i + 1], value, *args[i + 2:]]
