"""Imports the compiled extension, ``oxijax._oxijax``.

With ``OXIJAX_EXTENSION=/path/to/_oxijax....so`` that file is loaded instead: another build
of the same sources (scripts/sanitize_check.sh runs the tests on an ASan/UBSan build this
way, beside the installed one).
"""

from __future__ import annotations

import importlib.util
import os
import sys

_override = os.environ.get("OXIJAX_EXTENSION")
if _override and "oxijax._oxijax" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("oxijax._oxijax", _override)
    if _spec is None or _spec.loader is None:
        raise ImportError(f"OXIJAX_EXTENSION={_override!r} is not a loadable extension module")
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["oxijax._oxijax"] = _module
    _spec.loader.exec_module(_module)

try:
    from oxijax import _oxijax  # noqa: E402
except ImportError as error:  # most often: the source tree shadows a non-editable install
    raise ImportError(
        f"oxijax's compiled extension was not found next to {os.path.dirname(__file__)}. "
        "If that is a source checkout, either install it editable (pip install -e .) or "
        "run Python from another directory, so that the installed package is imported."
    ) from error

__all__ = ["_oxijax"]
