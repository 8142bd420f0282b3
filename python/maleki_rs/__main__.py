"""``python -m maleki_rs`` is the ``maleki`` command."""

import sys

from .cli import main

sys.exit(main())
