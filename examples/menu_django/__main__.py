"""``python examples/menu_django demo`` or, from the repository root,
``python -m examples.menu_django demo``: the demo; any other argument is one of
Django's management commands (``runserver``, ``check``, ``shell``, ...)."""

import sys
from pathlib import Path


def main() -> int:
    # Django names the settings and the app by module path (menu_django.settings,
    # menu_django.menus): import the example as ``menu_django`` from the folder
    # above it however it was started, so that its modules have one name each.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from menu_django.cli import main as run

    return run()


if __name__ == "__main__":
    sys.exit(main())
