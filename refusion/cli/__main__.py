"""``python -m refusion.cli``."""

import sys

from refusion.cli import main

sys.exit(main())
