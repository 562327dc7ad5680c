# MuJoCo's wheel ships no type information for its compiled modules (_functions, _structs,
# _enums, ... are star-imported into `mujoco` at run time), so pyright cannot see mj_step,
# MjModel or mjtObj. This partial stub says so: every attribute of `mujoco` is Any.
from typing import Any

def __getattr__(name: str) -> Any: ...
