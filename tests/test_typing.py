"""The named ops are real functions that type checkers see: mypy reveals their
signatures (not Any), and each has its own docstring and signature at run time."""

import inspect
import pathlib

import jax
import pytest

import oxijax

UNARY = ["relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "neg"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum"]

# jax itself is skipped but for the modules that define jax.Array: ~3 s instead of ~20.
# mypy_path: the checkout that `import oxijax` found (editable installs hide it from mypy).
CONFIG = f"""\
[mypy]
mypy_path = {pathlib.Path(oxijax.__file__).parent.parent}
[mypy-jax.*,jaxlib.*]
follow_imports = skip
[mypy-jax,jax.numpy,jax._src.basearray]
follow_imports = normal
"""


def test_mypy_sees_the_signatures(tmp_path):
    mypy_api = pytest.importorskip("mypy.api")  # a test extra; absent on the GPU image
    (tmp_path / "mypy.ini").write_text(CONFIG)
    names = UNARY + BINARY
    snippet = tmp_path / "snippet.py"
    snippet.write_text("import oxijax\n" + "".join(f"reveal_type(oxijax.{n})\n" for n in names)
                       + "reveal_type(oxijax.add(1.0, oxijax.relu(2.0)))\n")
    out, err, _ = mypy_api.run([str(snippet), "--config-file", str(tmp_path / "mypy.ini"),
                                "--no-incremental", "--cache-dir", str(tmp_path / "cache")])
    revealed = [line.split('Revealed type is "')[1].rstrip('"')
                for line in out.splitlines() if "Revealed type" in line]
    array = "jax._src.basearray.Array"
    assert revealed == ([f"def (x: Any) -> {array}"] * len(UNARY)
                        + [f"def (a: Any, b: Any) -> {array}"] * len(BINARY) + [array]), out + err


def test_named_ops_are_documented_functions():
    for name in UNARY + BINARY:
        fn = getattr(oxijax, name)
        assert inspect.isfunction(fn) and fn.__name__ == name and fn.__doc__, name
        parameters = list(inspect.signature(fn).parameters)
        assert parameters == (["x"] if name in UNARY else ["a", "b"]), name
        assert inspect.signature(fn, eval_str=True).return_annotation is jax.Array, name
