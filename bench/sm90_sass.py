"""A Triton kernel compiled for sm_90 without a GPU, and its SASS opcodes counted: what the `*_sass.py` benches read.
Uses the Triton installed (its bundled ptxas and cuobjdump)."""

import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def compile_sm90(kernel, arguments: dict[str, str], constants: dict, **options):
    """`kernel` compiled for sm_90: `arguments` name each runtime argument's type ("*bf16", "i32", ...), `constants`
    give the constexprs; pointers 16-byte aligned, as a launch specializes them; `options` as a launch takes them."""
    names = kernel.arg_names
    signature = {**arguments, **dict.fromkeys(constants, "constexpr")}
    aligned = {(names.index(name),): [["tt.divisibility", 16]] for name, kind in arguments.items() if kind[0] == "*"}
    source = ASTSource(kernel, signature, {(names.index(k),): v for k, v in constants.items()}, aligned)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def sass_opcodes(cubin: bytes, modifiers: bool = False) -> Counter:
    """The cubin's SASS opcodes counted, with their modifiers (IMAD.SHL.U32) or without (IMAD)."""
    tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        listing = subprocess.run([tool, "-sass", file.name], capture_output=True, text=True, check=True).stdout
    # an instruction line: /*0a30*/  @!P0 FFMA R1, ... ;
    return Counter(match.group(1) if modifiers else match.group(1).split(".")[0]
                   for match in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", listing))
