"""`python -m ftbert.weights_tools SRC DST [--dtype ...]`, the same as `ftbert convert`."""

import sys

from .cli import main

sys.exit(main())
