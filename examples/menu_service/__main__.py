"""``python examples/menu_service demo`` (or ``serve``), or from the repository root
``python -m examples.menu_service demo``; ``--help`` lists the options."""

import sys
from pathlib import Path


def main() -> int:
    if __package__ in (None, ""):
        # Run as a folder: no package holds this file yet. Import it as ``menu_service``
        # from the folder above, so that its modules' relative imports resolve.
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from menu_service.cli import main as run  # noqa: PLC0415
    else:  # python -m examples.menu_service (or -m menu_service with examples/ on the path)
        from .cli import main as run  # noqa: PLC0415
    return run()


if __name__ == "__main__":
    sys.exit(main())
