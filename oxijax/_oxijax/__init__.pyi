"""oxijax's XLA FFI handlers (use the oxijax package, not this module)"""

from oxijax._oxijax import backend as backend


def registrations() -> dict:
    """FFI handler capsules, keyed by platform and then by target name."""

def build_info() -> dict:
    """
    How this extension was built: CUDA support, architectures, FFI API version.
    """
