"""oxijax's XLA FFI handlers (use the oxijax package, not this module)"""

from collections.abc import Sequence

from oxijax._oxijax import backend as backend


def registrations() -> dict:
    """FFI handler capsules, keyed by platform and then by target name."""

def build_info() -> dict:
    """
    How this extension was built (CUDA support, architectures, FFI API version) and which CPU kernel level it runs: cpu_isa, chosen from cpu_isa_levels (those of cpu_isa_built this CPU runs) at load time (cpu_isa_default) or by OXIJAX_CPU_ISA.
    """

def ptx_probe(probe: int, words: Sequence[int]) -> list[int]:
    """
    Runs ptx.h probe `probe` (cuda/kernels.h PtxProbe) on the current GPU: 1024 words in, 1024 words out.
    """
