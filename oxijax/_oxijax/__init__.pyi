"""oxijax's XLA FFI handlers (use the oxijax package, not this module)"""

from collections.abc import Sequence

from oxijax._oxijax import backend as backend


def registrations() -> dict:
    """FFI handler capsules, keyed by platform and then by target name."""

def build_info() -> dict:
    """
    How this extension was built: CUDA support, architectures, FFI API version.
    """

def ptx_probe(probe: int, words: Sequence[int]) -> list[int]:
    """
    Runs ptx.h probe `probe` (cuda/kernels.h PtxProbe) on the current GPU: 1024 words in, 1024 words out.
    """
