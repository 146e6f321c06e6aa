import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROBLEMS = ROOT / "problems"
__all__ = ["ROOT", "PROBLEMS"]
