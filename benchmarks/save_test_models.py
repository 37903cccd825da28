"""Saves the small checkpoints of the rotary families' GPU tests (tests/cuda/test_cuda_rotary_families.py,
FAMILIES' sizes) for a GPU machine whose transformers lacks a family's class: run here, where it has
them, then point $FTBERT_TEST_CHECKPOINTS there at the copy.

  python benchmarks/save_test_models.py OUTDIR [FAMILY ...]   (default: every family of the tests)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests._models import make_model  # noqa: E402
from tests.cuda.test_cuda_rotary_families import FAMILIES  # noqa: E402


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    out, families = Path(argv[0]), argv[1:] or list(FAMILIES)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        print(f"unknown families {unknown}: choose from {list(FAMILIES)}", file=sys.stderr)
        return 2
    for family in families:
        make_model(out / family, family, vocab=157, max_pos=1024, **FAMILIES[family])
        print(family, "->", out / family)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
