"""oxijax: hand-written CPU and CUDA kernels for JAX, called as XLA FFI custom calls.

Every op is a JAX primitive (``oxijax_gemm``, ``oxijax_conv2d``, ``oxijax_attention``,
``oxijax_reduce``, ``oxijax_unary``, ``oxijax_binary``) that works eagerly and under
``jax.jit`` and ``jax.vmap``. See SPEC.md for the exact semantics.
"""

from oxijax._attention import attention
from oxijax._conv2d import conv2d
from oxijax._elementwise import (
    abs,
    add,
    binary,
    div,
    exp,
    log,
    maximum,
    minimum,
    mul,
    neg,
    relu,
    sigmoid,
    sqrt,
    sub,
    tanh,
    unary,
)
from oxijax._enums import BinaryOp, ReduceOp, Transpose, UnaryOp
from oxijax._ffi import BUILD_INFO, REGISTERED_TARGETS, export_disabled_checks
from oxijax._gemm import gemm, matmul
from oxijax._interpret import cuda_interpreter
from oxijax._reduce import max, mean, min, reduce, sum

__version__ = "0.1.0"

__all__ = [
    "BUILD_INFO",
    "REGISTERED_TARGETS",
    "BinaryOp",
    "ReduceOp",
    "Transpose",
    "UnaryOp",
    "abs",
    "add",
    "attention",
    "binary",
    "conv2d",
    "cuda_interpreter",
    "div",
    "exp",
    "export_disabled_checks",
    "gemm",
    "log",
    "matmul",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "mul",
    "neg",
    "reduce",
    "relu",
    "sigmoid",
    "sqrt",
    "sub",
    "sum",
    "tanh",
    "unary",
]

# Differentiation rules (jvp and transpose) of every op above.
from oxijax import _conv2d_grad, _elementwise_grad, _gemm_grad, _reduce_grad  # noqa: E402, F401
