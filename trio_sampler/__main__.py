"""``python -m trio_sampler``: the ``trio-sampler`` command."""

import sys

from .cli import main

sys.exit(main())
