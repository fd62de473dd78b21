"""``python examples/menu_service demo`` (or ``serve``); ``--help`` lists the options."""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a directory: make ``menu_service`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from menu_service.cli import main

sys.exit(main())
